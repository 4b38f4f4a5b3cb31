"""hostscripts/README.md's table says which module calls each script; here it is checked against the tree: every file of
hostscripts/ has its row, and every module a row names really names that script."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(REPO, 'hostscripts')


def table() -> dict:
    """{script: [calling module path]} from the README's rows."""
    with open(os.path.join(HERE, 'README.md')) as f:
        rows = [line for line in f.read().splitlines() if re.match(r'^\| `[^`]+` \|', line)]
    out = {}
    for line in rows:
        cells = [c.strip() for c in line.strip('|').split('|')]
        out[cells[0].strip('`')] = re.findall(r'`([^`]+)`', cells[2])
    return out


def test_every_script_has_its_row():
    on_disk = sorted(n for n in os.listdir(HERE) if n not in ('README.md', '__pycache__'))
    assert sorted(table()) == on_disk
    assert len(on_disk) >= 30   # the check reads the table it means to


def test_every_caller_named_is_a_module_that_names_the_script():
    wrong = []
    for script, callers in table().items():
        assert callers, '%s: no caller listed' % script
        stem = script.rsplit('.', 1)[0]
        for path in callers:
            full = os.path.join(REPO, path)
            if not os.path.isfile(full):
                wrong.append('%s: %s does not exist' % (script, path))
                continue
            with open(full) as f:
                text = f.read()
            # A script by its file name; one of the collector's modules by its file or module name.
            if script not in text and not (script.endswith('.py') and re.search(r'\b%s\b' % re.escape(stem), text)):
                wrong.append('%s: %s never names it' % (script, path))
    assert wrong == []
