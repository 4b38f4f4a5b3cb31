"""Simulated `python -m sglang.launch_server` for lab containers.

Parses the real command line with the parser of the installed SGLang version, rebuilt by lab_args
from the table dumped from that release's own argparse when the lab was built
(lab_server_args.json in this package; nothing from the program's components/): an unknown, removed,
mistyped or ambiguous flag fails start-up exactly like SGLang does (argparse's usage and
"<prog>: error: ..." on stderr, exit status 2). Then it serves the endpoints the program, monitoring
and a load generator use: /health (503 while "loading"), /ready, /server_info (the resolved
settings), /get_server_info, /v1/models, an OpenAI-compatible /v1/chat/completions (plain and
`stream: true` server-sent events) and, with --enable-metrics, /metrics; with --api-key, everything
but /health, /ready and /metrics wants the key, as in SGLang.

/metrics serves the metric families of the real SGLang release (names, types, labels, buckets, the
"Multiprocess metric" help text of prometheus_client's multiprocess collector that SGLang uses), taken
from its metrics collector (0.5.23: sglang/srt/observability/metrics_collector.py; before 0.5.10
sglang/srt/metrics/collector.py), with the differences between releases in FEATURES. They move as
requests are served: a simulated scheduler runs each request through queue, prefill and decode steps
at the speed speed_model() gives for the resolved speculative settings. Stdlib only.
"""

import collections
import hmac
import itertools
import json
import math
import os
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang import __version__, lab_args, lab_runtime, lab_weights

STARTUP_SECONDS = float(os.environ.get('LAB_SGLANG_STARTUP', '1.0'))
# Loading also ends as soon as this file exists (in the container): a test that must catch SGLang still
# loading at some moment - the program's progress line, ~15 s into its wait - sets a long start-up and
# ends it once it has seen that moment, instead of guessing a delay.
LOADED_FILE = os.environ.get('LAB_SGLANG_LOADED_FILE')
# Lab time compression: every simulated duration is divided by it (10 = ten times faster than the
# model below). Latencies and rates in /metrics are measured on the wall clock, as SGLang measures them.
SPEED = float(os.environ.get('LAB_SGLANG_SPEED', '1.0'))
# Every chat completion served, one JSON line each, on the server's own clock: the request's X-Request-ID
# (AIPerf sends one per request and records it), arrival, first and last token, token counts. A load test's
# report is checked against what the server itself did (tests/integration/test_bench_serve.py).
REQUEST_LOG = os.environ.get('LAB_SGLANG_REQUEST_LOG', '/var/log/lab-sglang/requests.jsonl')
_request_log_lock = threading.Lock()


def log_request(record):
    line = json.dumps(record, sort_keys=True) + '\n'
    with _request_log_lock:
        try:
            os.makedirs(os.path.dirname(REQUEST_LOG), exist_ok=True)
            with open(REQUEST_LOG, 'a') as f:
                f.write(line)
        except OSError as e:   # a full disk must not fail the request
            sys.stderr.write('[lab-sglang] request log %s: %s\n' % (REQUEST_LOG, e))


# ------------------------------------------------------------------------------------- speed model

# The model's parameters (docs/bench.md, "The lab's speed model"). Defaults reproduce SYSTEM.md's
# measurements: one request decodes ~110 tok/s without MTP and ~135 tok/s with NEXTN steps 1 (+23%), and
# the gain shrinks as concurrency grows (about +16% at 4, +2% at 16, -7% at 32).
SPEED_DEFAULTS = {
    'base_tok_s': 110.0,      # one request, no speculation: one token per forward step at this rate
    'batch_cost': 0.03,       # each further token in a forward step adds this fraction of a base step
    'draft_cost': 0.44,       # one draft step (the MTP head) costs this fraction of a base step (x batch)
    'accept_prob': 0.8,       # a draft position is accepted with this probability when the one before was
    'prefill_tok_s': 10000.0,  # prompt tokens per second (uncached part), before the first token
    'draw': 'mean',           # 'mean': every step yields the mean (running sum, deterministic);
                              # 'random': each draft position accepted at random (accept_prob), seeded
    'seed': 0,                # for draw 'random'
}
SPEED_FILE = '/etc/lab-sglang-speed.json'


