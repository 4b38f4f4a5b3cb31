set -euo pipefail
# ct_stop_unit.sh VMID UNIT PATH: stop, disable and remove the unit (destroy); a missing
# container means there is nothing left to remove.
vmid=$1 unit=$2 path=$3
if [ "$(pct status "$vmid" 2>/dev/null | awk '{print $2}')" != running ]; then
  echo "container $vmid not running; nothing to stop"
  exit 0
fi
pct exec "$vmid" -- systemctl disable --now "$unit" >&2 || true
pct exec "$vmid" -- rm -f "$path"
pct exec "$vmid" -- systemctl daemon-reload
echo removed
