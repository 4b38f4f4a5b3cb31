"""Hostile strings in every value that reaches the SGLang unit, checked with the REAL systemd parser.

Each case renders templates/sglang.service.j2 with one hostile string in one field (an argv element,
the executable path, an Environment= name or value, the Description text, the version in the header
comment), then loads all the units with `systemd-analyze verify` (systemd 252's own parser, at debug
log level it dumps every parsed unit) and asserts that systemd sees exactly the intended unit: one
ExecStart= with exactly the intended argv, exactly the intended Environment= entries and Description,
and nothing else - no ExecStartPre=, no other directive (the whole dump is compared with a benign
unit's). The program's own parser (grammar/systemd_unit.py, the policy pack's) must read every unit
the same way systemd does. All units go through one systemd-analyze run (about a second).
"""

import collections
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from resources import render
from grammar import systemd, systemd_unit

# --- systemd-analyze ---------------------------------------------------------------------------


def systemd_analyze():
    path = shutil.which('systemd-analyze')
    if not path:
        pytest.fail('systemd-analyze is missing: these tests check unit files with the real systemd parser; '
                    'install it with `apt-get install systemd` (CI does)')
    return path


def analyze(units):
    """{name: unit text} -> ({name: that unit's dump}, stderr) from one `systemd-analyze verify`."""
    exe = systemd_analyze()
    with tempfile.TemporaryDirectory(prefix='sdverify.') as d:
        paths = []
        for name, text in units.items():
            path = os.path.join(d, name)
            with open(path, 'wb') as f:
                f.write(text.encode('utf-8', 'surrogateescape'))
            paths.append(path)
        proc = subprocess.run([exe, 'verify', '--man=no'] + paths, capture_output=True, cwd=d,
                              env=dict(os.environ, SYSTEMD_LOG_LEVEL='debug', SYSTEMD_LOG_COLOR='0'))
        out = proc.stdout.decode('utf-8', 'surrogateescape')
        err = proc.stderr.decode('utf-8', 'surrogateescape').replace(d + '/', '')
    starts = []
    for name in units:
        header = '\t-> Unit %s:\n' % name
        assert out.count(header) == 1, 'systemd did not load %s:\n%s' % (name, diagnostics(err, name))
        starts.append((out.index(header), name))
    starts.sort()
    dumps = {}
    for k, (pos, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(out)
        dumps[name] = out[pos:end]
    return dumps, err


def diagnostics(err, name):
    return '\n'.join(line for line in err.splitlines() if name in line)


def unquote_command_line(line):
    """Undo the quoting of the dump's 'Command Line:' (systemd's quote_command_line(): words that
    need it in double quotes, \\ before " \\ ` $, control characters C-escaped in octal)."""
    simple = {'a': b'\a', 'b': b'\b', 'f': b'\f', 'n': b'\n', 'r': b'\r', 't': b'\t', 'v': b'\v'}
    words, i, n = [], 0, len(line)
    while i < n:
        if line[i] == '"':
            buf, i = bytearray(), i + 1
            while line[i] != '"':
                if line[i] == '\\':
                    c = line[i + 1]
                    if c in '01234567':
                        buf.append(int(line[i + 1:i + 4], 8))
                        i += 4
                        continue
                    buf += simple.get(c, c.encode('utf-8', 'surrogateescape'))
                    i += 2
                else:
                    buf += line[i].encode('utf-8', 'surrogateescape')
                    i += 1
            words.append(buf.decode('utf-8', 'surrogateescape'))
            i += 1
        else:
            j = line.find(' ', i)
            j = n if j < 0 else j
            words.append(line[i:j])
            i = j
        assert i == n or line[i] == ' ', 'unexpected dump quoting at %d: %r' % (i, line)
        i += 1
    return words


class Dump:
    """What systemd parsed for one unit, from its dump."""

    def __init__(self, text, env):
        self.text = text
        assert text.split('\n', 2)[1].startswith('\t\tDescription: ')
        self.description = text.split('\n', 2)[1][len('\t\tDescription: '):]
        # Environment= entries are printed raw (a newline in a value is a raw newline): the block is
        # compared whole with what it must be, then cut out before anything else is parsed.
        block = ''.join('\t\tEnvironment: %s\n' % e for e in env)
        start = text.find('\t\tEnvironment: ')
        if env:
            assert start >= 0 and text[start:start + len(block)] == block, \
                'Environment entries differ:\n%r\nexpected\n%r' % (text[start:start + len(block) + 200], block)
            assert not text[start + len(block):].startswith('\t\tEnvironment: '), 'an extra Environment entry'
            rest = text[:start] + text[start + len(block):]
        else:
            assert start < 0, 'unexpected Environment entries'
            rest = text
        assert '\t\tEnvironment: ' not in rest
        self.environment = list(env)
        self.rest = rest
        self.commands = collections.defaultdict(list)   # ExecStart -> [argv, ...]
        kind = None
        for line in rest.split('\n'):
            m = re.match(r'\t\t-> (\w+):$', line)
            if m:
                kind = m.group(1)
            elif line.startswith('\t\t\tCommand Line: '):
                self.commands[kind].append(unquote_command_line(line[len('\t\t\tCommand Line: '):]))
            elif not line.startswith('\t\t\t'):
                kind = None

    def shape(self, name):
        """The dump with the values under test taken out, as a multiset of lines (dependency lines
        come in hash order): equal for two units means no directive was added or changed."""
        lines = self.rest.replace(name, 'UNIT').split('\n')
        return collections.Counter(re.sub(r'^(\t\t(Description|\tCommand Line): ).*', r'\1...', line)
                                   for line in lines)


def dollars(argv):
    """The argv systemd stores before exec-time $ expansion: every $ of ours written as $$."""
    return [a.replace('$', '$$') for a in argv]


# --- the hostile strings -----------------------------------------------------------------------

CONTROL = [chr(c) for c in range(1, 0x20)] + ['\x7f']
HOSTILE = CONTROL + [
    '"', "'", '\\', '$', '${X}', '$$', '$X', '$PATH', '${PATH}', '%', '%n', '%%', '%i', '%h', '%z', ';', ' ; ',
    '\\;', '"\\;"', 'trailing\\', 'trailing\\\\', '\\\\\\', '\nExecStartPre=/bin/touch /tmp/pwned',
    'x\rExecStartPre=/bin/touch /tmp/pwned', 'x\x0bExecStartPre=/bin/touch /tmp/pwned',
    'a" ; /bin/touch /tmp/pwned ; "b', "a' ; /bin/touch /tmp/pwned ; 'b", '--x=1 ; /bin/touch /tmp/pwned',
    '\\\nExecStartPre=/bin/touch /tmp/pwned', '# comment', '; comment', '[Service]', 'User=nobody',
    ' leading', 'trailing ', '  ', '', 'a b\tc', 'é ü 日本語 🚀 \u00a0\u2028\u2029\u0085 \ufeff',
    '\\x41\\n\\u00e9', 'x' * 5000, ('a"b\\c$d%e;f\n' * 400),
]
assert len(set(HOSTILE)) == len(HOSTILE)


def has_control(s):
    return any(ord(c) < 0x20 or c == '\x7f' for c in s)


BASE_ARGV = ['/opt/sglang/venv/bin/python', '-m', 'sglang.launch_server', '--model-path', '/models/Qwen',
             '--served-model-name', 'qwen', '--port', '30000']
BASE_ENV = {'CUDA_HOME': '/usr/local/cuda-13.0', 'NCCL_P2P_DISABLE': '1',
            'PATH': '/opt/sglang/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'}
BASE = dict(version='0.5.23', served_model_name='qwen', tp=4, speculative='NEXTN steps=1 topk=1 draft=2',
            environment=BASE_ENV, argv=BASE_ARGV)


def description(v):
    return 'SGLang serving %s (TP %s%s)' % (v['served_model_name'], v['tp'],
                                           ', MTP %s' % v['speculative'] if v['speculative'] else '')


def unit_for(v):
    return render.render('sglang.service.j2', version=v['version'], served_model_name=v['served_model_name'],
                         tp=v['tp'], speculative=v['speculative'], environment=v['environment'], environment_file=None,
                         exec_start=render.exec_start(v['argv']))


def cases():
    """(case id, values, legal) for every hostile string in every field."""
    out = []
    for k, s in enumerate(HOSTILE):
        def case(field, legal, **change):
            out.append(('%s-%d' % (field, k), dict(BASE, **change), legal))
        case('arg', True, argv=BASE_ARGV[:4] + [s] + BASE_ARGV[5:])
        case('arg-mid', True, argv=BASE_ARGV[:2] + ['pre' + s + 'post'] + BASE_ARGV[3:])
        case('arg-last', True, argv=BASE_ARGV + [s])
        component = '/opt/%s/python' % s
        case('path', not has_control(s) and not any(c in s for c in '"\'\\$') and len(s.encode()) <= 255,
             argv=[component] + BASE_ARGV[1:])
        case('env-value', True, environment=dict(BASE_ENV, NOTE=s))
        case('env-value2', True, environment=dict(BASE_ENV, CUDA_HOME='/usr/%s/cuda' % s))
        case('env-key', bool(re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', s)), environment=dict(BASE_ENV, **{s: 'v'}))
        case('description', not has_control(s), served_model_name=s)
        case('speculative', not has_control(s), speculative=s)
        case('version', not has_control(s), version=s)
    return out


CASES = cases()


@pytest.fixture(scope='module')
def verified():
    """Every legal case rendered and loaded by systemd (one systemd-analyze run for all)."""
    units, values = {}, {}
    units['base.service'] = unit_for(BASE)
    values['base.service'] = BASE
    for k, (cid, v, legal) in enumerate(CASES):
        if legal:
            name = 'case%d.service' % k
            units[name] = unit_for(v)
            values[name] = v
    dumps, err = analyze(units)
    return units, values, dumps, warnings_by_unit(err)


def warnings_by_unit(err):
    """systemd's complaints about lines of our files ("case1.service:9: ...") by unit name."""
    out = collections.defaultdict(list)
    for m in re.finditer(r'^([\w.-]+\.service):\d+: .*$', err, re.M):
        out[m.group(1)].append(m.group(0))
    return out


def check_unit(name, text, v, dumps, warnings, base_shape):
    env = ['%s=%s' % kv for kv in sorted(v['environment'].items())]
    d = Dump(dumps[name], env)
    # (a) one ExecStart= with one command; no ExecStartPre=, ExecStartPost= or any other command.
    assert dict(d.commands) == {'ExecStart': [dollars(v['argv'])]}, dict(d.commands)
    # nothing else changed: the rest of the dump equals the benign unit's.
    assert d.shape(name) == base_shape, (d.shape(name) - base_shape, base_shape - d.shape(name))
    # systemd logged no warning about any line of the file.
    assert not warnings[name], warnings[name]
    # (b) the argv systemd executes: $$ -> $ at exec time (replace_env_argv).
    argv = systemd_unit.expand_argv(d.commands['ExecStart'][0], dict(e.partition('=')[::2] for e in env))
    assert argv == v['argv']
    # (c) Environment= entries: checked exactly by Dump; (d) Description.
    assert d.description == description(v)
    # The lab's parser reads the same unit.
    u = systemd_unit.parse_unit(text, name)
    assert u.warnings == []
    assert [(c.path, c.argv) for c in u.exec_start] == [(v['argv'][0], d.commands['ExecStart'][0])]
    assert u.exec_start_pre == [] and u.exec_start_post == []
    assert u.environment == env
    assert u.description == d.description
    assert systemd_unit.command_argv(u.exec_start[0], u.env_dict()) == v['argv']


def test_benign_unit_is_what_systemd_reads(verified):
    units, values, dumps, warnings = verified
    base_shape = Dump(dumps['base.service'], ['%s=%s' % kv for kv in sorted(BASE_ENV.items())]).shape('base.service')
    check_unit('base.service', units['base.service'], BASE, dumps, warnings, base_shape)


def test_hostile_values_reach_systemd_exactly(verified):
    units, values, dumps, warnings = verified
    base_shape = Dump(dumps['base.service'], ['%s=%s' % kv for kv in sorted(BASE_ENV.items())]).shape('base.service')
    failures = []
    for name in units:
        try:
            check_unit(name, units[name], values[name], dumps, warnings, base_shape)
        except AssertionError as e:
            failures.append('%s %r: %s' % (name, values[name], str(e)[:2000]))
    assert not failures, '\n\n'.join(failures[:10])
    assert len(units) > 400


@pytest.mark.parametrize('cid,v,legal', [c for c in CASES if not c[2]], ids=[c[0] for c in CASES if not c[2]])
def test_values_systemd_would_change_are_refused(cid, v, legal):
    with pytest.raises(ValueError):
        unit_for(v)


# --- the functions themselves ------------------------------------------------------------------

def test_plain_words_stay_unquoted_and_everything_else_is_quoted():
    assert systemd.exec_line(['/usr/bin/x', '-m', 'a.b', '--k=v', '0.0.0.0', '/a:b', 'a,b+c@d']) == \
        '/usr/bin/x -m a.b --k=v 0.0.0.0 /a:b a,b+c@d'
    assert systemd.exec_line(['/x', '', ';', 'a b', '50%', '$HOME', 'a\nb', '\x01', '"\\']) == \
        '/x "" ";" "a b" "50%%" "$$HOME" "a\\nb" "\\x01" "\\"\\\\"'
    assert systemd.environment_line('A', 'x$Y %n "q" \\ \n') == 'Environment="A=x$Y %%n \\"q\\" \\\\ \\n"'
    assert systemd.escape_specifiers('50% $x \\') == '50%% $x \\'


@pytest.mark.parametrize('argv', [[], ['python'], ['./bin/python'], ['-/bin/true'], ['@/bin/true'], [':/x'],
                                  ['+/x'], ['!/x'], ['|/x'], ['/bin/'], ['/a"b'], ["/a'b"], ['/a\\b'], ['/a$b'],
                                  ['/a\nb'], ['/a\x7f'], ['/' + 'x' * 256], ['/a/' * 1400], ['/bin/x', 'a\0b'],
                                  ['/bin/x', '\ud800'], ['/bin/x', 'y' * (1024 * 1024)]])
def test_exec_line_refuses(argv):
    with pytest.raises(ValueError):
        systemd.exec_line(argv)


def test_exec_line_takes_a_list():
    with pytest.raises(TypeError):
        systemd.exec_line('/bin/true')
    with pytest.raises(TypeError):
        systemd.exec_line(['/bin/echo', 4])
    with pytest.raises(TypeError, match='exec_start'):
        render.render('sglang.service.j2', version='1', served_model_name='m', tp=1, speculative=None,
                      environment={}, environment_file=None, exec_start='/bin/true; /bin/touch /tmp/pwned')


@pytest.mark.parametrize('key', ['', '1A', 'A-B', 'A B', 'A=B', 'Ä', 'A\n', '$A', 'A.B', '%n'])
def test_environment_line_refuses_bad_names(key):
    with pytest.raises(ValueError):
        systemd.environment_line(key, 'v')


@pytest.mark.parametrize('value', ['a\0b', '\udc80'])
def test_environment_line_refuses_values_systemd_cannot_hold(value):
    with pytest.raises(ValueError):
        systemd.environment_line('A', value)


@pytest.mark.parametrize('text', ['', ' x', 'x ', 'x\\', 'x\\\\\\', 'a\nb', 'a\tb', 'a\rb', '\x7f'])
def test_text_value_refuses_what_systemd_would_change(text):
    with pytest.raises(ValueError):
        systemd.text_value(text)


def test_text_value_keeps_even_backslashes_and_escapes_percent():
    assert systemd.text_value('a\\\\') == 'a\\\\'
    assert systemd.text_value('100% %n') == '100%% %%n'


@pytest.mark.parametrize('name', ['../../etc/passwd', 'a/b.service', 'x@.service', 'x@y.service', '.service',
                                  'a' * 248 + '.service', 'sglang', 'sglang.socket', 'a b.service', 'é.service',
                                  'a\n.service', '', 'a.service/', 'a%n.service'])
def test_bad_unit_names(name):
    assert not systemd.valid_unit_name(name)
    with pytest.raises(ValueError):
        systemd.check_unit_name(name)


@pytest.mark.parametrize('name', ['sglang-qwen.service', 'a.service', 'a:b_c.d-e.service', 'x\\x2dy.service',
                                  'a' * 247 + '.service'])
def test_good_unit_names(name):
    assert systemd.valid_unit_name(name)
    assert systemd.check_unit_name(name) == name


def test_unit_name_rule_matches_systemd():
    """systemd-analyze agrees: it loads the valid names and refuses the others."""
    exe = systemd_analyze()
    good = ['a' * 247 + '.service', 'a_b.c-d.service', 'x\\x2dy.service']  # (a ':' in a path means an alias to verify)
    bad = ['x y.service', 'é.service', 'a%n.service']
    for name in good + bad:
        assert systemd.valid_unit_name(name) == (name in good)
    with tempfile.TemporaryDirectory() as d:
        for name in good + bad:
            with open(os.path.join(d, name), 'w') as f:
                f.write('[Service]\nExecStart=/bin/true\n')
        for name in good + bad:
            r = subprocess.run([exe, 'verify', '--man=no', os.path.join(d, name)], capture_output=True, text=True,
                               env=dict(os.environ, SYSTEMD_LOG_LEVEL='debug'))
            assert ('-> Unit %s:' % name in r.stdout) == (name in good), (name, r.stderr[-2000:])


# --- the lab's parser against systemd on hand-written units ------------------------------------

GRAMMAR = {
    'quotes.service': r'''[Unit]
Description=quotes %% %n %N %p %i %j "x" \n $X
[Service]
Type=oneshot
ExecStart=/bin/echo a"b c"d 'a\nb' 'it''s' "a"'b' x" y"z "" '' \x41 \u00e9 \101 \s\a
ExecStart=/bin/echo "\e" a\;b \; "\;" x\ y "\x00" a% %% %%n "%%" \$ ab\\ "a\\" \"x\" trailing
ExecStart=/bin/echo %n %N %p %P %i %I %j %J %f %h %u %U %g %G %t %S %C %L %E %T %V %d
''',
    'semicolons.service': '''[Service]
Type=oneshot
ExecStart=/bin/echo a;b ";" c\\;
ExecStart=/bin/echo "a" ;/bin/echo
ExecStart=/bin/echo x ; ; /bin/echo y;
ExecStart=/bin/echo z ;
ExecStart=/bin/echo\t;\t/bin/echo 2 \\;\t3 \\;
''',
    'reset.service': '''[Service]
Type=oneshot
ExecStart=/bin/echo a
ExecStartPre=/bin/false
ExecStart=
ExecStartPre=
ExecStart=/bin/echo b
ExecStartPre=-/bin/echo pre1 $$X ${X} $X
ExecStartPre=:/bin/echo pre2 $X
ExecStartPost=+/bin/echo post
ExecStartPost=!!/bin/echo post2
ExecStartPost=-@/bin/echo zero one
Environment=X=1
''',
    'continuation.service': '''[Unit]
Description=first \\
  second
[Service]
ExecStart=/bin/echo a \\
# a comment inside the continuation is skipped
  b \\
 ; this one too
Environment="X=1" \\
  Y=2

[Service]
Environment=Z=3
''',
    'environment.service': r'''[Service]
ExecStart=/bin/true
Environment="A=b c" B=$X "C=%%n %n" 'D=x\ny' E=a\x01b "F=\x01" "G=\t" H=${X} "I=$$" J= 'K=it''s' L=a"b c"d
Environment=A=again M=1 1N=bad O
Environment=P=\x25n "Q=\x25%%n" R=%z S=ok "T=\q" U=lost
Environment=V=1 "W=unbalanced
''',
    'ignored.service': '''[Service]
Type=oneshot
ExecStart=/bin/echo a ; -/bin/echo %z ; /bin/echo c
ExecStart=/bin/echo d
ExecStart="/bin/echo
ExecStart=/bin/echo e
ExecStart=-@/bin/echo ; /bin/echo f
''',
    'envreset.service': '''[Service]
ExecStart=/bin/true
Environment=A=1 B=2
Environment=
Environment=C=3
''',
    'crlf.service': '[Unit]\r\nDescription=crlf\r\n[Service]\r\nExecStart=/bin/echo a\rEnvironment=X=1\r\n',
    'nul.service': '[Unit]\nDescription=a\0After=x.target\n[Service]\nExecStart=/bin/echo b\0Environment=X=1\n',
}


def test_lab_parser_reads_units_like_systemd():
    dumps, err = analyze(GRAMMAR)
    for name, text in GRAMMAR.items():
        u = systemd_unit.parse_unit(text, name, fragment_path='/dev/null')
        d = Dump(dumps[name], u.environment)   # asserts systemd's Environment entries are exactly these
        got = {k: [c.argv for c in getattr(u, a)] for k, a in
               (('ExecStartPre', 'exec_start_pre'), ('ExecStart', 'exec_start'), ('ExecStartPost', 'exec_start_post'))}
        assert {k: v for k, v in got.items() if v} == dict(d.commands), name
        assert (u.description or name) == d.description, name


@pytest.mark.parametrize('text', [
    '[Service]\nExecStart=/bin/echo "abc\n',
    '[Service]\nExecStart="/bin/echo\n',
    '[Service]\nExecStart=-/bin/echo "x\n',
    '[Service]\nEnvironment=A=1\n',
    '[Service]\nType=oneshot\nExecStart=/bin/echo e ; @/bin/echo\n',
    '[Service]\nExecStart=/bin/echo %z\n',
    '[Service]\nExecStart=/bin/echo a\nExecStart=/bin/echo b\n',
    '[Service\nExecStart=/bin/true\n',
    '[Service]\nExecStart=+!/bin/true\n',
    '[Service]\nExecStart=/bin/echo\\;\n',
    '[Service]\nExecStart=/' + 'p' * 4095 + '\n',
    '[Service]\nExecStart=/bin/true ' + 'x' * (1024 * 1024) + '\n',
])
def test_lab_parser_refuses_what_systemd_refuses(text):
    exe = systemd_analyze()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'bad.service')
        with open(path, 'w') as f:
            f.write(text)
        r = subprocess.run([exe, 'verify', '--man=no', path], capture_output=True, text=True,
                           env=dict(os.environ, SYSTEMD_LOG_LEVEL='debug'))
    assert '-> Unit bad.service:' not in r.stdout
    with pytest.raises(systemd_unit.UnitError):
        systemd_unit.parse_unit(text, 'bad.service')


def test_exec_time_expansion():
    env = {'X': 'a b  "c d"', 'E': ''}
    assert systemd_unit.expand_argv(['$X', '${X}', 'p${X}q', '$$X', '$${X}', '$$', 'a$X', '$E', '$UNSET', '${UNSET}',
                                     '${X:-d}', '${X', '$'], env) == \
        ['a', 'b', 'c d', 'a b  "c d"', 'pa b  "c d"q', '$X', '${X}', '$', 'a$X', '', '${X:-d}', '${X']


def test_environment_file_grammar():
    text = ('# comment\n; also\nA=1\n  B = two words  \nC="quoted \\"x\\" \\$y \\n"\nD=\'single $x\'\n'
            'E=a\\\nb\nexport F=1\nG\nH=\nI=x"y z"\n')
    assert systemd_unit.load_env_text(text) == [
        ('A', '1'), ('B', 'two words'), ('C', 'quoted "x" $y \\n'), ('D', 'single $x'), ('E', 'ab'),
        ('export F', '1'), ('H', ''), ('I', 'x"y z"')]
