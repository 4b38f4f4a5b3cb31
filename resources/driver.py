"""NvidiaDriver: the host's NVIDIA kernel driver as declared state (gpuhost:nvidia.driver; issue 59,
docs/driver-plan.md) - the loaded module at the declared version and flavour, and the module built for every installed
kernel (a kernel without it boots with no GPU driver).

Facts (hostscripts/driver_facts.sh, transport/driverfacts.py) -> desired -> the smallest change, priced at preview:
per host the old and new version, whether the modules can be reloaded in place (nothing but SGLang holds them) or the
host must reboot, and that SGLang stops for it. The upgrade is a durable job on the host (hostscripts/driver_upgrade.sh):
in place where nothing but SGLang holds the modules; across a reboot where something else does and
gpuhost:host.reboot is when-required (the job holds the modules back at the next boot, the host reboots, the job goes
on with nothing loaded); the loaded version built for a kernel that lacks it (the same job's build mode: nothing
stops). What an `up` does not do itself stops at this resource with one line, nothing changed.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from resources.fields import ANY, N, ROLLOUT, S, SERVICE, arr, mapof, obj, optional, secret
from resources.host import _HostResource
from resources.resource import CheckResult
from resources.state import ObservedProvider
from transport import driverfacts, jobs, remote
from transport.operator import OperatorError, info, warn

LABEL = 'host-nvidia-driver'
# One job for every change of a host's driver (an upgrade, a build): one at a time on the host.
JOB = 'gpuhost-driver'


def label(props: dict) -> str:
    """The resource's logical name, which starts the operator's lines: in a fleet the host's name before it
    (`gpu01-host-nvidia-driver`, as the program names it) - the plugin's log lines carry no resource, and every host's
    price and outcome would read alike."""
    host = (props.get('rollout') or {}).get('host')
    return '%s-%s' % (host, LABEL) if host else LABEL


class DriverError(OperatorError):
    pass


# ------------------------------------------------------------------ pure logic

def kernels_missing(facts: driverfacts.DriverFacts, version: str) -> list:
    """The installed kernels whose nvidia module is not `version` (none built, or another one): a boot into one runs
    no GPU driver, or another driver than the container's user space. A kernel the host cannot say ('?': no modinfo)
    is not counted - said by the preflight's row, never guessed."""
    return sorted(k for k, v in facts.kernels.items() if v != '?' and v != version)


def observe(facts: driverfacts.DriverFacts, version: str) -> dict:
    """The desired keys as the host has them, and the facts beside them."""
    return {'version': facts.loaded, 'modules': facts.flavour, 'kernels_missing': kernels_missing(facts, version),
            'installed': {k: (v or '-') for k, v in sorted(facts.kernels.items())}, 'running_kernel': facts.running}


@dataclasses.dataclass
class Plan:
    """What an `up` must do to a host's driver. kind: none (as declared), build (the loaded module is right; kernels
    lack it), load (no module loaded), reload (unload in place: nothing but SGLang holds the modules), reboot (held by
    others; host.reboot: when-required), held (held by others and no reboot allowed: nothing is touched)."""
    kind: str
    old: str | None
    new: str
    kernels: list
    others: list          # what holds the modules besides the container's SGLang, as sentences
    vmid: int | None
    refused: str | None = None   # a build `up` cannot do, and why (build_refusal): nothing is touched
    resuming: str | None = None  # the step an upgrade to `new` is in on the host (a Ctrl-C, a drop left it): followed


# The kinds that stop the host's SGLang (the upgrade job drains it): a rollout step that waits for its turn.
GOES_DOWN = ('load', 'reload', 'reboot')


# The host's own holder an upgrade stops first (and starts again after), as NVIDIA's driver container does.
PERSISTENCED = 'nvidia-persistenced.service'


def holders_besides(facts: driverfacts.DriverFacts, vmid) -> list:
    """What holds the nvidia modules other than container `vmid`'s processes and nvidia-persistenced (both stopped by
    the upgrade), as words for the operator: each process, and the fds the scan could not read (unknown is not
    nothing)."""
    out = ['%s (pid %d, %s)' % (p.comm, p.pid, 'container %d' % p.vmid if p.vmid is not None else 'on the host')
           for p in facts.holders_other_than(vmid) if not (p.cgroup or '').endswith('/' + PERSISTENCED)]
    if facts.unreadable:
        out.append('%d process%s whose open files could not be read' % (
            facts.unreadable, 'es' if facts.unreadable > 1 else ''))
    return out


