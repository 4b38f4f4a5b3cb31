set -euo pipefail
# ct_install_artifact.sh VMID INSTALLER SHA256 ARGS...: run an operator-provided installer from the host inside
# the container (NVIDIA's driver .run with --no-kernel-module, CUDA's runfile with --toolkit): checked against
# SHA256 on the host first (exit 5 and nothing copied if it differs; exit 4 if it is not there), pushed into the
# container, run there with ARGS (its output on stderr: the step's log), removed afterwards.
vmid=$1 src=$2 want=$3
shift 3
if [ ! -f "$src" ]; then
  echo "gpuhost: $src does not exist on $(hostname)" >&2
  exit 4
fi
got=$(sha256sum "$src" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "gpuhost: $src on $(hostname) has sha256 $got" >&2
  exit 5
fi
dest=/var/tmp/.gpuhost-$(basename "$src")
trap 'pct exec "$vmid" -- rm -f "$dest" >/dev/null 2>&1 || true' EXIT
pct push "$vmid" "$src" "$dest" --perms 0700
pct exec "$vmid" -- sh "$dest" "$@" >&2
