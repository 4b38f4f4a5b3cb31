"""The documents an operator reads before the code say what the program does: docs/monitoring.md's outputs tables are
the ones generated from components/outputs.py, every output the program exports has a row there (and every row an
output), docs/configuration.md's table of every key is the one generated from the config schema,
and docs/bench.md's `make bench` section is well-formed, states the resource count the program declares and says
in words what its table shows; its `make bench-state` section's table is tools/bench_state.py's and adds up. (The schemas: tests/unit/config/test_stack_schema.py.)"""

import os
import re

import pytest

import config
from components import outputs
from tests.lablib import REPO
from tests.unit.config.test_config import lab_data
from tests.unit.program import run_program
from tests.unit.test_runtime import FILES
from tools import bench, bench_state, docs


def read(*path):
    with open(os.path.join(REPO, *path)) as f:
        return f.read()


def names(rows) -> set:
    return {n for row_names, _ in rows for n in row_names}


@pytest.fixture(scope='module')
def lab_program():
    """__main__.py under mocks for Pulumi.lab.yaml (a container, a VM, the model, the runtime: every optional
    section, so every output)."""
    return run_program(config.parse_fleet(lab_data()), FILES)


@pytest.fixture(scope='module')
def driver_program():
    """The same with the host's driver declared (gpuhost:nvidia.driver, its output nvidia_driver)."""
    data = lab_data()
    data['nvidia'] = {'driver': dict(data['runtime'].pop('nvidia'))}
    return run_program(config.parse_fleet(data), FILES)


@pytest.fixture(scope='module')
def fleet_program():
    from lab import fleet
    entries = [fleet.host_entry(i, fleet.host_spec(i, fleet.addresses(i)), '.lab-fleet/gpu%02d' % i) for i in (1, 2)]
    data = {k.split(':', 1)[1]: v for k, v in fleet.stack_config(entries).items()}
    data['rollout'] = dict(data.get('rollout') or {}, canary={})     # its `canary` output too
    return run_program(config.parse_fleet(data), FILES)


@pytest.mark.parametrize('page, begin, end, block, source, part', [
    ('monitoring.md', 'OUTPUTS_BEGIN', 'OUTPUTS_END', 'outputs_block', 'components/outputs.py OUTPUTS/FLEET_OUTPUTS',
     'outputs'),
    ('configuration.md', 'CONFIG_BEGIN', 'CONFIG_END', 'config_block', 'the config schema (the models in config/)',
     'config'),
])
def test_the_generated_parts_of_the_docs_are_current(page, begin, end, block, source, part):
    text = read('docs', page)
    start, stop = docs.between(text, getattr(docs, begin), getattr(docs, end), 'docs/' + page)
    assert text[start:stop] == getattr(docs, block)(), ('docs/%s\'s generated part differs from %s: run python -m '
                                                        'tools.docs %s' % (page, source, part))


def test_the_configuration_reference_has_a_row_for_every_key_of_the_schema_file():
    """docs/config.schema.json (checked against the model by tests/unit/config/test_stack_schema.py) and the table
    name the same keys: every leaf and section of the schema file has its row."""
    import json
    schema = json.loads(read('docs', 'config.schema.json'))
    text = read('docs', 'configuration.md')
    start, stop = docs.between(text, docs.CONFIG_BEGIN, docs.CONFIG_END, 'docs/configuration.md')
    rows = set(re.findall(r'^\| `([^`]+)` \|', text[start:stop], re.M))
    keys = {key for key, _, _, _ in docs.config_rows(schema)}
    assert keys and keys <= rows, sorted(keys - rows)
    assert {'host.ssh.host_key', 'host.gpus[].address', 'runtime.python.index.password', 'model.rehash_days',
            'hosts', 'rollout.max_unavailable'} <= rows


def missing_rows(exported, documented, table) -> list:
    return ['the program exports `%s` but components/outputs.py %s has no row for it: add one saying what it holds, '
            'then run python -m tools.docs outputs' % (n, table) for n in sorted(set(exported) - documented)] + [
            'components/outputs.py %s has a row for `%s`, which the program does not export: remove it, then run '
            'python -m tools.docs outputs' % (table, n) for n in sorted(documented - set(exported))]


def test_every_output_of_a_one_host_stack_has_a_row(lab_program, driver_program):
    assert missing_rows(dict(lab_program['exports'], **driver_program['exports']), names(outputs.OUTPUTS),
                        'OUTPUTS') == []
    # The monitoring outputs are there (the tables are not empty by accident).
    assert {'prometheus_file_sd', 'model', 'vm'} <= set(lab_program['exports'])


def test_every_output_of_a_fleet_has_a_row(fleet_program):
    exported = fleet_program['exports']
    assert missing_rows(exported, names(outputs.FLEET_OUTPUTS), 'FLEET_OUTPUTS') == []
    # Each host's entry: a one-host stack's outputs without its file_sd, as the `hosts` row says.
    per_host = {k for host in exported['hosts'].values() for k in host}
    assert sorted(per_host - names(outputs.OUTPUTS)) == [], 'hosts entries export outputs OUTPUTS has no row for'
    assert 'prometheus_file_sd' not in per_host and len(exported['hosts']) == 2


