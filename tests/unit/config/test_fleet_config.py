"""gpuhost:hosts: a fleet in one stack - host entries merged over the shared settings, each validated
on its own with its name in every refusal; checks across hosts; the rollout order."""

import copy

import pytest

import config
from tests.unit.config.test_config import lab_data


def fleet(*entries, rollout=None, **shared_changes):
    data = copy.deepcopy(lab_data())
    data.update(shared_changes)
    data['hosts'] = list(entries)
    if rollout is not None:
        data['rollout'] = rollout
    return config.parse_fleet(data)


def entry(name, net, **more):
    e = {'name': name, 'host': {'address': '127.1.%d.3' % net, 'api': {'address': '127.1.%d.2' % net},
                                'node': 'pve-%s' % name},
         'container': {'ip': '127.1.%d.4/8' % net}}
    out = config.deep_merge(e, more)
    out.update({k: None for k, v in more.items() if v is None})   # a null in the entry itself
    return out


def test_one_host_stack_is_a_fleet_of_one_with_its_old_names():
    f = config.parse_fleet(copy.deepcopy(lab_data()))
    assert not f.is_fleet and len(f.hosts) == 1
    assert f.hosts[0].resource_name('container') == 'container'
    assert f.lane_before(0) is None and f.rollout_info(0) is None


def test_entries_override_the_shared_settings_and_null_removes():
    f = fleet(entry('gpu01', 1), entry('gpu02', 2, sglang={'port': 30001}, vm=None))
    a, b = (h.deployment for h in f.hosts)
    assert a.host.address == '127.1.1.3' and b.host.address == '127.1.2.3'
    assert a.host.api.port == 8006 and b.host.api.address == '127.1.2.2'   # merged, not replaced
    assert a.sglang.port == 30000 and b.sglang.port == 30001
    assert a.vm is not None and b.vm is None
    assert b.sglang.model_path == a.sglang.model_path == '/models/Qwen3.5-122B-A10B'
    assert [h.resource_name('host') for h in f.hosts] == ['gpu01-host', 'gpu02-host']


def test_rollout_lanes():
    names = ['gpu%02d' % i for i in range(1, 6)]
    f = fleet(*[entry(n, i + 1) for i, n in enumerate(names)], rollout={'max_unavailable': 2})
    assert [f.lane_before(i) and f.lane_before(i).name for i in range(5)] == [None, None, 'gpu01', 'gpu02', 'gpu03']
    info = f.rollout_info(2)
    assert info['before'] == ['gpu01'] and info['after'] == ['gpu05'] and info['max_unavailable'] == 2
    one = fleet(*[entry(n, i + 1) for i, n in enumerate(names)])
    assert one.rollout_info(1)['after'] == ['gpu03', 'gpu04', 'gpu05']


@pytest.mark.parametrize('entries,message', [
    ([entry('gpu01', 1), entry('gpu02', 2, sglang={'tp': 2})],
     r'host gpu02 \(gpuhost:hosts\[1\].*\n  - gpuhost:sglang.tp: 2 but the container has 4 GPUs'),
    ([entry('gpu01', 1, host={'address': 'bad host;rm'})], r'(?s)host gpu01 .*gpuhost:host.address'),
    ([entry('gpu01', 1, container={'gpus': ['0000:81:00.0']})], r'(?s)host gpu01 .*sits on NUMA node 1'),
    ([entry('gpu01', 1), entry('gpu01', 2)], r'hosts\[1\].name: gpu01 is also the name of gpuhost:hosts\[0\]'),
    ([entry('GPU_01', 1)], r'hosts\[0\].name: .GPU_01. is not a host name'),
    ([{'host': {'address': '127.1.1.3'}}], r'hosts\[0\].name: None is not a host name'),
    ([entry('gpu01', 1, sglnag={'port': 1})], r'hosts\[0\] \(gpu01\): sglnag is not a setting of a host \(did you '
                                              r'mean sglang\?\)'),
    ([entry('gpu01', 1), entry('gpu02', 1)], r'host gpu02 .*host.address:ssh.port 127.1.1.3:2222 is also host gpu01'),
    ([entry('gpu01', 1), entry('gpu02', 2, container={'ip': '127.1.1.4/8'})],
     r'host gpu02 .*container.ip 127.1.1.4 is also host gpu01\'s'),
    ([entry('gpu01', 1), entry('gpu02', 2, host={'api': {'address': '127.1.1.2'}})],
     r'host gpu02 .*vmid 200@127.1.1.2:8006 is also host gpu01\'s'),
    (['gpu01'], r'hosts\[0\]: .gpu01. is not a mapping'),
    # Resource mappings are cluster-wide: one prefix for two VMs behind one API would hand one VM the other's GPUs.
    ([entry('gpu01', 1, vm={'gpu_mapping_prefix': 'gpu'}),
      entry('gpu02', 2, host={'api': {'address': '127.1.1.2'}}, container={'vmid': 201},
            vm={'vmid': 301, 'gpu_mapping_prefix': 'gpu'})],
     r'host gpu02 .*PCI mapping id gpu0@127.1.1.2:8006 is also host gpu01\'s; resource mappings are cluster-wide'),
])
def test_refusals_name_the_host(entries, message):
    with pytest.raises(config.ConfigError, match=message):
        fleet(*entries)