def speed_params(environ=None, path=SPEED_FILE):
    """The speed model's parameters: SPEED_DEFAULTS, then a JSON object in the container's
    /etc/lab-sglang-speed.json, then one in $LAB_SGLANG_SPEED_MODEL (what gpuhost:sglang.environment sets).
    Unknown keys or non-numbers are refused at start-up, like a bad flag."""
    environ = os.environ if environ is None else environ
    params = dict(SPEED_DEFAULTS)
    sources = []
    if path and os.path.exists(path):
        with open(path) as f:
            sources.append((path, f.read()))
    if environ.get('LAB_SGLANG_SPEED_MODEL'):
        sources.append(('LAB_SGLANG_SPEED_MODEL', environ['LAB_SGLANG_SPEED_MODEL']))
    for where, text in sources:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError('%s: not JSON: %s' % (where, e))
        if not isinstance(doc, dict):
            raise ValueError('%s: a JSON object of %s is expected' % (where, ', '.join(SPEED_DEFAULTS)))
        for key, value in doc.items():
            if key not in SPEED_DEFAULTS:
                raise ValueError('%s: unknown speed model key %r (known: %s)' % (where, key, ', '.join(SPEED_DEFAULTS)))
            if key == 'draw':
                if value not in ('mean', 'random'):
                    raise ValueError("%s: draw must be 'mean' or 'random'" % where)
            elif key == 'seed':
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError('%s: seed must be an integer' % where)
            elif not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or \
                    (key in ('base_tok_s', 'prefill_tok_s') and value <= 0) or (key == 'accept_prob' and value > 1):
                raise ValueError('%s: %s=%r is out of range' % (where, key, value))
            params[key] = value
    return params


def speed_model(settings, batch=1, params=None):
    """How fast the simulated server is, for the resolved settings and `batch` running requests:

      prefill_tok_s   prompt tokens per second (uncached part), before the first token
      step_s          seconds per decode step of the batch (with MTP: one verify pass + the draft steps)
      accept_length   mean tokens each step yields per request (1 without speculation)
      accept_rate     mean accepted / proposed draft tokens (0 without speculation)
      tok_s           accept_length / step_s: one request's decode rate at this batch size

    The model (parameters in SPEED_DEFAULTS; `b` running requests, base step t = 1 / base_tok_s, per-token
    cost c = batch_cost):
      no speculation:   step = t * (1 + c * (b - 1))                       (b tokens in the forward pass)
      NEXTN/EAGLE, steps s, draft tokens d (topk 1: d = s + 1):
                        step = t * (1 + c * (b * d - 1))                   verify: b * d tokens
                             + s * draft_cost * t * (1 + c * (b - 1))      s draft steps of the MTP head
      accept_length   = 1 + sum(p ** k for k in 1 .. d - 1)   (p = accept_prob: position k is reached
                                                               only if the ones before were accepted)
    Defaults, one request: no MTP 110 tok/s; steps 1: 1.8 / (1.03 + 0.44) x 110 = 135 tok/s (+23%);
    steps 2: 2.44 / 1.94 x 110 = 138 tok/s; steps 3: 2.95 / 2.41 x 110 = 135 tok/s. Verifying d tokens
    per request makes a big batch's step grow faster with MTP, so the gain shrinks with concurrency.
    With draw 'mean' (the default) nothing is random; with 'random' each step's yield is drawn
    (position by position, accept_prob) around accept_length."""
    p = params or PARAMS
    base = 1.0 / p['base_tok_s']
    b = max(batch, 1)
    plain = base * (1.0 + p['batch_cost'] * (b - 1))
    out = {'prefill_tok_s': p['prefill_tok_s'], 'step_s': plain, 'accept_length': 1.0, 'accept_rate': 0.0,
           'draft_positions': 0}
    steps = settings.get('speculative_num_steps') or 0 if settings.get('speculative_algorithm') else 0
    if steps:
        draft = settings.get('speculative_num_draft_tokens') or steps + 1
        positions = max(draft - 1, 1)
        accepted = sum(p['accept_prob'] ** k for k in range(1, positions + 1))
        verify = base * (1.0 + p['batch_cost'] * (b * (positions + 1) - 1))
        out.update(step_s=verify + steps * p['draft_cost'] * plain, accept_length=1.0 + accepted,
                   accept_rate=accepted / positions, draft_positions=positions)
    out['tok_s'] = out['accept_length'] / out['step_s']
    return out


def draw_yield(positions, accept_prob, rng):
    """Tokens one decode step yields for one request, drawn: the bonus token plus the accepted draft
    positions (each reached only when the one before was accepted)."""
    n = 1
    for _ in range(positions):
        if rng.random() >= accept_prob:
            break
        n += 1
    return n


try:
    PARAMS = speed_params()
