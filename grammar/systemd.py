"""systemd's own grammar for the values gpuhost writes into unit files (pure, stdlib only).

Every function returns text that systemd parses back to exactly the value it was given, or raises
ValueError; none of them silently produces something different. What systemd 252 does with a unit
line, checked against `systemd-analyze verify` (tests/unit/grammar/test_systemd_unit.py):

- Lines end at "\\n", "\\r" or NUL; a line ending in an odd number of backslashes continues on the
  next one; a line whose first non-blank is '#' or ';' is a comment; a value loses its leading and
  trailing whitespace; a line longer than 1 MiB - 1 bytes makes the whole unit fail to load.
- ExecStart= (and ExecStartPre=/ExecStartPost=): the value is split into words like a shell does
  (extract_first_word with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE): double or single quotes may appear
  anywhere in a word, C escapes (\\n, \\t, \\xNN, \\\\, \\" ...) are decoded inside and outside
  quotes, a lone ';' separates commands. Then each word has its % specifiers expanded (%% is a
  literal %). When the command runs, $$ becomes $, ${VAR} is replaced by the variable's value and a
  word that is exactly $VAR by the value split at whitespace. The first word is the executable: it
  may begin with the prefixes - @ : + !, must not contain quotes, backslashes or control characters
  and is limited to PATH_MAX, each component to 255 bytes; it is NOT $-expanded, while argv[0] is.
- Environment=: words split the same way, then % specifiers; no $ expansion at all (Environment="A=$B"
  sets A to the four characters "$B"). A value may hold any character but NUL.
- Description=: no unquoting and no unescaping: only % specifiers.
"""

from __future__ import annotations

import re
import string

# systemd's limits (src/basic/def.h, linux/limits.h).
LONG_LINE_MAX = 1024 * 1024          # a unit-file line, including its newline
PATH_MAX = 4096
NAME_MAX = 255
UNIT_NAME_MAX = 256                  # unit names are at most 255 bytes
# Room left on a line for the directive's name and '=' when a function returns only the value.
_KEY_ROOM = 32
MAX_VALUE = LONG_LINE_MAX - 1 - _KEY_ROOM

# Words made only of these characters are written unquoted; anything else is quoted.
_SAFE = frozenset(string.ascii_letters + string.digits + '_./:=+,@-')
# Characters systemd treats as prefixes of an ExecStart= executable (252 knows @-:+!; newer also |).
EXEC_PREFIXES = '@-:+!|'
_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*\Z')
_UNIT_CHARS = frozenset(string.ascii_letters + string.digits + ':-_.\\')


def _is_control(ch: str) -> bool:
    return ord(ch) < 0x20 or ord(ch) == 0x7f


def _text(s, what: str) -> str:
    """s must be a str that can be written to a UTF-8 file and passed to exec (no NUL)."""
    if not isinstance(s, str):
        raise TypeError('%s must be a str, not %s: %r' % (what, type(s).__name__, s))
    if '\0' in s:
        raise ValueError('%s contains a NUL character, which systemd cannot carry: %r' % (what, s))
    try:
        s.encode('utf-8')
    except UnicodeEncodeError:
        raise ValueError('%s is not valid Unicode (lone surrogate): %r' % (what, s)) from None
    return s


def _fits(value: str, what: str, limit: int = MAX_VALUE) -> str:
    n = len(value.encode('utf-8'))
    if n > limit:
        raise ValueError('%s is %d bytes written out; systemd refuses unit-file lines longer than %d bytes'
                         % (what, n, LONG_LINE_MAX - 1))
    return value