def test_hosts_must_be_a_list_and_rollout_is_checked():
    data = copy.deepcopy(lab_data())
    data['hosts'] = {'gpu01': {}}
    with pytest.raises(config.ConfigError, match='gpuhost:hosts: .* is not a list of hosts'):
        config.parse_fleet(data)
    with pytest.raises(config.ConfigError, match='max_unavailable'):
        fleet(entry('gpu01', 1), rollout={'max_unavailable': 0})
    data = copy.deepcopy(lab_data())
    data['rollout'] = {'max_unavailable': 2}
    with pytest.raises(config.ConfigError, match='gpuhost:rollout: set, but the stack has no gpuhost:hosts'):
        config.parse_fleet(data)


def test_plain_secret_in_a_host_entry_is_refused():
    e = entry('gpu02', 2, host={'api': {'password': 'hunter2', 'password_file': None}})
    with pytest.raises(config.ConfigError, match=r'gpuhost:hosts\[1\].host.api.password is set as plain text'):
        config.check_secrets(e, lambda k: False, None, prefix=('hosts', '1'))
    # Secure in the stack file: accepted.
    config.check_secrets(e, lambda k: True, {('hosts', '1', 'host', 'api', 'password')}, prefix=('hosts', '1'))
    with pytest.raises(config.ConfigError, match='plain text'):
        config.check_secrets(e, lambda k: True, {('hosts', '0', 'host', 'api', 'password')}, prefix=('hosts', '1'))


