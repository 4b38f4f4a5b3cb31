"""SglangService: the systemd unit serving Qwen3.5-122B-A10B with TP 4 and MTP inside the container.

The unit is rendered (templates/sglang.service.j2) for the declared SGLang version: flags that
version accepts, CUDA_HOME, the virtualenv first on PATH, NCCL_P2P_DISABLE=1 because the host's IOMMU
translates (no GPU P2P), metrics on. On apply it is written into the container atomically; the
service is restarted only when the unit changed; the step waits for /health and then checks that
/server_info reports the speculative settings the unit asked for - a mismatch fails the update.
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import urllib.error
import urllib.request

from pulumi.runtime import rpc

from hostscripts import exposition
from resources import model as model_mod, runtime
from transport import operator
from transport import remote
from grammar import systemd
from resources.fields import ANY, B, I, N, ROLLOUT, S, arr, mapof, obj, optional, secret
from grammar.sglang_flags import API_KEY_VAR
from resources.render import exec_start, render
from resources.resource import CheckResult, CreateResult, DiffResult, UpdateResult
from resources.state import GpuhostResource, ObservedProvider, utc_now
from transport.operator import OperatorError, info, warn
from transport.operator import info as note  # where apply's `info` is SGLang's /server_info



class ServiceError(OperatorError):
    pass


def wait_http(url: str, timeout: float, what: str, failed=None) -> None:
    """Wait for 200 from url. `failed()` (checked every few seconds) returns a reason when waiting is
    pointless - the unit has failed - so a crash is reported at once, not after the whole timeout."""
    start = time.time()
    deadline = start + timeout
    last, next_check, next_report = None, start + 3, start + 15
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
                last = 'HTTP %d' % r.status
        except urllib.error.HTTPError as e:
            last = 'HTTP %d' % e.code
        except OSError as e:
            last = str(getattr(e, 'reason', e))
        if failed is not None and time.time() > next_check:
            why = failed()
            if why:
                raise ServiceError('%s: %s' % (what, why))
            next_check = time.time() + 3
        if time.time() > next_report:
            # The model takes minutes to load on the real host: say where the wait is.
            info('%s: waiting for %s - %s (%d s of %d s)' % (
                what, url, 'loading, last answer ' + last if last and last.startswith('HTTP') else
                'not answering yet (%s)' % last, time.time() - start, timeout))
            next_report = time.time() + 15
        operator.pause(0.5, what, url, 'SGLang goes on starting, and the next `pulumi up` checks it (a unit this run '
                    'restarted is restarted once more: its settings were not confirmed serving)')
    raise ServiceError('%s: %s did not answer 200 within %d s (last: %s); see the unit\'s log in the container '
                       '(journalctl -u <unit>)' % (what, url, timeout, last))


def unit_text(d, env=None) -> str:
    """The unit. env: the managed Python environment (resources/runtime.py environment()): the unit runs
    from its own directory, so a new environment is a new unit; without one, from gpuhost:sglang.venv."""
    s = d.sglang
    spec = s.speculative
    prefix = env['path'] if env else s.venv
    return render('sglang.service.j2', version=s.version, served_model_name=s.served_model_name, tp=s.tp,
                  speculative=('%s steps=%d topk=%d draft=%d' % (spec.algorithm, spec.num_steps, spec.eagle_topk,
                                                                 spec.num_draft_tokens)
                               if spec and spec.num_steps else None),
                  environment=d.service_environment(prefix if env else None),
                  environment_file=env_path(s.unit) if s.api_key else None,
                  exec_start=exec_start(['%s/bin/python' % prefix, '-m', 'sglang.launch_server'] + d.launch_args()))


def env_path(unit: str) -> str:
    """The unit's root-only environment file in the container (mode 0600): where its secrets live."""
    return '/etc/gpuhost/%s.env' % unit[:-len('.service')]


def env_content(api_key: str) -> str:
    return '%s=%s\n' % (API_KEY_VAR, api_key)


def key_from_env(text):
    """The API key an environment file holds (what the service really uses), or None."""
    for line in (text or '').splitlines():
        if line.startswith(API_KEY_VAR + '='):
            return line.split('=', 1)[1]
    return None


def flag_groups(argv: list) -> list:
    """["--flag value ...", ...]: one element per flag with its values, so a preview's diff of this
    list shows exactly the flags that change (the ExecStart= line is too long to read in a diff)."""
    out = []
    for a in argv:
        if isinstance(a, systemd.EnvRef):
            a = systemd.exec_arg(a)  # `${NAME}`, as ExecStart= has it (the value is in the root-only env file)
        if a.startswith('-') or not out:
            out.append(a)
        else:
            out[-1] += ' ' + a
    return out


def expected_speculation(d) -> dict:
    """What /server_info must report for the unit's flags (SGLang reports NEXTN as EAGLE)."""
    spec = d.sglang.speculative
    if not spec or spec.num_steps is None:
        return {'speculative_algorithm': None}
    return {'speculative_algorithm': 'EAGLE' if spec.algorithm == 'NEXTN' else spec.algorithm,
            'speculative_num_steps': spec.num_steps, 'speculative_eagle_topk': spec.eagle_topk,
            'speculative_num_draft_tokens': spec.num_draft_tokens}


def fetch_json(url: str, timeout: float = 10.0, api_key=None):
    req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + api_key} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def server_info(endpoint: str, api_key=None) -> dict:
    """/server_info (behind the API key when there is one; /health and /metrics are not)."""
    try:
        return fetch_json(endpoint + '/server_info', api_key=api_key)
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ServiceError('%s/server_info refused the API key (401): the service runs with another key than '
                               'gpuhost:sglang.api_key' % endpoint) from None
        if e.code != 404:
            raise
    return fetch_json(endpoint + '/get_server_info', api_key=api_key)  # the name before 0.5.x


def resolved(info: dict) -> dict:
    keys = ('speculative_algorithm', 'speculative_num_steps', 'speculative_eagle_topk',
            'speculative_num_draft_tokens', 'tp_size', 'served_model_name', 'mem_fraction_static',
            'mamba_radix_cache_strategy', 'version', 'model_path')
    out = {k: info.get(k) for k in keys}
    states = info.get('internal_states') or [{}]
    out['avg_spec_accept_length'] = states[0].get('avg_spec_accept_length') if states else None
    return out


def mismatches(expected: dict, got: dict) -> list:
    return ['%s: unit asked for %s, SGLang resolved %s' % (k, v, got.get(k))
            for k, v in expected.items() if got.get(k) != v]


def changed_lines(old: str, new: str, limit: int = 16) -> list:
    """The lines of a file that change ('-old', '+new'), for an adoption's preview; at most `limit`."""
    import difflib
    lines = [line for line in difflib.unified_diff((old or '').splitlines(), new.splitlines(), lineterm='', n=0)
             if line[:1] in '+-' and not line.startswith(('+++', '---'))]
    return lines[:limit] + (['... %d more changed lines' % (len(lines) - limit)] if len(lines) > limit else [])


def service_props(d) -> dict:
    """Where the service is and how long it may take to start: what the container step and a host
    reboot need to wait for it (they do not compare its settings: the unit's own step does)."""
    s = d.sglang
    return {'vmid': d.container.vmid, 'unit_name': s.unit, 'unit_path': '/etc/systemd/system/%s' % s.unit,
            'venv': s.venv, 'version': s.version, 'endpoint': 'http://%s:%d' % (d.container.address, s.port),
            'health_timeout': s.health_timeout_s}


class CanaryInterrupted(OperatorError):
    """A Ctrl-C during the canary's judgement: the canary runs the new setting, unconfirmed - the next `up`
    restarts it and judges it again (never a pass by default)."""