# Why a build cannot be done, in the job's words too (hostscripts/driver_upgrade.sh build: it checks again, for a host
# changed since this read). Nothing is touched either way.
NO_HEADERS = ('kernel %s has no headers (/lib/modules/%s/build), so DKMS cannot build the module for it: apt install '
              'proxmox-headers-%s (or remove the kernel) and re-run; nothing was changed')
NO_DKMS = ('%s, so %s cannot be built for kernel%s %s: %sre-install %s with the installer\'s --dkms (docs/operator-guide.md: '
           'the host\'s NVIDIA driver), or remove the kernel; nothing was changed')


def build_refusal(facts: driverfacts.DriverFacts, version: str, kernels: list) -> str | None:
    """Why DKMS cannot build `version` for `kernels`, from the facts (None: it can, or the host did not say - the
    job then finds out): no dkms, no nvidia/<version> in DKMS (the running driver was installed without it), or a
    kernel without its headers."""
    several = 's' if len(kernels) > 1 else ''
    if facts.dkms_tool is False:
        return NO_DKMS % ('dkms is not installed on the host', version, several, ' '.join(kernels),
                          'install dkms (apt install dkms), then ', version)
    if facts.dkms is not None and not any(e.module == 'nvidia' and e.version == version for e in facts.dkms):
        return NO_DKMS % ('`dkms status -m nvidia` has no nvidia/%s - the running driver was not installed with DKMS' %
                          version, version, several, ' '.join(kernels), '', version)
    for k in kernels:
        if facts.headers.get(k) is False:
            return NO_HEADERS % (k, k, k)
    return None


def plan(facts: driverfacts.DriverFacts, version: str, modules: str, vmid, reboot: str) -> Plan:
    missing = kernels_missing(facts, version)
    if facts.loaded == version and facts.flavour in (modules, None):
        if missing:
            return Plan('build', facts.loaded, version, missing, [], vmid, build_refusal(facts, version, missing))
        return Plan('none', facts.loaded, version, [], [], vmid)
    # The kernels the new version is built for: every installed one (DKMS), the running one at least.
    kernels = sorted(set(facts.kernels) | ({facts.running} if facts.running else set()))
    under = facts.upgrade_under_way(version)
    # An upgrade under way started from the version it recorded (its modules may be unloaded by now).
    old, step = (under[1], under[0]) if under else (facts.loaded, None)
    if facts.loaded is None:
        return Plan('load', old, version, kernels, [], vmid, resuming=step)
    others = holders_besides(facts, vmid)
    if not others:
        return Plan('reload', old, version, kernels, [], vmid, resuming=step)
    return Plan('reboot' if reboot == 'when-required' else 'held', old, version, kernels, others, vmid,
                resuming=step)


NOT_YET = ('this release does not yet %s (docs/driver-plan.md): `up` stops at this step with nothing changed; until '
           'then do it by hand (docs/operator-guide.md) or declare the version the host runs')
# What an `up` does itself; the other kinds are priced, and stopped at with NOT_YET.
DONE_BY_UP = ('none', 'build', 'load', 'reload', 'reboot')
NOT_YET_WHAT = {'held': 'change a driver that other processes hold'}


def price(p: Plan, service: dict | None) -> str:
    """The preview's words for a plan: old -> new, reload in place or reboot, what stops."""
    ct = ('SGLang in container %s (%s) stops for it, then restarts on the new user space' % (
        service['vmid'], service['unit_name']) if service else 'no SGLang is declared on this host')
    kernels = ', '.join(p.kernels) or 'none found'
    if p.kind == 'build':
        return ('the loaded module is %s as declared, but kernel%s %s %s no nvidia %s module built: a boot into %s '
                'runs without it. %s' % (
                    p.new, 's' if len(p.kernels) > 1 else '', kernels, 'have' if len(p.kernels) > 1 else 'has', p.new,
                    'them' if len(p.kernels) > 1 else 'it',
                    '`up` cannot build it: ' + p.refused if p.refused else
                    '`up` builds it with DKMS; nothing stops'))
    head = '%s -> %s (open kernel modules, built with DKMS for kernels %s)' % (p.old or 'not loaded', p.new, kernels)
    if p.resuming and p.kind != 'held':
        return ('%s: the upgrade is under way on the host (its job %s is at its step %s, left by an earlier `up`): '
                '`up` re-attaches to it or goes on from that step - never a second install -, then %s' % (
                    head, JOB, p.resuming, 'the container\'s user space and SGLang follow' if service else
                    'nothing else follows'))
    if p.kind == 'load':
        return '%s: no nvidia module is loaded; `up` installs %s and loads it' % (head, p.new)
    if p.kind == 'reload':
        return ('%s: the modules can be reloaded in place (nothing but SGLang holds them): %s. The VM\'s GPUs stay on '
                'vfio-pci, untouched' % (head, ct))
    if p.kind == 'reboot':
        return ('%s: the modules cannot be unloaded in place - held by %s - so the host reboots into %s '
                '(gpuhost:host.reboot: when-required): %s, and every guest stops while it reboots' % (
                    head, ', '.join(p.others), p.new, ct))
    return ('%s: nothing is touched - the modules are held by %s besides SGLang, and gpuhost:host.reboot is never. Stop '
            'what holds them, or allow a reboot (gpuhost:host.reboot: when-required), and re-run' % (
                head, ', '.join(p.others)))


