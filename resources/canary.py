"""The canary's judge (gpuhost:rollout.canary; issue 60, docs/canary-plan.md): is the canary host, on the new serving
setting, worse than the hosts still on the old one, under the same traffic at the same moments?

Its input is windows: one per host and time slot, each host's SGLang figures over that slot (from its metrics' deltas:
latency quantiles, aborted requests, queue depth, output tokens per running request, and the mean running requests).
The canary's window of a slot is compared with the baseline's windows of the same slot, grouped by load:

  * a slot's load band is the baseline's mean running requests in it (config bands: [1, 8, 32, 128] = idle below 1,
    then 1-8, 8-32, 32-128, 128 and more). Not the canary's own: at the same offered traffic a slower host runs more
    requests at once (Little's law), so banding by the canary's count would move a slow canary into a busier band.
    A slot below the first edge is idle and not judged;
  * a slot counts only when the canary took a comparable share of the traffic: its requests within
    traffic_tolerance (relative) of the baseline hosts' mean - else the comparison says nothing of the setting;
  * a band is judged once each side has min_samples windows in it. Per metric, a one-sided Mann-Whitney U test
    (scipy; Kayenta's test) asks whether the canary's figures are worse than the baseline's; a metric fails when the
    test is confident (p < 1 - confidence) AND the canary's median is worse by more than tolerance (relative): noise
    and small differences pass, a real regression does not. An absolute SLO fails a band whose canary median is
    beyond it.

Outcomes: fail (at the first failing metric: one line naming the metric, band and both figures), pass (no failure,
at least one band judged, and every band holding at least BAND_SHARE of the counted slots judged; at the end of the
judgement, every judged band), inconclusive (at the end with no band judged, or a metric without data: what was
missing), running (not yet decided). The accept length is reported, never a gate. Pure: no I/O here."""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from typing import Optional

# metric -> (words, unit, which way is better, gated). The figures a window carries under these names.
METRICS = {
    'itl_p95': ('inter-token latency p95', 'ms', 'lower', True),
    'ttft_p95': ('time to first token p95', 'ms', 'lower', True),
    'e2e_p95': ('end-to-end latency p95', 's', 'lower', True),
    'aborted_ratio': ('aborted requests per request', '', 'lower', True),
    'queue': ('queued requests', '', 'lower', True),
    'tokens_per_req': ('output tokens/s per running request', 'tok/s', 'higher', True),
    'accept_length': ('speculative accept length', '', 'higher', False),
}
# The SLO keys of config/fleet.py CanarySlo, by metric.
SLO_KEYS = {'itl_p95': 'itl_p95_ms', 'ttft_p95': 'ttft_p95_ms', 'e2e_p95': 'e2e_p95_s', 'aborted_ratio': 'aborted_ratio'}
# A band holding this share of the counted slots must be judged before a pass comes early.
BAND_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class Window:
    """One host's SGLang over one time slot. start: the slot's start (the same for every host of a slot);
    running: mean running requests; requests: requests that came in; values: METRICS' names -> figure, or None (no
    data: no request finished in the window)."""
    host: str
    start: float
    running: float
    requests: float
    values: dict


@dataclasses.dataclass
class Row:
    band: str
    metric: str
    canary: Optional[float]
    baseline: Optional[float]
    n_canary: int
    n_baseline: int
    p: Optional[float]
    effect: Optional[float]
    result: str          # pass, fail, slo, no data, signal

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Verdict:
    outcome: str         # pass, fail, inconclusive, running
    line: str
    rows: list
    counted: int = 0     # slots compared
    unequal: int = 0     # slots left out: the canary's traffic not comparable
    idle: int = 0        # slots below the first band

    def table(self) -> str:
        """The rows as an operator reads them (the report's body)."""
        out = ['%-12s %-38s %12s %12s %9s %8s %7s  %s' % ('band', 'metric', 'canary', 'baseline', 'n', 'p',
                                                              'worse', 'result')]
        for r in self.rows:
            out.append('%-12s %-38s %12s %12s %9s %8s %7s  %s' % (
                r.band, METRICS[r.metric][0], fmt(r.canary, r.metric), fmt(r.baseline, r.metric),
                '%d/%d' % (r.n_canary, r.n_baseline), '-' if r.p is None else '%.3g' % r.p,
                '-' if r.effect is None else '%+.0f%%' % (100 * r.effect) if r.effect != float('inf') else 'inf',
                r.result))
        return '\n'.join(out)


def fmt(value, metric) -> str:
    if value is None:
        return '-'
    unit = METRICS[metric][1]
    return ('%.3g %s' % (value, unit)).strip()


def band_names(edges) -> list:
    names = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        names.append('%g-%g' % (lo, hi) if hi is not None else '%g+' % lo)
    return names


def worse_by(metric, canary: float, baseline: float) -> float:
    """How much worse the canary's median is, relative to the baseline's (negative: better)."""
    if METRICS[metric][2] == 'lower':
        if baseline == 0:
            return float('inf') if canary > 0 else 0.0
        return canary / baseline - 1
    if baseline == 0:
        return 0.0
    return 1 - canary / baseline


def p_worse(metric, canary: list, baseline: list) -> float:
    """The one-sided Mann-Whitney U test's p-value for "the canary's figures are worse" (scipy's)."""
    from scipy.stats import mannwhitneyu
    alternative = 'greater' if METRICS[metric][2] == 'lower' else 'less'
    if len(set(canary) | set(baseline)) == 1:
        return 1.0          # every figure the same: nothing is worse (and the test is undefined)
    return float(mannwhitneyu(canary, baseline, alternative=alternative).pvalue)


