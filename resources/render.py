"""Files the program puts on hosts, rendered from templates/ with jinja2 (StrictUndefined): a
missing value is an error naming the template and line, never an empty string in a unit file.

Values reach systemd unit files only through grammar/systemd.py (systemd's own quoting for each
directive); a value systemd would read differently raises ValueError instead of being written."""

from __future__ import annotations

import os
import shlex

import jinja2

from grammar import systemd

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'templates')


def _exec_value(value) -> str:
    """An ExecStart= value in a template: exec_start(argv)'s result, or argv itself - never a str
    written by hand, which would bypass systemd's quoting."""
    if isinstance(value, systemd.ExecLine):
        return value
    if isinstance(value, (list, tuple)):
        return systemd.exec_line(value)
    raise TypeError('an ExecStart= value must come from resources.render.exec_start(argv) or be the argv '
                    'list itself, not %r' % (value,))


_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
_env.filters['shquote'] = shlex.quote
_env.filters['systemd_exec'] = _exec_value
_env.filters['systemd_text'] = systemd.text_value
_env.filters['systemd_comment'] = systemd.comment_text
_env.globals['systemd_environment'] = systemd.environment_line
_env.globals['systemd_environment_file'] = systemd.environment_file_line


class RenderError(RuntimeError):
    pass


def render(name: str, **values) -> str:
    try:
        return _env.get_template(name).render(**values)
    except jinja2.UndefinedError as e:
        raise RenderError('templates/%s: %s' % (name, e.message)) from None
    except jinja2.TemplateSyntaxError as e:
        raise RenderError('templates/%s:%s: %s' % (e.name or name, e.lineno, e.message)) from None


def exec_start(argv: list) -> systemd.ExecLine:
    """An ExecStart= value that systemd executes as exactly argv (components.systemd.exec_line)."""
    return systemd.exec_line(argv)
