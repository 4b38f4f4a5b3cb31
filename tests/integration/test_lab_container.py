"""The lab's container is a real one: its own root filesystem over a Debian 12 base like Proxmox's
debian-12-standard (nothing of this project in it), real systemd as PID 1, driven through `pct` the way
the program drives a Proxmox container."""

import os
import threading
import time

import hostsim


def test_a_new_container_runs_systemd_as_pid_1_and_has_nothing_of_ours(lab):
    lab.create_ct(200, hostname='sglang', dev0='/dev/nvidia0')
    assert lab.ssh('pct exec 200 -- ps -p 1 -o comm=').stdout == 'systemd\n'
    assert lab.ssh('pct exec 200 -- hostname').stdout == 'sglang\n'
    assert lab.ssh('pct exec 200 -- cat /etc/os-release').stdout.startswith('PRETTY_NAME="Debian GNU/Linux 12')
    # Bare as a fresh template: python3, but no SGLang, no virtualenv support, no pip, no NVIDIA user space.
    res = lab.ssh('pct exec 200 -- sh -c "test -e /opt/sglang; echo sglang=\\$?; command -v python3; '
                  'python3 -c \'import ensurepip\' 2>/dev/null; echo ensurepip=\\$?; ls /usr/lib/x86_64-linux-gnu | '
                  'grep -c -e libcuda -e libnvidia-ml || true; command -v nvidia-smi pip pip3 || true"')
    assert res.stdout == 'sglang=1\n/usr/bin/python3\nensurepip=1\n0\n', res
    # The device nodes its devN entries name are there, as LXC binds them (and no others).
    assert lab.ssh('pct exec 200 -- stat -c "%F %t:%T" /dev/nvidia0').stdout == 'character special file c3:0\n'
    assert lab.ssh('pct exec 200 -- test -e /dev/nvidia1').exit_code == 1


def test_systemd_runs_units_as_written(lab):
    """A unit with a drop-in, EnvironmentFile= and $ expansion, enabled and started through pct: what
    systemd itself does, journal included."""
    root = lab.ct_root(200)
    hostsim.write(os.path.join(root, 'etc/systemd/system/echo.service'),
                  '[Service]\nEnvironmentFile=/etc/echo.env\nEnvironment=A=from-unit\n'
                  'ExecStart=/bin/sh -c \'echo "A=$A B=$B"; exec sleep 1000\'\n[Install]\nWantedBy=multi-user.target\n')
    hostsim.write(os.path.join(root, 'etc/echo.env'), 'B="from file"\n')
    hostsim.write(os.path.join(root, 'etc/systemd/system/echo.service.d/override.conf'),
                  '[Service]\nEnvironment=A=from-dropin\n')
    assert lab.ssh('pct exec 200 -- systemctl daemon-reload && pct exec 200 -- systemctl enable --now echo').exit_code == 0
    show = lab.ssh('pct exec 200 -- systemctl show echo -p ActiveState -p UnitFileState -p DropInPaths').stdout
    assert dict(line.split('=', 1) for line in show.splitlines()) == {
        'ActiveState': 'active', 'UnitFileState': 'enabled',
        'DropInPaths': '/etc/systemd/system/echo.service.d/override.conf'}
    assert lab.unit_starts('echo.service') == 1
    lab.wait_for(lambda: 'A=from-dropin B=from file' in lab.ssh('pct exec 200 -- journalctl -u echo -o cat').stdout,
                 what='the unit\'s output in its journal')
    assert lab.unit_pid('echo.service') > 1


def test_pct_push_and_pull_go_through_the_container(lab):
    assert lab.ssh('printf data > /tmp/f && pct push 200 /tmp/f /root/f --perms 0600').exit_code == 0
    assert lab.ssh('pct exec 200 -- stat -c "%a %U %s" /root/f').stdout == '600 root 4\n'
    res = lab.ssh('pct push 200 /tmp/f /nowhere/f')
    assert (res.exit_code, res.stderr) == (255, 'failed to open /nowhere/f for writing: No such file or directory\n')
    assert lab.ssh('pct pull 200 /root/f /tmp/g && cat /tmp/g').stdout == 'data'
    assert lab.ssh('pct exec 200 -- sh -c "exit 7"').exit_code == 7
    # stdin, stdout and stderr are the command's own; a signal that ends it ends pct the same way.
    res = lab.ssh('pct exec 200 -- sh -c "tr a-z A-Z; echo err >&2"', stdin='piped\n')
    assert (res.exit_code, res.stdout, res.stderr) == (0, 'PIPED\n', 'err\n')
    assert lab.ssh('pct exec 200 -- sh -c \'kill -TERM $$\'; echo $?').stdout == '143\n'


