"""The fleet table printed at the end of `make up`: one line per host from the stack's outputs
(`pulumi stack output --json` on stdin). A one-host stack prints its one line."""

from __future__ import annotations

import json
import sys


def rows(outputs: dict) -> list:
    hosts = outputs.get('hosts')
    if hosts is None:   # a one-host stack: its top-level outputs
        hosts = {(outputs.get('container') or {}).get('address', 'host'): outputs}
    out = []
    for name, h in hosts.items():
        spec = h.get('speculation') or {}
        res = spec.get('resolved') or {}
        unit = h.get('sglang_unit') or {}
        gpus = h.get('gpu_assignment') or {}
        sides = {}
        for g in gpus.values():
            sides[g.get('assigned_to', '?')] = sides.get(g.get('assigned_to', '?'), 0) + 1
        smoke = h.get('smoke_test') or {}
        sha = h.get('sglang_unit_sha256') or ''
        out.append([name, 'active' if unit.get('active') else 'DOWN',
                    'yes' if h.get('reboot_required') else 'no',
                    '%s/%s' % (res.get('speculative_algorithm') or 'off', res.get('speculative_num_steps') or '-')
                    if res else '?',
                    sha[:12], ' '.join('%s:%d' % kv for kv in sorted(sides.items())) or '?',
                    '%s ms' % smoke['latency_ms'] if smoke.get('latency_ms') is not None else '-'])
    return out


def table(outputs: dict) -> str:
    head = ['host', 'sglang', 'reboot', 'speculation', 'unit sha256', 'GPUs', 'smoke test']
    body = rows(outputs)
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    line = lambda r: '  '.join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return '\n'.join([line(head), line(['-' * w for w in widths])] + [line(r) for r in body])


if __name__ == '__main__':
    print(table(json.load(sys.stdin)))