def test_a_plain_secret_of_a_host_entry_is_found_in_the_update_history_that_kept_it(tmp_path, monkeypatch):
    """The file backend keeps each update's config: the record holding this host entry's password is named
    (never the password), and only that one."""
    import json
    state = tmp_path / 'state'
    hist = state / '.pulumi' / 'history' / 'gpuhost' / 'prod'
    hist.mkdir(parents=True)
    for name, password in (('prod-1.history.json', 'hunter2'), ('prod-2.history.json', 'rotated-later')):
        hosts = [{'host': {'api': {'password': 'other'}}}, {'host': {'api': {'password': password}}}]
        (hist / name).write_text(json.dumps({'kind': 'update', 'config': {'gpuhost:hosts': hosts}}))
    (tmp_path / 'Pulumi.yaml').write_text('name: gpuhost\nruntime: python\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('PULUMI_BACKEND_URL', 'file://%s' % state)
    e = entry('gpu02', 2, host={'api': {'password': 'hunter2', 'password_file': None}})
    with pytest.raises(config.ConfigError) as err:
        config.check_secrets(e, lambda k: False, None, prefix=('hosts', '1'), stack='prod')
    text = str(err.value)
    assert ('It is already recorded in plain text - in Pulumi.prod.yaml and in 1 update record of the stack\'s history '
            'in the backend file://%s (%s) - treat it as disclosed: rotate it' % (state, hist / 'prod-1.history.json')) \
        in text, text
    assert 'hunter2' not in text
    # Another backend (S3, Pulumi Cloud): not read from here - said as what it keeps.
    monkeypatch.setenv('PULUMI_BACKEND_URL', 's3://bucket/gpuhost')
    with pytest.raises(config.ConfigError) as err:
        config.check_secrets(e, lambda k: False, None, prefix=('hosts', '1'), stack='prod')
    assert ('the backend s3://bucket/gpuhost keeps each update\'s config in the stack\'s update history (pulumi stack '
            'history): if an update, refresh or destroy ran with it, it is there - treat it as disclosed and rotate '
            'it') in str(err.value)


def test_unknown_fleet_level_namespace_key_is_still_refused():
    config.check_namespaces(['gpuhost:hosts', 'gpuhost:rollout', 'gpuhost:sglang'])
    with pytest.raises(config.ConfigError, match='gpuhost:host_list is not a setting'):
        config.check_namespaces(['gpuhost:host_list'])


def test_render_and_monitoring_tools_write_each_host_of_a_fleet(tmp_path):
    """make render / make monitoring on a fleet stack: the files of every host, under OUT/<host>/."""
    import yaml

    from lab import fleet as lab_fleet
    from tools.render import files, load_fleet
    entries = [lab_fleet.host_entry(i, lab_fleet.host_spec(i, lab_fleet.addresses(i)), '.lab-fleet/gpu%02d' % i)
               for i in (1, 3, 4)]
    (tmp_path / 'Pulumi.f.yaml').write_text(yaml.safe_dump({'config': lab_fleet.stack_config(entries)}))
    f = load_fleet('f', str(tmp_path))
    out = {h.name: files(h.deployment) for h in f.hosts}
    assert 'host/etc/driverctl.d/pci-0000:81:00.0' in out['gpu01']
    assert not any(k.startswith('host/etc/driverctl.d/') for k in out['gpu03'])          # no VM
    assert 'host/etc/driverctl.d/pci-0000:9a:00.0' in out['gpu04']                       # its own inventory
    from tools import monitoring as mon
    rules = {h.name: mon.files('f', h.deployment)[mon.RULES] for h in f.hosts}
    assert 'node="pve-gpu03"' in rules['gpu03'] and 'node="pve-gpu01"' not in rules['gpu03']


@pytest.mark.parametrize('rollout,message', [
    ({'max_unavail': 2}, r'gpuhost:rollout.max_unavail is not a setting here \(did you mean max_unavailable\?\); '
                         r'the settings of gpuhost:rollout are: max_unavailable'),
    ({'max_unavailable': True}, 'gpuhost:rollout.max_unavailable: True is not a whole number'),
    ({'max_unavailable': '2'}, r'not a whole number \(write it without quotes\)'),
    (0, 'gpuhost:rollout: 0 is not a mapping'),
])
def test_rollout_refusals_name_the_key(rollout, message):
    with pytest.raises(config.ConfigError, match=message):
        fleet(entry('gpu01', 1), rollout=rollout)


@pytest.mark.parametrize('override,message', [
    ({'host': None}, r'host gpu01 .*gpuhost:host is required and not set'),
    ({'host': 'pve1'}, r'host gpu01 .*gpuhost:host: .pve1. is not a mapping'),
    ({'sglang': {'environment': {'HF_TOKEN': 'x'}}}, r'host gpu01 .*HF_TOKEN'),
    ({'iommu': {'extra_kernel_args': ['iommu=pt']}}, r'host gpu01 .*iommu=pt'),
])
def test_hostile_host_entries_are_refused_with_the_host_named(override, message):
    e = dict(entry('gpu01', 1), **override)
    with pytest.raises(config.ConfigError, match='(?s)' + message):
        fleet(e)


def test_a_name_with_a_trailing_newline_is_refused():
    e = entry('gpu01', 1)
    e['name'] = 'gpu01\n'
    with pytest.raises(config.ConfigError, match='is not a host name'):
        fleet(e)


def test_null_inside_a_section_the_shared_settings_lack_removes_nothing_and_reaches_no_model():
    data = copy.deepcopy(lab_data())
    data.pop('vm')
    data['hosts'] = [dict(entry('gpu01', 1), vm={'vmid': 300, 'gpus': ['0000:81:00.0'], 'numa': 1,
                                                 'protect': None})]
    d = config.parse_fleet(data).hosts[0].deployment
    assert d.vm.protect is True   # the default, not a null


def test_one_machine_spelled_in_another_case_is_refused():
    b = entry('gpu02', 2, host={'address': '127.1.1.3'})
    a = entry('gpu01', 1, host={'address': 'PVE-GPU01.example.internal'})
    b['host']['address'] = 'pve-gpu01.example.internal'
    with pytest.raises(config.ConfigError, match='host.address:ssh.port pve-gpu01.example.internal:2222 is also '
                                                 'host gpu01'):
        fleet(a, b)


def test_a_container_that_served_before_a_reboot_must_serve_after_it(monkeypatch):
    """In a fleet the next host reboots once this step ends: a container that does not come back fails it."""
    from resources import sglang
    clock = [0.0]
    monkeypatch.setattr(sglang.time, 'time', lambda: clock[0])
    monkeypatch.setattr(sglang.operator, 'pause', lambda s, *what: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(sglang, 'unit_facts', lambda target, props: {'ct': 'stopped'})
    props = {'vmid': 200, 'unit_name': 'sglang-qwen.service'}
    with pytest.raises(sglang.ServiceError, match='container 200 served SGLang before the reboot but is not running'):
        sglang.verify_after_reboot(None, props, required=True)
    sglang.verify_after_reboot(None, props)   # first deployment: nothing served before, the guest steps see to it


def test_an_entry_swaps_a_pair_by_nulling_the_shared_one():
    from config import parse_host_key  # noqa: F401 - the key below must parse as a real one
    key = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlXMOnzn+VUtUJ2HPp/GySToF/fuDXoovapSPPhSllC'
    swapped = entry('gpu02', 2)
    swapped['host']['ssh'] = {'host_key_file': None, 'host_key': key}   # the null stays in the entry
    f = fleet(entry('gpu01', 1), swapped)
    assert f.hosts[1].deployment.host.ssh.host_key == key and f.hosts[1].deployment.host.ssh.host_key_file is None
    with pytest.raises(config.ConfigError, match='(?s)host gpu02 .*set exactly one of host_key'):
        fleet(entry('gpu01', 1), entry('gpu02', 2, host={'ssh': {'host_key': key}}))


def test_a_failed_rollout_step_says_where_the_rollout_stopped_and_other_steps_do_not():
    """state._normalising adds the note for the providers whose steps gate a rollout (ROLLOUT_STEP)."""
    from resources.host import HostStatusProvider, KernelCmdlineProvider
    from resources.sglang import SglangUnitProvider
    from resources.state import Failed
    r = {'host': 'gpu02', 'before': ['gpu01'], 'after': ['gpu03'], 'max_unavailable': 1}
    bad = {'rollout': r, 'connection': None}   # fails at once: no connection
    for provider, step in ((SglangUnitProvider(), 'its SGLang unit'), (HostStatusProvider(), 'its host status')):
        with pytest.raises(Failed, match=r'^rollout stopped at host gpu02 \(%s.*\): hosts done before it in its '
                                         r'lane: gpu01; not started, still on their old setting: gpu03\.' % step):
            provider.update('id', {}, bad)
    with pytest.raises(Failed) as e:
        KernelCmdlineProvider().update('id', {}, bad)
    assert 'rollout' not in str(e.value)
    with pytest.raises(Failed) as e:
        SglangUnitProvider().read('id', bad)   # a refresh is no rollout step
    assert 'rollout' not in str(e.value)


@pytest.mark.parametrize('canary,message', [
    ({'bands': [8, 1]}, r'gpuhost:rollout.canary: bands \[8.0, 1.0\]: the load band edges must be positive and '
                        r'increasing, e.g. \[1, 8, 32, 128\]'),
    ({'window_s': 60, 'max_duration_s': 600}, r'gpuhost:rollout.canary: max_duration_s 600 is shorter than '
                                              r'min_samples 50 windows of window_s 60 s \(3000 s\)'),
    ({'prometheus': 'http://admin:secret@prom:9090'}, r'gpuhost:rollout.canary.prometheus: holds credentials'),
    ({'prometheus': 'prom:9090'}, r"gpuhost:rollout.canary.prometheus: 'prom:9090' is not the http\(s\) URL of a "
                                  r"Prometheus server"),
    ({'baseline': 'shadow'}, r"gpuhost:rollout.canary.baseline: 'shadow' is not one of the allowed values: 'restart' "
                             r"or 'running'"),
    ({'slo': {'itl_p95': 50}}, r'gpuhost:rollout.canary.slo.itl_p95 is not a setting here \(did you mean '
                               r'itl_p95_ms\?\)'),
])
def test_canary_refusals_name_the_key_the_value_and_the_fix(canary, message):
    with pytest.raises(config.ConfigError, match=message) as e:
        fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'canary': canary})
    assert 'admin:secret' not in str(e.value)


