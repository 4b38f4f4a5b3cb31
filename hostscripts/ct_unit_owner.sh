set -euo pipefail
# ct_unit_owner.sh VMID UNIT PATH: who owns the unit name inside the container. Prints "absent" (no such
# container, or not running), "free", "ours" (PATH carries this program's header) or "foreign <file>"
# (a unit of that name the container has of its own: writing ours would override or overwrite it).
vmid=$1 unit=$2 path=$3
if [ "$(pct status "$vmid" 2>/dev/null | awk '{print $2}')" != running ]; then
  echo absent
  exit 0
fi
pct exec "$vmid" -- sh -c '
  unit=$1 path=$2
  if [ -e "$path" ] || [ -L "$path" ]; then
    if [ -f "$path" ] && head -n 1 "$path" | grep -q "^# Managed by gpuhost"; then echo ours; else echo "foreign $path"; fi
    exit 0
  fi
  for dir in /run/systemd/system /usr/local/lib/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
    if [ -e "$dir/$unit" ] || [ -L "$dir/$unit" ]; then echo "foreign $dir/$unit"; exit 0; fi
  done
  echo free' sh "$unit" "$path"
