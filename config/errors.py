"""Refusals as the operator reads them: pydantic's errors turned into one line each, naming the config
key (gpuhost:sglang.tp), the value (secrets never shown) and the fix, with a "did you mean" for keys."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ValidationError

from config.values import show


# Names operators reach for that this program spells differently.
SYNONYMS = {'cpus': 'cores', 'cpu': 'cores', 'vcpus': 'cores', 'memory': 'memory_mb', 'mem': 'memory_mb',
            'ram': 'memory_mb', 'swap': 'swap_mb', 'disk': 'rootfs_gb', 'rootfs': 'rootfs_gb', 'disk_gb': 'rootfs_gb',
            'template': 'ostemplate', 'id': 'vmid', 'tensor_parallel': 'tp', 'tp_size': 'tp', 'model': 'model_path',
            'spec': 'speculative', 'speculative_decoding': 'speculative', 'env': 'environment', 'args': 'extra_args',
            'kernel_args': 'extra_kernel_args', 'gpu': 'gpus', 'address': 'address'}


def did_you_mean(word: str, choices) -> str:
    choices = list(choices)
    if SYNONYMS.get(word) in choices:
        return ' (did you mean %s?)' % SYNONYMS[word]
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return ' (did you mean %s?)' % match[0] if match else ''


TYPE_NAMES = {'int_type': 'a whole number', 'int_parsing': 'a whole number', 'float_type': 'a number',
              'float_parsing': 'a number', 'bool_type': 'true or false', 'bool_parsing': 'true or false',
              'string_type': 'a string', 'list_type': 'a list', 'dict_type': 'a mapping', 'model_type': 'a mapping',
              'model_attributes_type': 'a mapping', 'int_from_float': 'a whole number'}


def _field_model(loc, root):
    """The model class at a location (for 'did you mean' on unknown keys)."""
    import typing
    model = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part) if hasattr(model, 'model_fields') else None
        if field is None:
            return model
        ann = field.annotation
        nxt = None
        for cand in [ann] + list(typing.get_args(ann)):
            for c in [cand] + list(typing.get_args(cand)):
                if isinstance(c, type) and issubclass(c, BaseModel):
                    nxt = c
        model = nxt
    return model


def _secret_loc(loc) -> bool:
    """A location under a credential's key (config/load.py SECRET_PATHS, the one list of them - held to the models'
    SecretStr fields by tests/unit/config/test_plain_secrets.py): its value is never shown, whatever is wrong with
    it (an API key or token written unquoted is read as a number, and was shown as one)."""
    from config.load import FLEET_SECRET_PATHS, SECRET_PATHS      # (config/load.py imports this module)
    return any(str(p) in {path[-1] for path in SECRET_PATHS + FLEET_SECRET_PATHS} for p in loc)


def _loc(loc) -> str:
    out = ''
    for p in loc:
        if isinstance(p, int):
            out += '[%d]' % p
        elif p == '[key]':
            out += '(key)'
        else:
            out += ('.' if out else '') + str(p)
    return out


def format_errors(e: ValidationError, root, prefix: tuple = ()) -> str:
    """root, prefix: the model validated (Deployment, Rollout) and where it sits in the gpuhost namespace
    (('rollout',) for Rollout)."""
    lines = []
    for err in e.errors(include_url=False):
        msg, kind, loc = err['msg'], err['type'], tuple(prefix) + tuple(err['loc'])
        value = err.get('input')
        if msg.startswith('Value error, '):
            msg = msg[len('Value error, '):]
        if msg.startswith('gpuhost:'):
            lines.append(msg)
            continue
        where = 'gpuhost:' + _loc(loc)
        shown = 'a secret value (not shown)' if _secret_loc(loc) else show(value)
        if kind == 'extra_forbidden':
            parent = _field_model(loc[len(prefix):-1], root)
            known = list(parent.model_fields) if parent is not None else []
            lines.append('%s is not a setting here%s; the settings of gpuhost:%s are: %s' % (
                where, did_you_mean(str(loc[-1]), known), _loc(loc[:-1]) or '', ', '.join(known)))
        elif kind == 'missing':
            lines.append('%s is required and not set' % where)
        elif kind in TYPE_NAMES:
            lines.append('%s: %s is not %s%s' % (where, shown, TYPE_NAMES[kind],
                                                 ' (write it without quotes)' if isinstance(value, str) and
                                                 kind.startswith(('int', 'float', 'bool')) and
                                                 loc[-1] != '[key]' else
                                                 ' (write it in quotes)' if kind == 'string_type' else ''))
        elif kind == 'literal_error':
            lines.append('%s: %s is not one of the allowed values: %s' % (
                where, shown, msg.split('Input should be ', 1)[-1]))
        elif kind in ('greater_than_equal', 'less_than_equal', 'greater_than', 'less_than', 'too_short', 'too_long'):
            lines.append('%s: %s - %s' % (where, shown, msg.lower()))
        else:
            lines.append('%s: %s' % (where, msg))
    return 'invalid stack configuration:\n  - ' + '\n  - '.join(lines)
