set -euo pipefail
# ct_remove_path.sh VMID PATH: remove a path the program made in the container for a step (a staged wheelhouse).
vmid=$1 path=$2
case $path in /var/tmp/.gpuhost-*) ;; *) echo "ct_remove_path.sh: not a path of the program's: $path" >&2; exit 2 ;; esac
pct exec "$vmid" -- rm -rf -- "$path"