def canary_words(c: dict) -> str:
    against = ('%s, restarted onto its own setting at the same moment (baseline: restart), under its own traffic' %
               c['restart']['host'] if c.get('restart') else
               '%s under their own traffic' % ', '.join(sorted(c['baseline'])))
    return ('judged against %s (windows of %g s, up to %g s, from %s; the mean inter-token latency, the TTFT and '
            'end-to-end p95, aborted requests, the queue and output tokens/s per running request, per load band)' % (
                against, c['window_s'], c['max_duration_s'],
                'Prometheus at %s' % c['prometheus'] if c.get('prometheus') else 'each host\'s /metrics'))


class BaselineRestart:
    """gpuhost:rollout.canary.baseline: restart - the baseline host's SGLang restarted onto its own, unchanged unit
    at the moment the canary restarts onto the new one (same start, same warm-up: caches, CUDA graphs), on that
    host's own connection (the `baseline_connection` input), in a thread beside the canary's restart; `wait()` until
    it serves (/health) or raise ServiceError, the judgement not begun. Its unit file is not touched."""

    def __init__(self, props):
        import threading
        self.r = props['canary']['restart']
        self.target = remote.Target.from_inputs(props['baseline_connection'])
        self.error = None
        self.thread = threading.Thread(target=self._run, name='gpuhost-canary-baseline', daemon=True)
        note('sglang-unit: the canary\'s baseline %s restarts %s onto its own setting at the canary\'s moment' % (
            self.r['host'], self.r['unit_name']))
        self.thread.start()

    def _run(self):
        r = self.r
        what = 'the canary\'s baseline %s (%s in container %s)' % (r['host'], r['unit_name'], r['vmid'])
        try:
            remote.run(self.target, 'ct_unit.sh', [r['vmid'], r['unit_name'], 'yes'])
            wait_http(r['endpoint'] + '/health', float(r['health_timeout']), what)
        except BaseException as e:   # noqa: BLE001 - said by wait(), on the canary's thread
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if isinstance(self.error, operator.Interrupted):
            raise self.error
        if self.error is not None:
            raise ServiceError('the canary\'s baseline %s did not serve again after its restart at the canary\'s '
                               'moment (%s); no judgement without it. Its unit is unchanged: check it (journalctl -u '
                               '%s in container %s on %s), then re-run `pulumi up`' % (
                                   self.r['host'], str(self.error).split(': ', 1)[-1] if isinstance(
                                       self.error, (ServiceError, remote.RemoteError)) else self.error,
                                   self.r['unit_name'], self.r['vmid'], self.r['host']))


# The judgement's state on the canary host (issue 60): the record an operator and `refresh` read (the verdict and its
# table: the `canary` output) and node_exporter's file (GpuhostCanaryUnresolved: a canary left on a new setting without
# a verdict - a Ctrl-C, a killed `pulumi up` - once its judgement's deadline has passed).
CANARY_RECORD = '/var/lib/gpuhost/canary.json'
CANARY_TEXTFILE = 'gpuhost-canary.prom'
UNRESOLVED = ('judging', 'interrupted')


def canary_files(record: dict, vmid) -> tuple:
    """The record's JSON and the node_exporter textfile for it (pure)."""
    lab = {'vmid': str(vmid)}
    t = exposition.Text()
    t.family('gpuhost_canary_judging', 'Whether this host is the fleet\'s canary running a new SGLang setting that no '
             'verdict has ruled on yet (1: being judged, or the judgement was interrupted) or not (0).',
             [(lab, 1 if record['state'] in UNRESOLVED else 0)])
    t.family('gpuhost_canary_deadline_timestamp_seconds', 'When the canary\'s judgement ends at the latest '
             '(gpuhost:rollout.canary.max_duration_s after it began; Unix time).', [(lab, record['deadline'])])
    t.family('gpuhost_canary_verdict', 'The canary\'s last verdict (pass, fail, inconclusive), once there is one.',
             [(dict(lab, outcome=record['state']), 1)] if record['state'] not in UNRESOLVED else [])
    t.family('gpuhost_canary_timestamp_seconds', 'When the canary\'s judgement last changed state (Unix time).',
             [(lab, record['changed'])])
    return json.dumps(record, indent=1, sort_keys=True) + '\n', t.text()


def write_canary(target, props, record: dict) -> None:
    """The record and its textfile on the canary host. A file that cannot be written is said, never the run's
    failure (the judgement itself goes on: its verdict is what counts)."""
    record = dict(record, changed=int(time.time()))
    text, prom = canary_files(record, props['vmid'])
    try:
        remote.run(target, 'ensure_dir.sh', [posixpath.dirname(CANARY_RECORD), '0755'])
        remote.put_file(target, CANARY_RECORD, text, '0644', 'any')
        remote.run(target, 'ensure_dir.sh', [exposition.TEXTFILE_DIR, '0755'])
        remote.put_file(target, posixpath.join(exposition.TEXTFILE_DIR, CANARY_TEXTFILE), prom, '0644', 'any')
    except remote.RemoteError as e:
        warn('sglang-unit: the canary\'s state (%s) could not be written on the host: %s' % (
            record['state'], str(e).split(': ', 1)[-1]))


def read_canary(target) -> dict | None:
    """The canary host's record (None: none, or unreadable - said)."""
    res = remote.run(target, 'read_file.sh', [CANARY_RECORD], check=False)
    if res.exit_code != 0 or not res.stdout.strip():
        return None
    try:
        record = json.loads(res.stdout)
    except ValueError:
        warn('sglang-unit: the canary\'s record %s on the host is not JSON; the next judgement replaces it' %
             CANARY_RECORD)
        return None
    return record if isinstance(record, dict) else None


def forget_canary(target, why: str) -> None:
    """This host is no longer the canary: its record and textfile go (no alert for a judgement nobody will make)."""
    try:
        remote.run(target, 'remove_file.sh', [posixpath.join(exposition.TEXTFILE_DIR, CANARY_TEXTFILE)])
        remote.run(target, 'remove_file.sh', [CANARY_RECORD])
    except remote.RemoteError as e:
        warn('sglang-unit: %s, but its canary files could not be removed: %s (remove %s and %s by hand)' % (
            why, str(e).split(': ', 1)[-1], CANARY_RECORD, CANARY_TEXTFILE))


def judge_canary(target, props) -> dict:
    """The canary's judgement (resources/canary.py) on this host, just restarted onto a new setting; returns its record
    (the `canary` output) on a pass (or an inconclusive one with inconclusive: proceed), raises ServiceError (the
    caller puts the previous unit back) or CanaryInterrupted. The record on the host says where it stands at each
    step: judging (with its deadline) before the first window, then the verdict - or interrupted."""
    import types
    from resources import canary
    c = props['canary']
    cfg = types.SimpleNamespace(**{k: c[k] for k in ('window_s', 'max_duration_s', 'min_samples', 'bands', 'confidence',
                                                     'tolerance', 'traffic_tolerance')},
                                prometheus=c.get('prometheus'), slo=types.SimpleNamespace(**(c.get('slo') or {})))
    host = c['host']
    note('sglang-unit: %s is the canary: %s' % (host, canary_words(c)))
    record = {'host': host, 'baseline': sorted(c['baseline']), 'unit_sha256': remote.sha256_hex(props['unit']),
              'started': utc_now(), 'deadline': int(time.time() + c['max_duration_s']), 'state': 'judging',
              'line': 'being judged', 'then': 'the other hosts wait for the verdict', 'rows': [], 'table': ''}
    write_canary(target, props, record)
    endpoints = dict({host: props['endpoint']}, **c['baseline'])
    verdict = canary.run(canary.source(cfg, endpoints), host, cfg, lambda line: note('sglang-unit: %s' % line))
    table = verdict.table()
    for line in table.splitlines():
        note('sglang-unit:   %s' % line)
    record.update(line=verdict.line, table=table, at=utc_now(), rows=[
        dict(r.as_dict(), effect=r.effect if r.effect is None or abs(r.effect) != float('inf') else None)
        for r in verdict.rows])
    proceed = verdict.outcome == 'pass' or (verdict.outcome == 'inconclusive' and c.get('inconclusive') == 'proceed')
    if verdict.outcome == 'running':
        record.update(state='interrupted', then='it runs the new setting, unconfirmed: the next `pulumi up` restarts it '
                                                'and judges it again')
    else:
        record.update(state=verdict.outcome, then='the rollout went on' if proceed else
                      'the previous unit was put back and the rollout stopped')
    write_canary(target, props, record)
    if verdict.outcome == 'pass':
        note('sglang-unit: the canary %s passed: %s; the rollout goes on' % (host, verdict.line))
        return record
    if proceed:
        warn('sglang-unit: the canary %s\'s judgement was inconclusive: %s; the rollout goes on '
             '(gpuhost:rollout.canary.inconclusive: proceed)' % (host, verdict.line))
        return record
    if verdict.outcome == 'running':
        raise CanaryInterrupted('the canary %s\'s judgement was interrupted (Ctrl-C) before a verdict; it runs the new '
                                'setting, unconfirmed - the next `pulumi up` restarts it and judges it again' % host)
    raise ServiceError('the canary %s %s: %s' % (
        host, 'failed its judgement' if verdict.outcome == 'fail' else
        'had too little comparable traffic for a verdict (gpuhost:rollout.canary.inconclusive: rollback)', verdict.line))


