"""`pulumi preview` of the production stack works with no network at all: the program contacts no
host during preview, and the production address is a DNS name that does not resolve from here."""

import os
import re
import shutil
import socket
import subprocess

import pytest

from tests.lablib import PROJECT_FILES, REPO

PROD_EXAMPLE_PASSPHRASE = 'gpuhost-prod-example'


@pytest.fixture
def project(tmp_path):
    proj = tmp_path / 'project'
    proj.mkdir()
    for name in PROJECT_FILES + ('Pulumi.prod.yaml', 'runtime'):
        src = os.path.join(REPO, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, proj / name)
    os.symlink(os.path.join(REPO, '.venv'), proj / '.venv')
    env = dict(os.environ, PULUMI_BACKEND_URL='file://%s' % (tmp_path / 'state'),
               PULUMI_HOME=str(tmp_path / 'home'), PULUMI_CONFIG_PASSPHRASE=PROD_EXAMPLE_PASSPHRASE,
               PULUMI_SKIP_UPDATE_CHECK='true')
    (tmp_path / 'state').mkdir()
    # pulumi-command's plugin (the smoke test), from the binary bootstrap cached: no download.
    subprocess.run([os.path.join(REPO, 'tools', 'install-command-plugin.sh'), env['PULUMI_HOME']], env=env,
                   check=True, capture_output=True)
    subprocess.run(['pulumi', 'stack', 'select', '--create', '--secrets-provider', 'passphrase', 'prod'],
                   cwd=proj, env=env, check=True, capture_output=True)
    return proj, env


def test_prod_address_does_not_resolve_here():
    with pytest.raises(OSError):
        socket.getaddrinfo('pve-gpu01.inference.example.internal', 22)


def test_prod_preview_succeeds_in_a_network_namespace_without_network(project):
    if os.geteuid() != 0:
        pytest.fail('unshare -n needs root (run the suite as root)')
    proj, env = project
    # Only a loopback of its own (the CLI talks to its plugins over it); no route anywhere else.
    res = subprocess.run(['unshare', '-n', 'sh', '-c', 'ip link set lo up && exec pulumi preview --diff'],
                         cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    # (16 resources and the host's provider instance)
    assert '17 to create' in out, out[-1500:]
    # The VM's GPUs through one PCI resource mapping each: what preview says it will create (the IDs and IOMMU
    # group are read from the host at apply), and the VM naming them.
    for i, bdf in enumerate(['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']):
        assert re.search(r'gpuhost-300-gpu%d\s*: \{\s*id\s*: "10de:2bb5"\s*path: "%s"' % (i, bdf), out), out[-6000:]
        # (the CLI pads a key to its map's longest one)
        assert re.search(r'hostpci%d\s*: "mapping=gpuhost-300-gpu%d,pcie=1"' % (i, i), out), out[-6000:]
    assert re.search(r'\+ gpuhost:index:PciMappings: \(create\)\s*\[urn=\S*::vm-pci-mappings\]', out), \
        out[-6000:]
    # Secrets stay secrets in the plan.
    assert 'placeholder-not-the-real-password' not in out
    assert 'BEGIN OPENSSH PRIVATE KEY' not in out
    # The OpenAI endpoint's key is on for prod: the unit takes it from its root-only environment file.
    assert '${SGLANG_API_KEY}' in out
    assert 'placeholder-sglang-api-key' not in out
