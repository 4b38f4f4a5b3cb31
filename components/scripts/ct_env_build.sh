set -euo pipefail
# ct_env_build.sh VMID WHEELHOUSE|- BUILDER (the job, JSON, on stdin): build a Python environment inside the
# container with its own python3 (BUILDER: ct_env_build.py's program, see there). A wheelhouse on the host is
# copied into the container first (tar through pct exec) and removed afterwards. The job - the index password
# among it - travels on stdin only.
vmid=$1 wheelhouse=$2 builder=$3
dir=-
if [ "$wheelhouse" != - ]; then
  if [ ! -d "$wheelhouse" ]; then
    echo "gpuhost-build: the wheelhouse $wheelhouse does not exist on $(hostname)" >&2
    exit 5
  fi
  dir=/var/tmp/.gpuhost-wheelhouse
  trap 'pct exec "$vmid" -- rm -rf "$dir" >/dev/null 2>&1 || true' EXIT
  tar -C "$wheelhouse" -cf - . | pct exec "$vmid" -- sh -c 'rm -rf "$1" && mkdir -p "$1" && tar -C "$1" -xf -' sh "$dir"
fi
pct exec "$vmid" -- python3 -c "$builder" "$dir"
