"""Unit files read the way systemd 252 reads them: the inverse of grammar/systemd.py, which writes
them. The policy pack uses it to see the SGLang unit as systemd will run it (the ExecStart= argv,
Environment=), whatever the text holds; tests/unit/grammar/test_systemd_unit.py compares it with systemd's own
parser (`systemd-analyze verify`) on hostile strings.

Followed from systemd 252's sources (conf-parser.c, load-fragment.c, extract-word.c, escape.c,
specifier.c, env-util.c) and checked against systemd-analyze:

- lines end at \\n, \\r, \\r\\n or NUL; a line ending in an odd number of backslashes continues
  on the next one (the backslash becomes a space); a line whose first non-blank is '#' or ';' is a
  comment, also in the middle of a continuation; sections, repeated keys; a line over 1 MiB - 1
  bytes or a malformed section header fails the unit;
- ExecStart=/ExecStartPre=/ExecStartPost=: extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE),
  retried with EXTRACT_UNESCAPE_RELAX on a bad escape (kept verbatim); quotes may open and close
  anywhere in a word; a lone ';' separates commands and '\\;' is a literal ';' argument; prefixes
  - @ : + ! on the executable; % specifiers per word; an empty value resets the list;
- Environment=: the same word splitting, then specifiers, no $ expansion;
- at exec time: $$ -> $, ${VAR} inside a word -> the value as one word, a word that is exactly
  $VAR -> the value split at whitespace (replace_env_argv), unless the ':' prefix is given.
"""

import os
import platform
import pwd
import re
import socket

WHITESPACE = ' \t\n\r'
COMMENTS = '#;'
LONG_LINE_MAX = 1024 * 1024
PATH_MAX = 4096
NAME_MAX = 255
# The manager's PATH for executables given by name only (systemd 252, split-usr build).
DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# extract_first_word() flags
UNQUOTE = 1
CUNESCAPE = 2
UNESCAPE_RELAX = 4
RELAX = 8

_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*\Z')


class UnitError(Exception):
    """systemd would refuse to load the unit ("bad unit file setting")."""


class _Inval(Exception):
    """-EINVAL from extract_first_word()/cunescape_one()."""


class SpecifierError(Exception):
    """A % specifier systemd cannot resolve (e.g. an unknown one: -EBADSLT)."""


# --- escapes and words -------------------------------------------------------------------------

def _enc(ch):
    return ch.encode('utf-8', 'surrogateescape')


def _dec(b):
    return bytes(b).decode('utf-8', 'surrogateescape')


def cunescape_one(s, i):
    """systemd's cunescape_one() for the escape whose letter is at s[i] (accept_nul false):
    (bytes, length consumed) or None if it is not a valid escape."""
    c = s[i] if i < len(s) else ''
    simple = {'a': b'\a', 'b': b'\b', 'f': b'\f', 'n': b'\n', 'r': b'\r', 't': b'\t', 'v': b'\v',
              '\\': b'\\', '"': b'"', "'": b"'", 's': b' '}
    if c in simple:
        return simple[c], 1
    hexd = '0123456789abcdefABCDEF'
    if c == 'x':
        h = s[i + 1:i + 3]
        if len(h) < 2 or any(ch not in hexd for ch in h) or int(h, 16) == 0:
            return None
        return bytes([int(h, 16)]), 3
    if c in ('u', 'U'):
        n = 4 if c == 'u' else 8
        h = s[i + 1:i + 1 + n]
        if len(h) < n or any(ch not in hexd for ch in h):
            return None
        v = int(h, 16)
        if v == 0:
            return None
        if c == 'U' and (v > 0x10ffff or 0xd800 <= v <= 0xdfff):
            return None
        if v > 0x10ffff:
            return None
        return chr(v).encode('utf-8', 'surrogatepass'), n + 1
    if c and c in '01234567':
        o = s[i:i + 3]
        if len(o) < 3 or any(ch not in '01234567' for ch in o):
            return None
        v = int(o, 8)
        if v == 0 or v > 255:
            return None
        return bytes([v]), 3
    return None