except ValueError as _e:  # at start-up, like a bad flag: one line, exit status 1
    sys.exit('ValueError: lab speed model: %s' % _e)


# ------------------------------------------------------------------------------------------- metrics

def version_tuple(v):
    return tuple(int(x) if x.isdigit() else 0 for x in v.replace('.post', '.').split('.'))


# The first release whose metrics collector has each difference (read from the releases' wheels).
FEATURES = {
    'e2e_buckets_to_2400': '0.5.3',     # e2e latency buckets ... 400, 600, 1200, 1800, 2400 (was ..., 400, 800)
    'spec_accept_rate': '0.5.4',        # sglang:spec_accept_rate
    'moe_ep_rank': '0.5.7',             # scheduler label moe_ep_rank
    'cache_source': '0.5.9',            # sglang:cached_tokens_total{cache_source=...}
    'tokenizer_engine_type': '0.5.11',  # engine_type on the tokenizer's metrics too
    'spec_num_steps': '0.5.13',         # sglang:spec_num_steps, sglang:spec_num_draft_tokens, spec_verify_calls
    'is_streaming': '0.5.17',           # is_streaming on token counters, request counter, TTFT, e2e
    'tpot': '0.5.22',                   # sglang:request_time_per_output_token_seconds
}


def has(feature, version=__version__):
    return version_tuple(version) >= version_tuple(FEATURES[feature])


TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
E2E_BUCKETS_OLD = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800)


def go_float(value):
    """A number as prometheus_client writes it (floatToGoString)."""
    value = float(value)
    if value == math.inf:
        return '+Inf'
    if value == -math.inf:
        return '-Inf'
    if math.isnan(value):
        return 'NaN'
    s = repr(value)
    dot = s.find('e')
    if dot > 0 and s[dot + 1] == '+':  # 1e+16 -> 1e16, as Go prints it
        s = s[:dot + 1] + s[dot + 2:]
    return s


def label_text(labels):
    if not labels:
        return ''
    return '{%s}' % ','.join('%s="%s"' % (k, str(v).replace('\\', r'\\').replace('\n', r'\n').replace('"', r'\"'))
                             for k, v in labels)


class Family(object):
    """One metric family: samples per label set (counter and gauge values, or histogram buckets)."""

    def __init__(self, name, kind, buckets=None):
        self.name, self.kind, self.buckets = name, kind, buckets
        self.values = collections.OrderedDict()

    def inc(self, labels, amount=1.0):
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def set(self, labels, value):
        self.values[labels] = float(value)

    def observe(self, labels, value, count=1, total=None):
        """`count` observations of `value` (SGLang records a multi-token step's interval this way)."""
        h = self.values.setdefault(labels, {'buckets': [0] * len(self.buckets), 'sum': 0.0, 'count': 0})
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                h['buckets'][i] += count
                break
        h['sum'] += value * count if total is None else total
        h['count'] += count

    def text(self):
        # prometheus_client's multiprocess collector: help text "Multiprocess metric", counters as <name>_total,
        # and only families that have samples.
        if not self.values:
            return []
        lines = ['# HELP %s Multiprocess metric' % self.name, '# TYPE %s %s' % (self.name, self.kind)]
        for labels, v in self.values.items():
            if self.kind != 'histogram':
                lines.append('%s%s %s' % (self.name, label_text(labels), go_float(v)))
                continue
            acc = 0
            for bound, n in zip(self.buckets, v['buckets']):
                acc += n
                lines.append('%s_bucket%s %s' % (self.name, label_text(labels + (('le', go_float(bound)),)),
                                                 go_float(acc)))
            lines.append('%s_bucket%s %s' % (self.name, label_text(labels + (('le', '+Inf'),)), go_float(v['count'])))
            lines.append('%s_count%s %s' % (self.name, label_text(labels), go_float(v['count'])))
            lines.append('%s_sum%s %s' % (self.name, label_text(labels), go_float(v['sum'])))
        return lines


