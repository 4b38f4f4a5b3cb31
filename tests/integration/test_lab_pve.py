"""fakepve's scenarios through the lab's control interface (lab.pve_set / lab.pve_reset), each seen
through proxmoxer as the program sees it: status code and message."""

import time

import proxmoxer
import pytest
import requests

NODE = 'pve-lab'


@pytest.fixture(scope='module')
def ct(lab):
    lab.create_ct(200)
    yield
    lab.pve_reset()


@pytest.fixture
def api(lab, ct):
    lab.pve_reset()
    return lab.api()


def error(fn):
    with pytest.raises(proxmoxer.ResourceException) as e:
        fn()
    return e.value.status_code, e.value.content


def task_exit(api, upid):
    return api.nodes(NODE).tasks(upid).status.get().get('exitstatus')


def test_lost_quorum_fails_writes_not_reads(lab, api):
    lab.pve_set(quorate=False)
    ct = api.nodes(NODE).lxc(200)
    assert ct.config.get()['hostname'] == 'ct200'
    assert error(lambda: ct.config.put(cores=4)) == (500, 'cluster not ready - no quorum?')
    assert error(lambda: api.nodes(NODE).lxc.post(vmid=201, ostemplate=lab.info['template'])) == \
        (500, 'cluster not ready - no quorum?')
    lab.pve_set(quorate=True)
    ct.config.put(cores=4)


def test_offline_node(lab, api):
    lab.pve_set(node_online=(NODE, False))
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (595, 'No route to host')
    assert error(lambda: api.nodes(NODE).lxc(200).config.put(cores=4)) == (595, 'No route to host')
    lab.pve_reset()
    assert api.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'


def test_guest_lock(lab, api):
    ct = api.nodes(NODE).lxc(200)
    lab.pve_set(lock=(200, 'backup'))
    assert ct.config.get()['lock'] == 'backup'
    assert error(lambda: ct.config.put(cores=4)) == (500, 'CT is locked (backup)')
    assert task_exit(api, ct.status.shutdown.post()) == 'CT is locked (backup)'
    lab.pve_set(unlock=200)
    ct.config.put(cores=4)


def test_held_config_lock_times_out(lab, api):
    ct = api.nodes(NODE).lxc(200)
    lab.pve_set(hold_config_lock=(200, None))
    assert error(lambda: ct.config.put(cores=4)) == (500, "can't lock file '/run/lock/lxc/pve-config-200.lock' - got timeout")
    # With time running, a write waits lock_wait (PVE seconds x time_scale) before it gives up;
    # a lock held for a while is released by itself.
    lab.pve_set(time_scale=1.0, lock_wait=0.5)
    t0 = time.time()
    error(lambda: ct.config.put(cores=4))
    assert time.time() - t0 >= 0.5
    lab.pve_set(release_config_lock=200, hold_config_lock=(200, 0.3))
    ct.config.put(cores=4)
    lab.pve_reset()


@pytest.mark.parametrize('op', ['revoke_tickets', 'expire_tickets'])
def test_tickets_gone(lab, api, op):
    lab.pve_set(**{op: True})
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (401, 'permission denied - invalid PVE ticket')
    assert lab.api().nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'  # a new login works


def test_flaky_network(lab, api):
    p = lab.info['pve']
    slow = proxmoxer.ProxmoxAPI(p['host'], port=p['port'], user='root@pam', password=open(p['password_file']).read(),
                                verify_ssl=p['cafile'], timeout=0.5)
    lab.pve_set(network={'drop_rate': 1.0})
    with pytest.raises(requests.exceptions.ConnectionError):
        api.nodes(NODE).lxc(200).config.get()
    with pytest.raises(requests.exceptions.ConnectionError):
        lab.api()  # the login too
    lab.pve_set(network={'drop_rate': 0.0, 'hang_rate': 1.0, 'hang_secs': 5})
    with pytest.raises(requests.exceptions.ReadTimeout):
        slow.nodes(NODE).lxc(200).config.get()
    lab.pve_reset()
    assert slow.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'


def test_slow_tasks_and_start_error(lab, api):
    ct = api.nodes(NODE).lxc(200)
    ct.status.stop.post()
    lab.pve_set(time_scale=1.0, guest_secs=(200, {'start': 1.0}))
    upid = ct.status.start.post()
    assert api.nodes(NODE).tasks(upid).status.get()['status'] == 'running'
    lab.wait_for(lambda: task_exit(api, upid) == 'OK', what='the slow start')
    ct.status.stop.post()
    lab.pve_set(time_scale=0, start_error=(200, 'startup for container 200 failed'))
    assert task_exit(api, ct.status.start.post()) == 'startup for container 200 failed'
    lab.pve_reset()
    assert task_exit(api, ct.status.start.post()) == 'OK'


def test_fail_and_bad_operations(lab, api):
    lab.pve_set(fail=[{'method': 'GET', 'suffix': '/lxc/200/config', 'status': 500, 'message': 'boom', 'times': 1}])
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (500, 'boom')
    assert api.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'
    with pytest.raises(ValueError, match='unknown pve-set operation'):
        lab.pve_set(bogus=1)
    with pytest.raises(ValueError, match='no guest 999'):
        lab.pve_set(lock=(999, 'backup'))