def _quote(s: str, dollar: bool) -> str:
    """s in double quotes, for a setting decoded with EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE then %
    specifiers (and $ expansion if dollar): one physical line, whatever s holds."""
    out = ['"']
    for ch in s:
        if ch == '\\':
            out.append('\\\\')
        elif ch == '"':
            out.append('\\"')
        elif ch == '%':
            out.append('%%')
        elif ch == '$' and dollar:
            out.append('$$')
        elif ch == '\n':
            out.append('\\n')
        elif ch == '\t':
            out.append('\\t')
        elif _is_control(ch):
            out.append('\\x%02x' % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return ''.join(out)


def _plain(s: str) -> bool:
    return bool(s) and s != ';' and all(ch in _SAFE for ch in s)


class EnvRef(str):
    """An ExecStart= argument that is the value of an environment variable at exec time (`${NAME}`,
    one word): for a secret kept in a root-only EnvironmentFile= instead of the unit's text."""


def exec_arg(s: str) -> str:
    """One argument of an ExecStart= line (not the executable): after systemd's unquoting,
    unescaping, specifier expansion and, at exec time, $ expansion it is exactly s."""
    if isinstance(s, EnvRef):
        if not _ENV_NAME.match(s):
            raise ValueError('ExecStart= variable reference %r is not a variable name' % str(s))
        return '${%s}' % s
    _text(s, 'ExecStart= argument')
    return s if _plain(s) else _quote(s, dollar=True)


def exec_path(path: str) -> str:
    """The executable (first word) of an ExecStart= line. It must be an absolute path that systemd
    accepts as is: no prefix characters, quotes, backslashes, control characters or '$' (systemd
    expands $ in argv[0] but not in the path it executes, so no escaping can make both right)."""
    _text(path, 'ExecStart= executable')
    if not path:
        raise ValueError('ExecStart= executable is empty')
    if path[0] in EXEC_PREFIXES:
        raise ValueError("ExecStart= executable %r begins with %r, which systemd reads as a prefix "
                         "(one of %s), not as part of the path" % (path, path[0], EXEC_PREFIXES))
    if not path.startswith('/'):
        raise ValueError('ExecStart= executable must be an absolute path, got %r' % path)
    bad = sorted({ch for ch in path if _is_control(ch) or ch in '"\'\\$'})
    if bad:
        raise ValueError('ExecStart= executable %r contains %s; systemd refuses quotes, backslashes and '
                         'control characters in it, and would expand $ in argv[0] but not in the path'
                         % (path, ', '.join(repr(ch) for ch in bad)))
    if path.endswith('/'):
        raise ValueError('ExecStart= executable %r ends with "/" (a directory)' % path)
    raw = path.encode('utf-8')
    if len(raw) >= PATH_MAX:
        raise ValueError('ExecStart= executable is %d bytes, systemd allows fewer than %d' % (len(raw), PATH_MAX))
    long = [c for c in raw.split(b'/') if len(c) > NAME_MAX]
    if long:
        raise ValueError('ExecStart= executable %r has a component longer than %d bytes' % (path, NAME_MAX))
    return path if _plain(path) else _quote(path, dollar=False)


class ExecLine(str):
    """An ExecStart= value produced by exec_line(); templates accept only this, never a raw str."""


def exec_line(argv) -> ExecLine:
    """An ExecStart= value whose command, as systemd executes it, is exactly argv: one physical line,
    safe words unquoted, everything else double-quoted with C escapes, %% and $$."""
    if isinstance(argv, str) or not hasattr(argv, '__iter__'):
        raise TypeError('exec_line() takes a list of arguments, not %r' % (argv,))
    argv = list(argv)
    if not argv:
        raise ValueError('ExecStart= needs at least the executable')
    line = ' '.join([exec_path(argv[0])] + [exec_arg(a) for a in argv[1:]])
    return ExecLine(_fits(line, 'ExecStart= value'))


def environment_line(key: str, value: str) -> str:
    """An Environment= line (Environment="KEY=value") that sets KEY to exactly value. systemd 252
    decodes quotes and C escapes, expands % specifiers and does no $ expansion in Environment=."""
    _text(key, 'Environment= name')
    if not _ENV_NAME.match(key):
        raise ValueError('Environment= name %r is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)' % key)
    _text(value, 'Environment= value of %s' % key)
    line = 'Environment=' + _quote(key + '=' + value, dollar=False)
    return _fits(line, 'Environment= line for %s' % key, LONG_LINE_MAX - 1)


def environment_file_line(path: str) -> str:
    """EnvironmentFile=<absolute path>: a plain path (the file must exist: no '-' prefix)."""
    if not isinstance(path, str) or not path.startswith('/') or not all(ch in _SAFE for ch in path):
        raise ValueError('EnvironmentFile= path %r is not a plain absolute path' % (path,))
    return 'EnvironmentFile=' + path.replace('%', '%%')


def escape_specifiers(text: str) -> str:
    """Free text for a setting that only expands % specifiers (Description=, Documentation= ...):
    % becomes %%. Control characters are refused: such a setting has no escapes, and a newline or
    carriage return would end the line and start a new directive."""
    _text(text, 'text')
    bad = sorted({ch for ch in text if _is_control(ch)})
    if bad:
        raise ValueError('control character(s) %s in %r: a systemd text setting cannot carry them'
                         % (', '.join(repr(ch) for ch in bad), text))
    return text.replace('%', '%%')


def text_value(text: str) -> str:
    """The complete value of a free-text setting such as Description=: escape_specifiers(), and
    refuse what systemd would change - leading or trailing whitespace (stripped), a trailing odd
    run of backslashes (a line continuation) and an empty value (a reset)."""
    value = escape_specifiers(text)
    if not text:
        raise ValueError('empty text: systemd reads an empty setting as a reset')
    if text != text.strip(' '):
        raise ValueError('leading or trailing whitespace in %r: systemd strips it' % text)
    if (len(text) - len(text.rstrip('\\'))) % 2:
        raise ValueError('%r ends with a backslash: systemd would continue the line with the next one' % text)
    return _fits(value, 'text setting')


def comment_text(text: str) -> str:
    """Text placed in a '#' comment line: anything but control characters (a newline, carriage
    return or NUL would end the comment and start a directive)."""
    _text(text, 'comment text')
    bad = sorted({ch for ch in text if _is_control(ch)})
    if bad:
        raise ValueError('control character(s) %s in comment text %r'
                         % (', '.join(repr(ch) for ch in bad), text))
    return _fits(text, 'comment text')


def valid_unit_name(name) -> bool:
    """systemd's unit_name_is_valid(name, UNIT_NAME_PLAIN) for a .service: [A-Za-z0-9:_.\\-] (plus
    backslash escapes such as \\x2d), at most 255 bytes with the suffix, a non-empty prefix, no '/'
    and no '@' (template and instance names are not supported here)."""
    if not isinstance(name, str) or not name.endswith('.service'):
        return False
    prefix = name[:-len('.service')]
    return (0 < len(name.encode('utf-8')) < UNIT_NAME_MAX and bool(prefix)
            and all(ch in _UNIT_CHARS for ch in prefix))


def check_unit_name(name) -> str:
    """name if valid_unit_name(name), else ValueError saying why not."""
    if valid_unit_name(name):
        return name
    if not isinstance(name, str):
        raise ValueError('unit name must be a str, got %r' % (name,))
    if not name.endswith('.service'):
        why = 'it does not end in .service'
    elif name == '.service':
        why = 'the name before .service is empty'
    elif len(name.encode('utf-8')) >= UNIT_NAME_MAX:
        why = 'it is longer than %d bytes' % (UNIT_NAME_MAX - 1)
    elif '@' in name:
        why = 'template/instance units (with @) are not supported'
    else:
        why = 'only letters, digits and ":-_.\\" are allowed before .service'
    raise ValueError('invalid systemd unit name %r: %s' % (name, why))
