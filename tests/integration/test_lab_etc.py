"""The lab's /etc is safe to edit from both sides: a test editing a file of the simulated host in
place (what an editor does) or replacing it (what the lab daemon does), and the program replacing it
atomically over SSH (temp file + mv), all work, repeatedly, and each side sees the other's write at
once. /etc/pve behaves like pmxcfs: an edit
of a guest's config file is what the API reports, an API change is what the file holds."""

import os

import pytest

import hostsim

PATHS = ('/etc/pve/lxc/200.conf', '/etc/kernel/cmdline', '/etc/modprobe.d/lab-test.conf',
         '/etc/driverctl.d/lab-test', '/etc/default/lab-test')

# What the program does to replace a file (hostscripts/put_file.sh): temp file + mv. With
# `show`, it first prints what the host sees there now.
ATOMIC = '''set -euo pipefail
path=$1
if [ "${2:-}" = show ]; then cat "$path"; echo "--- was"; fi
tmp=$(mktemp "$(dirname "$path")/.gpuhost.XXXXXX")
cat > "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$path"
cat "$path"
'''


@pytest.fixture(scope='module')
def ct(lab):
    return lab.create_ct(200, start=False)


def replace(path, text):
    """What labd and hostsim do: a new file renamed over the old one (on the overlay's upper layer this
    left the namespace's view stale and every later mv there failing with ESTALE)."""
    hostsim.write(path, text)


def edit_in_place(path, text):
    with open(path, 'r+') as f:
        f.read()
        f.seek(0)
        f.truncate()
        f.write(text)


@pytest.mark.parametrize('edit', [edit_in_place, replace], ids=['in-place', 'replace'])
@pytest.mark.parametrize('path', PATHS)
def test_edit_from_outside_then_atomic_write_over_ssh(lab, ct, path, edit):
    outside = lab.host.path(path.lstrip('/'))
    if not path.startswith('/etc/pve/'):
        with open(outside, 'a'):
            pass
    base = open(outside).read()
    for i in range(2):  # the failure was for ever: every later mv failed too
        mine = base + 'lxc.test.outside: %d\n' % i
        edit(outside, mine)
        theirs = base + 'lxc.test.inside: %d\n' % i
        res = lab.ssh_script(ATOMIC, path, 'show', stdin=theirs)
        assert res.exit_code == 0 and 'Stale file handle' not in res.stderr, res
        assert res.stdout == mine + '--- was\n' + theirs
        assert open(outside).read() == theirs


def test_file_edit_reaches_the_api_and_api_change_reaches_the_file(lab, ct):
    conf = lab.host.path('etc/pve/lxc/200.conf')
    lab.wait_for(lambda: 'hostname: ct200' in open(conf).read(), what='the API view in the file')
    text = open(conf).read()
    # By hand on the host (as `nano /etc/pve/lxc/200.conf` would): the API reports it, typed.
    edit_in_place(conf, text.replace('memory: 1024', 'memory: 2048') + 'cores: 6\nlxc.cgroup2.cpuset.cpus: 0-3\n')
    lab.wait_for(lambda: ct.config.get().get('cores') == 6, what='the file edit in the API')
    cfg = ct.config.get()
    assert cfg['memory'] == 2048 and 'lxc.cgroup2.cpuset.cpus' not in str(cfg)
    # Through the API: the file follows and keeps the raw lxc.* line, which only the file holds.
    ct.config.put(cores=4)
    lab.wait_for(lambda: 'cores: 4\n' in open(conf).read(), what='the API change in the file')
    assert 'lxc.cgroup2.cpuset.cpus: 0-3\n' in open(conf).read()
    assert lab.ssh('cat /etc/pve/lxc/200.conf').stdout == open(conf).read()
    # Over SSH, atomically (what the program does for raw lines): same.
    new = open(conf).read().replace('cores: 4', 'cores: 2')
    assert lab.ssh_script(ATOMIC, '/etc/pve/lxc/200.conf', stdin=new).exit_code == 0
    lab.wait_for(lambda: ct.config.get().get('cores') == 2, what='the SSH write in the API')


def test_dev_is_the_hosts_own(lab):
    """/dev is the host's own tmpfs, changed from inside the host (on_host); at every boot it gets the nodes the
    nvidia driver makes (LAB/host/dev, where the containers' devN entries bind them from: test_lab_reboot.py)."""
    assert lab.ssh('test -c /dev/nvidia3').exit_code == 0
    assert lab.on_host('rm /dev/nvidia3').exit_code == 0
    assert lab.ssh('test -e /dev/nvidia3').exit_code == 1
    assert os.path.exists(lab.host.path('dev/nvidia3')), 'the driver\'s node stays for the next boot'
    assert lab.on_host('mknod -m 666 /dev/nvidia3 c 195 3 && hostname').stdout == 'pve-lab\n'
    assert lab.ssh('stat -c %t:%T /dev/nvidia3').stdout == 'c3:3\n'