def not_yet(p: Plan) -> str:
    text = NOT_YET % NOT_YET_WHAT[p.kind]
    return text[0].upper() + text[1:]


# ------------------------------------------------------------------- the upgrade



def build_job(props: dict, p: Plan) -> jobs.Job:
    """hostscripts/driver_upgrade.sh's build mode as the durable job: `dkms install nvidia/<version> -k <kernel>` for
    each kernel that lacks it - nothing stopped, nothing unloaded."""
    return jobs.Job(name=JOB, label='the NVIDIA driver build of %s for kernel%s %s' % (
                        p.new, 's' if len(p.kernels) > 1 else '', ', '.join(p.kernels)),
                    spec=jobs.spec_of({'build': p.new, 'kernels': p.kernels}),
                    interpreter='bash', body=remote.script('driver_upgrade.sh'), args=('build', p.new) + tuple(p.kernels),
                    limit_s=int(float(props.get('timeout') or 3600)), stall_s=int(float(props.get('stall') or 600)),
                    limit_key='gpuhost:runtime.install_timeout_s', stall_key='gpuhost:runtime.stall_timeout_s',
                    prefix='gpuhost')


def build(target: remote.Target, props: dict, p: Plan) -> None:
    """The loaded version built for the kernels that lack it; one line for the operator whatever ends it. Never over
    another change of the driver in flight (an upgrade a Ctrl-C left running): that one is not stopped for a build."""
    started = time.monotonic()
    job = build_job(props, p)
    now = jobs.poll(target, job)
    if now.running and now.spec not in (None, job.spec):
        raise DriverError('%s: another change of the driver is running on the host (job %s); nothing was changed - '
                          're-run `up` once it ends (watch it: %s)' % (label(props), JOB, job.watch_hint()))
    try:
        jobs.run(target, job)
    except jobs.JobFailed as e:
        from resources.runtime import _exit_status, _job_log
        why = _job_log(e)
        if _exit_status(e) == 3:
            raise DriverError('%s: %s' % (label(props), why)) from None
        raise DriverError('%s: the build of %s for kernel%s %s failed: %s (its log: %s on the host); nothing was '
                          'stopped and %s stays loaded; the next `up` builds it again' % (
                              label(props), p.new, 's' if len(p.kernels) > 1 else '', ', '.join(p.kernels), why,
                              job.log_path, p.new)) from None
    info('%s: %s built with DKMS for kernel%s %s (%d s); nothing was stopped' % (
        label(props), p.new, 's' if len(p.kernels) > 1 else '', ', '.join(p.kernels), time.monotonic() - started))


def upgrade_job(props: dict, how: str = 'reload') -> jobs.Job:
    """hostscripts/driver_upgrade.sh as a durable job on the host: it outlives the SSH command, the connection and
    `pulumi` (a Ctrl-C or a drop mid-install leaves it running; the next `up` re-attaches to it, never a second one),
    and records its step on the host for a job started again after it died. how: reload (in place) or reboot (the
    modules held back at the next boot; an upgrade already started keeps the way it started with)."""
    inst, service = props['installer'], props.get('service') or {}
    body = remote.script('driver_upgrade.sh')
    args = (props['version'], inst['path'], inst['sha256'], str(service.get('vmid', '-')),
            service.get('unit_name', '-'), ','.join(props.get('container_gpus') or []) or '-',
            ','.join(props.get('vm_gpus') or []) or '-', how)
    return jobs.Job(name=JOB, label='the NVIDIA driver upgrade to %s' % props['version'],
                    spec=jobs.spec_of({'version': props['version'], 'installer': inst['path'], 'sha256': inst['sha256']}),
                    interpreter='bash', body=body, args=args, limit_s=int(float(props.get('timeout') or 3600)),
                    stall_s=int(float(props.get('stall') or 600)), limit_key='gpuhost:runtime.install_timeout_s',
                    stall_key='gpuhost:runtime.stall_timeout_s', prefix='gpuhost')