def extract_first_word(s, i, flags, separators=WHITESPACE):
    """systemd's extract_first_word() on s[i:]: (word, index after it), or (None, len(s)) when no
    word is left. Raises _Inval where systemd returns -EINVAL."""
    n = len(s)
    while i < n and s[i] in separators:
        i += 1
    if i >= n:
        return None, n
    out = bytearray()
    quote = None
    while True:
        if i >= n:
            if quote is not None and not flags & RELAX:
                raise _Inval('unbalanced quoting')
            return _dec(out), n
        c = s[i]
        if c == '\\':
            i += 1
            if i >= n:
                if flags & UNESCAPE_RELAX and (quote is None or flags & RELAX):
                    out += b'\\'
                    return _dec(out), n
                if flags & RELAX:
                    return _dec(out), n
                raise _Inval('trailing backslash')
            if flags & CUNESCAPE:
                r = cunescape_one(s, i)
                if r is not None:
                    out += r[0]
                    i += r[1]
                elif flags & UNESCAPE_RELAX:
                    out += b'\\' + _enc(s[i])
                    i += 1
                else:
                    raise _Inval('unknown escape \\%s' % s[i])
            else:
                out += _enc(s[i])
                i += 1
            continue
        if quote is not None:
            if c == quote:
                quote = None
            else:
                out += _enc(c)
            i += 1
            continue
        if c in '\'"' and flags & UNQUOTE:
            quote = c
            i += 1
            continue
        if c in separators:
            while i < n and s[i] in separators:
                i += 1
            return _dec(out), i
        out += _enc(c)
        i += 1


def extract_first_word_and_warn(s, i, flags, warn):
    """extract_first_word_and_warn(): on a bad escape, retry keeping unknown escapes verbatim."""
    try:
        return extract_first_word(s, i, flags)
    except _Inval:
        if flags & UNESCAPE_RELAX:
            raise
    word, j = extract_first_word(s, i, flags | UNESCAPE_RELAX)   # may raise: unbalanced quoting
    warn('Ignoring unknown escape sequences: "%s"' % word)
    return word, j


def split_words(s, flags):
    """strv_split_full(): every word of s."""
    out, i = [], 0
    while True:
        w, i = extract_first_word(s, i, flags)
        if w is None:
            return out
        out.append(w)


# --- specifiers --------------------------------------------------------------------------------

def _read(path, default=None):
    try:
        with open(path, encoding='utf-8', errors='surrogateescape') as f:
            return f.read()
    except OSError:
        return default


def _os_release(key):
    text = _read('/etc/os-release') or _read('/usr/lib/os-release') or ''
    for k, v in load_env_text(text):
        if k == key:
            return v
    return ''


def unit_name_unescape(s):
    """unit_name_unescape(): \\xNN -> the byte, '-' -> '/'."""
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == '-':
            out += b'/'
            i += 1
        elif s[i] == '\\' and s[i + 1:i + 2] == 'x' and re.match(r'[0-9a-fA-F]{2}', s[i + 2:i + 4]):
            out.append(int(s[i + 2:i + 4], 16))
            i += 4
        else:
            out += _enc(s[i])
            i += 1
    return _dec(out)


