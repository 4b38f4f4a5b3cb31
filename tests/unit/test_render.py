"""Files rendered for hosts: golden unit file, quoting, and template errors that name the template."""

import os
import shlex

import pytest

from resources import render
from resources.sglang import unit_text
from tests.unit.config.test_config import parse

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')


def test_unit_matches_golden():
    with open(os.path.join(GOLDEN, 'sglang-qwen.service')) as f:
        assert unit_text(parse()) == f.read()


def test_exec_start_quotes_values_and_escapes_percent():
    argv = ['/opt/x/bin/python', '-m', 'sglang.launch_server', '--model-path', '/models/my model', '--name', '50%']
    line = render.exec_start(argv)
    assert shlex.split(line.replace('%%', '%')) == argv


def test_environment_values_with_spaces_and_quotes_survive_systemd_quoting():
    text = unit_text(parse(sglang__environment={'NOTE': 'a "b" c'}))
    assert 'Environment="NOTE=a \\"b\\" c"' in text


def test_missing_template_value_names_the_template():
    with pytest.raises(render.RenderError, match='templates/gpuhost-nvidia.conf.j2'):
        render.render('gpuhost-nvidia.conf.j2')
