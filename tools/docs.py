"""make docs: the documents generated from the program, written where they are committed.

    python -m tools.docs            all of them
    python -m tools.docs outputs    docs/monitoring.md's "Outputs" tables, from components/outputs.py OUTPUTS /
                                    FLEET_OUTPUTS
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
    if what not in ('all', 'outputs', 'schemas') or len(argv) > 1:
        raise SystemExit('usage: python -m tools.docs [outputs|schemas]  (no argument: all)')
    if what in ('all', 'outputs'):
        write_outputs()
    if what in ('all', 'schemas'):
        write_schemas()
        write_provider_schema()


if __name__ == '__main__':
    main(sys.argv[1:])
