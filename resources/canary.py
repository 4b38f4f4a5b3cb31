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
missing), running (not yet decided). The accept length is reported, never a gate; a metric the release does not
export at all (no figure on either side) is reported as such, not waited for.

Reading (below the judge): the windows from each host's SGLang /metrics, scraped by the program at each window's
edges (counters' and histograms' deltas; gauges sampled within the window), parsed with prometheus_client's own
parser; quantiles as Prometheus' histogram_quantile computes them. A host that cannot be read, or whose counters go
back (SGLang restarted mid-judgement), fails the judgement closed: never a pass without figures."""

from __future__ import annotations

import bisect
import dataclasses
import statistics
import time
import urllib.error
import urllib.request
from typing import Callable, Iterator, Optional

from transport.operator import CANCELLED, OperatorError

# metric -> (words, unit, which way is better, gated). The figures a window carries under these names.
# The inter-token latency is gated by its mean (the decode speed a user sees): its p95 is reported, and gated only by
# an SLO - speculation delivers tokens in bursts (a step yields 1 to k tokens), so its per-token p95 can worsen while
# every request ends sooner.
METRICS = {
    'itl_mean': ('inter-token latency, mean', 'ms', 'lower', True),
    'itl_p95': ('inter-token latency p95', 'ms', 'lower', False),
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
    running: mean running requests; requests: requests that came in (finished, plus the change of those in flight);
    values: METRICS' names -> figure, or None (no
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
            if not cv and not bv:
                rows.append(Row(name, metric, None, None, 0, 0, None, None, 'not exported'))
                continue
            if len(cv) < cfg.min_samples or len(bv) < cfg.min_samples:
                rows.append(Row(name, metric, median(cv), median(bv), len(cv), len(bv), None, None,
                                'no data' if gated else 'signal'))
                if gated:
                    missing.append(('%s at load %s' % (METRICS[metric][0], name), len(cv), len(bv), 1.0, 'metric'))
                continue
            mc, mb = statistics.median(cv), statistics.median(bv)
            effect = worse_by(metric, mc, mb)
            slo_key = SLO_KEYS.get(metric)
            limit = getattr(cfg.slo, slo_key, None) if slo_key else None
            if not gated:
                result = 'slo' if limit is not None and mc > limit else 'signal'
                rows.append(Row(name, metric, mc, mb, len(cv), len(bv), None, effect, result))
                if result == 'slo' and failed is None:
                    failed = rows[-1]
                continue
            p = p_worse(metric, cv, bv)
            result = 'fail' if p < alpha and effect > cfg.tolerance else 'pass'
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


# ------------------------------------------------------------------- reading the windows

class ReadError(OperatorError):
    """A host's metrics could not be read (or went back): the judgement fails closed."""


@dataclasses.dataclass
class Scrape:
    """One read of a host's /metrics: at (the operator's clock), samples {(sample name, labels): value}."""
    at: float
    samples: dict


def parse_scrape(text: str, at: float) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(at, out)


def total(scrape: Scrape, name: str) -> Optional[float]:
    """The sum of a counter's samples (every label set); None where the host exports none."""
    values = [v for (n, _), v in scrape.samples.items() if n == name]
    return sum(values) if values else None


def gauge(scrape: Scrape, name: str) -> Optional[float]:
    """A scheduler gauge: its tensor-parallel rank 0's samples (every rank reports the same batch), summed over the
    rest of the labels (data-parallel schedulers)."""
    values = [v for (n, labels), v in scrape.samples.items() if n == name and dict(labels).get('tp_rank', '0') == '0']
    return sum(values) if values else None


def buckets(scrape: Scrape, name: str) -> dict:
    """A histogram's cumulative bucket counts by upper bound, summed over its label sets."""
    out = {}
    for (n, labels), v in scrape.samples.items():
        if n == name + '_bucket':
            le = float(dict(labels)['le'])
            out[le] = out.get(le, 0.0) + v
    return out


def histogram_quantile(q: float, cumulative: dict) -> Optional[float]:
    """Prometheus' histogram_quantile over cumulative bucket counts {upper bound: count} (promql's bucketQuantile,
    float for float): the rank's bucket found among the finite ones, linear within it from the bound below (0 for the
    first), the highest finite bound for a rank beyond them. None where Prometheus says NaN: no +Inf bucket, fewer
    than two buckets, no observations."""
    bounds = sorted(cumulative)
    if len(bounds) < 2 or bounds[-1] != float('inf'):
        return None
    counts = [cumulative[b] for b in bounds]
    observations = counts[-1]
    if observations == 0:
        return None
    rank = q * observations
    i = next((j for j in range(len(bounds) - 1) if counts[j] >= rank), len(bounds) - 1)
    if i == len(bounds) - 1:
        return bounds[-2]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[i], counts[i]
    if i > 0:
        start = bounds[i - 1]
        count -= counts[i - 1]
        rank -= counts[i - 1]
    if count == 0:
        return None
    return start + (end - start) * (rank / count)


