"""A fleet in one stack (gpuhost:hosts) against simulated hosts, each with its own fakepve and sshd:
deployed from empty, a no-op re-run, a host added and one removed without touching the others, a
rolling MTP change stopped by a failure on the second host, refusals that name their host, and last the host's NVIDIA
driver upgraded one host at a time (issue 59), then stopped at a host whose new version fails.

The tests run in order and share the fleet (each starts from the state the previous one left)."""

import os
import shutil

import pytest

from tests.lablib import (PER_HOST_FILES, PER_HOST_RELEASE, REPO, FleetLab, claim_net, keep_logs, max_overlap,
                          previous_release)

STACK = 'fleet'
# Four simulated hosts: the first test's setup starts four labs (a fifth joins for the third shard stack), and the
# rolling changes wait for each host's SGLang in turn.
pytestmark = pytest.mark.timeout(600)
UNIT = 'sglang-qwen.service'


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, request):
    if os.geteuid() != 0:
        pytest.fail('the integration tests need root (mount namespaces for the simulated hosts)')
    base = str(tmp_path_factory.mktemp('fleet'))
    claims = [claim_net() for _ in range(5)]
    f = FleetLab(base, [net for net, _ in claims])
    failed = request.session.testsfailed
    try:
        for i in range(1, 5):
            f.add(i)     # gpu05 is added by the sharding test, for a third shard
        yield f
    finally:
        if request.session.testsfailed > failed:
            keep_logs(base, 'test_fleet')
        f.down()
        for _, lock in claims:
            lock.close()
        shutil.rmtree(base, ignore_errors=True)


def unit_text(lab):
    path = os.path.join(lab.ct_root(200), 'etc', 'systemd', 'system', UNIT)
    with open(path) as f:
        return f.read()


def snapshot(lab, beside_upgrade=False):
    """What an operator would call 'touched': the host's files and bindings, the container's unit and
    how often SGLang was started (beside_upgrade: but what an earlier release's `up` rewrites by design, the
    collector's files, lablib.UPGRADE_REWRITES)."""
    try:
        unit = unit_text(lab)
    except FileNotFoundError:
        unit = None
    return lab.host_digest_beside_upgrade() if beside_upgrade else lab.host_digest(), unit, lab.unit_starts()


def steps(preview):
    """{urn: op} of the steps a `preview --json` plans, without the stack and the unchanged."""
    return {s['urn']: s['op'] for s in preview.get('steps', []) if s['op'] != 'same'
            and not s['urn'].endswith('pulumi:pulumi:Stack::gpuhost-' + STACK)}


def up_new_guests(fleet, stack):
    """`up` of a stack that creates containers: each new container is bare, so the program stops at its
    SGLang unit and the operator's step installs SGLang there (FleetLab.pulumi, as Lab.pulumi) - one host
    after another, as the rollout reaches them."""
    fleet.pulumi('up', '--yes', '--skip-preview', stack=stack)


