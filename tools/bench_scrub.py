"""python -m tools.bench_scrub [ERRORS_PY] [HOSTS,...]: the CPU a process spends remembering the secrets of a shard's
hosts (transport/errors.py remember(): each host's configuration with its own 4096-bit RSA private key and API
password, as Configure hands them over) and scrubbing one message after the last, for each number of hosts
(default 8,50,100,200). ERRORS_PY: another version of transport/errors.py to measure (an older commit's, from
`git show COMMIT:transport/errors.py`). EACH=1 scrubs a message after every host too. docs/bench.md has the
figures."""

import importlib.util
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] else os.path.join(ROOT, 'transport', 'errors.py')
    hosts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else '8,50,100,200').split(',')]
    key = subprocess.run(['openssl', 'genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:4096'],
                         capture_output=True, text=True, check=True).stdout
    for n in hosts:
        spec = importlib.util.spec_from_file_location('bench_errors_%d' % n, path)
        errors = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(errors)
        t = time.process_time()
        for i in range(n):
            # A key of its own per host: the body lines rotated by the host's number.
            own = '\n'.join(line if line.startswith('-----') else line[i % 7:] + line[:i % 7]
                            for line in key.splitlines())
            errors.remember({'connection': {'private_key': own}, 'api': {'password': 'pw-%08d-secret' % i}})
            if os.environ.get('EACH'):
                errors.scrub('host %d: a step ran' % i)
        errors.scrub('the last message')
        print('%d hosts: %.3f CPU-s' % (n, time.process_time() - t), flush=True)


if __name__ == '__main__':
    main()
