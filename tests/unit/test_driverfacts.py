"""hostscripts/driver_facts.sh and its parser (issue 59's first step, docs/driver-plan.md): the NVIDIA driver as
loaded and as installed per kernel - read, never guessed. The parser on the real output of the lent H100 (a machine
with no /lib/modules: said, not guessed), and the script itself with the real modinfo against module trees laid out
by the lab (lab/hostsim.py install_kernel: a module file modinfo and depmod read, as DKMS leaves it)."""

import os
import shutil
import subprocess

import pytest

from lab import hostsim
from tests.lablib import REPO
from transport import driverfacts

GOLDEN = os.path.join(REPO, 'tests', 'unit', 'golden')
SCRIPT = os.path.join(REPO, 'hostscripts', 'driver_facts.sh')


def test_the_real_h100s_driver_is_open_580_and_its_missing_module_tree_is_said_not_guessed():
    with open(os.path.join(GOLDEN, 'driver_facts.h100-device.txt')) as f:
        facts = driverfacts.parse(f.read())
    assert (facts.loaded, facts.flavour, facts.running) == ('580.159.04', 'open', '6.18.44-fc-v1272-gpu')
    assert facts.tree is False and facts.kernels == {} and facts.without_module() == []


def test_a_proprietary_module_and_an_unloaded_one():
    facts = driverfacts.parse('loaded\t550.54.14\nflavour\tNVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  '
                              'Thu Feb 22 01:44:30 UTC 2024\nrunning\t6.8.12-4-pve\n')
    assert facts.flavour == 'proprietary' and facts.tree is True
    facts = driverfacts.parse('running\t6.8.12-4-pve\nkernel\t6.8.12-4-pve\t580.95.05\n')
    assert facts.loaded is None and facts.flavour is None and facts.kernels == {'6.8.12-4-pve': '580.95.05'}


@pytest.mark.skipif(shutil.which('modinfo') is None or shutil.which('depmod') is None, reason='kmod not installed')
def test_each_kernel_with_the_module_it_has_read_by_the_real_modinfo(tmp_path):
    """Two kernels, one with the module DKMS built and one a kernel update left without it: the script, run with
    /lib/modules pointing at the lab's trees (a bind mount in a mount namespace of its own), reads each with modinfo."""
    if subprocess.run(['unshare', '-m', 'true'], capture_output=True).returncode != 0:
        pytest.skip('no mount namespace here')
    host = hostsim.Host.__new__(hostsim.Host)
    host.root = str(tmp_path)
    host.install_kernel('6.8.12-4-pve', '580.95.05')
    host.install_kernel('6.8.12-9-pve')
    made = not os.path.isdir('/lib/modules')     # (a machine without kernels of its own: a container, CI)
    if made:
        os.makedirs('/lib/modules')
    try:
        out = subprocess.run(['unshare', '-m', 'bash', '-c', 'mount --bind "$1" /lib/modules && bash "$2"', 'x',
                              str(tmp_path / 'lib' / 'modules'), SCRIPT], capture_output=True, text=True,
                             check=True).stdout
    finally:
        if made:
            os.rmdir('/lib/modules')
    facts = driverfacts.parse(out)
    assert facts.kernels == {'6.8.12-4-pve': '580.95.05', '6.8.12-9-pve': ''}, out
    assert facts.without_module() == ['6.8.12-9-pve']
