"""The fleet command's merged table (tools/fleet.py), assembled from engine events as the Automation API hands them
over (synthetic, in the event log's JSON): each host's steps with its shard, SGLang restarts and reboots read from our
resources' steps, a failing shard named by its first error line, and the shard stacks found by their config."""

import os

from pulumi.automation import EngineEvent

from tools import fleet

PROJECT = 'urn:pulumi:site-a::gpuhost::'


def step(op, name, type_='gpuhost:index:SglangUnit', kind='resourcePreEvent', diffs=None, new=None, old=None,
         custom=True):
    meta = {'op': op, 'urn': PROJECT + type_ + '::' + name, 'type': type_, 'provider': '', 'diffs': diffs or []}
    meta['new'] = dict({'type': type_, 'urn': meta['urn'], 'custom': custom}, **(new or {}))
    if old is not None:
        meta['old'] = dict({'type': type_, 'urn': meta['urn'], 'custom': custom}, **old)
    return EngineEvent.from_json({'sequence': 1, 'timestamp': 0, kind: {'metadata': meta}})


def diag(message, severity='error'):
    return EngineEvent.from_json({'sequence': 1, 'timestamp': 0,
                                  'diagnosticEvent': {'message': message, 'color': 'never', 'severity': severity}})


def rows(shard):
    return {r[1]: r for r in shard.rows()}


def test_a_preview_lists_each_host_with_its_restart_and_reboot():
    s = fleet.Shard('site-a', ['gpu01', 'gpu02', 'gpu1', 'gpu01-b'], group='rack-7')
    for e in [
        step('same', 'site-a', 'pulumi:pulumi:Stack', custom=False),
        step('update', 'gpu01-sglang-unit', diffs=['unit']),
        step('update', 'gpu01-collector', 'gpuhost:index:HostCollector'),
        step('update', 'gpu01-host-status', 'gpuhost:index:HostStatus', diffs=['expect', 'observed'],
             new={'inputs': {'reboot': 'when-required'}}),
        step('replace', 'gpu01-b-container-lxc', 'gpuhost:index:ProxmoxGuest'),
        step('create-replacement', 'gpu01-b-container-lxc', 'gpuhost:index:ProxmoxGuest'),
        step('delete-replaced', 'gpu01-b-container-lxc', 'gpuhost:index:ProxmoxGuest'),
        step('update', 'gpu1-host-status', 'gpuhost:index:HostStatus', diffs=['expect'],
             new={'inputs': {'reboot': 'never'}}),
        step('update', 'gpu1-host-status2', 'gpuhost:index:HostStatus', diffs=['observed'],
             new={'inputs': {'reboot': 'when-required'}}),
        step('create', 'gpu1-plugin', 'pulumi:providers:gpuhost'),
        step('same', 'gpu02-sglang-unit'),
        diag('gpu01-collector: a warning', severity='warning'),
    ]:
        s.add(e)
    got = rows(s)
    assert got['gpu01'] == ['site-a', 'gpu01', 'update 3 (collector, host-status, sglang-unit)', 'restart',
                            'when required', 'rack-7']
    # The longest host name that prefixes a resource is its host; a replacement counts once and restarts SGLang.
    assert got['gpu01-b'][2:5] == ['replace 1 (container-lxc)', 'restart (new guest)', '-']
    # reboot: never - the host's declared state changes, the reboot is the operator's; `observed` alone is none.
    assert got['gpu1'][2:5] == ['update 2 (host-status, host-status2)', '-', 'manual']
    assert got['gpu02'][2:5] == ['none', '-', '-']
    assert s.error is None and s.errors == []
    text = fleet.table([s])
    assert text.splitlines()[0].split() == ['shard', 'host', 'what', 'changes', 'SGLang', 'reboot', 'lock', 'group']
    assert len(text.splitlines()) == 2 + 4


def test_an_up_reports_what_was_done_from_the_outputs():
    s = fleet.Shard('site-b', ['gpu03', 'gpu04'], done=True)
    for e in [
        # the plan's pre events do not count after an up: only what ended
        step('update', 'gpu03-sglang-unit'),
        step('update', 'gpu03-sglang-unit', kind='resOutputsEvent', new={'outputs': {'restarted': True}}),
        step('update', 'gpu03-host-status', 'gpuhost:index:HostStatus', kind='resOutputsEvent',
             old={'outputs': {'boot_id': 'a'}}, new={'outputs': {'boot_id': 'b'}}),
        step('update', 'gpu04-sglang-unit', kind='resOutputsEvent', new={'outputs': {'restarted': False}}),
        step('create', 'gpu04-model', 'gpuhost:index:ModelWeights', kind='resOutputsEvent'),
    ]:
        s.add(e)
    got = rows(s)
    assert got['gpu03'][2:5] == ['update 2 (host-status, sglang-unit)', 'restarted', 'rebooted']
    assert got['gpu04'][2:5] == ['create 1 (model), update 1 (sglang-unit)', '-', '-']
    assert fleet.table([s]).splitlines()[0].split()[2:5] == ['what', 'is', 'done']


