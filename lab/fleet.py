"""A fleet lab: N simulated hosts, each a lab of its own (fakepve, sshd, simulated host) on its own
loopback addresses, and the `fleet` stack's config aimed at them.

    python -m lab.fleet up [--hosts N]     start N hosts (default 4) unless running; write Pulumi.lab-fleet.yaml
    python -m lab.fleet down               stop them and wipe .lab-fleet
    python -m lab.fleet status

Host i (1-based) is named gpuNN, lives in .lab-fleet/gpuNN and answers on 127.1.i.2 (Proxmox API),
127.1.i.3 (SSH) and 127.1.i.4 (its container). The topologies cycle, so any N >= 4 mixes them all:

    1  systemd-boot, 8 GPUs, container + SEV-SNP VM     (the reference host, lab/spec/default.json)
    2  GRUB                                              (update-grub instead of proxmox-boot-tool)
    3  no VM: the four NUMA1 GPUs stay with the host     (gpuhost:hosts[].vm: null)
    4  another GPU inventory (other PCI addresses)

The stack's config is Pulumi.lab.yaml's as the shared settings, plus one gpuhost:hosts entry per host
with what differs (its addresses, credentials, node, topology). tests/lablib.py builds fleets of its own
from the same functions.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys

import yaml

from lab import hostsim, pyindex

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_DIR = os.path.join(REPO, '.lab-fleet')
STACK_FILE = os.path.join(REPO, 'Pulumi.lab-fleet.yaml')

OTHER_INVENTORY = [('0000:17:00.0', 0), ('0000:2a:00.0', 0), ('0000:3d:00.0', 0), ('0000:63:00.0', 0),
                   ('0000:9a:00.0', 1), ('0000:ab:00.0', 1), ('0000:ba:00.0', 1), ('0000:db:00.0', 1)]
TOPOLOGIES = ('systemd-boot', 'grub', 'no-vm', 'other-gpus')


def name_of(i: int) -> str:
    return 'gpu%02d' % i


def topology(i: int) -> str:
    return TOPOLOGIES[(i - 1) % len(TOPOLOGIES)]


def host_spec(i: int, addresses: dict, base: dict = None) -> dict:
    """The simulated host i: lab/spec/default.json with its node name, addresses and topology."""
    if base is None:
        with open(os.path.join(HERE, 'spec', 'default.json')) as f:
            base = json.load(f)
    spec = copy.deepcopy(base)
    spec['node'] = 'pve-%s' % name_of(i)
    spec['addresses'] = dict(addresses)
    kind = topology(i)
    if kind == 'grub':
        spec['boot'] = 'grub'
        spec['cmdline'] = 'root=/dev/mapper/pve-root ro quiet'
    elif kind == 'other-gpus':
        spec['gpus'] = [{'bdf': bdf, 'id': '10de:2bb5', 'numa': numa, 'driver': 'nvidia', 'group': 60 + n}
                        for n, (bdf, numa) in enumerate(OTHER_INVENTORY)]
    spec['comment'] = 'fleet host %s: %s' % (name_of(i), kind)
    return spec


def host_entry(i: int, spec: dict, lab_dir: str) -> dict:
    """Host i's gpuhost:hosts entry: what differs from the shared settings. lab_dir: the host's lab
    directory relative to the project (credentials are files the lab generates)."""
    a = spec['addresses']
    entry = {'name': name_of(i),
             'host': {'address': a['ssh'], 'node': spec['node'],
                      'ssh': {'host_key_file': '%s/ssh/ssh_host_ed25519_key.pub' % lab_dir,
                              'private_key_file': '%s/ssh/id_ed25519' % lab_dir},
                      'api': {'address': a['pve'], 'password_file': '%s/secrets/pve-password' % lab_dir,
                              'ca_file': '%s/pve/fakepve.crt' % lab_dir}},
             'container': {'ip': '%s/8' % a['container']},
             # Each host's lab serves its own package index and wrote its own lock (the same wheels: the same lock).
             'runtime': {'python': {'lock': '%s/runtime/sglang.lock' % lab_dir,
                                    'index': {'url': 'http://%s:%d/simple' % (a.get('index', a['pve']), pyindex.PORT),
                                              'password_file': '%s/secrets/index-password' % lab_dir}}}}
    model = lab_model()
    if model and model.get('checksums'):
        # Each host's lab built the same model on its own host storage and wrote its checksum file.
        entry['model'] = {'checksums': '%s/model/%s.sha256' % (lab_dir, model['id'])}
    kind = topology(i)
    if kind == 'no-vm':
        entry['vm'] = None
    elif kind == 'other-gpus':
        entry['host']['gpus'] = [{'address': g['bdf'], 'numa': g['numa'], 'id': g['id']} for g in spec['gpus']]
        entry['container']['gpus'] = [g['bdf'] for g in spec['gpus'] if g['numa'] == 0]
        entry['vm'] = {'gpus': [g['bdf'] for g in spec['gpus'] if g['numa'] == 1]}
    return entry


def lab_model():
    """Pulumi.lab.yaml's gpuhost:model (lab/labmodel.py builds it on every lab host), or None."""
    with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
        return (yaml.safe_load(f)['config'] or {}).get('gpuhost:model')