def test_three_hosts_deploy_from_empty_each_with_its_own_resources(fleet):
    """Deployed by the previous release (dynamic providers only), then moved onto the gpuhost plugin (issue 28's
    upgrade test for a fleet stack): one provider instance created per host, nothing else changed or restarted (the
    smoke tests run again)."""
    cfg = fleet.stack_config(['gpu01', 'gpu02', 'gpu03'])
    fleet.write_stack(STACK, cfg)
    with previous_release(fleet):
        plan = steps(fleet.preview_json(STACK))
        hosts = {urn.split('::')[-1].split('-')[0] for urn in plan}
        assert hosts == {'gpu01', 'gpu02', 'gpu03'}, sorted(plan)
        assert not any('gpu03-vm' in urn for urn in plan)          # the host without a VM
        up_new_guests(fleet, STACK)
    before = {n: fleet.labs[n].host_digest_beside_upgrade() for n in ('gpu01', 'gpu02', 'gpu03')}
    plan = steps(fleet.preview_json(STACK))
    # (Each smoke test reaches its host through an SSH agent now - the lab keeps its keys in files: a new
    # connection, so it runs again; each collector's script and config are this release's: lablib.UPGRADE_REWRITES.)
    providers = {u: op for u, op in plan.items() if '::pulumi:providers:gpuhost::' in u}
    assert sorted(providers.values()) == ['create'] * 3, plan
    assert sorted((u.rsplit('::', 1)[-1], op) for u, op in plan.items() if u not in providers) == sorted(
        [('%s-sglang-smoke-test' % n, 'update') for n in ('gpu01', 'gpu02', 'gpu03')] +
        [('%s-collector' % n, 'update') for n in ('gpu01', 'gpu02', 'gpu03')]), plan
    fleet.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert {n: fleet.labs[n].host_digest_beside_upgrade() for n in before} == before, 'the upgrade changed a host'
    state = fleet.pulumi('stack', 'export', stack=STACK).stdout
    assert 'pulumi-python:dynamic' not in state
    out = fleet.outputs(STACK)
    assert sorted(out['hosts']) == ['gpu01', 'gpu02', 'gpu03']
    for name in ('gpu01', 'gpu02', 'gpu03'):
        lab, h = fleet.labs[name], out['hosts'][name]
        assert lab.unit_starts() == 1, name
        assert h['sglang_unit']['active'] is True and h['speculation']['resolved']['speculative_num_steps'] == 1
        assert h['container']['address'] == lab.spec['addresses']['container']
        assert h['smoke_test']['completion_tokens'] > 0
        # Its own collector (run once by the up that installed it): this host's GPUs, live, as declared for it.
        live = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost-collector.prom')
        assert live.exit_code == 0, (name, live.stderr)
        assert live.stdout.count('gpuhost_gpu_info{') == len(h['gpu_assignment']), name
        assert ('assigned_to="host"' in live.stdout) == (name == 'gpu03'), name
    # GRUB host: the IOMMU arguments went into /etc/default/grub, not /etc/kernel/cmdline.
    grub = fleet.labs['gpu02'].host.path('etc', 'default', 'grub')
    with open(grub) as f:
        assert 'iommu.passthrough=0' in f.read()
    assert out['hosts']['gpu02']['iommu']['boot'] == 'grub'
    # gpu03 has no VM: its NUMA1 GPUs stay on the host's nvidia driver.
    sides = {g['assigned_to'] for b, g in out['hosts']['gpu03']['gpu_assignment'].items() if b.startswith('0000:8')}
    assert sides == {'host'} and 'vm' not in out['hosts']['gpu03']
    # One file_sd for the fleet: SGLang and node_exporter of every host, labelled with the host.
    sd = out['prometheus_file_sd']
    assert sorted((g['labels']['host'], g['labels']['id']) for g in sd) == sorted(
        (n, i) for n in ('gpu01', 'gpu02', 'gpu03') for i in ('lxc/200', 'node/pve-%s' % n))
    assert out['rollout'] == {'order': ['gpu01', 'gpu02', 'gpu03'], 'max_unavailable': 1}


def test_no_op_rerun_changes_nothing_on_any_host(fleet):
    """Also issue 46's upgrade test for a fleet stack: an `up` of main before issues 45 and 46 (a plugin process per
    host and pass, the rollout order as dependency edges), then this release plans nothing and changes nothing."""
    before = {n: snapshot(fleet.labs[n], beside_upgrade=True) for n in ('gpu01', 'gpu02', 'gpu03')}
    with previous_release(fleet, PER_HOST_RELEASE, PER_HOST_FILES):
        fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert {n: snapshot(fleet.labs[n], beside_upgrade=True) for n in before} == before
    # That release wrote its own collector back; this one plans that alone, once (lablib.UPGRADE_REWRITES).
    assert sorted(u.rsplit('::', 1)[-1] for u, op in steps(fleet.preview_json(STACK)).items()) == [
        'gpu01-collector', 'gpu02-collector', 'gpu03-collector']
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    fleet.pulumi('preview', '--expect-no-changes', stack=STACK)
    fleet.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    assert {n: snapshot(fleet.labs[n], beside_upgrade=True) for n in before} == before