def test_a_failing_shard_is_named_by_its_first_error_line():
    s = fleet.Shard('site-c', ['gpu05'], done=True)
    s.add(step('update', 'gpu05-sglang-unit', kind='resOpFailedEvent'))
    s.add(diag('error: gpu05-sglang-unit: sglang-qwen.service failed its check after its restart: /health 503\n'
               'more detail'))
    s.add(diag('error: update failed'))
    s.error = s.errors[0]
    assert fleet.failures([s]) == ['shard site-c failed: gpu05-sglang-unit: sglang-qwen.service failed its check '
                                   'after its restart: /health 503']
    assert rows(s)['gpu05'][2] == 'none done: shard failed; FAILED: sglang-unit'
    # A shard that failed before any step (its program refused the config) still has its hosts listed.
    t = fleet.Shard('site-d', ['gpu06'])
    t.error = fleet.first_line('error: Program failed with an unhandled exception:\n'
                               'error: invalid stack configuration for host gpu06: bad')
    assert t.error == 'invalid stack configuration for host gpu06: bad'
    # A heading and its first item: the host and what is wrong with it.
    assert fleet.first_line('invalid stack configuration for host gpu06 (gpuhost:hosts[0] ...):\n'
                            '  - gpuhost:sglang.tp: 3 is not a power of two\n  - another') == \
        'invalid stack configuration for host gpu06 (gpuhost:hosts[0] ...): - gpuhost:sglang.tp: 3 is not a power ' \
        'of two'
    assert [r[1:3] for r in t.rows()] == [['gpu06', 'unknown: shard failed']]


def test_shard_stacks_are_those_that_list_hosts_and_the_lock_group_comes_from_their_config(tmp_path):
    # The lock shared by every shard in the project's config; site-b sets its own gpuhost:rollout, which replaces it.
    (tmp_path / 'Pulumi.yaml').write_text(
        'name: gpuhost\nconfig:\n  gpuhost:rollout:\n    value: {fleet_lock: {group: fleet, slots: 2}}\n')
    (tmp_path / 'Pulumi.site-a.yaml').write_text('config:\n  gpuhost:hosts:\n    - name: gpu01\n')
    (tmp_path / 'Pulumi.site-b.yaml').write_text(
        'config:\n  gpuhost:hosts:\n    - name: gpu02\n  gpuhost:rollout:\n    fleet_lock: {group: rack-7, slots: 1}\n')
    (tmp_path / 'Pulumi.lab.yaml').write_text('config:\n  gpuhost:host: {address: 127.0.0.3}\n')
    (tmp_path / 'Pulumi.empty.yaml').write_text('')
    assert fleet.shard_stacks(str(tmp_path)) == ['site-a', 'site-b']
    cfg = fleet.stack_config('site-a', str(tmp_path))
    assert fleet.host_names(cfg) == ['gpu01'] and fleet.lock_group(cfg) == 'fleet (2 slots)'
    cfg = fleet.stack_config('organization/gpuhost/site-b', str(tmp_path))
    assert fleet.host_names(cfg) == ['gpu02'] and fleet.lock_group(cfg) == 'rack-7 (1 slot)'
    assert fleet.lock_group({'gpuhost:rollout': {'max_unavailable': 1}}) == '-'
    assert fleet.lock_group(fleet.stack_config('lab', str(tmp_path))) == 'fleet (2 slots)'


def test_refusals_before_any_shard_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / 'Pulumi.yaml').write_text('name: gpuhost\n')
    assert fleet.main(['preview', '--cwd', str(tmp_path)]) == 2
    assert 'no shard stacks' in capsys.readouterr().err
    monkeypatch.delenv('PULUMI_CONFIG_PASSPHRASE', raising=False)
    monkeypatch.delenv('PULUMI_CONFIG_PASSPHRASE_FILE', raising=False)
    assert fleet.main(['preview', '--stack', 'site-a', '--cwd', str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert 'set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE' in err
    assert os.environ.get('PULUMI_CONFIG_PASSPHRASE') is None


def test_ctrl_c_starts_no_further_shard_and_waits_for_the_running_ones(monkeypatch, capsys):
    import threading
    import time
    release = threading.Event()
    ran = []

    def run_shard(shard, action, root):
        ran.append(shard.name)
        release.wait(5)        # the running shard's pulumi ends its steps in flight, then returns
        return shard
    real_wait, calls = fleet.wait, []

    def wait(futures):
        calls.append(len(futures))
        if len(calls) == 1:
            while not ran:     # Ctrl-C while the first shard runs
                time.sleep(0.01)
            raise KeyboardInterrupt
        release.set()
        return real_wait(futures)
    monkeypatch.setattr(fleet, 'run_shard', run_shard)
    monkeypatch.setattr(fleet, 'wait', wait)
    shards = fleet.run_all(['site-a', 'site-b', 'site-c'], 'up', 1, root='/nonexistent')
    assert ran == ['site-a'] and calls == [3, 3]
    assert [s.error for s in shards] == [None, 'not started: interrupted (Ctrl-C)', 'not started: interrupted (Ctrl-C)']
    assert 'waiting for the shards that run now' in capsys.readouterr().err