def test_a_canary_needs_hosts_to_compare_with_and_a_restarted_baseline_needs_two_hosts_down_at_once():
    with pytest.raises(config.ConfigError, match='gpuhost:rollout.canary: set, but gpuhost:hosts lists one host'):
        fleet(entry('gpu01', 1), rollout={'canary': {}})
    with pytest.raises(config.ConfigError, match=r'gpuhost:rollout.canary.baseline: restart takes two hosts down at '
                                                 r'once \(the canary gpu01 and its baseline gpu02 restart together\), '
                                                 r'but gpuhost:rollout.max_unavailable is 1; set max_unavailable: 2 or '
                                                 r'more, or baseline: running'):
        fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'canary': {'baseline': 'restart'}})
    f = fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'max_unavailable': 2, 'canary': {'baseline': 'restart'}})
    assert f.canary_settings()['baseline'] == 'restart'
    lock = {'group': 'prod', 'slots': 1, 'endpoints': ['http://127.0.0.1:2379']}
    with pytest.raises(config.ConfigError, match=r'gpuhost:rollout.canary.baseline: restart takes two hosts down at '
                                                 r'once, each with a slot of the fleet lock, but '
                                                 r'gpuhost:rollout.fleet_lock.slots is 1; set slots: 2 or more'):
        fleet(entry('gpu01', 1), entry('gpu02', 2),
              rollout={'max_unavailable': 2, 'canary': {'baseline': 'restart'}, 'fleet_lock': lock})