class Specifiers:
    """The % specifiers of a unit in the system manager (unit_full_printf() of systemd 252)."""

    def __init__(self, name, fragment_path=None):
        self.name = name
        self.fragment_path = fragment_path
        stem, _, _ = name.rpartition('.')
        prefix, at, instance = stem.partition('@')
        self.prefix, self.instance = prefix, instance

    def lookup(self, c):
        n, p, i = self.name, self.prefix, self.instance
        arch = {'x86_64': 'x86-64', 'aarch64': 'arm64', 'i686': 'x86', 'i386': 'x86',
                'ppc64le': 'ppc64-le', 'armv7l': 'arm'}.get(platform.machine(), platform.machine())
        hostname = socket.gethostname()

        def machine_id():
            mid = (_read('/etc/machine-id') or '').strip()
            if not mid:
                raise SpecifierError('no machine ID')
            return mid

        def boot_id():
            b = (_read('/proc/sys/kernel/random/boot_id') or '').strip().replace('-', '')
            if not b:
                raise SpecifierError('no boot ID')
            return b

        def pretty():
            for k, v in load_env_text(_read('/etc/machine-info') or ''):
                if k == 'PRETTY_HOSTNAME' and v:
                    return v
            return hostname

        table = {
            'n': lambda: n, 'N': lambda: n.rpartition('.')[0], 'p': lambda: p,
            'P': lambda: unit_name_unescape(p), 'i': lambda: i, 'I': lambda: unit_name_unescape(i),
            'j': lambda: p.rpartition('-')[2], 'J': lambda: unit_name_unescape(p.rpartition('-')[2]),
            'f': lambda: '/' + unit_name_unescape(i if i else p).lstrip('/'),
            'y': lambda: self.fragment_path or '', 'Y': lambda: os.path.dirname(self.fragment_path or ''),
            'c': lambda: '/system.slice/' + n, 'r': lambda: '/system.slice', 'R': lambda: '/',
            'C': lambda: '/var/cache', 'd': lambda: '/run/credentials/' + n, 'E': lambda: '/etc',
            'L': lambda: '/var/log', 'S': lambda: '/var/lib', 't': lambda: '/run',
            'a': lambda: arch, 'A': lambda: _os_release('IMAGE_VERSION'), 'b': boot_id,
            'B': lambda: _os_release('BUILD_ID'), 'H': lambda: hostname, 'l': lambda: hostname.split('.')[0],
            'm': machine_id, 'M': lambda: _os_release('IMAGE_ID'), 'o': lambda: _os_release('ID'),
            'q': pretty, 'v': lambda: os.uname().release, 'w': lambda: _os_release('VERSION_ID'),
            'W': lambda: _os_release('VARIANT_ID'),
            'g': lambda: 'root', 'G': lambda: '0', 'u': lambda: 'root', 'U': lambda: '0',
            'h': lambda: pwd.getpwuid(0).pw_dir, 's': lambda: pwd.getpwuid(0).pw_shell,
            'T': lambda: '/tmp', 'V': lambda: '/var/tmp',
        }
        if c not in table:
            raise SpecifierError('unknown specifier %%%s' % c)
        return table[c]()

    def printf(self, text, max_length=None):
        """specifier_printf(): %% -> %, %X -> its value, a trailing lone % kept."""
        out, k = [], 0
        while k < len(text):
            ch = text[k]
            if ch == '%' and k + 1 < len(text):
                nxt = text[k + 1]
                out.append('%' if nxt == '%' else self.lookup(nxt))
                k += 2
            else:
                out.append(ch)
                k += 1
        res = ''.join(out)
        if max_length is not None and len(_enc(res)) > max_length:
            raise SpecifierError('File name too long')
        return res


# --- the unit file -----------------------------------------------------------------------------

def physical_lines(text):
    """(line number, line) as systemd's read_line() yields them: \\n, \\r, \\r\\n and NUL end lines."""
    out, start, no, k, n = [], 0, 1, 0, len(text)
    while k < n:
        ch = text[k]
        if ch in '\n\r\0':
            out.append((no, text[start:k]))
            no += 1
            k += 2 if text[k:k + 2] == '\r\n' else 1
            start = k
        else:
            k += 1
    if start < n:
        out.append((no, text[start:]))
    return out


def logical_lines(text):
    """(line number, line) after config_parse()'s comment and continuation handling."""
    if text.startswith('\ufeff'):
        text = text[1:]
    out, cont, cont_no = [], None, None
    for no, raw in physical_lines(text):
        if len(_enc(raw)) >= LONG_LINE_MAX:
            raise UnitError('line %d: line too long' % no)
        stripped = raw.lstrip(WHITESPACE)
        if stripped and stripped[0] in COMMENTS:
            continue
        p = raw if cont is None else cont + raw
        if cont is not None and len(_enc(p)) > LONG_LINE_MAX:
            raise UnitError('line %d: continuation line too long' % no)
        escaped = False
        for ch in p:
            escaped = False if escaped else ch == '\\'
        if escaped:
            if cont is None:
                cont_no = no
            cont = p[:-1] + ' '
            continue
        out.append((no if cont is None else cont_no, p))
        cont = None
    if cont is not None:
        out.append((cont_no, cont))
    return out


class ExecCommand:
    """One command of ExecStart= & co.: path is what runs, argv is before $ expansion."""

    def __init__(self, path, argv, ignore_failure=False, no_env_expand=False, privileged=''):
        self.path, self.argv = path, argv
        self.ignore_failure, self.no_env_expand, self.privileged = ignore_failure, no_env_expand, privileged

    def __repr__(self):
        flags = [f for f in ('ignore_failure', 'no_env_expand') if getattr(self, f)]
        return 'ExecCommand(%r, %r%s)' % (self.path, self.argv, ''.join(', %s=True' % f for f in flags))