def slots(windows: list, canary: str) -> dict:
    """{start: (the canary's window, [the baseline's windows])} for the slots both sides have."""
    by = {}
    for w in windows:
        c, b = by.setdefault(w.start, [None, []])
        if w.host == canary:
            by[w.start][0] = w
        else:
            b.append(w)
    return {t: (c, b) for t, (c, b) in sorted(by.items()) if c is not None and b}


def judge(windows: list, canary: str, cfg, final: bool = False) -> Verdict:
    """The verdict so far (final: the judgement's time is up). cfg: config/fleet.py Canary (bands, min_samples,
    confidence, tolerance, traffic_tolerance, slo)."""
    edges = list(cfg.bands)
    names = band_names(edges)
    per_band = {i: {'c': [], 'b': []} for i in range(len(edges))}
    idle = unequal = counted = 0
    for _, (c, base) in slots(windows, canary).items():
        load = statistics.fmean(w.running for w in base)
        band = bisect.bisect_right(edges, load) - 1
        if band < 0:
            idle += 1
            continue
        rate = statistics.fmean(w.requests for w in base)
        if abs(c.requests - rate) > cfg.traffic_tolerance * max(rate, 1e-9):
            unequal += 1
            continue
        counted += 1
        per_band[band]['c'].append(c)
        per_band[band]['b'].extend(base)
    rows, missing, failed = [], [], None     # missing: (what, canary windows, baseline windows, share, kind)
    alpha = 1 - cfg.confidence
    judged = 0
    for i, name in enumerate(names):
        cw, bw = per_band[i]['c'], per_band[i]['b']
        if not cw:
            continue
        if len(cw) < cfg.min_samples or len(bw) < cfg.min_samples:
            missing.append(('load %s running' % name, len(cw), len(bw), len(cw) / counted, 'band'))
            continue
        judged += 1
        for metric, (_, _, _, gated) in METRICS.items():
            cv = [w.values[metric] for w in cw if w.values.get(metric) is not None]
            bv = [w.values[metric] for w in bw if w.values.get(metric) is not None]
            if len(cv) < cfg.min_samples or len(bv) < cfg.min_samples:
                rows.append(Row(name, metric, median(cv), median(bv), len(cv), len(bv), None, None,
                                'no data' if gated else 'signal'))
                if gated:
                    missing.append(('%s at load %s' % (METRICS[metric][0], name), len(cv), len(bv), 1.0, 'metric'))
                continue
            mc, mb = statistics.median(cv), statistics.median(bv)
            effect = worse_by(metric, mc, mb)
            if not gated:
                rows.append(Row(name, metric, mc, mb, len(cv), len(bv), None, effect, 'signal'))
                continue
            p = p_worse(metric, cv, bv)
            result = 'fail' if p < alpha and effect > cfg.tolerance else 'pass'
            slo_key = SLO_KEYS.get(metric)
            limit = getattr(cfg.slo, slo_key, None) if slo_key else None
            if result == 'pass' and limit is not None and mc > limit:
                result = 'slo'
            rows.append(Row(name, metric, mc, mb, len(cv), len(bv), p, effect, result))
            if result != 'pass' and failed is None:
                failed = rows[-1]
    verdict = Verdict('running', '', rows, counted, unequal, idle)
    if failed is not None:
        verdict.outcome = 'fail'
        if failed.result == 'slo':
            limit = getattr(cfg.slo, SLO_KEYS[failed.metric])
            verdict.line = ('%s at load %s running: the canary\'s %s is beyond the SLO of %s (baseline %s; %d '
                            'windows)' % (METRICS[failed.metric][0], failed.band, fmt(failed.canary, failed.metric),
                                          fmt(limit, failed.metric), fmt(failed.baseline, failed.metric),
                                          failed.n_canary))
        else:
            verdict.line = ('%s at load %s running: canary %s, baseline %s (%s worse, beyond the tolerance of %.0f%%; '
                            'Mann-Whitney p=%.2g over %d and %d windows)' % (
                                METRICS[failed.metric][0], failed.band, fmt(failed.canary, failed.metric),
                                fmt(failed.baseline, failed.metric),
                                'infinitely' if failed.effect == float('inf') else '%.0f%%' % (100 * failed.effect),
                                100 * cfg.tolerance, failed.p, failed.n_canary, failed.n_baseline))
        return verdict
    pending = [m for m in missing if m[3] >= BAND_SHARE]
    no_data = [m for m in missing if m[4] == 'metric']
    if judged and not no_data and (final or not pending):
        verdict.outcome = 'pass'
        verdict.line = 'no metric worse beyond the tolerance in %s (%d windows compared)%s' % (
            ', '.join('load %s' % r for r in sorted({r.band for r in rows}, key=names.index)), counted,
            '; not judged, too few windows: %s' % describe(missing, cfg) if missing else '')
        return verdict
    if final:
        verdict.outcome = 'inconclusive'
        what = describe(missing, cfg) if missing else 'no window with traffic in any band'
        verdict.line = 'too little comparable traffic within the judgement\'s time: %s (%d windows idle, %d with ' \
                       'unequal traffic)' % (what, idle, unequal)
        return verdict
    verdict.line = 'collecting: %s' % (describe(missing, cfg) if missing else 'no window with traffic yet')
    return verdict


def describe(missing, cfg) -> str:
    return '; '.join('%s: canary %d of %d windows, baseline %d of %d' % (what, nc, cfg.min_samples, nb, cfg.min_samples)
                     for what, nc, nb, _, _ in missing)


def median(values: list) -> Optional[float]:
    return statistics.median(values) if values else None
