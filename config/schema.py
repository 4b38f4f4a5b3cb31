"""JSON schemas: the model's (`python -m config schema`, docs/config.schema.json) and one for
Pulumi.<stack>.yaml as written (`python -m config stack-schema`, docs/stack.schema.json)."""

from __future__ import annotations

from config.deployment import Deployment
from config.fleet import HOST_NAME_RE, Rollout
from config.load import FOREIGN_NAMESPACES


SECURE = {'type': 'object', 'description': 'a Pulumi secret (pulumi config set --secret)',
          'properties': {'secure': {'type': 'string', 'pattern': '^v1:'}}, 'required': ['secure'],
          'additionalProperties': False}


def stack_schema() -> dict:
    """A JSON schema for Pulumi.<stack>.yaml as written: `gpuhost:<key>` objects checked against the
    model's structure and types, any value may be a `secure:` one, unknown keys and namespaces other
    than Pulumi's own are refused. For editors and CI; the program's own checks go further."""
    import copy

    def securable(node):
        if isinstance(node, dict):
            node = {k: securable(v) for k, v in node.items()}
            if node.get('type') in ('string', 'integer', 'number', 'boolean') or 'anyOf' in node or '$ref' in node:
                return {'anyOf': [node, SECURE]} if node is not SECURE else node
            return node
        if isinstance(node, list):
            return [securable(v) for v in node]
        return node

    model = copy.deepcopy(Deployment.model_json_schema())
    defs = {k: securable(v) for k, v in model.pop('$defs', {}).items()}
    props = {'gpuhost:' + k: securable(v) for k, v in model['properties'].items()}
    # A fleet: the keys above are the shared settings (each may then be partial); gpuhost:hosts entries
    # are a name plus any of them (the program merges and validates each host in full).
    entry = {'type': 'object', 'required': ['name'], 'additionalProperties': False,
             'properties': dict({'name': {'type': 'string', 'pattern': HOST_NAME_RE.pattern}},
                                **{k: {} for k in model['properties']})}
    props['gpuhost:hosts'] = {'type': 'array', 'minItems': 1, 'items': entry,
                              'description': 'A fleet: one entry per host, merged over the shared gpuhost:* settings'}
    props['gpuhost:rollout'] = securable(copy.deepcopy(Rollout.model_json_schema()))
    return {
        '$schema': 'https://json-schema.org/draft/2020-12/schema',
        'title': 'Pulumi.<stack>.yaml of the gpuhost project',
        'type': 'object',
        'properties': {
            # One host: the keys in full. A fleet (gpuhost:hosts): the shared keys may be partial, so they
            # are checked as mappings only; the program validates each merged host in full.
            'config': {'type': 'object', 'properties': {k: {} for k in props},
                       'patternProperties': {'^(%s):' % '|'.join(FOREIGN_NAMESPACES): {}},
                       'additionalProperties': False,
                       'if': {'required': ['gpuhost:hosts']},
                       'then': {'properties': dict({k: {'type': 'object'} for k in props},
                                                   **{k: props[k] for k in ('gpuhost:hosts', 'gpuhost:rollout')})},
                       'else': {'properties': props, 'required': ['gpuhost:' + r for r in model['required']]}},
            'encryptionsalt': {'type': 'string'}, 'secretsprovider': {'type': 'string'},
            'encryptedkey': {'type': 'string'}, 'environment': {},
        },
        'additionalProperties': False,
        '$defs': defs,
    }