def test_added_host_touches_no_other_host(fleet):
    before = {n: snapshot(fleet.labs[n]) for n in ('gpu01', 'gpu02', 'gpu03')}
    untouched4 = fleet.labs['gpu04'].host_digest()
    fleet.write_stack(STACK, fleet.stack_config(['gpu01', 'gpu02', 'gpu03', 'gpu04']))
    plan = steps(fleet.preview_json(STACK))
    assert plan and all('::gpu04-' in urn and op == 'create' for urn, op in plan.items()), plan
    up_new_guests(fleet, STACK)
    assert {n: snapshot(fleet.labs[n]) for n in before} == before
    assert fleet.labs['gpu04'].host_digest() != untouched4
    assert fleet.labs['gpu04'].unit_starts() == 1
    out = fleet.outputs(STACK)
    # The other inventory: its own PCI addresses, NUMA1 ones on vfio-pci for its VM.
    gpus = out['hosts']['gpu04']['gpu_assignment']
    assert gpus['0000:9a:00.0']['assigned_to'] == 'vm' and gpus['0000:17:00.0']['assigned_to'] == 'container'


def test_removed_host_needs_its_guests_unprotected_and_touches_no_other_host(fleet):
    keep = ('gpu01', 'gpu03', 'gpu04')
    before = {n: snapshot(fleet.labs[n]) for n in keep}
    # A host dropped from the list with its guests protected (the default): refused, nothing deleted.
    fleet.write_stack(STACK, fleet.stack_config(list(keep)))
    res = fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    assert res.returncode != 0 and 'protect' in (res.stdout + res.stderr)
    assert fleet.labs['gpu02'].unit_starts() == 1 and os.path.isdir(fleet.labs['gpu02'].ct_root(200))
    # The operator's way: protect: false on that host first, then remove it.
    entries = [fleet.entry(n) for n in ('gpu01', 'gpu02', 'gpu03', 'gpu04')]
    entries[1]['container']['protect'] = False
    entries[1]['vm'] = {'protect': False}
    fleet.write_stack(STACK, fleet.stack_config(entries=entries))
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    fleet.write_stack(STACK, fleet.stack_config(list(keep)))
    plan = steps(fleet.preview_json(STACK))
    assert plan and all('::gpu02-' in urn and op == 'delete' for urn, op in plan.items()), plan
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert {n: snapshot(fleet.labs[n]) for n in keep} == before
    assert sorted(fleet.outputs(STACK)['hosts']) == list(keep)


