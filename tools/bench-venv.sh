#!/usr/bin/env bash
# The benchmark tool's own virtualenv (.venv-bench, requirements-bench.txt), for `make bench-serve`:
# AIPerf and its ~100 dependencies stay out of the Pulumi program's .venv. Idempotent: reinstalls only
# when requirements-bench.txt changed. Wheels come from pip's cache (~/.cache/pip) when it has them.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${GPUHOST_BENCH_VENV:-$root/.venv-bench}
want=$(sha256sum "$root/requirements-bench.txt" | cut -c1-16)
if [ -x "$venv/bin/aiperf" ] && [ "$(cat "$venv/.reqs" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "bench-venv: installing requirements-bench.txt (AIPerf) into $venv (cold: ~2 min, ~1.2 GB)" >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/requirements-bench.txt"
echo "$want" > "$venv/.reqs"
