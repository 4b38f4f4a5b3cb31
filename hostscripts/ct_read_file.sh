set -euo pipefail
# ct_read_file.sh VMID PATH: a file's content inside the container, or exit 4 if it is absent.
vmid=$1 path=$2
pct exec "$vmid" -- sh -c 'if [ -f "$1" ]; then cat "$1"; else exit 4; fi' sh "$path"
