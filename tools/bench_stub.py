"""The plugin's stub alone: CPU of N stub starts - each gets an instance from the pass's serving process, prints its
port, and ends at the engine's SIGINT, as the engine runs it once per host and pass - for the built stub
(provider/bin/gpuhost-stub) and provider/stub.py (GPUHOST_PLUGIN_STUB=python). The serving process is started by a
first stub and is not counted (it is not the stubs' child).

    python -m tools.bench_stub [N]      (default 24: 8 hosts, three passes)
"""

import os
import resource
import signal
import socket
import subprocess
import sys
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, 'provider', 'pulumi-resource-gpuhost')


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(n: int, env: dict) -> float:
    """CPU-s of n stubs of one pass (an engine address of its own), started one after another."""
    engine = socket.socket()
    engine.bind(('127.0.0.1', 0))
    engine.listen(64)

    def accept():
        while True:
            try:
                engine.accept()[0].close()
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    addr = '127.0.0.1:%d' % engine.getsockname()[1]
    first = subprocess.Popen([PLUGIN, addr], stdout=subprocess.PIPE, env=env)   # starts the serving process
    first.stdout.readline()
    before = children_cpu()
    for _ in range(n):
        p = subprocess.Popen([PLUGIN, addr], stdout=subprocess.PIPE, env=env)
        p.stdout.readline()
        p.send_signal(signal.SIGINT)
        p.wait(10)
    spent = children_cpu() - before
    first.send_signal(signal.SIGINT)
    first.wait(10)
    engine.close()
    return spent


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    built = os.path.join(REPO, 'provider', 'bin', 'gpuhost-stub')
    kinds = [('built (provider/bin/gpuhost-stub)', {})] if os.access(built, os.X_OK) else []
    kinds.append(('provider/stub.py', {'GPUHOST_PLUGIN_STUB': 'python'}))
    for name, extra in kinds:
        env = {k: v for k, v in os.environ.items() if k != 'GPUHOST_PLUGIN_STUB'}
        env.update(extra)
        runs = sorted(run(n, env) for _ in range(3))
        print('%-36s %d stubs: %.3f CPU-s (median of 3: %s), %.1f ms a stub' % (
            name, n, runs[1], ' '.join('%.3f' % r for r in runs), runs[1] / n * 1000))


if __name__ == '__main__':
    main()
