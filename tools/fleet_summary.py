"""The fleet table printed at the end of `make up`: one line per host from the stack's outputs
(`pulumi stack output --json` on stdin). A one-host stack prints its one line. With a canary
(gpuhost:rollout.canary), its last judgement follows - and `--canary-page PATH` writes it as a page (Markdown) the
operator reads later: `make up` writes monitoring/<stack>/canary.md."""

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


def canary_page(outputs: dict, stack: str = '') -> str | None:
    """The `canary` output (the canary host's record of its last judgement) as a page; None: no canary."""
    c = outputs.get('canary')
    if not c:
        return None
    lines = ['# The canary%s: %s' % (' of stack %s' % stack if stack else '', c.get('state', '?')), '',
             c.get('line') or '', '',
             '- host %s, judged against %s under their own traffic' % (c.get('host'), ', '.join(c.get('baseline') or [])),
             '- began %s%s; %s' % (c.get('started'), ', verdict %s' % c['at'] if c.get('at') else '', c.get('then')),
             '- the unit judged: sha256 %s' % c.get('unit_sha256')]
    if c.get('table'):
        lines += ['', '```', c['table'], '```']
    return '\n'.join(lines) + '\n'


def main(argv) -> int:
    import argparse
    import os
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--canary-page', help='write the canary\'s last judgement there (Markdown)')
    ap.add_argument('--stack', default='')
    args = ap.parse_args(argv)
    outputs = json.load(sys.stdin)
    print(table(outputs))
    page = canary_page(outputs, args.stack)
    if page is not None:
        print()
        print(page.rstrip())
        if args.canary_page:
            os.makedirs(os.path.dirname(args.canary_page) or '.', exist_ok=True)
            tmp = args.canary_page + '.tmp'
            with open(tmp, 'w') as f:
                f.write(page)
            os.replace(tmp, args.canary_page)
            print('(written to %s)' % args.canary_page)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
