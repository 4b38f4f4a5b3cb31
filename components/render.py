"""Files the program puts on hosts, rendered from templates/ with jinja2 (StrictUndefined): a
missing value is an error naming the template and line, never an empty string in a unit file."""

from __future__ import annotations

import os
import shlex

import jinja2

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'templates')

_env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                          keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
_env.filters['shquote'] = shlex.quote
_env.filters['systemd_quote'] = lambda s: '"%s"' % s.replace('\\', '\\\\').replace('"', '\\"')


class RenderError(RuntimeError):
    pass


def render(name: str, **values) -> str:
    try:
        return _env.get_template(name).render(**values)
    except jinja2.UndefinedError as e:
        raise RenderError('templates/%s: %s' % (name, e.message)) from None
    except jinja2.TemplateSyntaxError as e:
        raise RenderError('templates/%s:%s: %s' % (e.name or name, e.lineno, e.message)) from None


def exec_start(argv: list) -> str:
    """An ExecStart= value: systemd splits it like a shell does for quoted words; % is escaped."""
    return ' '.join(shlex.quote(a).replace('%', '%%') for a in argv)
