"""Prometheus' text exposition format, as node_exporter's textfile collector reads it (pure, stdlib only).

Shared by the two textfiles gpuhost puts on a host - gpuhost.prom, written by `pulumi up`
(components/monitoring.py), and gpuhost-collector.prom, written on the host every 30 s by the collector
(components/collector.py, which carries this module inside its script) - so both escape, order and
type their families the same way, and `promtool check metrics` accepts both."""

import math

# Where node_exporter reads textfiles (Debian's prometheus-node-exporter default).
TEXTFILE_DIR = '/var/lib/prometheus/node-exporter'


def escape(value) -> str:
    """A label value: backslash, newline and double quote escaped, as the format requires."""
    return str(value).replace('\\', r'\\').replace('\n', r'\n').replace('"', r'\"')


def labels(pairs: dict) -> str:
    if not pairs:
        return ''
    return '{%s}' % ','.join('%s="%s"' % (k, escape(v)) for k, v in pairs.items())


def number(value) -> str:
    """Integral values without a fraction (1, not 1.0); NaN and infinities as the format spells them."""
    value = float(value)
    if math.isnan(value):
        return 'NaN'
    if math.isinf(value):
        return '+Inf' if value > 0 else '-Inf'
    return str(int(value)) if value.is_integer() else repr(value)


class Text(object):
    """Families in the order they are added, each with HELP and TYPE; a family without samples is left
    out (node_exporter would serve its HELP for nothing)."""

    def __init__(self):
        self.lines = []
        self.names = set()

    def family(self, name, help_, samples, kind='gauge'):
        """samples: [(labels dict, value)]."""
        if not samples:
            return
        if name in self.names:
            raise ValueError('metric family %s written twice' % name)
        if kind == 'counter' and not name.endswith('_total'):
            raise ValueError('counter %s must end in _total' % name)
        self.names.add(name)
        self.lines += ['# HELP %s %s' % (name, help_.replace('\\', r'\\').replace('\n', r'\n')),
                       '# TYPE %s %s' % (name, kind)]
        self.lines += ['%s%s %s' % (name, labels(pairs), number(value)) for pairs, value in samples]

    def text(self):
        return '\n'.join(self.lines) + '\n'