def upgrade(target: remote.Target, props: dict, p: Plan) -> None:
    """The installer on the host (downloaded first where it is declared by source), then the upgrade job - for a
    reboot, the job up to the hold, the reboot, and the job again on the new boot; one line for the operator whatever
    ends it."""
    inst = props['installer']
    if inst.get('source'):
        from resources.runtime import fetch_installers
        # The runtime's download job (resumable, never two of one file, the token sent to the source's origin only).
        fetch_installers(target, {'runtime': {'nvidia': props['version']},
                                  'install': {'nvidia': {'installer': inst['path'], 'sha256': inst['sha256'],
                                                         'source': inst['source']},
                                              'timeout': props.get('timeout') or 3600, 'stall': props.get('stall')},
                                  'installer_tokens': props.get('installer_tokens')}, {'container_driver': None})
    started = time.monotonic()
    how = 'reboot' if p.kind == 'reboot' else 'reload'
    done = run_job(target, props, p, how)
    if done.startswith('reboot '):
        from resources.host import reboot_and_wait
        info('%s: the nvidia modules are held back at the next boot (held by %s); rebooting %s' % (
            label(props), ', '.join(p.others) or 'other processes', target.host))
        reboot_and_wait(target)
        info('%s: %s is back with nothing loaded; installing %s' % (label(props), target.host, p.new))
        run_job(target, props, p, how)
    info('%s: %s -> %s: loaded, every container GPU up on it (%d s); the container\'s user space and SGLang follow' % (
        label(props), p.old or 'not loaded', p.new, time.monotonic() - started))


def run_job(target: remote.Target, props: dict, p: Plan, how: str) -> str:
    """The upgrade job to its end; its outcome line (`upgraded FROM NEW`, `reboot FROM NEW`), or one line for the
    operator."""
    job = upgrade_job(props, how)
    try:
        return (jobs.run(target, job).out or '').strip()
    except jobs.JobFailed as e:
        from resources.runtime import _exit_status, _job_log
        why = _job_log(e)
        code = _exit_status(e)
        if code == 5:
            raise DriverError('%s: %s; the rollout stops at this host (its SGLang runs again on %s). Read the '
                              'kernel log (journalctl --dmesg) on the host before trying %s again' % (
                                  label(props), why, p.old, p.new)) from None
        if code in (3, 4):
            raise DriverError('%s: %s' % (label(props), why)) from None
        raise DriverError('%s: the upgrade to %s failed: %s (its log: %s on the host); the next `up` goes on from the '
                          'step it was in' % (label(props), p.new, why, job.log_path)) from None


# ------------------------------------------------------------------- the provider

# goes_down's decision, for the apply that follows it on the same thread (provider/__main__.py step()).
_turn = threading.local()


def _turn_key(props) -> tuple:
    conn = props.get('connection') or {}
    return (conn.get('host'), conn.get('port'), props.get('version'))


def read(target: remote.Target) -> driverfacts.DriverFacts:
    return driverfacts.parse(remote.run(target, 'driver_facts.sh', []).stdout)