class Engine(object):
    """The simulated scheduler and tokenizer manager: requests wait for a slot, prefill, then decode in
    steps whose length and yield come from speed_model(); every step and every finished request is
    recorded the way SGLang's collectors record it."""

    KV_TOKENS = 1048576          # the simulated KV pool (sglang:max_total_num_tokens)
    WINDOW_S = 3.0               # gen_throughput: tokens of the last few seconds (0 when idle)

    def __init__(self, settings, version=__version__, max_running=None):
        self.settings, self.version = settings, version
        self.capacity = max_running or 64
        self.cond = threading.Condition()
        self.running = {}            # rid -> tokens held in the KV cache
        self.waiting = collections.deque()
        self.recent = collections.deque()   # (time, tokens) of decode steps, for gen_throughput
        self.prompt_window = collections.deque(maxlen=32)  # (prompt, cached) for cache_hit_rate
        self.seen_prefixes = set()
        self.accept = {'tokens': 0.0, 'steps': 0, 'last_length': 0.0, 'last_rate': 0.0, 'active': False}
        self.params = PARAMS
        self.rng = random.Random(self.params['seed'])
        # The last decode steps' yields (SGLang's gauges cover its decode log interval, 40 steps by default).
        self.window = collections.deque(maxlen=40)
        self.build_families()

    # -- labels, as the releases set them
    def scheduler_labels(self):
        labels = [('model_name', self.settings['served_model_name']), ('engine_type', 'unified'),
                  ('tp_rank', '0'), ('pp_rank', '0')]
        if has('moe_ep_rank', self.version):
            labels.append(('moe_ep_rank', '0'))
        return tuple(labels)

    def tokenizer_labels(self, streaming=None, **extra):
        labels = [('model_name', self.settings['served_model_name'])]
        if has('tokenizer_engine_type', self.version):
            labels.append(('engine_type', 'unified'))
        labels += sorted(extra.items())
        if streaming is not None and has('is_streaming', self.version):
            labels.append(('is_streaming', 'true' if streaming else 'false'))
        return tuple(labels)

    def build_families(self):
        f = collections.OrderedDict()
        for name in ('num_running_reqs', 'num_queue_reqs', 'num_grammar_queue_reqs', 'gen_throughput',
                     'cache_hit_rate', 'token_usage', 'num_used_tokens', 'spec_accept_length'):
            f[name] = Family('sglang:' + name, 'gauge')
        if has('spec_accept_rate', self.version):
            f['spec_accept_rate'] = Family('sglang:spec_accept_rate', 'gauge')
        if has('spec_num_steps', self.version):
            f['spec_num_steps'] = Family('sglang:spec_num_steps', 'gauge')
            f['spec_num_draft_tokens'] = Family('sglang:spec_num_draft_tokens', 'gauge')
        for name in ('prompt_tokens_total', 'generation_tokens_total', 'cached_tokens_total', 'num_requests_total'):
            f[name] = Family('sglang:' + name, 'counter')
        if has('spec_num_steps', self.version):
            f['spec_verify_calls_total'] = Family('sglang:spec_verify_calls_total', 'counter')
        f['ttft'] = Family('sglang:time_to_first_token_seconds', 'histogram', TTFT_BUCKETS)
        f['itl'] = Family('sglang:inter_token_latency_seconds', 'histogram', ITL_BUCKETS)
        if has('tpot', self.version):
            f['tpot'] = Family('sglang:request_time_per_output_token_seconds', 'histogram', ITL_BUCKETS)
        f['e2e'] = Family('sglang:e2e_request_latency_seconds', 'histogram',
                          E2E_BUCKETS if has('e2e_buckets_to_2400', self.version) else E2E_BUCKETS_OLD)
        self.families = f
        self.update_gauges(time.time())

    def speculative(self):
        return bool(self.settings.get('speculative_algorithm') and self.settings.get('speculative_num_steps'))

    def update_gauges(self, now):
        """The scheduler's gauges (called with the lock held, on every step and every scrape)."""
        f, s = self.families, self.scheduler_labels()
        while self.recent and self.recent[0][0] < now - self.WINDOW_S:
            self.recent.popleft()
        used = sum(self.running.values())
        prompt = sum(p for p, _ in self.prompt_window)
        f['num_running_reqs'].set(s, len(self.running))
        f['num_queue_reqs'].set(s, len(self.waiting))
        f['num_grammar_queue_reqs'].set(s, 0)
        f['gen_throughput'].set(s, sum(n for _, n in self.recent) / self.WINDOW_S)
        f['cache_hit_rate'].set(s, (sum(c for _, c in self.prompt_window) / prompt) if prompt else 0.0)
        f['token_usage'].set(s, round(used / float(self.KV_TOKENS), 4))
        f['num_used_tokens'].set(s, used)
        # Speculation gauges keep the last decode window's values (0 before any decode, 0 without it).
        f['spec_accept_length'].set(s, self.accept['last_length'])
        if 'spec_accept_rate' in f:
            f['spec_accept_rate'].set(s, self.accept['last_rate'])
        if 'spec_num_steps' in f:
            active = self.accept['active'] and self.speculative()
            f['spec_num_steps'].set(s, self.settings.get('speculative_num_steps') or 0 if active else 0)
            f['spec_num_draft_tokens'].set(s, self.settings.get('speculative_num_draft_tokens') or 0 if active else 0)

    def metrics(self):
        with self.cond:
            self.update_gauges(time.time())
            lines = []
            for fam in self.families.values():
                lines += fam.text()
        return '\n'.join(lines) + '\n'

    def prompt_split(self, messages, prompt_tokens):
        """(cached tokens) - the radix cache holds every earlier conversation prefix: a request whose
        messages before the last one were seen before gets those tokens from the cache."""
        prefix = json.dumps(messages[:-1], sort_keys=True)
        cached = count_tokens(messages[:-1]) if len(messages) > 1 and prefix in self.seen_prefixes else 0
        self.seen_prefixes.add(json.dumps(messages, sort_keys=True))
        self.seen_prefixes.add(prefix)
        return min(cached, prompt_tokens - 1)

    def generate(self, messages, max_new, streaming, emit, timing=None):
        """Serve one request; emit(n_tokens) is called after each step that produced tokens.
        Returns (prompt_tokens, completion_tokens, cached_tokens); `timing` (a dict), when given, gets the
        request's own clock: arrived, first_token, last_token (wall-clock seconds) and the largest batch it ran in."""
        arrived = time.time()
        rid = uuid.uuid4().hex
        prompt_tokens = count_tokens(messages) + 3
        with self.cond:
            cached = self.prompt_split(messages, prompt_tokens)
            self.waiting.append(rid)
            while len(self.running) >= self.capacity or self.waiting[0] != rid:
                self.cond.wait()
            self.waiting.popleft()
            self.running[rid] = prompt_tokens
            self.prompt_window.append((prompt_tokens, cached))
            batch = len(self.running)
            self.cond.notify_all()
        model = speed_model(self.settings, batch, self.params)
        time.sleep((prompt_tokens - cached) / model['prefill_tok_s'] / SPEED)
        first = time.time()
        max_batch = batch
        t_labels = self.tokenizer_labels()
        with self.cond:
            self.families['ttft'].observe(self.tokenizer_labels(streaming), first - arrived)
            self.running[rid] += 1
            self.recent.append((first, 1))
        emit(1)
        done, acc, last = 1, 0.0, first
        # Steps are scheduled on a clock (each one due step_s after the one before), not slept one after
        # the other: the time the simulator itself spends per step (locks, metrics, the HTTP write; more on
        # a loaded 2-core machine) is absorbed instead of slowing every request down.
        due = first
        try:
            while done < max_new:
                with self.cond:
                    batch = len(self.running)
                max_batch = max(max_batch, batch)
                model = speed_model(self.settings, batch, self.params)
                due += model['step_s'] / SPEED
                time.sleep(max(0.0, due - time.time()))
                if self.params['draw'] == 'random':
                    with self.cond:
                        step_yield = draw_yield(model['draft_positions'], self.params['accept_prob'], self.rng)
                    length = step_yield
                    n = min(step_yield, max_new - done)
                else:
                    # Deterministic yield: the running sum of accept lengths, rounded down, per step.
                    acc += model['accept_length']
                    n = min(int(acc), max_new - done)
                    acc -= int(acc)
                    length = model['accept_length']
                now = time.time()
                with self.cond:
                    self.running[rid] += n
                    self.recent.append((now, n))
                    self.families['itl'].observe(t_labels, (now - last) / n, count=n, total=now - last)
                    if self.speculative():
                        a = self.accept
                        a['tokens'] += length
                        a['steps'] += 1
                        if self.params['draw'] == 'random':
                            # The gauges: accepted tokens per step over the last steps, as SGLang logs them.
                            self.window.append(length)
                            mean = sum(self.window) / float(len(self.window))
                            rate = (mean - 1.0) / model['draft_positions']
                        else:
                            mean, rate = model['accept_length'], model['accept_rate']
                        a['last_length'], a['last_rate'], a['active'] = round(mean, 4), round(rate, 4), True
                        if 'spec_verify_calls_total' in self.families:
                            self.families['spec_verify_calls_total'].inc(t_labels)
                    self.update_gauges(now)
                done += n
                last = now
                emit(n)
        finally:
            end = time.time()
            if timing is not None:
                timing.update(arrived=arrived, first_token=first, last_token=last, max_batch=max_batch)
            with self.cond:
                del self.running[rid]
                f = self.families
                f['prompt_tokens_total'].inc(self.tokenizer_labels(streaming), prompt_tokens)
                f['generation_tokens_total'].inc(self.tokenizer_labels(streaming), done)
                if cached:
                    f['cached_tokens_total'].inc(self.tokenizer_labels(cache_source='device')
                                                 if has('cache_source', self.version) else t_labels, cached)
                f['num_requests_total'].inc(self.tokenizer_labels(streaming))
                f['e2e'].observe(self.tokenizer_labels(streaming), end - arrived)
                if 'tpot' in f and done > 1:
                    f['tpot'].observe(self.tokenizer_labels(streaming), (end - first) / (done - 1))
                self.update_gauges(end)
                self.cond.notify_all()
        return prompt_tokens, done, cached

    def avg_accept_length(self):
        with self.cond:
            a = self.accept
            return round(a['tokens'] / a['steps'], 4) if a['steps'] else None