def test_with_a_canary_the_first_host_is_named_in_every_hosts_rollout_and_takes_the_settings():
    f = fleet(entry('gpu01', 1), entry('gpu02', 2), entry('gpu03', 3),
              rollout={'max_unavailable': 2, 'canary': {'window_s': 10, 'min_samples': 5, 'slo': {'itl_p95_ms': 80}}})
    assert [f.rollout_info(i)['canary'] for i in range(3)] == ['gpu01'] * 3
    assert f.canary_settings() == {'window_s': 10, 'max_duration_s': 3600, 'min_samples': 5, 'bands': [1, 8, 32, 128],
                                   'confidence': 0.98, 'tolerance': 0.1, 'traffic_tolerance': 0.25,
                                   'inconclusive': 'rollback', 'slo': {'itl_p95_ms': 80.0}, 'baseline': 'running'}
    plain = fleet(entry('gpu01', 1), entry('gpu02', 2))
    assert 'canary' not in plain.rollout_info(1) and plain.canary_settings() is None


LOCK = {'group': 'prod-gpu', 'slots': 2, 'endpoints': ['http://127.0.0.1:2379']}


@pytest.mark.parametrize('lock,message', [
    (dict(LOCK, group='Prod/GPU'), r"gpuhost:rollout.fleet_lock.group: 'Prod/GPU' is not a fleet lock group "
                                   r"\(lowercase letters, digits.*/gpuhost/fleetlock/<group>/slot/<i>\); write e.g. "
                                   r"prod-gpu"),
    (dict(LOCK, group=''), r"gpuhost:rollout.fleet_lock.group: '' is not a fleet lock group"),
    (dict(LOCK, slots=0), r'gpuhost:rollout.fleet_lock.slots: 0 - input should be greater than or equal to 1'),
    (dict(LOCK, endpoints=['etcd1:2379']), r"gpuhost:rollout.fleet_lock.endpoints\[0\]: 'etcd1:2379' is not the "
                                           r"http\(s\) URL of an etcd member's client endpoint .* write e.g. "
                                           r"https://etcd1.example.internal:2379"),
    (dict(LOCK, endpoints=['http://root:pw@etcd1:2379']), r'gpuhost:rollout.fleet_lock.endpoints\[0\]: holds '
                                                          r'credentials .*set gpuhost:rollout.fleet_lock.user, and its '
                                                          r'password as a secret'),
    (dict(LOCK, endpoints=[]), r'gpuhost:rollout.fleet_lock.endpoints: \[\] - list should have at least 1 item'),
    (dict(LOCK, ttl_s=1), r'gpuhost:rollout.fleet_lock.ttl_s: 1 - input should be greater than or equal to 5'),
    (dict(LOCK, user='lock'), r'gpuhost:rollout.fleet_lock: a user needs a password and a password a user'),
    (dict(LOCK, cert_file='c.pem'), r'gpuhost:rollout.fleet_lock: cert_file and key_file go together'),
    (dict(LOCK, ca_file='ca.pem'), r'gpuhost:rollout.fleet_lock: ca_file is set, but endpoint http://127.0.0.1:2379 '
                                   r'is http: TLS settings need https endpoints'),
    (dict(LOCK, size=3), r'gpuhost:rollout.fleet_lock.size is not a setting here'),
])
def test_fleet_lock_refusals_name_the_key_the_value_and_the_fix(lock, message):
    with pytest.raises(config.ConfigError, match=message):
        fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'fleet_lock': lock})