# ------------------------------------------------------------------------------------------ docs/bench.md

def bench_section():
    text = read('docs', 'bench.md')
    start, stop = docs.between(text, bench.BEGIN, bench.END, 'docs/bench.md')
    return text[start:stop]


def bench_rows(section):
    lines = section.splitlines()
    assert bench.HEADER in lines, \
        'docs/bench.md: the make bench table\'s header is not tools/bench.py\'s; run make bench'
    i = lines.index(bench.HEADER)
    assert re.fullmatch(r'\|(---\|)+', lines[i + 1]) and lines[i + 1].count('|') == bench.HEADER.count('|')
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith('|'):
            break
        cells = [c.strip() for c in line.strip('|').split('|')]
        assert len(cells) == bench.HEADER.count('|') - 1, line
        rows.append(cells)
    return rows


def test_the_bench_table_is_well_formed():
    section = bench_section()
    assert re.search(r'Measured by `make bench` \(tools/bench\.py\) on \d{4}-\d{2}-\d{2}: ', section), \
        'docs/bench.md: the make bench section lost its date line; run make bench'
    rows = bench_rows(section)
    assert [r[0] for r in rows] == ['`%s`' % name for name, _ in bench.COMMANDS]
    for name, med, lo, hi, ssh, changed, restarts, trivial, ratio in rows:
        med, lo, hi, trivial = float(med), float(lo), float(hi), float(trivial)
        assert lo <= med <= hi, '%s: median %s outside [%s, %s]' % (name, med, lo, hi)
        assert int(ssh) >= 0 and int(restarts) >= 0 and changed in ('yes', 'no')
        assert ratio == '%.1fx' % (med / trivial), '%s: the ratio is not median / one-resource median' % name


def test_the_bench_page_states_the_resource_count_the_program_declares(lab_program):
    found = re.findall(r'First `up` from empty \((\d+) resources', bench_section())
    assert len(found) == 1, 'docs/bench.md: the make bench section lost its "First `up` from empty (N resources" line'
    declared = len(lab_program['resources'])
    assert int(found[0]) == declared, (
        'docs/bench.md says the lab stack has %s resources; the program declares %d for Pulumi.lab.yaml: the figures '
        'are from an older program - run make bench' % (found[0], declared))


def test_the_bench_prose_says_what_its_table_shows():
    section = bench_section()
    ssh = {r[0].strip('`'): int(r[4]) for r in bench_rows(section)}
    said = re.findall(r'A no-op `up` ran (\d+) SSH commands? a run', section)
    assert said == [str(ssh['up (no-op)'])], 'the no-op up\'s SSH count in the words is not the table\'s'
    said = re.findall(r'`up --refresh` ran (\d+)', section)
    assert said == [str(ssh['up --refresh (no-op)'])], 'the up --refresh SSH count in the words is not the table\'s'
    if ssh['up (no-op)']:
        assert not re.search(r'no-op `up` runs? none', section), 'the words say a no-op up runs no SSH command'
    # The commands by name add up to the counts.
    listed = re.search(r'by name, in that run: `preview` (.*?); `up` (.*?); `up --refresh` (.*?)\.\n', section)
    assert listed, 'docs/bench.md: the SSH commands by name are missing'
    for (name, _), text in zip(bench.COMMANDS, listed.groups()):
        count = 0 if text == 'none' else sum(int(m.group(1) or 1) for m in re.finditer(r'`[^`]+`(?: x(\d+))?', text))
        assert count == ssh[name], '%s: %d commands by name, %d in the table' % (name, count, ssh[name])


def test_the_bench_state_table_is_well_formed_and_adds_up():
    text = read('docs', 'bench.md')
    start, stop = docs.between(text, bench_state.BEGIN, bench_state.END, 'docs/bench.md')
    section = text[start:stop]
    assert re.search(r'Measured by tools/bench_state\.py on \d{4}-\d{2}-\d{2}: ', section), \
        'docs/bench.md: the make bench-state section lost its date line; run make bench-state'
    lines = section.splitlines()
    assert bench_state.HEADER in lines, \
        'docs/bench.md: the make bench-state table\'s header is not tools/bench_state.py\'s; run make bench-state'
    i = lines.index(bench_state.HEADER)
    width = bench_state.HEADER.count('|') - 1
    assert lines[i + 1] == '|' + '---|' * width
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith('|'):
            break
        cells = [c.strip() for c in line.strip('|').split('|')]
        assert len(cells) == width, line
        rows.append([float(c) for c in cells])
    assert len(rows) >= 2, 'docs/bench.md: the make bench-state table needs two sizes at least'
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    for hosts, resources, _mb, k, _p, _pc, noop, _nc, changed, _cc, skip, _sc, step, ckpt, _ckc in rows:
        # the stack, the command provider, 17 a host
        assert resources == hosts * len(bench_state.HOST_RESOURCE_BYTES) + 2
        assert abs(step - (changed - noop) / k) < 0.002 and abs(ckpt - (changed - skip) / k) < 0.002
