"""Simulated `python -m sglang.launch_server` for lab containers.

Parses the real command line with the flags the installed version accepts (so a flag renamed or
removed in that version fails start-up exactly like SGLang does), then serves the endpoints the
program and monitoring use: /health (503 while "loading"), /ready, /server_info (the resolved
settings), /get_server_info, /v1/models and /metrics. Stdlib only.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang import __version__

STARTUP_SECONDS = float(os.environ.get('LAB_SGLANG_STARTUP', '1.0'))


def vtuple(v):
    return tuple(int(x) for x in v.split('.')[:3])


def parser(version):
    v = vtuple(version)
    p = argparse.ArgumentParser(prog='sglang.launch_server', allow_abbrev=True)
    p.add_argument('--model-path', required=True)
    p.add_argument('--served-model-name')
    p.add_argument('--host', default='127.0.0.1')
    p.add_argument('--port', type=int, default=30000)
    p.add_argument('--tp-size', '--tp', type=int, default=1)
    p.add_argument('--mem-fraction-static', type=float)
    p.add_argument('--context-length', type=int)
    p.add_argument('--trust-remote-code', action='store_true')
    p.add_argument('--enable-metrics', action='store_true')
    p.add_argument('--disable-custom-all-reduce', action='store_true')
    p.add_argument('--attention-backend')
    p.add_argument('--speculative-algorithm', choices=['EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE'])
    p.add_argument('--speculative-draft-model-path')
    p.add_argument('--speculative-num-steps', type=int)
    p.add_argument('--speculative-eagle-topk', type=int)
    p.add_argument('--speculative-num-draft-tokens', type=int)
    strategies = ['auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy']
    if v < (0, 5, 20):
        p.add_argument('--mamba-scheduler-strategy', choices=['no_buffer', 'extra_buffer'])
    if v >= (0, 5, 14):
        p.add_argument('--mamba-radix-cache-strategy', choices=strategies, default='auto')
    if v >= (0, 5, 23):
        # Two flags now share the old name as a prefix, so argparse calls it ambiguous.
        p.add_argument('--cuda-graph-max-bs-decode', type=int)
        p.add_argument('--cuda-graph-max-bs-prefill', type=int)
    else:
        p.add_argument('--cuda-graph-max-bs', type=int)
    return p


def resolve(args, version):
    """The settings as SGLang reports them after its own adjustments."""
    algo = args.speculative_algorithm
    spec = {
        'speculative_algorithm': 'EAGLE' if algo == 'NEXTN' else algo,
        'speculative_num_steps': args.speculative_num_steps,
        'speculative_eagle_topk': args.speculative_eagle_topk,
        'speculative_num_draft_tokens': args.speculative_num_draft_tokens,
    }
    if algo and args.speculative_eagle_topk == 1 and args.speculative_num_steps is not None:
        # SGLang forces draft tokens = steps + 1 when topk is 1.
        spec['speculative_num_draft_tokens'] = args.speculative_num_steps + 1
    strategy = getattr(args, 'mamba_radix_cache_strategy', None) or getattr(args, 'mamba_scheduler_strategy', None)
    if strategy == 'auto':
        strategy = 'extra_buffer'
    settings = {
        'version': version,
        'model_path': args.model_path,
        'served_model_name': args.served_model_name or args.model_path,
        'tp_size': args.tp_size,
        'host': args.host,
        'port': args.port,
        'mem_fraction_static': args.mem_fraction_static,
        'enable_metrics': args.enable_metrics,
        'mamba_radix_cache_strategy': strategy,
        'disable_custom_all_reduce': args.disable_custom_all_reduce,
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


def main(argv=None):
    args = parser(__version__).parse_args(argv)
    triple = (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
    if args.speculative_algorithm and None in triple:
        sys.exit('ValueError: speculative decoding needs --speculative-num-steps, --speculative-eagle-topk '
                 'and --speculative-num-draft-tokens')
    if ':' in (args.served_model_name or ''):
        sys.exit('ValueError: served model name must not contain ":"')
    settings = resolve(args, __version__)
    # Lab knob: report other resolved values, as an SGLang that silently ignores a flag would.
    if os.path.exists('/etc/lab-sglang-override.json'):
        with open('/etc/lab-sglang-override.json') as f:
            settings.update(json.load(f))
    started = time.time()
    accept = 2.0 if args.speculative_algorithm else None
    counters = {'requests': 0}
    lock = threading.Lock()

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

        def do_GET(self):
            ready = time.time() - started >= STARTUP_SECONDS
            with lock:
                counters['requests'] += 1
            path = self.path.split('?')[0]
            if path in ('/health', '/health_generate', '/ready'):
                return self.send(200 if ready else 503, b'' if ready else b'starting', 'text/plain')
            if path in ('/server_info', '/get_server_info'):
                info = dict(settings)
                info['internal_states'] = [{'avg_spec_accept_length': accept}] if accept else [{}]
                return self.send(200, info)
            if path == '/v1/models':
                return self.send(200, {'object': 'list', 'data': [
                    {'id': settings['served_model_name'], 'object': 'model', 'owned_by': 'sglang',
                     'root': settings['model_path']}]})
            if path == '/metrics' and args.enable_metrics:
                name = settings['served_model_name']
                lines = ['sglang:num_running_reqs{model_name="%s"} 0' % name,
                         'sglang:num_queue_reqs{model_name="%s"} 0' % name,
                         'sglang:token_usage{model_name="%s"} 0.0' % name,
                         'sglang:gen_throughput{model_name="%s"} 0.0' % name]
                if accept:
                    lines += ['sglang:spec_accept_length{model_name="%s"} %.2f' % (name, accept),
                              'sglang:spec_accept_rate{model_name="%s"} 1.0' % name]
                return self.send(200, ('\n'.join(lines) + '\n').encode(), 'text/plain; version=0.0.4')
            return self.send(404, {'detail': 'Not Found'})

    server = ThreadingHTTPServer((bind_address(args.host), args.port), Handler)
    sys.stderr.write('[lab-sglang] %s serving %s on %s:%d (speculative: %s)\n' % (
        __version__, settings['served_model_name'], server.server_address[0], args.port,
        settings['speculative_algorithm']))
    sys.stderr.flush()
    server.serve_forever()


if __name__ == '__main__':
    main()
