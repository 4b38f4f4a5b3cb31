"""make docs: the documents generated from the program, written where they are committed.

    python -m tools.docs            all of them
    python -m tools.docs outputs    docs/monitoring.md's "Outputs" tables, from components/outputs.py OUTPUTS /
                                    FLEET_OUTPUTS
    python -m tools.docs config     docs/configuration.md's reference table of every key, from the config schema
                                    (config.Deployment's, as docs/config.schema.json holds it, and config/fleet.py's
                                    Rollout)
    python -m tools.docs schemas    docs/config.schema.json (python -m config schema), docs/stack.schema.json
                                    (python -m config stack-schema) and provider/schema.json (tools/provider_schema.py)

Unit tests compare each committed document with what these produce (tests/unit/test_docs.py,
tests/unit/config/test_stack_schema.py) and name the command that regenerates it. docs/bench.md's tables are
measured, not generated from code: `make bench` (tools/bench.py) writes them.
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.sglang_flags_gen import write_atomic  # noqa: E402 - a file of its own beside the target, renamed over it

OUTPUTS_PAGE = os.path.join(ROOT, 'docs', 'monitoring.md')
OUTPUTS_BEGIN = ('<!-- outputs: begin (generated from components/outputs.py OUTPUTS and FLEET_OUTPUTS by '
                 '`python -m tools.docs outputs`: edit there) -->')
OUTPUTS_END = '<!-- outputs: end -->'

CONFIG_PAGE = os.path.join(ROOT, 'docs', 'configuration.md')
CONFIG_BEGIN = ('<!-- config-keys: begin (generated from the config schema - config.Deployment, docs/config.schema.json, '
                'and config/fleet.py Rollout - by `python -m tools.docs config`: edit the models in config/) -->')
CONFIG_END = '<!-- config-keys: end -->'


def table(rows, header: str) -> list:
    def cell(text):
        # A | inside a cell would end it.
        return text.replace('|', '\\|')
    return ['| %s | content |' % header, '|---|---|'] + [
        '| %s | %s |' % (', '.join('`%s`' % n for n in names), cell(desc)) for names, desc in rows]


def outputs_block() -> str:
    """docs/monitoring.md's outputs tables, markers included."""
    from components import outputs
    lines = [OUTPUTS_BEGIN] + table(outputs.OUTPUTS, 'output') + [
        '', 'A fleet (`gpuhost:hosts`, [Many hosts: a fleet](fleets.md)) exports instead:', ''] + table(
        outputs.FLEET_OUTPUTS, 'output (fleet)') + [OUTPUTS_END]
    return '\n'.join(lines) + '\n'


