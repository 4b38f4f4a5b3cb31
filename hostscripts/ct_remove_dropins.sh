set -euo pipefail
# ct_remove_dropins.sh VMID UNIT: move the unit's drop-ins (<unit>.d/*.conf in /etc and /run) out of the
# unit directories into /var/lib/gpuhost/removed-dropins/<time>/ (kept for the operator), one line each.
vmid=$1 unit=$2
pct exec "$vmid" -- sh -c 'set -eu
  keep=/var/lib/gpuhost/removed-dropins/$(date -u +%Y%m%dT%H%M%SZ)
  for f in /etc/systemd/system/"$1".d/*.conf /run/systemd/system/"$1".d/*.conf; do
    [ -e "$f" ] || continue
    dst=$keep$(dirname "$f")
    mkdir -p "$dst"
    mv -f "$f" "$dst/"
    printf "%s\t%s\n" "$f" "$dst/$(basename "$f")"
  done' sh "$unit"
