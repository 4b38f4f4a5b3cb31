set -euo pipefail
# ct_gpu_proof.sh VMID UNIT PYTHON ENV... -- ARGS...   (gpu_proof.py's source on stdin; called by components/sglang.py
# prove): stop UNIT in container VMID (SGLang must not hold the GPUs the proof uses), put the proof in the container
# (pushed to a root-only file in its /run) and run it with PYTHON - the service's own - in exactly the unit's
# environment (ENV: its KEY=value pairs, nothing else inherited). Prints the proof's JSON; exits with its status
# (0 ok, 1 a check failed, 2 a hang it killed, 3 it could not run).
vmid=$1 unit=$2 python=$3
shift 3
envs=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
[ "$#" -gt 0 ] && shift
tmp=$(mktemp /tmp/.gpuhost-proof.XXXXXX)
trap 'rm -f "$tmp"' EXIT
cat > "$tmp"
# Stopped whatever its state (active, or between two automatic restarts); a unit systemd has not loaded (a first
# start: its file is new) has nothing to stop.
if [ "$(pct exec "$vmid" -- systemctl show -p LoadState --value "$unit")" = loaded ]; then
  pct exec "$vmid" -- systemctl stop "$unit" >&2
fi
pct push "$vmid" "$tmp" /run/gpuhost-gpu-proof.py --perms 0600
set +e
pct exec "$vmid" -- env -i "${envs[@]}" "$python" /run/gpuhost-gpu-proof.py --json - "$@"
code=$?
set -e
pct exec "$vmid" -- rm -f /run/gpuhost-gpu-proof.py
exit "$code"