def test_rolling_mtp_change_stops_at_the_failing_second_host(fleet):
    order = ['gpu01', 'gpu03', 'gpu04']
    old = {n: unit_text(fleet.labs[n]) for n in order}
    starts = {n: fleet.labs[n].unit_starts() for n in order}
    cfg = fleet.stack_config(order)
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                            'num_draft_tokens': 3}
    fleet.write_stack(STACK, cfg)
    fleet.labs['gpu03'].fail_systemctl('restart')
    try:
        res = fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        fleet.labs['gpu03'].clear_faults()
    text = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'rollout stopped at host gpu03 (its SGLang unit): hosts done before it in its lane: gpu01; not ' \
           'started, still on their old setting: gpu04' in text, text[-3000:]
    # The first host is updated and serving with two steps; the third was never touched.
    assert '--speculative-num-steps 2' in unit_text(fleet.labs['gpu01'])
    assert fleet.labs['gpu01'].unit_starts() == starts['gpu01'] + 1
    assert unit_text(fleet.labs['gpu04']) == old['gpu04'] and fleet.labs['gpu04'].unit_starts() == starts['gpu04']
    # Never more than max_unavailable (1) hosts down at once.
    assert max_overlap([iv for n in order for iv in fleet.labs[n].down_intervals()
                        if iv[1] != float('inf')]) <= 1
    # Fixed: the re-run goes on from the failed host and converges.
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    for n in order:
        assert '--speculative-num-steps 2' in unit_text(fleet.labs[n]), n
    out = fleet.outputs(STACK)
    assert {n: h['speculation']['resolved']['speculative_num_steps'] for n, h in out['hosts'].items()} == \
        dict.fromkeys(order, 2)
    intervals = [iv for n in order for iv in fleet.labs[n].down_intervals()]
    assert max_overlap(intervals) <= 1, intervals
    fleet.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_reboots_needed_by_a_host_change_roll_one_host_at_a_time(fleet):
    """host.reboot: when-required and an IOMMU change every host needs a reboot for: the hosts reboot one
    after another, each only once the one before serves again (/health, /server_info)."""
    import copy
    order = ['gpu01', 'gpu03', 'gpu04']
    cfg = copy.deepcopy(current(fleet))
    cfg['gpuhost:host']['reboot'] = 'when-required'
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    fleet.write_stack(STACK, cfg)
    reboots = {n: len(fleet.labs[n].reboots()) for n in order}
    start = __import__('time').time()
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    windows = []
    for n in order:
        lab = fleet.labs[n]
        done = lab.reboots()[reboots[n]:]
        assert len(done) == 1, (n, done)
        starts = lab.unit_start_times(UNIT)
        # Down from the reboot until SGLang started again in the container and loaded (1 s in the lab).
        back = min(t for t in starts if t >= done[0]['down']) + 1.0
        windows.append((done[0]['down'], back))
    assert all(a >= start for a, _ in windows)
    assert max_overlap(windows) == 1, windows
    out = fleet.outputs(STACK)
    assert out['reboot_required'] == []
    assert all(h['sglang_unit']['active'] for h in out['hosts'].values())
    fleet.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def current(fleet):
    import yaml
    with open(os.path.join(fleet.project, 'Pulumi.%s.yaml' % STACK)) as f:
        return yaml.safe_load(f)['config']


def test_refusals_name_the_host_and_change_nothing(fleet):
    import copy
    order = ['gpu01', 'gpu03', 'gpu04']
    before = {n: snapshot(fleet.labs[n]) for n in order}
    good = current(fleet)
    # At preview: a bad value on one host.
    cfg = copy.deepcopy(good)
    cfg['gpuhost:hosts'][2]['sglang'] = {'extra_args': ['--tp-size', '2']}
    fleet.write_stack(STACK, cfg)
    res = fleet.pulumi('preview', stack=STACK, check=False)
    assert res.returncode != 0
    assert 'host gpu04 (gpuhost:hosts[2] merged over the shared gpuhost:* settings)' in res.stdout + res.stderr
    # At up, from the host itself: gpu03's inventory says another GPU model than the host has.
    cfg = copy.deepcopy(good)
    cfg['gpuhost:hosts'][1]['host']['gpus'] = [dict(g, id='10de:2bb1') for g in good['gpuhost:host']['gpus']]
    fleet.write_stack(STACK, cfg)
    res = fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    text = res.stdout + res.stderr
    assert res.returncode != 0 and 'host gpu03: the host does not match the config' in text, text[-2000:]
    assert 'is 10de:2bb5 on the host, config says 10de:2bb1' in text
    assert {n: snapshot(fleet.labs[n]) for n in order} == before
    fleet.write_stack(STACK, good)
    fleet.pulumi('preview', '--expect-no-changes', stack=STACK)


def policy_opt_in(fleet, stacks):
    """The lab's SGLang listens on every address of its container: the lab's stacks opt in (policy/, as lab-fleet)
    for the fleet command, which runs the policy pack as `make up` does."""
    os.makedirs(os.path.join(fleet.project, 'policy'), exist_ok=True)
    for stack in stacks:
        shutil.copyfile(os.path.join(REPO, 'policy', 'config.lab-fleet.json'),
                        os.path.join(fleet.project, 'policy', 'config.%s.json' % stack))


SHARDS = {STACK: ('gpu01', 'gpu03', 'gpu04'), 'shard-b': ('gpu02',), 'shard-c': ('gpu05',)}