class NvidiaDriverProvider(ObservedProvider):
    """The host's NVIDIA kernel driver (gpuhost:nvidia.driver): the loaded module at the declared version and
    flavour, and that version built for every installed kernel. Observed: the loaded module, each kernel's."""
    ID = 'nvidia-driver'
    DESIRED = ('version', 'modules', 'kernels_missing')
    ROLLOUT_STEP = 'its NVIDIA driver'
    # goes_down() reads the host: asked before the apply (provider/__main__.py step()), never by the preview's lines.
    GOES_DOWN_READS_HOST = True
    INPUTS = {'version': S, 'modules': S, 'kernels_missing': arr(S),
              'installer': obj('DriverInstaller', path=S, sha256=S, source=optional(S)),
              'installer_tokens': optional(secret(ANY)), 'timeout': N, 'stall': N,
              'container_gpus': arr(S), 'vm_gpus': arr(S),
              'reboot': S, 'service': optional(SERVICE), 'rollout': optional(ROLLOUT)}
    OUTPUTS = {'installed': mapof(S), 'running_kernel': optional(S), 'applied': S}

    def goes_down(self, props) -> bool:
        """Whether this change of the driver stops the host's SGLang (provider/rollout.py: then it waits for its turn):
        an upgrade or a load does, a build for a new kernel does not. Read from the host now; unreadable, it may. The
        apply on this thread next re-reads, and refuses a plan that now stops SGLang after this said it would not (a
        host changed in between: it did not wait for its turn)."""
        try:
            _facts, p = self.plan_for(props)
        except (OperatorError, remote.RemoteError):
            return True
        _turn.ungated = None if p.kind in GOES_DOWN else _turn_key(props)
        return _turn.ungated is None

    def plan_for(self, props) -> tuple:
        target = remote.Target.from_inputs(props['connection'])
        facts = read(target)
        service = props.get('service')
        vmid = service['vmid'] if service else None
        if vmid is not None and facts.loaded is not None and facts.loaded != props['version']:
            # Who holds the GPUs inside the container: a Proxmox host shows its processes itself (their cgroup names
            # it), the container's own scan covers a host that does not.
            facts = facts.with_container(vmid, driverfacts.container_processes(target, vmid))
        return facts, plan(facts, props['version'], props['modules'], vmid, props.get('reboot') or 'never')

    def say_price(self, props) -> None:
        try:
            _facts, p = self.plan_for(props)
        except (OperatorError, remote.RemoteError) as e:
            warn('%s: %s - what the change costs could not be read: %s' % (label(props), props['version'], e))
            return
        if p.kind == 'build' and p.refused:
            warn('%s: %s' % (label(props), price(p, props.get('service'))))
        elif p.kind in DONE_BY_UP[1:]:
            info('%s: %s' % (label(props), price(p, props.get('service'))))
        elif p.kind != 'none':
            info('%s: %s. %s' % (label(props), price(p, props.get('service')), not_yet(p)))

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        ungated, _turn.ungated = getattr(_turn, 'ungated', None) == _turn_key(props), None
        facts, p = self.plan_for(props)
        if ungated and p.kind in GOES_DOWN:
            raise DriverError('%s: the host\'s driver changed while this `up` ran (%s now, where nothing was to stop, '
                              'so it did not wait for its turn in the rollout); nothing was changed - re-run `up`' % (
                                  label(props), price(p, props.get('service'))))
        if p.kind == 'held':
            raise DriverError('%s: %s.' % (label(props), price(p, props.get('service'))))
        if p.kind == 'build' and p.refused:
            raise DriverError('%s: %s' % (label(props), p.refused))
        if p.kind not in DONE_BY_UP:
            raise DriverError('%s: %s; %s.' % (label(props), price(p, props.get('service')), not_yet(p)))
        if p.kind == 'build':
            build(target, props, p)
            facts = read(target)
        elif p.kind != 'none':
            upgrade(target, props, p)
            facts = read(target)
        return dict(props, **observe(facts, props['version']))

    def check(self, olds, news):
        # The first preview that declares the driver (no olds: no diff follows) says what `up` will do.
        if not olds and isinstance(news.get('connection'), dict):
            self.say_price(news)
        return CheckResult(news, [])

    def diff(self, id_, olds, news):
        result = super().diff(id_, olds, news)
        if result.changes and isinstance(news.get('connection'), dict):
            self.say_price(news)
        return result

    def current(self, props):
        facts = read(remote.Target.from_inputs(props['connection']))
        out = observe(facts, props['version'])
        if out['kernels_missing']:
            warn('%s: DANGER - kernel%s %s %s no nvidia %s module built: a boot into %s runs without the GPU driver '
                 '(or another version than the container\'s user space). `pulumi up` builds it' % (
                     label(props), 's' if len(out['kernels_missing']) > 1 else '', ', '.join(out['kernels_missing']),
                     'have' if len(out['kernels_missing']) > 1 else 'has', props['version'],
                     'them' if len(out['kernels_missing']) > 1 else 'it'))
        return out


# ------------------------------------------------------------------- the resource

class NvidiaDriver(_HostResource, name='NvidiaDriver'):
    pass