def test_the_fleet_lock_reaches_every_hosts_rollout_without_its_password():
    f = fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'fleet_lock': dict(
        LOCK, endpoints=['https://etcd1:2379/', 'https://etcd2:2379'], ca_file='/etc/etcd/ca.pem', user='lock',
        password='pw-not-shown')})
    for i in range(2):
        assert f.rollout_info(i)['fleet_lock'] == {
            'group': 'prod-gpu', 'slots': 2, 'endpoints': ['https://etcd1:2379', 'https://etcd2:2379'], 'ttl_s': 60,
            'user': 'lock', 'ca_file': '/etc/etcd/ca.pem'}
    assert f.fleet_lock_secret() == {'password': 'pw-not-shown'}
    off = fleet(entry('gpu01', 1), entry('gpu02', 2))
    assert 'fleet_lock' not in off.rollout_info(1) and off.fleet_lock_secret() is None


def test_a_fleet_lock_password_must_be_a_secret_and_a_bad_one_is_never_shown():
    data = copy.deepcopy(lab_data())
    data.update(hosts=[entry('gpu01', 1), entry('gpu02', 2)],
                rollout={'fleet_lock': dict(LOCK, user='lock', password='hunter2')})
    plain_rollout = lambda key: key != 'gpuhost:rollout'   # noqa: E731 - the engine's flag: gpuhost:rollout is plain
    with pytest.raises(config.ConfigError) as e:
        config.load.fleet_from_data(data, plain_rollout, None)
    assert str(e.value).startswith('gpuhost:rollout.fleet_lock.password is set as plain text')
    assert 'hunter2' not in str(e.value) and 'pulumi config set --secret --path gpuhost:rollout.fleet_lock.password' \
        in str(e.value)
    assert config.load.fleet_from_data(data, lambda key: True, None).fleet_lock_secret() == {'password': 'hunter2'}
    data['rollout']['fleet_lock']['password'] = 'bad\nline'
    with pytest.raises(config.ConfigError) as e:
        config.load.fleet_from_data(data, lambda key: True, None)
    assert 'gpuhost:rollout.fleet_lock.password' in str(e.value) and 'bad' not in str(e.value)


def test_the_fleet_locks_tls_files_are_read_at_preview(tmp_path):
    (tmp_path / 'ca.pem').write_text('-----BEGIN CERTIFICATE-----\n')
    lock = dict(LOCK, endpoints=['https://etcd1:2379'], ca_file='ca.pem', cert_file='client.pem',
                key_file='client-key.pem')
    f = fleet(entry('gpu01', 1), entry('gpu02', 2), rollout={'fleet_lock': lock})
    with pytest.raises(config.ConfigError) as e:
        config.load.fleet_lock_files(f, str(tmp_path))
    assert str(e.value) == ('gpuhost:rollout.fleet_lock.cert_file: cannot read %s: No such file or directory'
                            % (tmp_path / 'client.pem'))
    (tmp_path / 'client.pem').write_text('cert')
    (tmp_path / 'client-key.pem').write_text('key')
    config.load.fleet_lock_files(f, str(tmp_path))
