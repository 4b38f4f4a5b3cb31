set -euo pipefail
# check_devices.sh PATH...: every path must be a character device on the host (devN entries
# point at them; Proxmox does not check before the container starts). Prints the missing ones.
missing=0
for p in "$@"; do
  if [ ! -c "$p" ]; then echo "missing $p"; missing=1; fi
done
exit $missing