def verify_serving(target, props, active) -> dict:
    """Wait for /health (failing at once if the unit is not running: `active()`), then check that
    /server_info reports the speculation the unit asked for. Returns the resolved settings."""
    def failed():
        if not active():
            return ('%s is not running in container %s (it exited or failed to start); see `pct exec %s -- '
                    'journalctl -u %s`' % (props['unit_name'], props['vmid'], props['vmid'], props['unit_name']))
        return None
    wait_http(props['endpoint'] + '/health', float(props['health_timeout']),
              '%s in container %s' % (props['unit_name'], props['vmid']), failed=failed)
    if props.get('expect') is None:
        return None  # a restart of the whole container: serving again is what counts here
    info = resolved(server_info(props['endpoint'], props.get('api_key')))
    bad = mismatches(props['expect'], info)
    if bad:
        raise ServiceError('%s started, but /server_info does not match the unit: %s. Check the flags for '
                           'SGLang %s (journalctl -u %s in the container)' % (
                               props['unit_name'], '; '.join(bad), props['version'], props['unit_name']))
    return info


def unit_facts(target, props) -> dict:
    return remote.parse_kv(remote.run(target, 'ct_unit_facts.sh', [
        props['vmid'], props['unit_name'], props['unit_path'], props['venv']]).stdout)


def serving_now(target, props) -> bool:
    """The container runs and the unit is active (read before a reboot: what must come back)."""
    f = unit_facts(target, props)
    return f.get('ct') == 'running' and f.get('ActiveState') == 'active'


def verify_after_reboot(target, props, required: bool = False) -> None:
    """After a host reboot: if the container came back with the unit enabled, SGLang must serve again
    before the run ends (onboot guests start with the host; the unit starts with the container).
    required: it served before the reboot, so it must serve again - a container that does not come
    back (onboot off, a slow or failed start) is an error, not something to leave to a later step:
    in a fleet, the next host's reboot waits for this one."""
    def facts():
        return unit_facts(target, props)
    deadline = time.time() + 120
    f = facts()
    # A container that does not exist yet (a first deployment: the guests are made after the reboot)
    # will not come back by itself; one that exists may take a while (onboot guests start after sshd).
    while f.get('ct') == 'stopped' and time.time() < deadline:
        # onboot guests start a little after the host answers SSH
        operator.pause(2, 'container %s' % props['vmid'], 'it to start after the host\'s reboot',
                    'it starts by itself (onboot), and the next `pulumi up` checks that SGLang serves')
        f = facts()
    if f.get('ct') != 'running' or f.get('UnitFileState') != 'enabled':
        if required:
            raise ServiceError('container %s served SGLang before the reboot but %s 120 s after it; start it '
                               '(pct start %s; check onboot) and re-run' % (
                                   props['vmid'], 'is not running' if f.get('ct') != 'running' else
                                   'its unit %s is not enabled' % props['unit_name'], props['vmid']))
        return  # no container or no service yet (first deployment), or not started at boot: the guest steps see to it
    verify_serving(target, props, lambda: facts().get('ActiveState') in ('active', 'activating'))


def facts_args(props) -> list:
    """ct_unit_facts.sh's arguments: where the unit, its environment(s) and CUDA are."""
    py = (props.get('install') or {}).get('python') or {}
    return [props['vmid'], props['unit_name'], props['unit_path'], props['venv'], props.get('cuda_home') or '-',
            py.get('envs_dir') or '-'] + ([runtime.checker_source()] if py.get('envs_dir') else [])


def proof_inputs(d, env) -> dict | None:
    """The unit resource's `proof` input (gpuhost:sglang.proof): the GPUs to prove, the tensor-parallel group, the
    time limit, and the service's own Python and environment to prove them with. None: the proof is off."""
    p = d.sglang.proof
    if not p.enabled:
        return None
    prefix = env['path'] if env else d.sglang.venv
    return {'gpus': list(d.container.gpus), 'tp': d.sglang.tp, 'time_limit_s': p.time_limit_s,
            'min_busbw_gbps': p.min_busbw_gbps,
            'python': prefix + '/bin/python', 'environment': dict(d.service_environment(prefix if env else None))}


def proof_due(props, last, new_ground: bool) -> bool:
    """The proof runs where SGLang is stopped anyway: a restart onto a new NVIDIA user space, CUDA or environment
    (new_ground), its first start, and other GPUs than the last proof's."""
    proof = props.get('proof')
    if not proof:
        return False
    return new_ground or not last or last.get('gpus') != proof['gpus']


def rebooted_since_proof(props, last, boot_id) -> bool:
    """The host booted since the last proof (its boot id, /proc/sys/kernel/random/boot_id, differs): SGLang started
    at boot on GPUs nobody proved since - a GPU that did not initialise after a reboot is one of the failures the
    proof is for. `up` makes the window itself: it stops SGLang, proves the GPUs and starts it again."""
    return bool(props.get('proof') and last and last.get('boot_id') and boot_id and last['boot_id'] != boot_id)


def host_boot(olds, news) -> str | None:
    """The host's boot as this run knows it: its status resource's (read after this run's own reboot, or by the
    refresh), else what the unit's last read found. Unknown in a preview where the status is read again."""
    boot = news.get('host_boot_id')
    if isinstance(boot, str) and boot and boot != rpc.UNKNOWN:
        return boot
    return (olds.get('runtime_facts') or {}).get('boot_id')


def first_figure(proof, last, out) -> dict | None:
    """The all-reduce's first recorded figure for this group of GPUs (the reference every later proof is shown
    against, and what to set gpuhost:sglang.proof.min_busbw_gbps from): the last proof's while the GPUs, the group
    and the largest size stay the same, else this proof's."""
    first = (last or {}).get('first')
    if first and last.get('gpus') == proof['gpus'] and last.get('tp') == proof['tp'] and \
            first.get('bytes') == out.get('allreduce_bytes'):
        return first
    if out.get('ok') and out.get('busbw') is not None and proof['tp'] > 1:
        return {'busbw': out['busbw'], 'bytes': out['allreduce_bytes'], 'transport': out.get('transport'),
                'at': out['at']}
    return None


PROOF_TEXTFILE = 'gpuhost-gpu-proof.prom'