def shared_config() -> dict:
    """Pulumi.lab.yaml's config without what each host sets for itself."""
    with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
        cfg = copy.deepcopy(yaml.safe_load(f)['config'])
    host = cfg['gpuhost:host']
    for key in ('address', 'node'):
        host.pop(key, None)
    for key in ('host_key_file', 'private_key_file'):
        host['ssh'].pop(key, None)
    for key in ('address', 'password_file', 'ca_file'):
        host['api'].pop(key, None)
    cfg['gpuhost:container'].pop('ip', None)
    python = cfg['gpuhost:runtime']['python']
    python.pop('lock', None)
    for key in ('url', 'password_file'):
        python['index'].pop(key, None)
    if cfg.get('gpuhost:model'):
        cfg['gpuhost:model'].pop('checksums', None)   # each host's lab wrote its own (host_entry)
    return cfg


def stack_config(entries: list, max_unavailable: int = 1) -> dict:
    cfg = shared_config()
    cfg['gpuhost:hosts'] = entries
    cfg['gpuhost:rollout'] = {'max_unavailable': max_unavailable}
    return cfg


def addresses(i: int) -> dict:
    return {'pve': '127.1.%d.2' % i, 'ssh': '127.1.%d.3' % i, 'container': '127.1.%d.4' % i}


def labctl(lab: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'lab.labctl', '--lab', lab] + list(args), cwd=REPO,
                           capture_output=True, text=True)


def hosts_present(root: str) -> list:
    if not os.path.isdir(root):
        return []
    return sorted(n for n in os.listdir(root) if n.startswith('gpu') and os.path.isdir(os.path.join(root, n)))


def up(root: str, n: int) -> dict:
    """Start hosts 1..n (those running stay; hosts beyond n are stopped) and write Pulumi.lab-fleet.yaml."""
    os.makedirs(root, exist_ok=True)
    for extra in hosts_present(root)[n:]:
        labctl(os.path.join(root, extra), 'down')
    entries, started = [], []
    for i in range(1, n + 1):
        lab = os.path.join(root, name_of(i))
        spec = host_spec(i, addresses(i))
        spec_path = os.path.join(root, '%s.spec.json' % name_of(i))
        hostsim.write(spec_path, json.dumps(spec, indent=2) + '\n')
        res = labctl(lab, 'up', '--spec', spec_path)
        if res.returncode != 0:
            sys.exit('lab host %s did not start:\n%s' % (name_of(i), res.stderr[-3000:]))
        if json.loads(res.stdout.strip().splitlines()[0]).get('started'):
            started.append(name_of(i))
        entries.append(host_entry(i, spec, os.path.relpath(lab, REPO)))
    doc = {'config': stack_config(entries)}
    # Atomically: a `pulumi` reading the stack file meanwhile sees the old one or the new one.
    hostsim.write(STACK_FILE, '# The fleet lab\'s stack (python -m lab.fleet up --hosts %d, `make lab HOSTS=%d`): '
                              'generated, not\n# committed. The shared settings are Pulumi.lab.yaml\'s; each '
                              'gpuhost:hosts entry says what differs.\n' % (n, n)
                  + yaml.safe_dump(doc, sort_keys=False, width=120))
    return {'hosts': [name_of(i) for i in range(1, n + 1)], 'started': started, 'stack_file': STACK_FILE}


def down(root: str) -> None:
    for name in hosts_present(root):
        labctl(os.path.join(root, name), 'down')
    if os.path.isdir(root):
        shutil.rmtree(root)


def main(argv=None):
    ap = argparse.ArgumentParser(prog='lab.fleet', description=__doc__.splitlines()[0])
    ap.add_argument('--dir', default=DEFAULT_DIR)
    sub = ap.add_subparsers(dest='cmd', required=True)
    p_up = sub.add_parser('up')
    p_up.add_argument('--hosts', type=int, default=4)
    sub.add_parser('down')
    sub.add_parser('status')
    args = ap.parse_args(argv)
    root = os.path.abspath(args.dir)
    if args.cmd == 'up':
        if not 1 <= args.hosts <= 64:
            sys.exit('--hosts: 1 to 64')
        print(json.dumps(up(root, args.hosts)))
    elif args.cmd == 'down':
        down(root)
        print(json.dumps({'stopped': True}))
    else:
        out = {}
        for name in hosts_present(root):
            res = labctl(os.path.join(root, name), 'status')
            out[name] = json.loads(res.stdout or '{}').get('running', False)
        print(json.dumps(out))


if __name__ == '__main__':
    main()
