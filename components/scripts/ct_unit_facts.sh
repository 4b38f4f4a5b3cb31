set -euo pipefail
# ct_unit_facts.sh VMID UNIT PATH VENV: read-only facts of the service inside the container.
vmid=$1 unit=$2 path=$3 venv=$4
# absent: no such container (pct: "Configuration file ... does not exist"); stopped: there, not running.
if ! status=$(pct status "$vmid" 2>/dev/null); then
  echo "ct	absent"
  exit 0
fi
if [ "$(printf '%s\n' "$status" | awk '{print $2}')" != running ]; then
  echo "ct	stopped"
  exit 0
fi
echo "ct	running"
pct exec "$vmid" -- sh -c 'if [ -f "$1" ]; then echo "unit	$(sha256sum "$1" | cut -d" " -f1)"; else echo "unit	-"; fi' sh "$path"
# Drop-ins (systemctl edit) change the unit as systemd loads it, whatever the unit file says.
pct exec "$vmid" -- sh -c 'for f in /etc/systemd/system/"$1".d/*.conf /run/systemd/system/"$1".d/*.conf; do
  if [ -e "$f" ]; then printf "dropin\t%s\n" "$f"; fi; done' sh "$unit"
pct exec "$vmid" -- systemctl show "$unit" -p ActiveState -p InvocationID -p UnitFileState | sed 's/=/\t/'
pct exec "$vmid" -- sh -c 'if [ -x "$1/bin/python" ]; then echo "sglang	$("$1/bin/python" -c "import sglang; print(sglang.__version__)" 2>/dev/null || echo -)"; else echo "sglang	-"; fi' sh "$venv"