def _path_is_valid(path):
    b = _enc(path)
    return 0 < len(b) < PATH_MAX and all(len(c) <= NAME_MAX for c in b.split(b'/'))


def _filename_is_valid(name):
    return name not in ('', '.', '..') and '/' not in name and len(_enc(name)) <= NAME_MAX


def _string_is_safe(s):
    return not any(ord(ch) < 0x20 or ch in '"\'\\\x7f' for ch in s)


def parse_exec(rvalue, spec, warn):
    """config_parse_exec(): the commands of one ExecStart=-style value. Raises UnitError where
    systemd fails the unit; a command with the '-' prefix is dropped instead (with a warning)."""
    cmds, p = [], 0
    n = len(rvalue)
    flags = UNQUOTE | CUNESCAPE
    while True:
        try:
            first, p = extract_first_word_and_warn(rvalue, p, flags, warn)
        except _Inval:      # systemd ignores the rest of the line (no error) when the first word is bad
            warn('Unbalanced quoting, ignoring: "%s"' % rvalue)
            return cmds
        if first is None:
            return cmds
        if first == ';':
            continue
        f, ignore, at, no_expand, priv = first, False, False, False, ''
        while f:
            if f[0] == '-' and not ignore:
                ignore = True
            elif f[0] == '@' and not at:
                at = True
            elif f[0] == ':' and not no_expand:
                no_expand = True
            elif f[0] == '+' and not priv:
                priv = '+'
            elif f[0] == '!' and priv in ('', '!'):
                priv += '!'
            else:
                break
            f = f[1:]

        def bad(msg):
            if ignore:
                warn(msg + ', ignoring')
                return None
            raise UnitError(msg)

        try:
            path = spec.printf(f, PATH_MAX - 1)
        except SpecifierError as e:
            return bad("Failed to resolve unit specifiers in '%s': %s" % (f, e)) or cmds
        if not path:
            return bad("Empty path in command line: '%s'" % rvalue) or cmds
        if not _string_is_safe(path):
            return bad('Executable name contains special characters: %s' % path) or cmds
        if path.endswith('/'):
            return bad('Executable path specifies a directory: %s' % path) or cmds
        if not (_path_is_valid(path) if path.startswith('/') else _filename_is_valid(path)):
            return bad('Neither a valid executable name nor an absolute path: %s' % path) or cmds
        argv = [] if at else [path]
        semicolon = False
        while p < n:   # p is at a word (extract_first_word skips the separators after one)
            if rvalue[p] == ';' and (p + 1 == n or rvalue[p + 1] in WHITESPACE):
                p += 1
                while p < n and rvalue[p] in WHITESPACE:
                    p += 1
                semicolon = True
                break
            if rvalue[p:p + 2] == '\\;' and (p + 2 == n or rvalue[p + 2] in WHITESPACE):
                p += 2
                while p < n and rvalue[p] in WHITESPACE:
                    p += 1
                argv.append(';')
                continue
            try:
                word, p = extract_first_word_and_warn(rvalue, p, flags, warn)
            except _Inval:
                return bad('Unbalanced quoting: "%s"' % rvalue) or cmds
            if word is None:
                break
            try:
                argv.append(spec.printf(word))
            except SpecifierError as e:
                return bad('Failed to resolve unit specifiers in %s: %s' % (word, e)) or cmds
        if not argv:
            return bad('Empty executable name or zeroeth argument: %s' % rvalue) or cmds
        cmds.append(ExecCommand(path, argv, ignore, no_expand, priv))
        if not semicolon:
            return cmds


def parse_environment(rvalue, spec, warn):
    """config_parse_environ(): the KEY=value assignments of one Environment= value, in order."""
    out, p = [], 0
    while True:
        try:
            word, p = extract_first_word(rvalue, p, UNQUOTE | CUNESCAPE)
        except _Inval:
            warn('Invalid syntax, ignoring: %s' % rvalue)
            return out
        if word is None:
            return out
        try:
            word = spec.printf(word)
        except SpecifierError as e:
            warn('Failed to resolve specifiers in %s, ignoring: %s' % (word, e))
            continue
        if not env_assignment_is_valid(word):
            warn('Invalid environment assignment, ignoring: %s' % word)
            continue
        out.append(word)


