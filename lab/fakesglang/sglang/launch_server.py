"""Simulated `python -m sglang.launch_server` for lab containers.

Parses the real command line with the parser of the installed SGLang version, rebuilt by
sglang_argparse (a copy of components/sglang_argparse.py) from the table generated from that
version's own argparse (sglang_flags_data/<version>.json, copied in by labctl): an unknown, removed,
mistyped or ambiguous flag fails start-up exactly like SGLang does (argparse's usage and
"<prog>: error: ..." on stderr, exit status 2). Then it serves the endpoints the program and
monitoring use: /health (503 while "loading"), /ready, /server_info (the resolved settings),
/get_server_info, /v1/models and /metrics. Stdlib only.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang import __version__, sglang_argparse

STARTUP_SECONDS = float(os.environ.get('LAB_SGLANG_STARTUP', '1.0'))


def parse_args(version, argv):
    """SGLang's argparse for `version`: the namespace, or usage + error on stderr and exit 2 (0 for
    --help, after the usage), as argparse's parse_args does."""
    prog = sglang_argparse.table(version)['parser'].get('prog') or 'launch_server.py'
    parser = sglang_argparse.build_parser(version, prog=prog)
    try:
        return parser.parse_args(argv)
    except sglang_argparse.FlagError as e:
        if e.kind == 'help':
            parser.print_usage(sys.stdout)
            sys.exit(0)
        if e.raises not in (None, 'parser.error'):
            # One of SGLang's own actions raised: it dies with a traceback ending in the exception.
            sys.exit('%s: %s' % (e.raises, e))
        message = str(e)
    except argparse.ArgumentError as e:  # a bad or missing value
        message = str(e)
    parser.print_usage(sys.stderr)
    sys.stderr.write('%s: error: %s\n' % (prog, message))
    sys.exit(2)


def setting(args, version, field, default=None):
    """A ServerArgs field from the namespace (0.5.1-0.5.13 parse --tp-size into tensor_parallel_size)."""
    for dest, name in sglang_argparse.table(version)['parser'].get('dest_to_field', {}).items():
        if name == field and hasattr(args, dest):
            return getattr(args, dest)
    return getattr(args, field, default)


def resolve(args, version):
    """The settings as SGLang reports them after its own adjustments."""
    algo = setting(args, version, 'speculative_algorithm')
    steps = setting(args, version, 'speculative_num_steps')
    topk = setting(args, version, 'speculative_eagle_topk')
    spec = {
        'speculative_algorithm': 'EAGLE' if algo == 'NEXTN' else algo,
        'speculative_num_steps': steps,
        'speculative_eagle_topk': topk,
        'speculative_num_draft_tokens': setting(args, version, 'speculative_num_draft_tokens'),
    }
    if algo and topk == 1 and steps is not None:
        # SGLang forces draft tokens = steps + 1 when topk is 1.
        spec['speculative_num_draft_tokens'] = steps + 1
    strategy = setting(args, version, 'mamba_radix_cache_strategy') or setting(args, version, 'mamba_scheduler_strategy')
    if strategy == 'auto':
        strategy = 'extra_buffer'
    model_path = setting(args, version, 'model_path')
    settings = {
        'version': version,
        'model_path': model_path,
        'served_model_name': setting(args, version, 'served_model_name') or model_path,
        'tp_size': setting(args, version, 'tp_size'),
        'host': setting(args, version, 'host'),
        'port': setting(args, version, 'port'),
        'mem_fraction_static': setting(args, version, 'mem_fraction_static'),
        'enable_metrics': setting(args, version, 'enable_metrics', False),
        'mamba_radix_cache_strategy': strategy,
        'disable_custom_all_reduce': setting(args, version, 'disable_custom_all_reduce', False),
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
    args = parse_args(__version__, sys.argv[1:] if argv is None else argv)
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
