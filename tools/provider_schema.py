"""python -m tools.provider_schema: provider/schema.json, the gpuhost plugin's Pulumi package schema (what
`pulumi package get-schema ./provider` prints and an SDK would be generated from).

Every custom resource the plugin serves, from the declarations of the class that serves it (resources/fields.py):
its input properties with their types, which are required and which secret, replaceOnChanges from its REPLACE, and
as output properties the inputs plus the facts it reports (its OUTPUTS); the object types they name under `types`.
A ProxmoxGuest is served by one class per kind (provider/registry.py GUEST_KINDS): its properties are theirs
together, required where every kind requires them. Nothing is run: tests/unit/test_provider_schema.py checks the
declarations against what the program registers. `make docs` writes it; tests/unit/test_provider.py compares the
committed file with what this produces."""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PATH = os.path.join(ROOT, 'provider', 'schema.json')
ANY = {'$ref': 'pulumi.json#/Any'}


class Conflict(ValueError):
    """Two declarations of one property or object type that differ."""


def merged(name: str, classes: list, attr: str) -> dict:
    """{key: Type} of the serving classes' INPUTS or OUTPUTS together; a key they declare differently is refused."""
    out = {}
    for cls in classes:
        for key, t in dict(getattr(cls, attr, None) or {}).items():
            if key in out and out[key] != t:
                raise Conflict('%s.%s is declared as %s by one class that serves %s and as %s by %s' % (
                    name, key, out[key], name, t, cls.__name__))
            out[key] = t
    return out


def prop(t, replace: bool = False) -> dict:
    spec = t.spec()
    if t.secret:
        spec['secret'] = True
    if replace:
        spec['replaceOnChanges'] = True
    return spec


def resource(name: str, types: dict) -> dict:
    """The resource's schema; the object types its properties name are added to `types`."""
    from provider import registry
    classes = registry.serving_classes(name)
    inputs, facts = merged(name, classes, 'INPUTS'), merged(name, classes, 'OUTPUTS')
    clash = sorted(set(inputs) & set(facts))
    if clash:
        raise Conflict('%s: %s both an input and a reported fact' % (name, ', '.join(clash)))
    replace = {k for cls in classes for k in cls.REPLACE}
    unknown = sorted(replace - set(inputs))
    if unknown:
        raise Conflict('%s: REPLACE names %s, which it does not declare' % (name, ', '.join(unknown)))
    required = sorted(k for k, t in inputs.items() if all(
        k in cls.INPUTS and not cls.INPUTS[k].optional for cls in classes))
    for t in list(inputs.values()) + list(facts.values()):
        for o in t.objects():
            spec = {'type': 'object', 'properties': {k: prop(ft) for k, ft in o.fields}}
            needed = [k for k, ft in o.fields if not ft.optional]
            if needed:
                spec['required'] = needed
            if types.setdefault(o.token(), spec) != spec:
                raise Conflict('object type %s is declared twice, differently' % o.token())
    properties = {k: prop(t, k in replace) for k, t in inputs.items()}
    return {
        'description': registry.describe(name),
        'inputProperties': properties,
        'requiredInputs': required,
        'properties': dict(properties, **{k: prop(t) for k, t in facts.items()}),
    }


def schema() -> dict:
    from provider import registry
    types = {}
    resources = {registry.token(name): resource(name, types) for name in sorted(registry.CLASSES)}
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
        'types': types,
    }


def text() -> str:
    return json.dumps(schema(), indent=2, sort_keys=True) + '\n'


if __name__ == '__main__':
    from tools.docs import write_atomic
    write_atomic(PATH, text())
    print('wrote %s' % os.path.relpath(PATH, ROOT))
