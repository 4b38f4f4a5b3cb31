set -euo pipefail
# ct_gpu_proof.sh VMID UNIT PYTHON ARGS...   (on stdin: the length in bytes of the unit's environment, a line; that
# environment, KEY=value entries each ended by a NUL; then gpu_proof.py's source. Called by resources/sglang.py prove):
# stop UNIT in container VMID (SGLang must not hold the GPUs the proof uses), put the proof and the environment in the
# container (root-only files in its /run) and run the proof with PYTHON - the service's own - in exactly the unit's
# environment: started with none (env -i), it reads the file, removes it and runs again with those values and nothing
# else inherited. The values never reach a command line - the host's process list shows every container's commands.
# Prints the proof's JSON; exits with its status (0 ok, 1 a check failed, 2 a hang it killed, 3 it could not run).
vmid=$1 unit=$2 python=$3
shift 3
tmp=$(mktemp /tmp/.gpuhost-proof.XXXXXX)
envf=$(mktemp /tmp/.gpuhost-proof-env.XXXXXX)
trap 'rm -f "$tmp" "$envf"' EXIT
IFS= read -r size
case $size in ''|*[!0-9]*) echo "ct_gpu_proof.sh: no environment length on stdin (got '${size:0:20}')" >&2; exit 3 ;; esac
head -c "$size" > "$envf"
cat > "$tmp"
# Stopped whatever its state (active, or between two automatic restarts); a unit systemd has not loaded (a first
# start: its file is new) has nothing to stop.
if [ "$(pct exec "$vmid" -- systemctl show -p LoadState --value "$unit")" = loaded ]; then
  pct exec "$vmid" -- systemctl stop "$unit" >&2
fi
pct push "$vmid" "$tmp" /run/gpuhost-gpu-proof.py --perms 0600
pct push "$vmid" "$envf" /run/gpuhost-gpu-proof.env --perms 0600
set +e
pct exec "$vmid" -- env -i "$python" /run/gpuhost-gpu-proof.py --env-file /run/gpuhost-gpu-proof.env --json - "$@"
code=$?
set -e
pct exec "$vmid" -- rm -f /run/gpuhost-gpu-proof.py /run/gpuhost-gpu-proof.env
exit "$code"