def test_three_shard_stacks_merge_into_one_file_sd(fleet, tmp_path):
    """A fleet sharded into stacks (docs/fleets.md, "Sharding"): gpu02 in a stack of its own next to `fleet`, and a
    fifth host in a third (shard-c), both new shards brought up from bare containers by one fleet command at once;
    fleet-monitoring's StackReference program merges the three shards' file_sd, which promtool accepts."""
    import json
    import subprocess
    import yaml
    fleet.add(5)
    fleet.write_stack('shard-b', fleet.stack_config(['gpu02']))
    fleet.write_stack('shard-c', fleet.stack_config(['gpu05']))
    policy_opt_in(fleet, ('shard-b', 'shard-c'))
    res = fleet_command(fleet, 'up', '--yes', '--stack', 'shard-b', '--stack', 'shard-c', '--parallel', '2')
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'up: 2 of 2 shards succeeded' in res.stdout, res.stdout
    assert [fleet.labs[n].unit_starts() for n in ('gpu02', 'gpu05')] == [1, 1]
    mon = tmp_path / 'fleet-monitoring'
    shutil.copytree(os.path.join(REPO, 'fleet-monitoring'), mon)
    os.symlink(os.path.join(REPO, '.venv'), str(tmp_path / '.venv'))

    def run(*args, check=True):
        return fleet.pulumi(*args, check=check, cwd=str(mon))
    run('stack', 'init', 'merged', '--secrets-provider', 'passphrase')
    for i, stack in enumerate(SHARDS):
        run('config', 'set', '--path', 'shards[%d]' % i, 'organization/gpuhost/%s' % stack)
    run('up', '--yes', '--skip-preview')
    groups = json.loads(run('stack', 'output', 'prometheus_file_sd', '--json').stdout)
    got = sorted((g['labels']['shard'], g['labels']['host'], g['labels']['id']) for g in groups)
    want = sorted((stack, n, i) for stack, hosts in SHARDS.items() for n in hosts
                  for i in ('lxc/200', 'node/pve-%s' % n))
    assert got == want
    targets = tmp_path / 'targets.json'
    targets.write_text(json.dumps(groups))
    prom = tmp_path / 'prometheus.yml'
    prom.write_text(yaml.safe_dump({'scrape_configs': [{'job_name': 'gpuhost', 'file_sd_configs': [
        {'files': [str(targets)]}]}]}))
    check = subprocess.run(['promtool', 'check', 'config', str(prom)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # The same shard listed twice would count its hosts twice: refused, in one line.
    run('config', 'set', '--path', 'shards[3]', 'organization/gpuhost/shard-b')
    res = run('preview', check=False)
    assert res.returncode != 0 and 'shards: organization/gpuhost/shard-b is listed twice' in res.stdout + res.stderr


def fleet_command(fleet, *args):
    """`python -m tools.fleet` (what `make fleet-preview` and `make fleet-up` run) on the fleet's project copy."""
    import subprocess
    import sys
    res = subprocess.run([sys.executable, '-m', 'tools.fleet'] + list(args) + ['--cwd', fleet.project], cwd=REPO,
                         env=fleet.env, capture_output=True, text=True, timeout=300)
    # As every `pulumi` run of the tests (lablib Lab.pulumi): never Python frames for the operator, a shard's included.
    for stream in (res.stdout, res.stderr):
        assert 'Traceback (most recent call last)' not in stream and '.py", line ' not in stream, stream[-4000:]
    return res


def merged_rows(stdout):
    """{host: {column: value}} of the merged table the fleet command prints (columns apart by 2+ spaces)."""
    import re
    lines = stdout.splitlines()
    head = re.split(r'\s{2,}', lines[0].strip())
    rows = [dict(zip(head, re.split(r'\s{2,}', ln.strip()))) for ln in lines[2:] if ln.strip()
            and not ln.startswith(('preview:', 'up:'))]
    return {r['host']: r for r in rows}


def dead_runner(etcd_url, slots, ttl_s):
    """A runner killed mid-step, as etcd sees it: a process of the fleet lock's client that took `slots` slots of the
    group `lab` (as a canary with `baseline: restart` takes two) and was SIGKILLed - nothing released, its leases
    left to run out. Returns the holders' names."""
    import signal
    import subprocess
    import sys
    names = ['gpu%02d dead/runner' % (90 + i) for i in range(slots)]
    code = ('import sys, time; sys.path.insert(0, %r); from transport import fleetlock; '
            's = fleetlock.Settings(group="lab", slots=%d, endpoints=(%r,), ttl_s=%d); '
            '[fleetlock.acquire(s, n, n.split()[0], "-") for n in %r]; print("held", flush=True); time.sleep(600)' % (
                REPO, slots, etcd_url, ttl_s, names))
    runner = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().strip() == 'held'
    finally:
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(10)
    return names


def test_one_command_previews_and_ups_every_shard_and_names_a_failing_one(fleet, tmp_path):
    """Issue 61's fleet command on the three shard stacks the test above left (fleet: gpu01, gpu03, gpu04; shard-b:
    gpu02; shard-c: gpu05): one merged preview of a change that restarts SGLang on every host, each host with its
    shard; a shard whose config is broken named in one line while the other shards' previews still complete; then the
    change applied to the three shards at once, each host's SGLang restarted once, with each shard's host table and
    the merged targets - under one fleet lock of 2 slots in a real etcd (gpuhost:rollout.fleet_lock): the shard
    `fleet` alone would take its three hosts down at once (max_unavailable 3) beside the other shards' one each, the
    lock holds the three shards to 2 hosts down between them. Both slots are held, as the run begins, by a runner
    killed mid-step (its leases' TTL 20 s): nothing restarts until the TTL frees them. (The change stays deployed:
    the tests after this one start from the stacks' files.)"""
    import copy
    import threading
    import yaml
    configs, changed = {}, {}
    for stack in SHARDS:
        with open(os.path.join(fleet.project, 'Pulumi.%s.yaml' % stack)) as f:
            configs[stack] = yaml.safe_load(f)['config']
        changed[stack] = copy.deepcopy(configs[stack])
        changed[stack]['gpuhost:sglang'] = dict(configs[stack]['gpuhost:sglang'], environment={'NCCL_DEBUG': 'WARN'})
    policy_opt_in(fleet, SHARDS)
    starts = {n: lab.unit_starts() for n, lab in fleet.labs.items()}
    shard_of = {h: stack for stack, hosts in SHARDS.items() for h in hosts}
    assert sorted(shard_of) == sorted(fleet.labs)
    every = [a for stack in SHARDS for a in ('--stack', stack)]
    try:
        for stack, cfg in changed.items():
            fleet.write_stack(stack, cfg)
        res = fleet_command(fleet, 'preview', *every, '--parallel', '3')
        assert res.returncode == 0, res.stdout + res.stderr
        rows = merged_rows(res.stdout)
        assert {h: (r['shard'], r['SGLang'], r['reboot'], r['lock group']) for h, r in rows.items()} == {
            h: (shard, 'restart', '-', '-') for h, shard in shard_of.items()}, res.stdout
        assert all('sglang-unit' in r['what changes'] for r in rows.values()), res.stdout
        assert 'preview: 3 of 3 shards succeeded' in res.stdout

        # shard-b's host asks for another tensor parallelism than its GPUs give: refused by the program, named.
        bad = copy.deepcopy(changed['shard-b'])
        bad['gpuhost:hosts'][0]['sglang'] = {'extra_args': ['--tp-size', '2']}
        fleet.write_stack('shard-b', bad)
        res = fleet_command(fleet, 'preview', *every)
        assert res.returncode == 1, res.stdout + res.stderr
        failed = [ln for ln in res.stderr.splitlines() if ln.startswith('shard ')]
        assert len(failed) == 1 and failed[0].startswith('shard shard-b failed: ') and 'gpu02' in failed[0], res.stderr
        rows = merged_rows(res.stdout)
        assert [rows[h]['SGLang'] for h in ('gpu01', 'gpu03', 'gpu04', 'gpu05')] == ['restart'] * 4, res.stdout
        assert rows['gpu02']['what changes'] == 'unknown: shard failed', res.stdout
        assert 'preview: 2 of 3 shards succeeded' in res.stdout
        assert {n: lab.unit_starts() for n, lab in fleet.labs.items()} == starts    # a preview restarts nothing
        fleet.write_stack('shard-b', changed['shard-b'])
    except BaseException:
        for stack, cfg in configs.items():
            fleet.write_stack(stack, cfg)
        raise
    # The three shards' `up` at once (no question: --yes): what was done, per host, from the engine's outputs.
    import time
    from tests.etcdlab import Etcd
    etcd = Etcd(tmp_path / 'etcd').start()
    try:
        for stack, cfg in changed.items():
            rollout = dict(cfg.get('gpuhost:rollout') or {}, fleet_lock={'group': 'lab', 'slots': 2,
                                                                          'endpoints': [etcd.url]})
            if stack == STACK:
                rollout['max_unavailable'] = 3
            fleet.write_stack(stack, dict(cfg, **{'gpuhost:rollout': rollout}))
        # Its leases outlast the shards' refresh and plan (~10-15 s here): their first restart waits for the TTL.
        dead = dead_runner(etcd.url, 2, 20)
        # The last moment the dead runner's slots were seen held (read before each look: they were held then).
        seen = {'held': None}
        done = threading.Event()

        def watch():
            while not done.is_set():
                t = time.time()
                values = etcd.ctl('get', '--prefix', '--print-value-only', '/gpuhost/fleetlock/lab/').splitlines()
                if not set(dead) & set(values):
                    return
                seen['held'] = t
                done.wait(0.5)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        began = time.time()
        try:
            res = fleet_command(fleet, 'up', '--yes', *every, '--parallel', '3')
        finally:
            done.set()
            watcher.join(30)
        assert res.returncode == 0, res.stdout + res.stderr
        down = [iv for lab in fleet.labs.values() for iv in lab.down_intervals() if iv[0] >= began]
        assert len(down) == 5 and max_overlap(down) <= 2, down
        # Nothing went down while the killed runner's slots were held: its TTL freed them, then the shards went on.
        assert seen['held'] is not None and min(a for a, _ in down) > seen['held'], (seen, down)
        assert etcd.ctl('get', '--prefix', '/gpuhost/fleetlock/lab/') == '', 'a slot was not given back'
    finally:
        etcd.stop()
        for stack, cfg in changed.items():
            fleet.write_stack(stack, cfg)
    head, _, rest = res.stdout.partition('\n\n')
    rows = merged_rows(head)
    assert {h: (r['shard'], r['SGLang'], r['reboot']) for h, r in rows.items()} == {
        h: (shard, 'restarted', '-') for h, shard in shard_of.items()}, res.stdout
    assert all('sglang-unit' in r['what is done'] for r in rows.values()), res.stdout
    assert {n: lab.unit_starts() for n, lab in fleet.labs.items()} == {n: k + 1 for n, k in starts.items()}
    assert all('Shard %s ' % stack in rest for stack in SHARDS) and 'up: 3 of 3 shards succeeded' in rest, rest
    assert 'Monitoring: 10 target groups across 3 shards' in rest, rest


def test_a_driver_upgrade_rolls_one_host_at_a_time_the_first_host_first(fleet):
    """Issue 59's fleet case: the host's NVIDIA driver declared at the version every host runs (the first `up` adopts
    it, nothing restarted), then A -> B with max_unavailable 1: priced per host at preview, each host reloaded in place
    at B with its container's user space, SGLang stopped once per host, one host down at a time in rollout order."""
    import hashlib
    import time
    from lab import hostsim
    from tests.integration.test_driver import A, B, with_driver
    order = ['gpu01', 'gpu03', 'gpu04']
    labs = [fleet.labs[n] for n in order]
    shared = current(fleet)
    sha_a = shared['gpuhost:runtime']['nvidia']['sha256']
    starts = [lab.unit_starts() for lab in labs]
    fleet.write_stack(STACK, with_driver(shared, A, sha_a))
    adopt = fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert '-host-nvidia-driver: ' not in adopt.stdout + adopt.stderr      # nothing to do on any host
    assert [lab.unit_starts() for lab in labs] == starts
    assert {n: h['nvidia_driver']['loaded'] for n, h in fleet.outputs(STACK)['hosts'].items()} == dict.fromkeys(order, A)
    # B's installer, uploaded to each host beside A's as an operator does.
    text = hostsim.nvidia_installer(B)
    for lab in labs:
        lab.host.add_artifact(hostsim.nvidia_installer_name(B), text)
    fleet.write_stack(STACK, with_driver(shared, B, hashlib.sha256(text.encode()).hexdigest()))
    res = fleet.pulumi('preview', '--diff', stack=STACK)
    pre = ' '.join((res.stdout + res.stderr).split())
    for n, lab in zip(order, labs):
        assert ('%s-host-nvidia-driver: 580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels %s): '
                'the modules can be reloaded in place' % (n, lab.host.spec['kernel'])) in pre, (n, pre)
    t0 = time.time()
    fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    out = fleet.outputs(STACK)['hosts']
    for n, lab, before in zip(order, labs, starts):
        assert (lab.host.nvidia_module(), lab.host.installed_nvidia()) == (B, B), n
        assert out[n]['nvidia_driver']['loaded'] == B and out[n]['runtime']['container_driver'] == B, n
        assert out[n]['sglang_unit']['active'] is True, n
        assert lab.unit_starts() == before + 1, n          # stopped by its upgrade, started once on B
    # Each host's window: SGLang stopped by the driver's job until it serves again on B.
    windows = {n: [iv for iv in lab.down_intervals() if iv[0] >= t0] for n, lab in zip(order, labs)}
    assert all(len(w) == 1 for w in windows.values()), windows
    assert max_overlap([w[0] for w in windows.values()]) == 1, windows
    assert sorted(order, key=lambda n: windows[n][0][0]) == order, windows
    fleet.pulumi('preview', '--expect-no-changes', stack=STACK)


def test_a_driver_that_fails_on_the_second_host_stops_the_rollout_there(fleet):
    """C's load fails to initialise gpu03's GPUs (the FSP's boot error): gpu01 runs C, gpu03 is back on B and the run
    stops naming it, gpu04 behind it is never touched. (The last test: the fleet is left as the failure left it.)"""
    import hashlib
    from lab import hostsim
    from tests.integration.test_driver import B, C, RUN
    order = ['gpu01', 'gpu03', 'gpu04']
    labs = dict((n, fleet.labs[n]) for n in order)
    text = hostsim.nvidia_installer(C)
    for lab in labs.values():
        lab.host.add_artifact(hostsim.nvidia_installer_name(C), text)
    cfg = current(fleet)
    cfg['gpuhost:nvidia']['driver'].update(version=C, installer=RUN % C, sha256=hashlib.sha256(text.encode()).hexdigest())
    fleet.write_stack(STACK, cfg)
    labs['gpu03'].host.arm_fsp_failure(version=C)
    starts = {n: lab.unit_starts() for n, lab in labs.items()}
    untouched = labs['gpu04'].host_digest()
    try:
        res = fleet.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        labs['gpu03'].host.disarm_fsp_failure()
    out = ' '.join((res.stdout + res.stderr).split())
    assert res.returncode != 0
    assert ('rollout stopped at host gpu03 (its NVIDIA driver): hosts done before it in its lane: gpu01; not started, '
            'still on their old setting: gpu04') in out, out[-3000:]
    assert 'gpu03-host-nvidia-driver: 580.119.02 did not bring the GPUs up' in out, out[-3000:]
    assert (labs['gpu01'].host.nvidia_module(), labs['gpu01'].host.installed_nvidia()) == (C, C)
    assert (labs['gpu03'].host.nvidia_module(), labs['gpu03'].host.installed_nvidia()) == (B, B)
    assert labs['gpu01'].unit_starts() == starts['gpu01'] + 1 and labs['gpu03'].unit_starts() == starts['gpu03'] + 1
    assert labs['gpu03'].ct_exec(['systemctl', 'is-active', UNIT]).stdout.strip() == 'active'
    assert (labs['gpu04'].host_digest(), labs['gpu04'].unit_starts()) == (untouched, starts['gpu04'])
    assert labs['gpu04'].host.nvidia_module() == B
