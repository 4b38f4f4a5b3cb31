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
parser; quantiles as Prometheus' histogram_quantile computes them. Or, with gpuhost:rollout.canary.prometheus, the
same samples from the fleet's Prometheus (PrometheusSource: its HTTP API, the hosts by their file_sd `host` label),
the same figures computed from them. A host that cannot be read, or whose counters go
back (SGLang restarted mid-judgement), fails the judgement closed: never a pass without figures."""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
import statistics
import time
import urllib.error
import urllib.parse
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


def run(slots: Iterator[list], canary: str, cfg, say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic) -> Verdict:
    """Judge until a verdict or max_duration_s. slots: each slot's windows as it ends, from either source - the hosts'
    own /metrics (watch) or Prometheus (PrometheusSource.watch; source() picks by cfg.prometheus). A read that fails
    fails it closed, a Ctrl-C leaves it 'running' (the caller decides what an interrupted judgement means)."""
    deadline = clock() + cfg.max_duration_s
    seen: list = []
    verdict = Verdict('running', 'no window yet', [])
    try:
        for slot in slots:
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


def source(cfg, endpoints: dict) -> Iterator[list]:
    """The slots a judgement reads: from cfg.prometheus where it is set, else from each host's own /metrics
    (endpoints {host: SGLang's URL}; with Prometheus only their names count)."""
    if cfg.prometheus:
        return PrometheusSource(cfg.prometheus, list(endpoints)).watch(cfg.window_s)
    return watch(endpoints, cfg.window_s)


# ------------------------------------------------------------------- the same windows from Prometheus
#
# Which series are a host's: the stack's `prometheus_file_sd` output is what Prometheus scrapes SGLang by
# (docs/monitoring.md, "Monitoring"; resources/monitoring.py file_sd). A fleet's target groups each carry `host`, the
# host's name in gpuhost:hosts (components/outputs.py export_fleet; fleet-monitoring's merge keeps it, and gives a
# one-host shard its node) - the very names this program keys windows by. `node` is the Proxmox node (two hosts may
# share one, and it is not the fleet's name), `instance` is the container's address:port (not a name the operator
# knows), `job` is whatever the operator's scrape config calls it (`gpuhost` in `make monitoring`'s). So: match on
# `host`, pick SGLang's target with `id=~"lxc/.+"` as the generated rules do (node_exporter's group carries the same
# `host`), never on `job`.
#
# How: not increase() - Prometheus extrapolates it to the range's edges from the samples inside (and a range of two
# samples is a guess), while the scrape path takes exact deltas between two reads. Instead each slot edge's raw values
# (an instant query: the last sample at or before the edge) and the gauges' samples inside the slot (a range
# selector) become the same Scrape objects the program's own reads give, and window_of computes every figure from
# them: one definition of each metric, no extrapolation, the quantiles still Prometheus' own histogram_quantile, a
# counter that goes back still failing closed, and one slot's end edge the next one's start (nothing counted twice or
# lost between slots). The edges are scrapes, so a host's window spans its last scrape before the slot's start to its
# last scrape before the slot's end: window_s should be a multiple of the scrape interval, several of it; the
# requests that came in are scaled to the slot's length (what increase() would report) so that two hosts scraped at
# different phases compare fairly.

SGLANG_TARGET = 'id=~"lxc/.+"'          # SGLang's file_sd group (node_exporter's is id="node/<node>")
HOST_LABEL = 'host'
# The families window_of reads; the gauges also sampled inside the slot (the mean running and queued requests, the
# accept length).
COUNTERS = ('sglang:num_requests_total', 'sglang:num_aborted_requests_total', 'sglang:generation_tokens_total',
            'sglang:inter_token_latency_seconds_sum', 'sglang:inter_token_latency_seconds_count',
            'sglang:inter_token_latency_seconds_bucket', 'sglang:time_to_first_token_seconds_bucket',
            'sglang:e2e_request_latency_seconds_bucket')
GAUGES = ('sglang:num_running_reqs', 'sglang:num_queue_reqs', 'sglang:spec_accept_length')
# Labels Prometheus adds to a target's series: dropped from a sample's key, so that the same series scraped twice
# (two jobs reading the same target) shows as a clash instead of being summed twice.
SCRAPE_LABELS = ('__name__', 'job', 'instance')


class PrometheusSource:
    """The hosts' windows read from Prometheus' HTTP API (url: config/fleet.py Canary.prometheus, which refuses
    credentials in it). A failure fails the judgement closed: ReadError, one line naming the URL and what failed."""

    def __init__(self, url: str, hosts: list, timeout: float = 10.0, settle_s: float = 2.0):
        self.url = url.rstrip('/')
        self.hosts = list(hosts)
        self.timeout = timeout
        self.settle_s = settle_s        # after a slot's end, for a scrape begun before it to be stored
        self.selector = '%s=~%s,%s' % (HOST_LABEL, json.dumps('|'.join(re.escape(h) for h in self.hosts)),
                                       SGLANG_TARGET)

    def query(self, expr: str, at: float) -> list:
        """The API's result for expr evaluated at `at` (an instant query; a range selector gives raw samples)."""
        params = urllib.parse.urlencode({'query': expr, 'time': '%.3f' % at})
        where = 'Prometheus %s' % self.url
        try:
            with urllib.request.urlopen('%s/api/v1/query?%s' % (self.url, params), timeout=self.timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            detail = api_error(e.read()) or 'HTTP %d %s' % (e.code, e.reason)
            raise ReadError('%s: the query failed: %s' % (where, detail)) from None
        except (OSError, urllib.error.URLError) as e:
            raise ReadError('%s is unreachable: %s' % (where, getattr(e, 'reason', None) or e)) from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise ReadError('%s: the answer is not the HTTP API\'s JSON (is this Prometheus\' address?)' % where) \
                from None
        if doc.get('status') != 'success':
            raise ReadError('%s: the query failed: %s' % (where, api_error(body) or 'status %r' % doc.get('status')))
        return doc['data']['result']

    def edge(self, t: float, window_s: float) -> tuple:
        """({host: Scrape of every family's last value at or before t, at that sample's time}, {host: [Scrape of
        the gauges, one per scrape in (t - window_s, t), oldest first]})."""
        def names(families):
            return json.dumps('|'.join(re.escape(n) for n in families))
        values = self.query('{__name__=~%s,%s}' % (names(COUNTERS + GAUGES), self.selector), t)
        samples = self.query('{__name__=~%s,%s}[%dms]' % (names(GAUGES), self.selector, round(1000 * window_s)), t)
        scrapes = {h: {} for h in self.hosts}
        inside = {h: {} for h in self.hosts}        # host -> {sample time: {host: samples}}
        try:
            for series in values:
                self._put(scrapes, series['metric'], float(series['value'][1]))
            for series in samples:
                host = series['metric'].get(HOST_LABEL)
                for at, value in series['values'] if host in inside else ():
                    self._put(inside[host].setdefault(float(at), {host: {}}), series['metric'], float(value))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ReadError('Prometheus %s: its answer is not the HTTP API\'s (%s %s missing or malformed)' % (
                self.url, type(e).__name__, e)) from None
        times = {h: sorted(inside[h]) for h in self.hosts}
        for h in self.hosts:
            if not scrapes[h]:
                raise ReadError('Prometheus %s has no SGLang series for host %s at %s (%s="%s", %s): it is not '
                                'scraped - the stack\'s prometheus_file_sd in its file_sd_configs?' % (
                                    self.url, h, iso(t), HOST_LABEL, h, SGLANG_TARGET))
            if not times[h]:
                raise ReadError('Prometheus %s has no sample of host %s\'s SGLang within %g s before %s: its scrape '
                                'fails, or its interval is longer than window_s' % (self.url, h, window_s, iso(t)))
        edges = {h: Scrape(times[h][-1], scrapes[h]) for h in self.hosts}
        between = {h: [Scrape(at, inside[h][at][h]) for at in times[h][:-1]] for h in self.hosts}
        return edges, between

    def _put(self, scrapes: dict, metric: dict, value: float) -> None:
        host = metric.get(HOST_LABEL)
        if host not in scrapes:
            return
        key = (metric['__name__'], tuple(sorted((k, v) for k, v in metric.items() if k not in SCRAPE_LABELS)))
        if key in scrapes[host]:
            raise ReadError('Prometheus %s holds host %s\'s %s twice (two scrape jobs read its SGLang?): its figures '
                            'would count twice - keep one job for the target' % (self.url, host, metric['__name__']))
        scrapes[host][key] = value

    def windows(self, start: float, end: float, first: Optional[dict] = None) -> tuple:
        """The hosts' windows of the slot [start, end] (first: the start edge, when the previous slot's end read
        it); returns (windows, the end edge)."""
        if first is None:
            first, _ = self.edge(start, end - start)
        last, between = self.edge(end, end - start)
        out = []
        for h in self.hosts:
            a, b = first[h], last[h]
            if b.at <= a.at:
                raise ReadError('Prometheus %s has no sample of host %s\'s SGLang after %s: its scrape fails, or '
                                'its interval is longer than window_s' % (self.url, h, iso(a.at)))
            w = window_of(h, start, a, b, between[h])
            out.append(dataclasses.replace(w, requests=w.requests * (end - start) / (b.at - a.at)))
        return out, last

    def watch(self, window_s: float) -> Iterator[list]:
        """Each slot's windows, as watch() gives them from the hosts' own reads; each slot read settle_s after its
        end. Raises ReadError (fail closed); stops at a Ctrl-C (CANCELLED)."""
        if CANCELLED.wait(self.settle_s):
            return
        start = time.time() - self.settle_s
        first, _ = self.edge(start, window_s)
        while True:
            end = start + window_s
            if CANCELLED.wait(max(0.0, end + self.settle_s - time.time())):
                return
            slot, first = self.windows(start, end, first)
            yield slot
            start = end


def api_error(body: bytes) -> Optional[str]:
    """The HTTP API's error in one line ("bad_data: parse error ..."), None where the body is not its JSON."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not doc.get('error'):
        return None
    return ' '.join(('%s: %s' % (doc.get('errorType') or 'error', doc['error'])).split())


def iso(t: float) -> str:
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(t))