def window_of(host: str, start: float, a: Scrape, b: Scrape, between: list) -> Window:
    """The Window of host between scrapes a and b (between: the gauge reads inside the slot)."""
    dt = b.at - a.at

    def delta(name):
        x, y = total(a, name), total(b, name)
        if x is None and y is None:
            return None
        x, y = x or 0.0, y or 0.0
        if y < x:
            raise ReadError('host %s: SGLang\'s %s went back (%g -> %g): it restarted during the judgement' % (
                host, name, x, y))
        return y - x

    def quantile(name, scale):
        x, y = buckets(a, name), buckets(b, name)
        if not y:
            return None
        diff = {le: c - x.get(le, 0.0) for le, c in y.items()}
        if any(v < 0 for v in diff.values()):
            raise ReadError('host %s: SGLang\'s %s went back: it restarted during the judgement' % (host, name))
        value = histogram_quantile(0.95, diff)
        return None if value is None else value * scale

    def mean_gauge(name):
        values = [v for v in (gauge(s, name) for s in between + [b]) if v is not None]
        return statistics.fmean(values) if values else None
    # The requests that came in: SGLang counts a request when it ends, so the finished ones plus the change of those
    # in flight (running and queued) - what the load balancer sent, however fast this host served it.
    def in_flight(scrape):
        return (gauge(scrape, 'sglang:num_running_reqs') or 0.0) + (gauge(scrape, 'sglang:num_queue_reqs') or 0.0)
    ended = delta('sglang:num_requests_total') or 0.0
    requests = max(0.0, ended + in_flight(b) - in_flight(a))
    aborted = delta('sglang:num_aborted_requests_total')
    running = mean_gauge('sglang:num_running_reqs') or 0.0
    generated = delta('sglang:generation_tokens_total')
    accept = [v for v in (gauge(s, 'sglang:spec_accept_length') for s in between + [b]) if v]
    itl_sum, itl_count = delta('sglang:inter_token_latency_seconds_sum'), delta('sglang:inter_token_latency_seconds_count')
    values = {
        'itl_mean': (1000.0 * itl_sum / itl_count) if itl_sum is not None and itl_count else None,
        'itl_p95': quantile('sglang:inter_token_latency_seconds', 1000.0),
        'ttft_p95': quantile('sglang:time_to_first_token_seconds', 1000.0),
        'e2e_p95': quantile('sglang:e2e_request_latency_seconds', 1.0),
        'aborted_ratio': (aborted / ended) if aborted is not None and ended else None,
        'queue': mean_gauge('sglang:num_queue_reqs'),
        'tokens_per_req': (generated / dt / running) if generated is not None and running > 0 and dt > 0 else None,
        'accept_length': statistics.fmean(accept) if accept else None,
    }
    return Window(host, start, running, requests, values)


def fetch_metrics(endpoint: str, timeout: float = 5.0) -> str:
    """A host's SGLang /metrics (no API key: SGLang serves it without one)."""
    with urllib.request.urlopen(endpoint + '/metrics', timeout=timeout) as r:
        return r.read().decode('utf-8', 'replace')


def scrape(host: str, endpoint: str, fetch: Callable[[str], str]) -> Scrape:
    at = time.time()
    try:
        return parse_scrape(fetch(endpoint), at)
    except (OSError, urllib.error.URLError, ValueError) as e:
        raise ReadError('host %s: its SGLang metrics (%s/metrics) could not be read: %s' % (
            host, endpoint, getattr(e, 'reason', None) or e)) from None


def watch(endpoints: dict, window_s: float, reads_per_window: int = 5,
          fetch: Callable[[str], str] = fetch_metrics) -> Iterator[list]:
    """Each slot's windows, one per host of endpoints {host: SGLang's URL}, as the slots end: every host read at each
    slot's edges (one slot's end is the next one's start) and reads_per_window times in between for the gauges.
    Raises ReadError (fail closed); stops at a Ctrl-C (CANCELLED)."""
    edge = {h: scrape(h, u, fetch) for h, u in endpoints.items()}
    while not CANCELLED.is_set():
        start = time.time()
        between = {h: [] for h in endpoints}
        for i in range(1, reads_per_window):
            if CANCELLED.wait(max(0.0, start + window_s * i / reads_per_window - time.time())):
                return
            for h, u in endpoints.items():
                between[h].append(scrape(h, u, fetch))
        if CANCELLED.wait(max(0.0, start + window_s - time.time())):
            return
        end = {h: scrape(h, u, fetch) for h, u in endpoints.items()}
        yield [window_of(h, start, edge[h], end[h], between[h]) for h in endpoints]
        edge = end


def run(endpoints: dict, canary: str, cfg, say: Callable[[str], None], fetch: Callable[[str], str] = fetch_metrics,
        clock: Callable[[], float] = time.monotonic) -> Verdict:
    """Judge until a verdict or max_duration_s; a host that cannot be read fails it closed, a Ctrl-C leaves it
    'running' (the caller decides what an interrupted judgement means)."""
    deadline = clock() + cfg.max_duration_s
    seen: list = []
    verdict = Verdict('running', 'no window yet', [])
    try:
        for slot in watch(endpoints, cfg.window_s, fetch=fetch):
            seen.extend(slot)
            verdict = judge(seen, canary, cfg, final=clock() >= deadline)
            say('canary %s: %s' % (canary, verdict.line))
            if verdict.outcome != 'running':
                return verdict
    except ReadError as e:
        out = judge(seen, canary, cfg)
        out.outcome, out.line = 'fail', '%s - the judgement fails closed' % e
        return out
    return verdict