def env_assignment_is_valid(a):
    key, eq, value = a.partition('=')
    if not eq or not _ENV_NAME.match(key):
        return False
    try:
        value.encode('utf-8')
    except UnicodeEncodeError:       # invalid UTF-8 (surrogate-escaped bytes)
        return False
    return True


def env_replace(env_list, assignment):
    """strv_env_replace(): a new KEY=value replaces KEY's earlier one in place, else is appended."""
    key = assignment.partition('=')[0]
    for k, old in enumerate(env_list):
        if old.partition('=')[0] == key:
            env_list[k] = assignment
            return
    env_list.append(assignment)


class Unit:
    """A parsed unit: every assignment in order, and the settings the lab's systemctl runs."""

    def __init__(self, name, fragment_path=None):
        self.name = name
        self.fragment_path = fragment_path
        self.assignments = []          # (section, key, value, line number)
        self.warnings = []
        self.description = None
        self.type = 'simple'
        self.remain_after_exit = False
        self.environment = []          # ['KEY=value', ...] as systemd keeps them
        self.environment_files = []    # [(path, optional)]
        self.exec_start_pre = []
        self.exec_start = []
        self.exec_start_post = []
        self.working_directory = None  # (path, optional) or None for '/'
        self.timeout_start_sec = 90.0

    def env_dict(self):
        return dict(a.partition('=')[::2] for a in self.environment)

    def get(self, section, key, default=None):
        """The last value of section/key, as systemd keeps the last of a plain setting."""
        vals = [v for s, k, v, _ in self.assignments if s == section and k == key]
        return vals[-1] if vals else default


def parse_bool(v):
    v = v.strip().lower()
    if v in ('1', 'yes', 'y', 'true', 't', 'on'):
        return True
    if v in ('0', 'no', 'n', 'false', 'f', 'off'):
        return False
    raise ValueError(v)


def parse_sec(v):
    """parse_sec(): '900', '15min', '1h 30s', 'infinity' -> seconds (None for infinity)."""
    v = v.strip()
    if v == 'infinity':
        return None
    units = {'us': 1e-6, 'usec': 1e-6, 'ms': 1e-3, 'msec': 1e-3, '': 1, 's': 1, 'sec': 1, 'second': 1,
             'seconds': 1, 'm': 60, 'min': 60, 'minute': 60, 'minutes': 60, 'h': 3600, 'hr': 3600,
             'hour': 3600, 'hours': 3600, 'd': 86400, 'day': 86400, 'days': 86400}
    parts = re.findall(r'\s*([0-9.]+)\s*([a-z]*)', v)
    if not parts or ''.join(a + b for a, b in parts) != re.sub(r'\s', '', v):
        raise ValueError(v)
    return sum(float(a) * units[b] for a, b in parts)


def parse_unit(text, name, fragment_path=None):
    """A unit file's text -> Unit, as systemd 252 loads it. Raises UnitError when systemd would
    refuse the unit ("bad unit file setting"); other problems become warnings, as in systemd."""
    u = Unit(name, fragment_path)
    spec = Specifiers(name, fragment_path)
    section, ignored = None, False
    for no, line in logical_lines(text):
        def warn(msg, no=no):
            u.warnings.append('%s:%d: %s' % (fragment_path or name, no, msg))
        line = line.strip(WHITESPACE)
        if not line:
            continue
        if line[0] == '[':
            if line[-1] != ']':
                raise UnitError("line %d: Invalid section header '%s'" % (no, line))
            section = line[1:-1]
            if not _string_is_safe(section):
                raise UnitError('line %d: Bad characters in section header %r' % (no, line))
            ignored = section not in ('Unit', 'Service', 'Install') and not section.startswith('X-')
            if ignored:
                warn("Unknown section '%s'. Ignoring." % section)
            continue
        if section is None:
            warn('Assignment outside of section. Ignoring.')
            continue
        if ignored:
            continue
        if '=' not in line:
            warn("Missing '=', ignoring line.")
            continue
        key, _, value = line.partition('=')
        key, value = key.strip(WHITESPACE), value.strip(WHITESPACE)
        if not key:
            warn("Missing key name before '=', ignoring line.")
            continue
        try:
            _enc(line).decode('utf-8')
        except UnicodeDecodeError:
            raise UnitError('line %d: String is not UTF-8 clean: %s=...' % (no, key))
        u.assignments.append((section, key, value, no))
        _apply(u, spec, section, key, value, warn)
    _verify(u)
    return u