# -------------------------------------------------------------------------------------- chat

WORDS = ('The', ' lab', ' serves', ' this', ' answer', ' one', ' simulated', ' token', ' at', ' a', ' time', '.')
NATURAL_TOKENS = 64   # an answer's length when neither max_tokens nor ignore_eos ends it earlier


def content_text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return ' '.join(p.get('text', '') for p in content if isinstance(p, dict))
    return ''


def count_tokens(messages):
    """A tokenizer stand-in: ~4 characters a token, plus the chat template's tokens per message."""
    return sum(4 + (len(content_text(m.get('content'))) + 3) // 4 for m in messages)


def token_texts():
    return itertools.cycle(WORDS)


class BadRequest(ValueError):
    pass


def parse_chat(body):
    try:
        req = json.loads(body.decode('utf-8') or '{}')
    except ValueError as e:
        raise BadRequest('invalid JSON body: %s' % e)
    if not isinstance(req, dict):
        raise BadRequest('the body must be a JSON object')
    messages = req.get('messages')
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise BadRequest('messages: a non-empty list of {"role", "content"} objects is required')
    limit = req.get('max_completion_tokens', req.get('max_tokens'))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise BadRequest('max_tokens must be a positive integer')
    if req.get('ignore_eos'):
        if limit is None:
            raise BadRequest('ignore_eos needs max_tokens')
        n = limit
    else:
        n = min(limit or NATURAL_TOKENS, NATURAL_TOKENS)
    return req, messages, n, 'length' if limit is not None and n == limit else 'stop'


# ----------------------------------------------------------------------------------- settings

def load_table(version, path=lab_args.TABLE):
    """This package's argument table, SGLang `version`'s (the lab builds both together)."""
    try:
        table = lab_args.load(path)
    except (OSError, ValueError) as e:
        sys.exit('RuntimeError: lab: no argument table for the simulated SGLang %s (%s); the lab writes it with '
                 'tools/sglang_flags_gen.py --lab-table %s --out <package>/sglang/lab_server_args.json'
                 % (version, e, version))
    if table.get('version') != version:
        sys.exit('RuntimeError: lab: %s is SGLang %s\'s argument table, this package is %s'
                 % (path, table.get('version'), version))
    return table


def parse_args(table, argv):
    """SGLang's argparse: the namespace, or what argparse does (usage + error on stderr, exit 2;
    --help, exit 0)."""
    return lab_args.build_parser(table).parse_args(argv)


def resolve(args, table):
    """The settings as SGLang reports them after its own adjustments."""
    version = table['version']

    def setting(name, default=None):
        return lab_args.field(table, args, name, default)

    algo = setting('speculative_algorithm')
    steps = setting('speculative_num_steps')
    topk = setting('speculative_eagle_topk')
    spec = {
        'speculative_algorithm': 'EAGLE' if algo == 'NEXTN' else algo,
        'speculative_num_steps': steps,
        'speculative_eagle_topk': topk,
        'speculative_num_draft_tokens': setting('speculative_num_draft_tokens'),
    }
    if algo and topk == 1 and steps is not None:
        # SGLang forces draft tokens = steps + 1 when topk is 1.
        spec['speculative_num_draft_tokens'] = steps + 1
    strategy = setting('mamba_radix_cache_strategy') or setting('mamba_scheduler_strategy')
    if strategy == 'auto':
        strategy = 'extra_buffer'
    model_path = setting('model_path')
    settings = {
        'version': version,
        'model_path': model_path,
        'served_model_name': setting('served_model_name') or model_path,
        'tp_size': setting('tp_size'),
        'host': setting('host'),
        'port': setting('port'),
        'mem_fraction_static': setting('mem_fraction_static'),
        'enable_metrics': setting('enable_metrics', False),
        'mamba_radix_cache_strategy': strategy,
        'disable_custom_all_reduce': setting('disable_custom_all_reduce', False),
        'max_running_requests': setting('max_running_requests'),
    }
    settings.update(spec)
    return settings


def bind_address(host):
    if host in ('0.0.0.0', '::'):
        # The lab container's own address (every lab container shares the host's loopback).
        try:
            with open('/etc/lab-ct.json') as f:
                return json.load(f)['ip']
        except FileNotFoundError:
            return '127.0.0.1'
    return host


# ------------------------------------------------------------------------------------- server

def authorized(path, header, api_key):
    """SGLang's API key rule (0.5.23 sglang/srt/utils/auth.py decide_request_auth, no admin key): with
    --api-key every endpoint wants `Authorization: Bearer <key>` except /health*, /ready* and /metrics*
    (probes and Prometheus scrape without secrets)."""
    if not api_key or path.startswith(('/health', '/ready', '/metrics')):
        return True
    scheme, _, token = (header or '').partition(' ')
    return scheme.lower() == 'bearer' and hmac.compare_digest(token, api_key)


def make_handler(settings, engine, started, metrics_on, api_key=None):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            sys.stderr.write('[lab-sglang] ' + (fmt % a) + '\n')

        def send(self, code, body, ctype='application/json'):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header('Content-Type', ctype)
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def ready(self):
            return time.time() - started >= STARTUP_SECONDS or bool(LOADED_FILE and os.path.exists(LOADED_FILE))

        def refused(self, path):
            if authorized(path, self.headers.get('Authorization'), api_key):
                return False
            self.send(401, {'error': 'Unauthorized'})
            return True

        def do_GET(self):
            path = self.path.split('?')[0]
            if self.refused(path):
                return None
            if path in ('/health', '/health_generate', '/ready'):
                ok = self.ready()
                return self.send(200 if ok else 503, b'' if ok else b'starting', 'text/plain')
            if path in ('/server_info', '/get_server_info'):
                info = dict(settings)
                avg = engine.avg_accept_length() if engine.speculative() else None
                # SGLang reports the average only once speculative decoding has run.
                info['internal_states'] = [{'avg_spec_accept_length': avg} if avg is not None else {}]
                return self.send(200, info)
            if path == '/get_model_info':
                # As SGLang's: the --model-path it loaded (and the tokenizer's, the same directory here).
                return self.send(200, {'model_path': settings['model_path'], 'tokenizer_path': settings['model_path'],
                                       'is_generation': True, 'weight_version': 'default'})
            if path == '/v1/models':
                return self.send(200, {'object': 'list', 'data': [
                    {'id': settings['served_model_name'], 'object': 'model', 'created': int(started),
                     'owned_by': 'sglang', 'root': settings['model_path'], 'max_model_len': 262144}]})
            if path == '/metrics' and metrics_on:
                return self.send(200, engine.metrics().encode(), 'text/plain; version=0.0.4; charset=utf-8')
            return self.send(404, {'detail': 'Not Found'})

        def error(self, code, message):
            kind = 'BadRequestError' if code == 400 else 'ServiceUnavailableError'
            return self.send(code, {'object': 'error', 'message': message, 'type': kind, 'param': None,
                                    'code': code})

        def do_POST(self):
            path = self.path.split('?')[0]
            body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
            if self.refused(path):
                return None
            if path != '/v1/chat/completions':
                return self.send(404, {'detail': 'Not Found'})
            if not self.ready():
                return self.error(503, 'the server is still starting')
            try:
                req, messages, n, finish = parse_chat(body)
            except BadRequest as e:
                return self.error(400, str(e))
            rid = 'chatcmpl-' + uuid.uuid4().hex
            created = int(time.time())
            model = req.get('model') or settings['served_model_name']
            words = token_texts()
            timing = {}

            def served(prompt, done, cached, streaming):
                log_request(dict(timing, request_id=self.headers.get('X-Request-ID'), id=rid, streaming=streaming,
                                 prompt_tokens=prompt, completion_tokens=done, cached_tokens=cached))
            if not req.get('stream'):
                parts = []
                prompt, done, cached = engine.generate(messages, n, False,
                                                       lambda k: parts.extend(next(words) for _ in range(k)), timing)
                served(prompt, done, cached, False)
                return self.send(200, {
                    'id': rid, 'object': 'chat.completion', 'created': created, 'model': model,
                    'choices': [{'index': 0, 'message': {'role': 'assistant', 'content': ''.join(parts),
                                                         'reasoning_content': None, 'tool_calls': None},
                                 'logprobs': None, 'finish_reason': finish, 'matched_stop': None}],
                    'usage': usage(prompt, done, cached)})
            include_usage = bool((req.get('stream_options') or {}).get('include_usage'))
            self.send_response(200)
            self.send_header('Content-Type', 'text/event-stream')
            self.send_header('Cache-Control', 'no-cache')
            self.end_headers()

            def chunk(delta, finish_reason=None, **extra):
                doc = {'id': rid, 'object': 'chat.completion.chunk', 'created': created, 'model': model,
                       'choices': [{'index': 0, 'delta': delta, 'logprobs': None, 'finish_reason': finish_reason,
                                    'matched_stop': None}], 'usage': None}
                doc.update(extra)
                self.wfile.write(('data: %s\n\n' % json.dumps(doc)).encode())
                self.wfile.flush()

            first = [True]

            def emit(k):
                text = ''.join(next(words) for _ in range(k))
                chunk({'role': 'assistant', 'content': text} if first[0] else {'content': text})
                first[0] = False
            try:
                prompt, done, cached = engine.generate(messages, n, True, emit, timing)
                served(prompt, done, cached, True)
                chunk({}, finish)
                if include_usage:
                    self.wfile.write(('data: %s\n\n' % json.dumps({
                        'id': rid, 'object': 'chat.completion.chunk', 'created': created, 'model': model,
                        'choices': [], 'usage': usage(prompt, done, cached)})).encode())
                self.wfile.write(b'data: [DONE]\n\n')
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler


def usage(prompt, completion, cached):
    return {'prompt_tokens': prompt, 'total_tokens': prompt + completion, 'completion_tokens': completion,
            'prompt_tokens_details': None, 'reasoning_tokens': 0}


class Server(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: a load generator opening a few dozen connections at once (and a
    # Prometheus scrape beside it) overflows it, and the kernel's SYN retry adds a whole second to a
    # request's TTFT. SGLang's uvicorn listens with a backlog of 2048.
    request_queue_size = 2048


def main(argv=None):
    table = load_table(__version__)
    args = parse_args(table, sys.argv[1:] if argv is None else argv)
    triple = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    if args.speculative_algorithm and None in triple:
        sys.exit('ValueError: speculative decoding needs --speculative-num-steps, --speculative-eagle-topk '
                 'and --speculative-num-draft-tokens')
    if ':' in (args.served_model_name or ''):
        sys.exit('ValueError: served model name must not contain ":"')
    settings = resolve(args, table)
    # Lab knob: die at start-up when the resolved settings match every key of this JSON object (a setting
    # that does not fit on the GPUs, say), as SGLang does: a message, exit status 1, the unit failed.
    if os.path.exists('/etc/lab-sglang-fail.json'):
        with open('/etc/lab-sglang-fail.json') as f:
            fail = json.load(f)
        if all(settings.get(k) == v for k, v in fail.items() if k != 'message'):
            sys.exit(fail.get('message') or 'RuntimeError: lab: start-up fails for %s' % json.dumps(fail, sort_keys=True))
    # What the container must give it: the NVIDIA user space at the host module's version, CUDA at CUDA_HOME.
    broken = lab_runtime.problem()
    if broken:
        sys.exit(broken)
    # The weights at --model-path, as SGLang's loader finds them (lab_weights).
    broken = lab_weights.problem(settings.get('model_path'))
    if broken:
        sys.exit(broken)
    # Lab knob: report (and run with) other resolved values, as an SGLang that silently ignores a flag would.
    if os.path.exists('/etc/lab-sglang-override.json'):
        with open('/etc/lab-sglang-override.json') as f:
            settings.update(json.load(f))
    engine = Engine(settings, __version__, settings.get('max_running_requests'))
    server = Server((bind_address(args.host), args.port),
                                 make_handler(settings, engine, time.time(), bool(args.enable_metrics),
                                              lab_args.field(table, args, 'api_key')))
    server.daemon_threads = True
    sys.stderr.write('[lab-sglang] %s serving %s on %s:%d (speculative: %s)\n' % (
        __version__, settings['served_model_name'], server.server_address[0], args.port,
        settings['speculative_algorithm']))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == '__main__':
    main()