def proof_textfile(target, props, out) -> None:
    """The proof's result for node_exporter (TEXTFILE_DIR/gpuhost-gpu-proof.prom), written by the proof itself - a
    failed proof fails the run, so no later step would write it - for the GpuhostGpuProofFailed alert. A file that
    cannot be written is said, never the run's failure."""
    vmid = {'vmid': str(props['vmid'])}
    t = exposition.Text()
    t.family('gpuhost_gpu_proof_ok', 'Whether the last GPU proof before SGLang started passed (1) or failed (0) '
             '(gpuhost:sglang.proof, docs/gpu-proof.md).', [(vmid, 1 if out['ok'] else 0)])
    t.family('gpuhost_gpu_proof_timestamp_seconds', 'When the last GPU proof ran (Unix time).',
             [(vmid, int(time.time()))])
    t.family('gpuhost_gpu_proof_gpu_ok', 'Whether each GPU passed the last proof: seen by torch, its bf16 product '
             'right (1), or not (0).', [(dict(vmid, bus_id=g['bus_id']), 1 if g.get('ok') else 0)
                                        for g in out['per_gpu'] if g.get('bus_id')])
    if out.get('busbw') is not None and out.get('allreduce_bytes'):
        t.family('gpuhost_gpu_proof_allreduce_busbw_bytes_per_second', 'The last proof\'s all-reduce bus bandwidth '
                 'across the tensor-parallel group (nccl-tests\' busbw) at its largest size, and the transport NCCL '
                 'chose.', [(dict(vmid, transport=out.get('transport') or '', bytes=str(out['allreduce_bytes'])),
                             out['busbw'])])
    floor = (props.get('proof') or {}).get('min_busbw_gbps')
    if floor:
        t.family('gpuhost_gpu_proof_allreduce_busbw_floor_bytes_per_second', 'The floor for the proof\'s all-reduce '
                 'bus bandwidth (gpuhost:sglang.proof.min_busbw_gbps): below it the proof fails.',
                 [(vmid, floor * 1e9)])
    try:
        # A first deployment's proof runs before the host's metrics file made node_exporter's directory.
        remote.run(target, 'ensure_dir.sh', [exposition.TEXTFILE_DIR, '0755'])
        remote.put_file(target, posixpath.join(exposition.TEXTFILE_DIR, PROOF_TEXTFILE), t.text(), '0644', 'any')
    except remote.RemoteError as e:
        warn('sglang-unit: the GPU proof\'s result could not be written for node_exporter (%s): %s' % (
            PROOF_TEXTFILE, str(e).split(': ', 1)[-1]))


def proof_reason(olds, news) -> str | None:
    """Why the next restart proves the GPUs, for the preview (proof_due's cases as a person reads them)."""
    proof, last = news.get('proof'), olds.get('proven')
    if not proof:
        return None
    if (olds.get('runtime') or {}) != (news.get('runtime') or {}):
        return 'the NVIDIA user space or CUDA changes'
    if news.get('env') and (olds.get('env') or {}).get('id') != news['env']['id']:
        return 'the Python environment changes'
    if not last:
        return 'they were never proven'
    if last.get('gpus') != proof['gpus']:
        return 'the container\'s GPUs changed'
    if rebooted_since_proof(news, last, host_boot(olds, news)):
        return 'the host rebooted since they were proven (%s), and SGLang started at boot on them unproven - `up` ' \
               'stops it for the proof and starts it again' % last.get('at')
    return None


def prove(target, props, last=None, boot_id=None, stopped_at_boot=False) -> dict:
    """Stop the unit and run the GPU proof (hostscripts/gpu_proof.py) in the container with the service's
    Python and environment. Returns its result for the `proven` output (last: the proof before, for the first
    figure; boot_id: the host's boot now); raises ServiceError naming the GPU or the transport and the figure when it
    fails (the caller rolls back as for a failed start). stopped_at_boot: SGLang had started at boot on these GPUs
    and is stopped for the proof - a failure leaves it stopped."""
    proof = props['proof']
    with open(os.path.join(remote.SCRIPTS, 'gpu_proof.py'), 'rb') as f:
        body = f.read()
    args = [props['vmid'], props['unit_name'], proof['python'],
            '--gpus', ','.join(proof['gpus']), '--tp', str(proof['tp']), '--time-limit', str(proof['time_limit_s'])] + \
        (['--min-busbw', '%g' % proof['min_busbw_gbps']] if proof.get('min_busbw_gbps') else [])
    # The unit's environment on stdin, never on a command line (the host's process list shows the container's).
    env = b''.join(('%s=%s' % kv).encode() + b'\0' for kv in sorted(proof['environment'].items()))
    info('sglang-unit: proving the GPUs of container %s before SGLang starts (%s; at most %d s)' % (
        props['vmid'], ', '.join(proof['gpus']), proof['time_limit_s']))
    res = remote.run(target, 'ct_gpu_proof.sh', args, stdin=b'%d\n' % len(env) + env + body, check=False,
                     timeout=float(proof['time_limit_s']) + 60)
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        raise ServiceError('the GPU proof in container %s printed no result (exit %d): %s' % (
            props['vmid'], res.exit_code, (res.stderr.strip().splitlines() or ['no output'])[-1])) from None
    allreduce = doc.get('allreduce') or {}
    big = max(allreduce.get('sizes') or [{}], key=lambda s: s.get('bytes') or 0)
    out = {'ok': bool(doc.get('ok')) and res.exit_code == 0, 'at': utc_now(), 'message': doc.get('message'),
           'gpus': proof['gpus'], 'tp': proof['tp'],
           'per_gpu': [{'bus_id': g.get('bus_id'), 'ok': g.get('ok'), 'tflops': g.get('tflops'),
                        'memory_total': g.get('memory_total')} for g in doc.get('gpus') or []],
           'allreduce_bytes': big.get('bytes'), 'busbw': big.get('busbw'), 'transport': allreduce.get('transport'),
           'floor_gbps': proof.get('min_busbw_gbps'), 'versions': doc.get('versions'), 'boot_id': boot_id}
    out['first'] = first_figure(proof, last, out)
    proof_textfile(target, props, out)
    them = 'them' if len(proof['gpus']) > 1 else 'it'
    if not out['ok']:
        raise ServiceError('the GPU proof failed in container %s: %s. %s (run the proof by hand: docs/gpu-proof.md)' % (
            props['vmid'], doc.get('message') or 'exit %d' % res.exit_code,
            'SGLang, started at boot on %s, was stopped for the proof and stays stopped: fix the GPUs, then `up` '
            'proves them again and starts it (or start it by hand: pct exec %s -- systemctl start %s)' % (
                them, props['vmid'], props['unit_name']) if stopped_at_boot else
            'SGLang was not started on %s' % them))
    said = doc.get('message')
    first = out['first']
    if first and out.get('busbw') is not None:
        if first.get('at') == out['at']:
            said += '. The first figure for these GPUs: set gpuhost:sglang.proof.min_busbw_gbps below it to make a ' \
                    'slower all-reduce fail later proofs' if not proof.get('min_busbw_gbps') else ''
        else:
            said += '; the first proof\'s: %.3g GB/s (%s, %s)%s' % (
                first['busbw'] / 1e9, first.get('transport'), first.get('at'),
                '' if proof.get('min_busbw_gbps') else '; no floor set (gpuhost:sglang.proof.min_busbw_gbps)')
    info('sglang-unit: GPU proof passed: %s' % said)
    return out


# An installer of gpuhost:runtime (runtime.install_inputs): where it is on the host, its sha256, where the host fetches
# it from (None: uploaded by the operator).
INSTALLER = obj('Installer', installer=S, sha256=S, source=optional(S))