def _apply(u, spec, section, key, value, warn):
    if section == 'Unit' and key == 'Description':
        try:
            u.description = spec.printf(value) or None
        except SpecifierError as e:
            warn('Failed to resolve unit specifiers in %s, ignoring: %s' % (value, e))
        return
    if section != 'Service':
        return
    if key in ('ExecStartPre', 'ExecStart', 'ExecStartPost'):
        attr = {'ExecStartPre': 'exec_start_pre', 'ExecStart': 'exec_start', 'ExecStartPost': 'exec_start_post'}[key]
        if not value:
            setattr(u, attr, [])
        else:
            getattr(u, attr).extend(parse_exec(value, spec, warn))
    elif key == 'Environment':
        if not value:
            u.environment = []
        for a in parse_environment(value, spec, warn):
            env_replace(u.environment, a)
    elif key == 'EnvironmentFile':
        if not value:
            u.environment_files = []
            return
        optional = value.startswith('-')
        try:
            path = spec.printf(value[1:] if optional else value, PATH_MAX - 1)
        except SpecifierError as e:
            warn('Failed to resolve unit specifiers in %s, ignoring: %s' % (value, e))
            return
        if not path.startswith('/'):
            warn("Path '%s' is not absolute, ignoring." % path)
            return
        u.environment_files.append((path, optional))
    elif key == 'WorkingDirectory':
        optional = value.startswith('-')
        v = value[1:] if optional else value
        try:
            v = spec.printf(v, PATH_MAX - 1)
        except SpecifierError as e:
            raise UnitError('Failed to resolve unit specifiers in %s: %s' % (value, e))
        if v == '~':
            v = pwd.getpwuid(0).pw_dir
        if not v.startswith('/'):
            raise UnitError('WorkingDirectory= path is not absolute: %s' % v)
        u.working_directory = (v, optional)
    elif key == 'Type':
        if value not in ('simple', 'exec', 'forking', 'oneshot', 'dbus', 'notify', 'idle'):
            warn('Failed to parse service type, ignoring: %s' % value)
        else:
            u.type = value
    elif key == 'RemainAfterExit':
        try:
            u.remain_after_exit = parse_bool(value)
        except ValueError:
            warn('Failed to parse boolean value, ignoring: %s' % value)
    elif key in ('TimeoutStartSec', 'TimeoutSec'):
        try:
            u.timeout_start_sec = parse_sec(value)
        except (ValueError, KeyError):
            warn('Failed to parse %s= parameter, ignoring: %s' % (key, value))


def _verify(u):
    """service_verify(): what makes systemd refuse a loaded service."""
    if u.name.endswith('.service'):
        if not u.exec_start and not u.get('Service', 'ExecStop') and not u.get('Unit', 'SuccessAction'):
            raise UnitError('Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing.')
        if u.type != 'oneshot' and len(u.exec_start) > 1:
            raise UnitError('Service has more than one ExecStart= setting, which is only allowed for '
                            'Type=oneshot services. Refusing.')


# --- environment files (os-release, machine-info: the specifiers read them) ----------------------

