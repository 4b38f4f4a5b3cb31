set -euo pipefail
# ct_stop_unit.sh VMID UNIT PATH: stop, disable and remove the unit (destroy, rename); a container
# that is gone or stopped, or a unit that is not there, means there is nothing left to stop.
vmid=$1 unit=$2 path=$3
status=$(pct status "$vmid" 2>/dev/null || true)
if [ "${status#status: }" != running ]; then
  echo "container $vmid not running; nothing to stop"
  exit 0
fi
if pct exec "$vmid" -- test -e "$path"; then
  pct exec "$vmid" -- systemctl disable --now "$unit" >&2
  pct exec "$vmid" -- rm -f "$path"
  pct exec "$vmid" -- systemctl daemon-reload
  echo removed
else
  echo "no $path in container $vmid"
fi