def test_pct_exec_outlives_its_ssh_session_and_reaches_the_containers_systemd(lab):
    """As with lxc-attach: a command pct started keeps running when the SSH connection drops."""
    session = threading.Thread(target=lambda: lab.ssh('pct exec 200 -- sh -c "sleep 1; echo ran on > /root/survivor"',
                                                      timeout=30))
    session.start()
    lab.wait_for(lambda: any('survivor' in (e['command'] or '') for e in lab.ssh_log()), what='the session')
    time.sleep(0.3)
    assert lab.kill_ssh_sessions() >= 1
    session.join(10)
    lab.wait_for(lambda: os.path.exists(os.path.join(lab.ct_root(200), 'root/survivor')), what='the command done')
    assert open(os.path.join(lab.ct_root(200), 'root/survivor')).read() == 'ran on\n'
    # systemd-run through pct: a transient unit of the container's systemd, not the host's.
    assert lab.ssh('pct exec 200 -- systemd-run --unit=lab-transient --collect sleep 600').exit_code == 0
    assert lab.ssh('pct exec 200 -- systemctl is-active lab-transient').stdout == 'active\n'
    assert lab.ssh('systemctl is-active lab-transient').stdout == 'inactive\n'
    assert lab.ssh('pct exec 200 -- systemctl stop lab-transient').exit_code == 0


def test_a_stopped_container_cannot_be_entered_and_keeps_its_files(lab):
    lab.create_ct(201, hostname='other')
    assert lab.ssh('pct exec 201 -- touch /root/kept').exit_code == 0
    lab.node().lxc(201).status.stop.post()
    lab.wait_for(lambda: lab.ct(201).leader() is None, what='container 201 down')
    res = lab.ssh('pct exec 201 -- true')
    assert (res.exit_code, res.stderr) == (255, 'CT 201 not running\n')
    lab.node().lxc(201).status.start.post()
    lab.wait_for(lambda: lab.ct(201).leader() is not None, what='container 201 up')
    assert lab.ssh('pct exec 201 -- ls /root').stdout == 'kept\n'
    lab.node().lxc(201).status.stop.post()
    lab.wait_for(lambda: lab.ct(201).leader() is None, what='container 201 down')
    lab.node().lxc(201).delete()
    lab.wait_for(lambda: not os.path.exists(os.path.join(lab.dir, 'ct', '201')), what='container 201 gone')


def test_a_power_task_ends_with_the_container_there_and_pct_never_enters_a_dying_one(lab):
    """On Proxmox a container's reboot, stop or start task ends once the container is down or its init runs again,
    and `pct exec` into a container that is not running says so. The lab boots and stops its containers
    asynchronously: the task waits for them, and pct refuses a container whose shutdown has begun."""
    node = lab.api().nodes(lab.info['node'])
    task = lambda upid: node.tasks(upid).status.get()   # noqa: E731
    # A unit that takes 2 s to stop holds the container's shutdown (systemd stops it at poweroff).
    hostsim.write(os.path.join(lab.ct_root(200), 'etc/systemd/system/slowstop.service'),
                  '[Service]\nExecStart=/bin/sleep infinity\nExecStop=/bin/sleep 2\n')
    assert lab.ssh('pct exec 200 -- systemctl daemon-reload && pct exec 200 -- systemctl start slowstop && '
                   'pct exec 200 -- touch /run/this-boot').exit_code == 0
    leader = lab.ct(200).leader()
    t0 = time.time()
    upid = node.lxc(200).status.reboot.post()
    res = lab.ssh('pct exec 200 -- true')
    assert (res.exit_code, res.stderr) == (255, 'CT 200 not running\n')
    assert task(upid)['status'] == 'running'
    lab.wait_for(lambda: task(upid)['status'] == 'stopped', timeout=30, what='the reboot task')
    assert time.time() - t0 >= 2 and task(upid)['exitstatus'] == 'OK'
    assert lab.ct(200).leader() not in (None, leader)
    # Right after the task: the new boot (its own /run), not the old one going down.
    assert lab.ssh('pct exec 200 -- test -e /run/this-boot').exit_code == 1
    upid = node.lxc(200).status.stop.post()
    lab.wait_for(lambda: task(upid)['status'] == 'stopped', timeout=30, what='the stop task')
    assert lab.ct(200).leader() is None
    upid = node.lxc(200).status.start.post()
    lab.wait_for(lambda: task(upid)['status'] == 'stopped', timeout=30, what='the start task')
    assert lab.ssh('pct exec 200 -- ps -p 1 -o comm=').stdout == 'systemd\n'
