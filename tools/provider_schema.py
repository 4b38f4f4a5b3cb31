"""python -m tools.provider_schema: provider/schema.json, the gpuhost plugin's Pulumi package schema (what
`pulumi package get-schema ./provider` prints and an SDK would be generated from).

Every custom resource the plugin serves, with the input properties the program gives it - read from the program
itself, run under the unit tests' mocks (tests/unit/program.py) for the repository's lab stack and a two-host
fleet, so no input is missing and none is made up - secret ones marked (provider/registry.py SECRET_INPUTS), and
as output properties the same keys plus the facts each class reports (its OUTPUTS). `make docs` writes it;
tests/unit/test_provider.py compares the committed file with what this produces."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PATH = os.path.join(ROOT, 'provider', 'schema.json')
ANY = {'$ref': 'pulumi.json#/Any'}


def declared_inputs() -> dict:
    """{type token: {input key, ...}} as the program registers its custom resources (lab stack + fleet)."""
    import config
    from lab import fleet
    from tests.unit.config.test_config import lab_data
    from tests.unit.program import run_program
    from tests.unit.test_runtime import FILES
    entries = [fleet.host_entry(i, fleet.host_spec(i, fleet.addresses(i)), '.lab-fleet/gpu%02d' % i) for i in (1, 2)]
    two = {k.split(':', 1)[1]: v for k, v in fleet.stack_config(entries).items()}
    found = {}
    for data in (lab_data(), two):
        for r in run_program(config.parse_fleet(data), FILES)['resources']:
            if r.typ.startswith('gpuhost:index:') and r.custom:
                found.setdefault(r.typ, set()).update(r.inputs)
    return found


def schema() -> dict:
    from provider import registry
    inputs = declared_inputs()
    resources = {}
    for name in sorted(registry.CLASSES):
        token = registry.token(name)
        cls = registry.provider_for(token, {}).__class__
        keys = sorted(set(inputs.get(token, ())) | set(registry.OPTIONAL_INPUTS.get(name, ())))
        outputs = sorted(set(keys) | set(getattr(cls, 'OUTPUTS', ())))

        def prop(key):
            return dict(ANY, secret=True) if key in registry.SECRET_INPUTS else dict(ANY)
        resources[token] = {
            'description': registry.describe(name),
            'inputProperties': {k: prop(k) for k in keys},
            'properties': {k: prop(k) for k in outputs},
        }
    with open(os.path.join(ROOT, 'provider', 'VERSION')) as f:
        version = f.read().strip()
    return {
        'name': registry.PACKAGE,
        'version': version,
        'description': 'An 8-GPU Proxmox inference host (IOMMU, vfio-pci, LXC + SEV-SNP VM, SGLang with MTP): the '
                       'custom resources of the gpuhost program.',
        'provider': {'description': 'One instance per host: its SSH connection and Proxmox API login, held once.',
                     'inputProperties': {k: dict(ANY, secret=True) for k in ('api', 'connection')},
                     'requiredInputs': ['api', 'connection']},
        'resources': resources,
    }


def text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + '\n'


if __name__ == '__main__':
    from tools.docs import write_atomic
    write_atomic(PATH, text())
    print('wrote %s' % os.path.relpath(PATH, ROOT))