def between(text: str, begin: str, end: str, where: str) -> tuple:
    """(start, stop) of the block from `begin` to `end` and its newline; one each, in that order."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit('%s: the markers %s ... %s must be there once each, in that order; put them back (git '
                         'show HEAD:%s has them) and run again' % (where, begin, end, os.path.relpath(where, ROOT)))
    start, stop = text.index(begin), text.index(end) + len(end)
    if text[stop:stop + 1] == '\n':
        stop += 1
    return start, stop


def replace_between(text: str, begin: str, end: str, block: str, where: str) -> str:
    start, stop = between(text, begin, end, where)
    return text[:start] + block + text[stop:]


def write_block(path: str, begin: str, end: str, block: str, what: str) -> None:
    with open(path) as f:
        text = f.read()
    new = replace_between(text, begin, end, block, path)
    if new != text:
        write_atomic(path, new)
    print('docs: %s %s %s' % (os.path.relpath(path, ROOT), what, 'written' if new != text else 'unchanged'))


def write_outputs() -> None:
    write_block(OUTPUTS_PAGE, OUTPUTS_BEGIN, OUTPUTS_END, outputs_block(), 'outputs tables')


# ------------------------------------------------------------------------------ the configuration reference

def _cell(text: str) -> str:
    return ' '.join(str(text).split()).replace('|', '\\|')


def _code(value) -> str:
    return '`%s`' % json.dumps(value, ensure_ascii=False)


def _type(node: dict, defs: dict) -> str:
    """What a value of this schema node may be, in a few words."""
    if 'anyOf' in node:
        kinds = [k for k in node['anyOf'] if k.get('type') != 'null']
        text = ' or '.join(_type(k, defs) for k in kinds)
        return text + (', or null' if len(kinds) < len(node['anyOf']) else '')
    if '$ref' in node:
        return 'section'
    if 'enum' in node:
        return 'one of ' + ', '.join(_code(v) for v in node['enum'])
    kind = node.get('type')
    if kind == 'array':
        text = 'list of ' + ('sections' if '$ref' in node.get('items', {}) else _type(node.get('items', {}), defs))
        bounds = [('at least %d' % node['minItems']) if 'minItems' in node else '',
                  ('at most %d' % node['maxItems']) if 'maxItems' in node else '']
        bounds = [b for b in bounds if b]
        return text + (' (%s)' % ', '.join(bounds) if bounds else '')
    if kind == 'object':
        values = node.get('additionalProperties')
        text = 'map of %s' % (_type(values, defs) if isinstance(values, dict) and values else 'any value')
        return text + (' (at most %d)' % node['maxProperties'] if 'maxProperties' in node else '')
    if kind == 'string' and node.get('format') == 'password':
        return 'secret string'
    if kind in ('integer', 'number'):
        low = ('>= %s' % node['minimum']) if 'minimum' in node else (
            ('> %s' % node['exclusiveMinimum']) if 'exclusiveMinimum' in node else '')
        high = ('<= %s' % node['maximum']) if 'maximum' in node else ''
        bounds = ', '.join(b for b in (low, high) if b)
        return kind + (' (%s)' % bounds if bounds else '')
    return kind or 'any value'


def _section(node: dict, defs: dict):
    """The model a property holds (its $ref, also through Optional[...] or a list's items), else None."""
    for option in [node] + node.get('anyOf', []) + [node.get('items') or {}]:
        if '$ref' in option:
            return defs[option['$ref'].rsplit('/', 1)[-1]]
    return None


def config_rows(schema: dict, prefix: str = '', defs: dict = None) -> list:
    """(key, type, default, description) for every key of a pydantic model's JSON schema, depth first in the
    model's order; a section (a model of its own) has a row of its own before its keys."""
    defs = schema.get('$defs', {}) if defs is None else defs
    rows = []
    required = set(schema.get('required', []))
    for name, node in schema.get('properties', {}).items():
        key = prefix + name
        section = _section(node, defs)
        if name in required:
            default = 'required'
        elif 'default' not in node:
            default = 'optional'
        elif node['default'] is None:
            default = 'null (unset)'
        else:
            default = _code(node['default'])
        description = node.get('description') or (section or {}).get('description') or ''
        rows.append((key, _type(node, defs), default, description))
        if section is not None:
            rows += config_rows(section, key + ('[].' if node.get('type') == 'array' else '.'), defs)
    return rows


def config_block() -> str:
    """docs/configuration.md's reference table, markers included."""
    import config
    from config.fleet import Rollout
    from config.schema import stack_schema
    hosts = stack_schema()['properties']['config']['then']['properties']['gpuhost:hosts']
    rows = (config_rows(config.Deployment.model_json_schema())
            + [('hosts', 'list of sections (at least %d)' % hosts['minItems'], 'optional',
                hosts['description'] + ': each a `name` (a DNS label) plus any of the sections above'),
               ('rollout', 'section', 'optional', 'How a fleet (`hosts`) rolls a change out')]
            + config_rows(Rollout.model_json_schema(), 'rollout.'))
    lines = [CONFIG_BEGIN, '| key (`gpuhost:`) | type | default | description |', '|---|---|---|---|'] + [
        '| `%s` | %s | %s | %s |' % (key, _cell(kind), _cell(default), _cell(description))
        for key, kind, default, description in rows] + [CONFIG_END]
    return '\n'.join(lines) + '\n'


def write_config() -> None:
    write_block(CONFIG_PAGE, CONFIG_BEGIN, CONFIG_END, config_block(), 'configuration reference')


def write_schemas() -> None:
    import config
    from config.schema import stack_schema
    for name, schema in (('config.schema.json', config.Deployment.model_json_schema()),
                         ('stack.schema.json', stack_schema())):
        # As `python -m config schema > docs/...` writes it (print: indent 2, a final newline).
        path, text = os.path.join(ROOT, 'docs', name), json.dumps(schema, indent=2) + '\n'
        with open(path) as f:
            same = f.read() == text
        if not same:
            write_atomic(path, text)
        print('docs: docs/%s %s' % (name, 'unchanged' if same else 'written'))


def write_provider_schema() -> None:
    """provider/schema.json, the gpuhost plugin's package schema (tools/provider_schema.py)."""
    from tools import provider_schema
    text = provider_schema.text()
    with open(provider_schema.PATH) as f:
        same = f.read() == text
    if not same:
        write_atomic(provider_schema.PATH, text)
    print('docs: provider/schema.json %s' % ('unchanged' if same else 'written'))


def main(argv) -> None:
    what = argv[0] if argv else 'all'
    if what not in ('all', 'outputs', 'config', 'schemas') or len(argv) > 1:
        raise SystemExit('usage: python -m tools.docs [outputs|config|schemas]  (no argument: all)')
    if what in ('all', 'outputs'):
        write_outputs()
    if what in ('all', 'config'):
        write_config()
    if what in ('all', 'schemas'):
        write_schemas()
        write_provider_schema()


if __name__ == '__main__':
    main(sys.argv[1:])
