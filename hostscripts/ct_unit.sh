set -euo pipefail
# ct_unit.sh VMID UNIT RESTART(yes|no): load the unit, enable it, and (re)start it - restart only
# when asked (the unit changed) or when it is not running. Prints the unit's state afterwards.
vmid=$1 unit=$2 restart=$3
pct exec "$vmid" -- systemctl daemon-reload
pct exec "$vmid" -- systemctl enable "$unit" >&2
if [ "$restart" = yes ]; then
  pct exec "$vmid" -- systemctl restart "$unit"
  echo "restarted"
elif ! pct exec "$vmid" -- systemctl is-active --quiet "$unit"; then
  pct exec "$vmid" -- systemctl start "$unit"
  echo "started"
fi
pct exec "$vmid" -- systemctl show "$unit" -p ActiveState -p InvocationID