class SglangUnitProvider(ObservedProvider):
    """SGLang's systemd unit in the container, with what it stands on (NVIDIA user space, CUDA, its Python
    environment): written, restarted and checked (/health, /server_info), rolled back when the check fails."""

    # container_uid: which container (changes when it is replaced). A container started or rebooted by
    # this run is checked by the container step itself (/health, /server_info).
    # dropins: <unit>.d/*.conf files (systemctl edit) - they change the unit as systemd runs it: none.
    # runtime, env: what the service stands on when the stack declares it (gpuhost:runtime, resources/runtime.py):
    # the NVIDIA user space and CUDA versions in the container, and the Python environment (None: not managed).
    # model: the weights it serves ({id, revision}, gpuhost:model; None: not managed) - a new revision restarts it.
    DESIRED = ('unit', 'version', 'container_uid', 'active', 'enabled', 'unit_name', 'vmid', 'api_key', 'dropins',
               'runtime', 'env', 'model')
    # What the service is (service_props), what /server_info must report (expect), the unit's flags one element a
    # flag (launch_args: what a preview's diff shows), and what it stands on: the declared runtime and environment
    # (runtime.declared, runtime.environment), how to install them (install, not compared), the GPU proof, the model
    # and what is verified of it before a restart (model_check) - each None when the stack does not manage it.
    INPUTS = {'vmid': I, 'unit_name': S, 'unit_path': S, 'venv': S, 'version': S, 'endpoint': S, 'health_timeout': N,
              'expect': obj('ServingExpect', speculative_algorithm=optional(S), speculative_num_steps=optional(I),
                            speculative_eagle_topk=optional(I), speculative_num_draft_tokens=optional(I),
                            model_path=optional(S)),
              'api_key': secret(optional(S)), 'container_uid': S, 'unit': S, 'launch_args': arr(S), 'active': B,
              'enabled': B, 'dropins': arr(S), 'adopt': B, 'cuda_home': S,
              'runtime': optional(obj('Runtime', nvidia=optional(S), cuda=optional(S))),
              # venv_link, modified: what a read saw of the environment in the container (outputs only).
              'env': optional(obj('PythonEnv', id=S, path=S, python=S, lock_sha256=S, packages=mapof(S),
                                  patches=arr(obj('PatchRef', name=S, sha256=S)), sglang=S,
                                  venv_link=optional(S), modified=optional(S))),
              'proof': optional(obj('GpuProof', gpus=arr(S), tp=I, time_limit_s=N, min_busbw_gbps=optional(N),
                                    python=S, environment=mapof(S))),
              # host_boot_id: the host's boot as its status resource read it (a new one: the GPUs are proven again).
              'host_boot_id': optional(S),
              'install': optional(obj(
                  'Install', timeout=N, stall=N, nvidia=optional(INSTALLER), cuda=optional(INSTALLER),
                  python=optional(obj('InstallPython', lock_path=S, lock=S, patches=arr(obj('Patch', name=S, text=S)),
                                      keep=I, envs_dir=S, index=optional(obj('PackageIndex', url=S, username=S)),
                                      wheelhouse=optional(S))))),
              'model': optional(obj('ModelRef', id=S, revision=S)),
              'model_check': optional(obj('ModelCheck', id=S, revision=S, dir=S, storage=S, timeout_s=optional(N),
                                          stall_timeout_s=N, rehash_days=optional(N),
                                          checksums=optional(mapof(S)))),
              'index_password': secret(optional(S)),
              'installer_tokens': secret(optional(mapof(obj('InstallerLogin', token=S)))),
              'rollout': optional(ROLLOUT), 'fleet_host': optional(S),
              # The fleet's canary (gpuhost:rollout.canary; the first host's unit only): the judge's settings, this
              # host's fleet name and the baseline hosts' SGLang endpoints. Not compared by diff (not DESIRED).
              'canary': optional(obj('CanaryJudge', host=S, baseline=mapof(S), window_s=N, max_duration_s=N,
                                     min_samples=I, bands=arr(N), confidence=N, tolerance=N, traffic_tolerance=N,
                                     inconclusive=S, slo=mapof(N), prometheus=optional(S),
                                     restart=optional(obj('CanaryBaselineRestart', host=S, vmid=I, unit_name=S,
                                                          endpoint=S, health_timeout=N)))),
              # baseline: restart - the baseline host's connection (its own provider's), for that restart only.
              'baseline_connection': secret(optional(ANY))}
    # confirmed: sha256 of the unit last confirmed healthy (kept through refreshes, which may see no unit
    # at all in a stopped container): a restart is forced only when the unit differs from it. confirmed_unit:
    # its text, which a failed switch to a new environment puts back; confirmed_envs: the environments
    # confirmed so far, newest first (the ones pruning keeps).
    # observed_at: when `resolved` was read from SGLang (UTC, ISO 8601): at every apply, and at a refresh
    # that found it different (an unchanged value keeps its time, so a refresh alone is no change).
    # runtime_facts: driver versions (host module, container libraries), CUDA, the running environment.
    # pending_cleanup: previous revisions' directories whose removal failed after the new one served ([{storage,
    # dir, revision}]): retried by every `up` until they go; never a reason to fail a run that served.
    # proven: the last GPU proof's result (gpuhost:sglang.proof; None: never run) - per GPU, the all-reduce, when.
    # canary_verdict: the fleet canary's last judgement on this host (gpuhost:rollout.canary; the first host's unit only):
    # the record judge_canary keeps on the host (CANARY_RECORD) - state, line, rows, table, baseline, when.
    OUTPUTS = {'resolved': ANY, 'invocation_id': S, 'restarted': B, 'confirmed': S, 'observed_at': S,
               'runtime_facts': obj('RuntimeFacts', host_driver=optional(S), boot_id=optional(S),
                                    container_driver=optional(S), cuda=optional(S), sglang=optional(S), env=optional(S),
                                    lock_sha256=optional(S), venv_link=optional(S)),
               'confirmed_unit': S, 'confirmed_envs': arr(S),
               'pending_cleanup': arr(obj('RevisionDir', storage=S, dir=S, revision=S)), 'proven': ANY,
               'canary_verdict': ANY}
    ROLLOUT_STEP = 'its SGLang unit'   # a failed step names where a fleet's rollout stopped (state.rollout_note)

    def facts(self, target, props) -> dict:
        return runtime.parse_facts(remote.run(target, 'ct_unit_facts.sh', facts_args(props)).stdout)

    def observe(self, target, props, facts=None):
        facts = facts if facts is not None else self.facts(target, props)
        running = facts.get('ct') == 'running'
        unit = key = None
        if running:
            unit = facts.get('unit_text')
            if props.get('api_key'):
                # Read back (it stays a secret: same name as the secret input) so a changed key is drift.
                res = remote.run(target, 'ct_read_file.sh', [props['vmid'], env_path(props['unit_name'])], check=False)
                key = key_from_env(res.stdout) if res.exit_code == 0 else None
        rt = runtime.observed(props, facts)
        if props.get('env') is not None:
            # A managed environment: the version is the one of the environment the unit file runs from.
            version = (rt['runtime_facts'] or {}).get('sglang') or '-'
        else:
            version = facts.get('sglang')
        return dict({'unit': unit, 'version': version if running else None,
                     'active': facts.get('ActiveState') == 'active', 'enabled': facts.get('UnitFileState') == 'enabled',
                     'invocation_id': facts.get('InvocationID') or None, 'container_uid': props.get('container_uid'),
                     'api_key': key, 'sha256': facts.get('unit') if running and facts.get('unit') != '-' else None,
                     'dropins': facts.get('dropins', [])}, **rt)

    def apply(self, props, force_restart=False, previous=None, pending=None):
        """previous: the last confirmed unit ({unit, env_id, envs, expect, version}), put back when the unit
        fails its check after switching to a new environment."""
        target = remote.Target.from_inputs(props['connection'])
        facts = self.facts(target, props)
        before = self.observe(target, props, facts)
        if before['version'] is None:
            raise ServiceError('container %s is not running, so its SGLang unit cannot be written; start it (pct start %s) '
                               'or check the container step above' % (props['vmid'], props['vmid']))
        if props.get('model_check'):
            # Before anything changes: the weights the (re)started unit will load are all there and match
            # (resources/model.py; cached sums, so unchanged shards are not read again).
            model_mod.verify_for_unit(target, props['model_check'])
        installed = False
        # What this run installs under the service: the way back names it (roll_back).
        reinstalled = {'nvidia': None, 'cuda': None, 'was': {}}
        if props.get('runtime') is not None:
            # Before anything changes: the user space to install must be the module the host runs.
            runtime.check_host_driver(props, facts)
            reinstalled['was'] = {'nvidia': facts.get('container_driver'), 'cuda': facts.get('cuda')}
            runtime.fetch_installers(target, props, facts)
            installed = runtime.install_nvidia(target, props, facts)
            if installed:
                reinstalled['nvidia'] = props['runtime']['nvidia']
            reinstalled['cuda'] = runtime.cuda_to_install(props, facts)
            try:
                runtime.install_cuda(target, props, facts)
                if installed or reinstalled['cuda']:
                    runtime.verify_installed(target, props)
            except runtime.RuntimeStepError as e:
                # The running service stands on cuda_home: the toolkit it had goes back there.
                if reinstalled['cuda']:
                    raise runtime.RuntimeStepError('%s; %s.' % (str(e).rstrip('.'), runtime.toolkit_back(
                        target, props)[1])) from None
                raise
            installed = installed or bool(reinstalled['cuda'])
        if props.get('env') is not None:
            # Beside the running one; nothing the service uses changes until the unit is written below.
            # The environment rebuilt in place of one changed by hand: the same unit, one restart onto it.
            installed = runtime.build_env(target, props, facts, password=props.get('index_password')) == 'replaced' \
                or installed
        elif before['version'] == '-':
            raise ServiceError('container %s: no SGLang at %s (expected %s); install it in the container first '
                               '(python -m venv %s && %s/bin/pip install "sglang[all]==%s"), or let the program '
                               'build it: gpuhost:runtime.python '
                               '(docs/operator-guide.md, "The first `up` on a bare host")' % (
                                   props['vmid'], props['venv'], props['version'], props['venv'], props['venv'],
                                   props['version']))
        elif before['version'] != props['version']:
            raise ServiceError('container %s has SGLang %s but gpuhost:sglang.version declares %s; the unit\'s flags '
                               'are rendered for the declared version - install it or change the config' % (
                                   props['vmid'], before['version'], props['version']))
        key_changed = False
        if props.get('api_key'):
            # Mode 0600, root-only; the content travels on stdin and never reaches a message.
            key_changed = remote.ct_put_file(target, props['vmid'], env_path(props['unit_name']),
                                             env_content(props['api_key']), mode='0600')
        if before['dropins']:
            moved = remote.run(target, 'ct_remove_dropins.sh', [props['vmid'], props['unit_name']]).stdout.split('\n')
            moved = [m.split('\t') for m in moved if '\t' in m]
            warn('sglang-unit: removed drop-in%s of %s set outside Pulumi (they changed how the service runs): %s; '
                 'copies kept in the container' % ('s' if len(moved) > 1 else '', props['unit_name'],
                                                   ', '.join('%s -> %s' % (a, b) for a, b in moved)))
            key_changed = True   # the unit systemd runs changes: restart
        changed = remote.ct_put_file(target, props['vmid'], props['unit_path'], props['unit'],
                                     expected=before['sha256'] or '-') or key_changed
        # New NVIDIA libraries or CUDA are loaded only by a new process: one restart for all of it.
        restart = 'yes' if changed or force_restart or installed else 'no'
        switching = bool(props.get('env') and previous and previous.get('unit') and
                         previous.get('env_id') != props['env']['id'])
        # New ground for the GPUs' proof: another NVIDIA user space, CUDA or Python environment under the service.
        new_ground = installed or switching
        # A new model revision: the unit names the new revision's directory (config/model.py); the previous
        # revision's directory stays on the host until the new one has served, so it can be put back.
        old_model = model_switch(props, previous)
        # Any restart this run makes from a unit that served before - another environment, another revision, or
        # only other flags (a speculative setting SGLang rejects at start-up) - has a way back: the unit confirmed
        # last, restarted and checked.
        # A reinstalled NVIDIA user space or CUDA toolkit under the same unit too: the toolkit is put back.
        switching = switching or bool(old_model) or bool(
            restart == 'yes' and previous and previous.get('unit') and
            (previous['unit'] != props['unit'] or installed))
        # With the proof off, no result stands for these GPUs (switched on again, the next start proves them).
        proven = previous_proof = (previous or {}).get('proven') if props.get('proof') else None
        # The canary's last judgement (the host's record: a failed one ends this apply, a refresh reads it).
        verdict = (previous or {}).get('canary_verdict') if props.get('canary') else None
        baseline = None
        # SGLang started at boot on GPUs nobody proved since: the window is made here - stopped, proven, started.
        rebooted = rebooted_since_proof(props, previous_proof, facts.get('boot_id'))
        stopped_at_boot = rebooted and restart == 'no' and before['active']
        if rebooted:
            restart = 'yes'
        try:
            if restart == 'yes' and (rebooted or proof_due(props, previous_proof, new_ground)):
                proven = prove(target, props, previous_proof, facts.get('boot_id'), stopped_at_boot)
            if props.get('canary') and switching and (props['canary'].get('restart') and restart == 'yes'):
                baseline = BaselineRestart(props)    # at the canary's moment, on its own connection
            remote.run(target, 'ct_unit.sh', [props['vmid'], props['unit_name'], restart])
            info = verify_serving(target, props, lambda: self.observe(target, props)['active'])
            if baseline is not None:
                baseline.wait()
            if props.get('canary') and switching:
                # Serving again on something new: the canary is judged against the baseline under their traffic
                # before any other host takes the change (provider/rollout.py holds them); a fail goes back below.
                verdict = judge_canary(target, props)
        except (ServiceError, remote.RemoteError) as e:
            if switching:
                self.roll_back(target, props, previous, e, reinstalled)
            raise
        if reinstalled['cuda']:
            runtime.previous_toolkit(target, props, 'drop')
        confirmed_envs = None
        if props.get('env') is not None:
            confirmed_envs = runtime.confirmed_history(props['env']['id'], (previous or {}).get('envs'),
                                                       props['install']['python']['keep'])
            runtime.finish(target, props, confirmed_envs)
        # The new revision served (/health, /server_info): the previous one's directory goes - and any an earlier
        # run could not remove. A removal that fails is said and kept for the next `up`, never failing this one.
        pending_cleanup = self.clean_up(target, props, (pending or []) + ([old_model] if old_model else []))
        after = self.observe(target, props)
        after.pop('sha256', None)
        return dict(props, **after, resolved=info, restarted=restart == 'yes' or before['active'] is False, proven=proven,
                    confirmed=remote.sha256_hex(props['unit']), confirmed_unit=props['unit'],
                    confirmed_envs=confirmed_envs, observed_at=utc_now(), pending_cleanup=pending_cleanup or None,
                    canary_verdict=verdict)

    def clean_up(self, target, props, dirs) -> list:
        """Remove previous revisions' directories, each below its own storage; returns those that stay."""
        current = (props.get('model_check') or {}).get('dir')
        left, seen = [], set()
        for old in dirs:
            if not old or old['dir'] == current or old['dir'] in seen:
                continue
            seen.add(old['dir'])
            storage = old.get('storage') or (props.get('model_check') or {}).get('storage')
            try:
                res = remote.run(target, 'model_remove.sh', [storage, old['dir'], model_mod.cache_path(old['dir'])])
            except remote.RemoteError as e:
                left.append(dict(old, storage=storage))
                warn('sglang-unit: %s serves revision %s, but removing the previous revision %s (%s) failed: %s. The '
                     'service is fine; the next `up` tries again (or remove the directory by hand)' % (
                         props['unit_name'], (props.get('model') or {}).get('revision'), old.get('revision'),
                         old['dir'], str(e).split(': ', 1)[-1]))
                continue
            if res.stdout.startswith('removed'):
                note('sglang-unit: %s serves revision %s; the previous revision %s was removed from the host (%s)' % (
                    props['unit_name'], (props.get('model') or {}).get('revision'), old.get('revision'), old['dir']))
        return left

    def roll_back(self, target, props, previous, error, reinstalled=None):
        """The unit failed its check after a restart onto something new - another environment, model revision,
        settings, or a reinstalled CUDA toolkit or NVIDIA user space: the toolkit the service had is put back
        (the one kept beside cuda_home), the previous confirmed unit is written back and restarted (its
        environment is still there: pruning runs only after a success), checked, and the run fails saying both.
        The NVIDIA user space is not put back: it follows the host's kernel module, and the one before would not
        talk to it. Raises."""
        reinstalled = reinstalled or {}
        was = reinstalled.get('was') or {}
        old_model = model_switch(props, previous)
        if props.get('env') is not None:
            envs_dir = props['install']['python']['envs_dir']
            old_id = runtime.env_of_unit(previous['unit'], envs_dir)
            old_env = posixpath.join(envs_dir, old_id) if old_id else props['venv']
        else:
            old_env = props['venv']
        new, fixes = [], []
        env_switch = props.get('env') is not None and previous.get('env_id') != props['env']['id']
        if env_switch:
            new.append('the new environment %s (SGLang %s)' % (props['env']['path'], props['env']['sglang']))
            fixes.append('the lock, the patches or gpuhost:sglang.version')
        if old_model:
            new.append('the new model revision %s (%s)' % (props['model']['revision'], props['model_check']['dir']))
            fixes.append('gpuhost:model.revision or the weights at its source')
        if reinstalled.get('cuda'):
            new.append('CUDA %s (%s)' % (reinstalled['cuda'], props['cuda_home']))
            fixes.append('gpuhost:runtime.cuda (a toolkit of the CUDA the environment\'s torch was built for)')
        if reinstalled.get('nvidia'):
            new.append('the NVIDIA user space %s' % reinstalled['nvidia'])
            fixes.append('the NVIDIA user space (gpuhost:runtime.nvidia, the host\'s driver)')
        if previous['unit'] != props['unit'] and not (env_switch or old_model):
            lines = [l for l in changed_lines(previous['unit'], props['unit'], limit=4) if l.startswith('+')]
            new.append('its new settings (%s)' % '; '.join(l[1:].strip() for l in lines) if lines else
                       'its new unit file')
            fixes.append('the settings SGLang refused')
        if not new:
            new.append('its unit file')
            fixes.append('what SGLang refused')
        # What failed and why first; what was new (a changed command line runs to hundreds of characters) last.
        what = '%s failed its check after its restart: %s' % (props['unit_name'], error)
        onto = ' It had restarted with %s.' % ' and '.join(new)
        back = 'environment %s' % old_env + (', model revision %s (%s)' % (old_model['revision'], old_model['dir'])
                                              if old_model else '')
        stays = []
        if reinstalled.get('cuda'):
            version, said = runtime.toolkit_back(target, props)
            if version:
                back += ', CUDA %s (%s)' % (version, props['cuda_home'])
            else:
                stays.append(said)
        if reinstalled.get('nvidia'):
            stays.append('the NVIDIA user space stays at %s: it must be the host\'s kernel module\'s version (%s, the '
                         'one before, would not talk to it)' % (reinstalled['nvidia'], was.get('nvidia') or 'none'))
        kept = ' and '.join((['the new environment'] if env_switch else []) +
                            (['the new revision\'s weights (the previous revision\'s too)'] if old_model else []))
        try:
            remote.ct_put_file(target, props['vmid'], props['unit_path'], previous['unit'],
                               expected=remote.sha256_hex(props['unit']))
            remote.run(target, 'ct_unit.sh', [props['vmid'], props['unit_name'], 'yes'])
            old = dict(props, expect=previous.get('expect'), version=previous.get('version') or '?')
            verify_serving(target, old, lambda: self.observe(target, props)['active'])
        except operator.Interrupted:
            # Ctrl-C while the previous unit loads again: it was put back and restarted; what failed still says why.
            raise ServiceError('%s. The previous unit was put back (%s%s) and restarted; the run was interrupted '
                               '(Ctrl-C) before it answered - the next `pulumi up` checks it.%s' % (
                                   what, back, ''.join('; ' + s for s in stays), onto)) from None
        except (ServiceError, remote.RemoteError) as e:
            raise ServiceError('%s. Putting the previous unit back (%s%s) failed too: %s. Check the service in '
                               'container %s (journalctl -u %s) and re-run.%s' % (
                                   what, back, ''.join('; ' + s for s in stays), e, props['vmid'],
                                   props['unit_name'], onto)) from None
        raise ServiceError('%s. Rolled back: container %s runs the previous unit again - %s, SGLang %s - and it '
                           'serves (/health and /server_info checked)%s. This run failed; %sfix what failed - %s - '
                           '(SGLang\'s log: journalctl -u %s in the container) and re-run.%s' % (
                               what, props['vmid'], back, previous.get('version') or '?',
                               ''.join('; ' + s for s in stays),
                               '%s stay%s on disk until the next successful `up`. ' % (
                                   kept, '' if ' and ' in kept else 's') if kept else '',
                               ' or '.join(fixes), props['unit_name'], onto)) from None

    def diff(self, id_, olds, news):
        result = super().diff(id_, olds, news)
        if not result.changes and olds.get('pending_cleanup'):
            info('sglang-unit: %s of an earlier revision could not be removed after the new one served; `up` tries '
                 'again (no restart)' % ', '.join(d['dir'] for d in olds['pending_cleanup']))
            result = DiffResult(changes=True, replaces=[], delete_before_replace=None)
        if not result.changes and rebooted_since_proof(news, olds.get('proven'), host_boot(olds, news)):
            result = DiffResult(changes=True, replaces=[], delete_before_replace=None)   # proof_reason says why
        confirmed = olds.get('confirmed')
        if not result.changes and confirmed and isinstance(news.get('unit'), str) and \
                confirmed != remote.sha256_hex(news['unit']):
            # The container has the declared unit file, but no run saw it serve: a run that wrote it ended
            # before its restart and check (killed, then refreshed). The running process may still be the old
            # unit's: update() restarts it once and checks it.
            info('sglang-unit: the unit file in the container was written by a run that did not finish (never seen '
                 'serving): `up` restarts it once and checks it')
            result = DiffResult(changes=True, replaces=[], delete_before_replace=None)
        # What a person reads in the preview besides the inputs' diff: the environment change in words.
        if news.get('env') and isinstance(olds.get('env'), dict) and olds['env'].get('modified') and \
                olds['env'].get('id') == news['env']['id']:
            info('sglang-unit: the environment %s was changed in place since it was built: %s. `up` builds it again '
                 'beside it, swaps it in and restarts SGLang once' % (news['env']['path'], olds['env']['modified']))
        elif news.get('env') and isinstance(olds.get('env'), dict) and olds['env'].get('venv_link') and \
                dict(olds['env'], venv_link=None) == dict(news['env'], venv_link=None):
            info('sglang-unit: %s points at %s, not at the environment the unit runs from (%s): `up` links it again '
                 '(no restart)' % (news.get('venv'), olds['env']['venv_link'], news['env']['path']))
        elif news.get('env') and olds.get('env') != news.get('env'):
            info('sglang-unit: the Python environment changes: %s. It is built beside the running one as %s, then the '
                 'unit switches to it (one restart; the previous one is put back if SGLang fails its check)' % (
                     runtime.describe_change(olds.get('env'), news['env']), news['env']['path']))
        if news.get('model') and olds.get('model') and olds['model'] != news['model']:
            info('sglang-unit: the model revision changes: %s@%s -> %s@%s. Its weights are downloaded and verified beside '
                 'the serving ones (%s), then the unit switches to them (one restart; the previous revision is put back '
                 'if SGLang fails its check, and its directory is removed once the new one serves)' % (
                     olds['model'].get('id'), olds['model'].get('revision'), news['model']['id'],
                     news['model']['revision'], (news.get('model_check') or {}).get('dir')))
        old_rt, new_rt = olds.get('runtime') or {}, news.get('runtime') or {}
        for key, name in (('nvidia', 'NVIDIA user space'), ('cuda', 'CUDA toolkit')):
            if new_rt.get(key) and old_rt.get(key) != new_rt.get(key):
                info('sglang-unit: the container\'s %s: %s -> %s (%s, then one restart)' % (
                    name, old_rt.get(key) or 'none', new_rt[key], runtime.installed_from(news['install'][key])))
        c = news.get('canary')
        if result.changes and isinstance(c, dict) and isinstance(news.get('unit'), str) and olds.get('confirmed') and \
                olds['confirmed'] != remote.sha256_hex(news['unit']):
            info('sglang-unit: %s is the canary: `up` restarts it first, onto the new setting, and it is %s, before any '
                 'other host takes the change; a fail (or too little traffic, with inconclusive: %s) puts its previous '
                 'unit back and stops the rollout' % (c['host'], canary_words(c), c.get('inconclusive')))
        if result.changes:
            why = proof_reason(olds, news)
            if why:
                info('sglang-unit: `up` proves the GPUs (%s) before SGLang starts: %s; a failure stops that start '
                     '(gpuhost:sglang.proof)' % (', '.join(news['proof']['gpus']), why))
        return result

    def check(self, olds, news):
        """With the container adopted (gpuhost:container.adopt), at preview and up while the stack does not
        hold the unit yet: the unit already in the container is read and what `up` does to it said - the
        lines of the unit that change, the drop-ins it removes, and whether it restarts (once at most: the
        create below is the usual apply, which reads the unit and its drop-ins first)."""
        if olds:
            return CheckResult(dict(news, adopt=False), [])   # held by the stack: never adopted again
        first = runtime.first_install(news)
        if first:
            info('sglang-unit: %s' % first)
        if news.get('proof'):
            info('sglang-unit: the first `up` proves the GPUs (%s) before SGLang\'s first start (gpuhost:sglang.proof)'
                 % ', '.join(news['proof']['gpus']))
        if news.get('adopt') and isinstance(news.get('connection'), dict) and isinstance(news.get('unit'), str):
            info('sglang-unit: %s' % self.adoption(remote.Target.from_inputs(news['connection']), news))
        return CheckResult(news, [])

    def adoption(self, target, props) -> str:
        facts = self.facts(target, props)
        where = '%s in container %s' % (props['unit_name'], props['vmid'])
        if facts.get('ct') != 'running':
            return '%s: the container is %s; the unit is written once it runs' % (where, facts.get('ct'))
        have = facts.get('unit_text')
        if have is None:
            return '%s: no unit there yet - `up` writes it and starts it' % where
        lines = changed_lines(have, props['unit'])
        dropins = facts.get('dropins') or []
        if not lines and not dropins:
            state = facts.get('ActiveState')
            return '%s exists and is the declared unit: adopted as it is, not restarted%s' % (
                where, '' if state == 'active' else ' (started: it is %s)' % state)
        todo = (['rewrites the unit file'] if lines else []) + (
            ['removes the drop-in%s %s (copies kept in the container)' % (
                '' if len(dropins) == 1 else 's', ', '.join(dropins))] if dropins else [])
        shown = '. The unit\'s lines that change:\n    %s' % '\n    '.join(lines) if lines else ''
        return '%s exists - adopted; `up` %s, then restarts it once%s' % (where, ' and '.join(todo), shown)

    def create(self, props):
        return CreateResult('%s/%s' % (props['vmid'], props['unit_name']), self.apply(props))

    def update(self, _id, olds, news):
        if olds.get('unit_name') != news['unit_name'] and olds.get('vmid') == news['vmid'] and olds.get('unit_name'):
            # A renamed unit: the old one is stopped and removed first (it holds the port). An update,
            # not a replacement, so the resource stays protected with its container.
            target = remote.Target.from_inputs(news['connection'])
            remote.run(target, 'ct_stop_unit.sh', [news['vmid'], olds['unit_name'],
                                                   '/etc/systemd/system/%s' % olds['unit_name']])
        # Restart when the unit differs from the last one confirmed healthy - also when an earlier
        # apply already wrote it but failed before confirming (the file is then "unchanged") - and
        # when the container was replaced (new uid): it starts from nothing.
        confirmed = olds.get('confirmed') or (remote.sha256_hex(olds['unit']) if olds.get('unit') else None)
        force = confirmed != remote.sha256_hex(news['unit']) or olds.get('container_uid') != news.get('container_uid') \
            or (news.get('model') is not None and olds.get('model') != news.get('model'))
        previous = None
        if olds.get('confirmed_unit') and olds.get('vmid') == news['vmid'] and \
                olds.get('container_uid') == news.get('container_uid'):
            previous = {'unit': olds['confirmed_unit'], 'envs': olds.get('confirmed_envs'),
                        'env_id': (olds.get('confirmed_envs') or [None])[0], 'expect': olds.get('expect'),
                        'version': olds.get('version'), 'model': olds.get('model'),
                        'model_dir': (olds.get('model_check') or {}).get('dir'),
                        'model_storage': (olds.get('model_check') or {}).get('storage'),
                        'proven': olds.get('proven'), 'canary_verdict': olds.get('canary_verdict')}
        if olds.get('canary') and not news.get('canary'):
            forget_canary(remote.Target.from_inputs(news['connection']),
                          'host %s is no longer the fleet\'s canary' % olds['canary']['host'])
        return UpdateResult(self.apply(news, force_restart=force, previous=previous,
                                       pending=olds.get('pending_cleanup')))

    def read(self, id_, props):
        target = remote.Target.from_inputs(props['connection'])
        facts = self.facts(target, props)
        outs = dict(props, **self.observe(target, props, facts))
        outs.pop('sha256', None)
        # A host driver upgraded under the running container: nothing to repair here, everything to say.
        danger = runtime.driver_danger(props, facts, 'sglang-unit')
        if danger:
            warn(danger)
        try:
            outs['resolved'] = resolved(server_info(props['endpoint'], props.get('api_key')))
        except (OSError, ValueError, ServiceError):
            outs['resolved'] = None
        if outs['resolved'] != props.get('resolved') or not props.get('observed_at'):
            outs['observed_at'] = utc_now()
        if props.get('canary'):
            # The last judgement as the host holds it: also one that failed (its `up` failed, so kept no output).
            outs['canary_verdict'] = read_canary(target) or props.get('canary_verdict')
        return self.read_result(id_, outs)

    def delete(self, _id, props):
        target = remote.Target.from_inputs(props['connection'])
        if props.get('install'):
            runtime.stop_jobs(target, props)
        remote.run(target, 'ct_stop_unit.sh', [props['vmid'], props['unit_name'], props['unit_path']])
        if props.get('proof') or props.get('proven'):
            # The proof's result goes with the unit it was for: no alert for a service that is not there.
            try:
                remote.run(target, 'remove_file.sh', [posixpath.join(exposition.TEXTFILE_DIR, PROOF_TEXTFILE)])
            except remote.RemoteError as e:
                warn('sglang-unit: %s was removed, but its GPU proof\'s metrics file could not be: %s (remove %s by '
                     'hand)' % (props['unit_name'], str(e).split(': ', 1)[-1], PROOF_TEXTFILE))
        if props.get('canary'):
            forget_canary(target, '%s was removed' % props['unit_name'])


def model_switch(props, previous):
    """The previous revision ({revision, dir}) when this apply switches the unit to another model revision, else
    None."""
    model, old = props.get('model'), (previous or {}).get('model')
    if not (model and old and previous.get('unit') and previous.get('model_dir')) or old == model:
        return None
    if previous['model_dir'] == (props.get('model_check') or {}).get('dir'):
        return None
    return {'revision': old.get('revision'), 'dir': previous['model_dir'], 'storage': previous.get('model_storage')}


class SglangUnit(GpuhostResource, name='SglangUnit'):
    """The unit inside the container (SglangUnitProvider)."""
