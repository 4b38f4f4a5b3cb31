"""The lab's systemctl (lab/ctbin/systemctl) runs units as systemd does: ExecStartPre= lines run (so an
injected one is visible), a failing one fails the start, and a rendered unit's process gets exactly
the argv and environment the configuration declared. Runs the script's functions against a temporary
root (its UNITS/STATE/LOGS directories pointed there)."""

import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import time

import pytest

from components import render

SYSTEMCTL = os.path.join(os.path.dirname(__file__), '..', '..', 'lab', 'ctbin', 'systemctl')


@pytest.fixture
def sc(tmp_path, monkeypatch):
    loader = importlib.machinery.SourceFileLoader('lab_systemctl', SYSTEMCTL)
    spec = importlib.util.spec_from_loader('lab_systemctl', loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    units = tmp_path / 'etc' / 'systemd' / 'system'
    units.mkdir(parents=True)
    monkeypatch.setattr(mod, 'UNITS', str(units))
    monkeypatch.setattr(mod, 'WANTS', str(units / 'multi-user.target.wants'))
    monkeypatch.setattr(mod, 'STATE', str(tmp_path / 'run'))
    monkeypatch.setattr(mod, 'LOGS', str(tmp_path / 'log'))
    mod.tmp = tmp_path
    yield mod
    for name in os.listdir(units):
        if name.endswith('.service'):
            mod.stop(name)


def install(sc, name, text):
    with open(os.path.join(sc.UNITS, name), 'w') as f:
        f.write(text)
    assert sc.main(['daemon-reload']) == 0


def show(sc, name, *props):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        sc.main(['show', name] + [a for p in props for a in ('-p', p)])
    return dict(line.split('=', 1) for line in buf.getvalue().splitlines())


def wait_for(path, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path) and os.path.getsize(path):
            time.sleep(0.05)
            return
        time.sleep(0.02)
    raise AssertionError('%s never appeared' % path)


def test_exec_start_pre_runs_in_order_then_the_service(sc):
    t = sc.tmp
    install(sc, 'demo.service', '''[Service]
Environment="STAMP=%(t)s/stamps" WHO=pre
ExecStartPre=/bin/sh -c 'echo "1 $WHO" >> "$STAMP"'
ExecStartPre=-/bin/false
ExecStartPre=/bin/sh -c "echo 2 ${WHO} >> ${STAMP}"
ExecStart=/bin/sh -c 'echo main >> "$STAMP"; exec sleep 30'
ExecStartPost=/bin/sh -c 'echo post $MAINPID >> "$STAMP"'
''' % {'t': t})
    assert sc.main(['start', 'demo']) == 0
    wait_for(str(t / 'stamps'))
    for _ in range(100):
        lines = (t / 'stamps').read_text().splitlines()
        if len(lines) == 4:
            break
        time.sleep(0.05)
    pid = sc.pid_of('demo.service')
    assert lines[:2] == ['1 pre', '2 pre'] and sorted(lines[2:]) == sorted(['main', 'post %d' % pid])
    assert show(sc, 'demo', 'ActiveState')['ActiveState'] == 'active'
    assert len((t / 'run' / 'demo.service.starts').read_text().splitlines()) == 1
    assert sc.main(['stop', 'demo']) == 0
    assert show(sc, 'demo', 'ActiveState')['ActiveState'] == 'inactive'


def test_a_failing_exec_start_pre_fails_the_start(sc, capsys):
    t = sc.tmp
    install(sc, 'bad.service', '[Service]\nExecStartPre=/bin/false\nExecStart=/bin/touch %s/main-ran\n' % t)
    assert sc.main(['start', 'bad.service']) == 1
    assert 'Job for bad.service failed because the control process exited with error code' in capsys.readouterr().err
    assert show(sc, 'bad', 'ActiveState')['ActiveState'] == 'failed'
    assert sc.main(['is-active', 'bad']) == 3
    assert not (t / 'main-ran').exists()
    assert not (t / 'run' / 'bad.service.starts').exists()


def test_an_injected_exec_start_pre_is_run(sc):
    """A line injected into [Service] runs, as under systemd (the old lab ignored it); in [Unit],
    where systemd ignores ExecStartPre=, it does not."""
    t = sc.tmp
    install(sc, 'old.service', '[Unit]\nDescription=SGLang serving x\nExecStartPre=/bin/touch %s/unit-section\n'
                               '[Service]\nExecStart=/bin/sleep 30\nEnvironment="NOTE=x\n'
                               'ExecStartPre=/bin/touch %s/pwned\n' % (t, t))
    assert sc.main(['start', 'old']) == 0
    assert (t / 'pwned').exists() and not (t / 'unit-section').exists()


def test_a_bad_unit_file_is_refused(sc, capsys):
    install(sc, 'quote.service', '[Service]\nExecStart=/bin/echo "unbalanced\n')
    assert sc.main(['start', 'quote']) == 1
    assert 'has a bad unit file setting' in capsys.readouterr().err


HOSTILE = ['x\nExecStartPre=/bin/touch PWNED', 'a" ; /bin/touch PWNED ; "b', "it's", '$HOME ${HOME} $$', '%n %%',
           '\\', 'trailing\\', ';', '', ' spaced ', '\t\x01\x7f', 'é 🚀', '\\x41 \\n']


def test_a_rendered_unit_runs_with_exactly_the_declared_argv_and_environment(sc):
    t = sc.tmp
    out = str(t / 'seen.json')
    script = ('import json, os, sys, time\n'
              'json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, open(%r, "w"))\n'
              'time.sleep(30)\n' % out)
    argv = [sys.executable, '-c', script] + HOSTILE + [h.replace('PWNED', str(t / 'pwned')) for h in HOSTILE[:2]]
    env = {'NOTE%d' % k: v for k, v in enumerate(HOSTILE)}
    text = render.render('sglang.service.j2', version='0.5.23', served_model_name='m $X %n "q" \\ ;', tp=4,
                         speculative=None, environment=env, environment_file=None,
                         exec_start=render.exec_start(argv))
    install(sc, 'sglang-test.service', text)
    assert sc.main(['enable', '--now', 'sglang-test']) == 0
    wait_for(out)
    with open(out) as f:
        seen = json.load(f)
    assert seen['argv'] == argv[3:]
    assert {k: v for k, v in seen['env'].items() if k.startswith('NOTE')} == env
    assert not (t / 'pwned').exists() and not os.path.exists('PWNED')
    assert show(sc, 'sglang-test', 'ActiveState', 'UnitFileState', 'NeedDaemonReload') == {
        'ActiveState': 'active', 'UnitFileState': 'enabled', 'NeedDaemonReload': 'no'}
    assert sc.main(['disable', '--now', 'sglang-test']) == 0
    assert show(sc, 'sglang-test', 'ActiveState', 'UnitFileState') == {'ActiveState': 'inactive',
                                                                       'UnitFileState': 'disabled'}
