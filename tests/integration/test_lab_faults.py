"""The lab's tool fault hooks: a fake host tool that fails or hangs, systemctl failing inside a real
container (real systemd underneath); clear_faults() undoes them."""

import os
import socket
import subprocess

import pytest

import hostsim


def running(pattern):
    return subprocess.run(['pgrep', '-f', pattern], capture_output=True).returncode == 0


def test_failing_tool(lab):
    lab.fail_tool('proxmox-boot-tool.refresh', 'E: mount of /dev/disk/by-uuid/7A3B-1C2D failed')
    res = lab.ssh('proxmox-boot-tool refresh')
    assert (res.exit_code, res.stderr) == (1, 'E: mount of /dev/disk/by-uuid/7A3B-1C2D failed\n')
    assert lab.ssh('proxmox-boot-tool status').exit_code == 0  # another subcommand
    lab.clear_faults()
    assert lab.ssh('proxmox-boot-tool refresh').exit_code == 0


def test_hanging_tool_hangs_until_the_client_gives_up(lab):
    lab.hang_tool('update-initramfs')
    with pytest.raises(socket.timeout):
        lab.ssh('update-initramfs -u -k all', timeout=1.5)
    # The client is gone, so is its command (no hang outlives the test).
    lab.wait_for(lambda: not running('sbin/update-initramfs'), what='the hung tool to end')
    lab.clear_faults()
    assert lab.ssh('update-initramfs -u -k all').exit_code == 0


@pytest.fixture(scope='module')
def unit(lab):
    lab.create_ct(200)
    hostsim.write(os.path.join(lab.ct_root(200), 'etc/systemd/system/demo.service'),
                  '[Service]\nExecStart=/bin/sleep 1000\n[Install]\nWantedBy=multi-user.target\n')
    assert lab.ssh('pct exec 200 -- systemctl daemon-reload && pct exec 200 -- systemctl enable --now demo').exit_code == 0
    return 'demo.service'


def test_systemctl_restart_fails_in_the_container_as_systemd_fails_it(lab, unit):
    """The fault is systemd's own: the start job's control process fails, systemd prints its message and
    leaves the unit failed; nothing of it stays behind (no drop-in, the next restart works)."""
    starts = lab.unit_starts(unit)
    lab.fail_systemctl('restart')
    res = lab.ssh('pct exec 200 -- systemctl restart %s' % unit)
    assert res.exit_code == 1
    assert res.stderr == ('Job for demo.service failed because the control process exited with error code.\n'
                          'See "systemctl status demo.service" and "journalctl -xeu demo.service" for details.\n')
    show = lab.ssh('pct exec 200 -- systemctl show %s -p ActiveState -p Result' % unit).stdout
    assert sorted(show.splitlines()) == ['ActiveState=failed', 'Result=exit-code']
    assert lab.unit_starts(unit) == starts
    assert lab.ct_exec(['test', '-e', '/run/systemd/system/demo.service.d'], check=False).returncode == 1
    lab.clear_faults()
    assert lab.ssh('pct exec 200 -- systemctl restart %s' % unit).exit_code == 0
    assert lab.unit_starts(unit) == starts + 1
    assert lab.ssh('pct exec 200 -- systemctl is-active %s' % unit).stdout == 'active\n'


@pytest.mark.parametrize('cmd, message', [
    ('daemon-reload', 'Failed to reload daemon: Connection timed out'),
    ('enable', 'Failed to enable unit: Input/output error'),
    ('start', None),
])
def test_systemctl_other_commands_fail_with_their_message(lab, unit, cmd, message):
    if cmd == 'start':
        assert lab.ssh('pct exec 200 -- systemctl stop %s' % unit).exit_code == 0
    lab.fail_systemctl(cmd)
    argv = 'systemctl %s %s' % (cmd, '' if cmd == 'daemon-reload' else unit)
    res = lab.ssh('pct exec 200 -- ' + argv)
    assert res.exit_code == 1
    assert res.stderr.startswith(message or 'Job for demo.service failed because'), res
    lab.fail_systemctl(cmd, 'custom {unit}')
    assert lab.ssh('pct exec 200 -- ' + argv).stderr == 'custom %s\n' % ('' if cmd == 'daemon-reload' else unit)
    lab.clear_faults()
    assert lab.ssh('pct exec 200 -- ' + argv).exit_code == 0