def load_env_text(text):
    """parse_env_file_internal() of systemd 252 (EnvironmentFile=, os-release): [(key, value)]."""
    NEWLINE, SHELL_NEED_ESCAPE = '\n\r', '"\\`$'
    out = []
    state = 'PRE_KEY'
    key, value = [], None
    last_key_ws = last_value_ws = None

    def push(strip_value):
        k = ''.join(key)
        if last_key_ws is not None:
            k = ''.join(key[:last_key_ws])
        v = None if value is None else ''.join(value)
        if strip_value and v is not None and last_value_ws is not None:
            v = ''.join(value[:last_value_ws])
        out.append((k, v if v is not None else ''))

    for c in text:
        if state == 'PRE_KEY':
            if c in COMMENTS:
                state = 'COMMENT'
            elif c not in WHITESPACE:
                state, key, last_key_ws = 'KEY', [c], None
        elif state == 'KEY':
            if c in NEWLINE:
                state, key = 'PRE_KEY', []
            elif c == '=':
                state, last_value_ws = 'PRE_VALUE', None
            else:
                if c not in WHITESPACE:
                    last_key_ws = None
                elif last_key_ws is None:
                    last_key_ws = len(key)
                key.append(c)
        elif state == 'PRE_VALUE':
            if c in NEWLINE:
                push(False)
                state, key, value = 'PRE_KEY', [], None
            elif c == "'":
                state = 'SINGLE_QUOTE_VALUE'
                value = value if value is not None else []
            elif c == '"':
                state = 'DOUBLE_QUOTE_VALUE'
                value = value if value is not None else []
            elif c == '\\':
                state = 'VALUE_ESCAPE'
                value = value if value is not None else []
            elif c not in WHITESPACE:
                state = 'VALUE'
                value = (value if value is not None else []) + [c]
        elif state == 'VALUE':
            if c in NEWLINE:
                push(True)
                state, key, value = 'PRE_KEY', [], None
            elif c == '\\':
                state, last_value_ws = 'VALUE_ESCAPE', None
            else:
                if c not in WHITESPACE:
                    last_value_ws = None
                elif last_value_ws is None:
                    last_value_ws = len(value)
                value.append(c)
        elif state == 'VALUE_ESCAPE':
            state = 'VALUE'
            if c not in NEWLINE:
                value.append(c)
        elif state == 'SINGLE_QUOTE_VALUE':
            if c == "'":
                state = 'PRE_VALUE'
            else:
                value.append(c)
        elif state == 'DOUBLE_QUOTE_VALUE':
            if c == '"':
                state = 'PRE_VALUE'
            elif c == '\\':
                state = 'DOUBLE_QUOTE_VALUE_ESCAPE'
            else:
                value.append(c)
        elif state == 'DOUBLE_QUOTE_VALUE_ESCAPE':
            state = 'DOUBLE_QUOTE_VALUE'
            if c in SHELL_NEED_ESCAPE:
                value.append(c)
            elif c != '\n':
                value += ['\\', c]
        elif state == 'COMMENT':
            if c == '\\':
                state = 'COMMENT_ESCAPE'
            elif c in NEWLINE:
                state = 'PRE_KEY'
        elif state == 'COMMENT_ESCAPE':
            state = 'COMMENT'
    if state in ('PRE_VALUE', 'VALUE', 'VALUE_ESCAPE', 'SINGLE_QUOTE_VALUE', 'DOUBLE_QUOTE_VALUE',
                 'DOUBLE_QUOTE_VALUE_ESCAPE'):
        push(state == 'VALUE')
    return out



# --- what a command's argv becomes ------------------------------------------------------------

def replace_env(word, env):
    """replace_env() without flags: $$ -> $, ${VAR} -> its value ('' if unset), anything else kept."""
    out, start, state = [], 0, 'WORD'
    for e, ch in enumerate(word):
        if state == 'WORD':
            if ch == '$':
                state = 'CURLY'
        elif state == 'CURLY':
            if ch == '{':
                out.append(word[start:e - 1])
                start, state = e - 1, 'VARIABLE'
            elif ch == '$':
                out.append(word[start:e])
                start, state = e + 1, 'WORD'
            else:
                state = 'WORD'
        elif state == 'VARIABLE':
            if ch == '}':
                out.append(env.get(word[start + 2:e], ''))
                start, state = e + 1, 'WORD'
            elif ch == ':':
                state = 'WORD'
    out.append(word[start:])
    return ''.join(out)


def expand_argv(argv, env):
    """replace_env_argv(): a word that is exactly $VAR becomes the value split at whitespace (quotes
    honoured), nothing if unset; other words go through replace_env()."""
    out = []
    for w in argv:
        if w.startswith('$') and w[1:2] not in ('{', '$'):
            v = env.get(w[1:])
            if v is not None:
                out.extend(split_words(v, RELAX | UNQUOTE))
            continue
        out.append(replace_env(w, env))
    return out


def command_argv(cmd, env):
    """The argv a command runs with."""
    return list(cmd.argv) if cmd.no_env_expand else expand_argv(cmd.argv, env)
