"""The simulated SGLang's command line: a plain argparse.ArgumentParser rebuilt from SGLang's own.

lab_server_args.json (beside this file) is the parser of the real release, dumped from its wheel
when the lab is built (tools/sglang_flags_gen.py --lab-table VERSION --out .../lab_server_args.json):
every action's option strings, dest, nargs, const, default, choices, type and action class, and for
SGLang's own action classes what calling them did. Nothing comes from the program (components/), so
a wrong flag table there fails in the lab as it would on a host.

The rebuilt parser is argparse itself: it refuses unknown, ambiguous, mistyped and removed flags
with argparse's own usage and "<prog>: error: ..." (exit status 2), and prints the help (exit 0).
SGLang's custom value types are known by name (TYPES); any other custom type reads a string.
Stdlib only: it runs in the container's virtualenv.
"""

import argparse
import json
import os
import re
import sys
from decimal import Decimal

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lab_server_args.json')


def load(path=TABLE):
    with open(path) as f:
        return json.load(f)


# SGLang's custom argparse types (0.5.23: sglang/srt/utils/common.py and
# sglang/srt/model_executor/cuda_graph_config.py); argparse shows an ArgumentTypeError's text as is.

def nullable_str(val):
    if not val or val == 'None':
        return None
    return val


def human_readable_int(value):
    value = value.strip()
    si = {'k': 10 ** 3, 'M': 10 ** 6, 'G': 10 ** 9, 'T': 10 ** 12}
    iec = {'Ki': 2 ** 10, 'Mi': 2 ** 20, 'Gi': 2 ** 30, 'Ti': 2 ** 40}
    match = re.fullmatch(r'(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)', value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if '.' in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'. Use an integer IEC value such as "
                    "'%d%s', or an SI value such as '%s%s'." % (suffix, int(Decimal(number)), suffix, number, suffix[0]))
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive." % value)


def json_list_type(value):
    try:
        return json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError('Invalid JSON list: %s. Please provide a valid JSON list.' % value)


def parse_cuda_graph_backend_arg(raw):
    if raw == 'tc_piecewise':
        raise argparse.ArgumentTypeError('tc_piecewise was removed; select breakable, full, or disabled')
    return raw


def parse_cuda_graph_config_arg(raw):
    """Only the JSON-object checks: SGLang also checks the phases and their keys."""
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError('--cuda-graph-config must be JSON: %s' % e)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError('--cuda-graph-config must be a JSON object, got %s' % type(parsed).__name__)
    return parsed


# The dump names a type "int", "float", "str", "bool", "json" (json.loads: argparse says "invalid loads
# value") or "other:<module>.<function>".
TYPES = {'int': int, 'float': float, 'str': str, 'bool': bool, 'json': json.loads}
TYPES.update((f.__name__, f) for f in (nullable_str, human_readable_int, json_list_type, parse_cuda_graph_backend_arg,
                                       parse_cuda_graph_config_arg))


def value_type(name):
    if name is None:
        return None
    return TYPES.get(name.rsplit('.', 1)[-1] if name.startswith('other:') else name, str)


class Replayed(argparse.Action):
    """One of SGLang's own action classes (deprecated spellings, LoRA paths), replayed from what calling
    it did: it stopped SGLang with a message, or set attributes to the given values or to constants."""

    def __init__(self, option_strings, dest, behaviour=None, **kwargs):
        self.behaviour = behaviour
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        b = self.behaviour
        if 'error' in b:
            if b.get('raises') == 'parser.error':
                parser.error(b['error'])
            # SGLang dies of the exception its action raised; the lab prints its last line, exit status 1.
            sys.exit('%s: %s' % (b.get('raises'), b['error']))
        for name, how in sorted(b['sets'].items()):
            setattr(namespace, name, values if how.get('from_values') else how.get('value'))


BUILTIN = {'store', 'store_const', 'store_true', 'store_false', 'append', 'append_const', 'count', 'extend', 'help'}


def add(container, a):
    kind, opts = a['action'], a['option_strings']
    if kind.startswith('other:') and 'behaviour' not in a and a.get('action_base') in BUILTIN:
        kind = a['action_base']
    kw = {'dest': a['dest'], 'default': a.get('default')}
    if a.get('required'):
        kw['required'] = True
    if kind in ('store', 'append', 'extend'):
        kw.update(action=kind, nargs=a.get('nargs'), type=value_type(a.get('type')), choices=a.get('choices'))
        if a.get('nargs') == '?' or kind == 'append':
            kw['const'] = a.get('const')
    elif kind in ('store_const', 'append_const'):
        kw.update(action=kind, const=a.get('const'))
    elif kind in ('store_true', 'store_false', 'count', 'help'):
        kw['action'] = kind
    elif kind == 'BooleanOptionalAction':
        kw['action'] = argparse.BooleanOptionalAction
        # It adds the --no- spellings itself.
        opts = [o for o in opts if not (o.startswith('--no-') and '--' + o[5:] in opts)]
    else:
        nargs = a.get('nargs')
        behaviour = a.get('behaviour') or {'sets': {a['dest']: {'value': True} if nargs == 0 else {'from_values': True}}}
        kw.update(action=Replayed, nargs=nargs, type=value_type(a.get('type')), choices=a.get('choices'),
                  const=a.get('const'), behaviour=behaviour)
    container.add_argument(*opts, **kw)


def build_parser(table):
    """SGLang's parser for the dumped `table` (what load() returns), as a plain argparse parser."""
    p = table['parser']
    parser = argparse.ArgumentParser(prog=p.get('prog'), allow_abbrev=p['allow_abbrev'],
                                     prefix_chars=p['prefix_chars'], add_help=False,
                                     fromfile_prefix_chars=p.get('fromfile_prefix_chars'))
    groups = {}
    for g in p.get('mutually_exclusive_groups') or []:
        group = parser.add_mutually_exclusive_group(required=g['required'])
        for dest in g['dests']:
            groups[dest] = group
    for a in table['actions']:
        if a['option_strings']:  # SGLang's launch_server has no positional arguments
            add(groups.get(a['dest'], parser), a)
    return parser


def field(table, args, name, default=None):
    """ServerArgs field `name` from a parsed namespace: SGLang 0.5.1-0.5.13 parse --tp-size into
    tensor_parallel_size (likewise pp, dp, ep) and copy it in ServerArgs.from_cli_args."""
    for dest, to in table['parser'].get('dest_to_field', {}).items():
        if to == name and hasattr(args, dest):
            return getattr(args, dest)
    return getattr(args, name, default)
