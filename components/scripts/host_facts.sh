set -euo pipefail
# Read-only: the host facts the program decides from, one tab-separated record per line
# (parsed by components/remote.py:parse_facts). Changes nothing.
tab=$'\t'
if [ -f /etc/kernel/proxmox-boot-uuids ] && [ -f /etc/kernel/cmdline ] &&
   proxmox-boot-tool status 2>/dev/null | grep -q 'configured with: uefi'; then
  echo "boot${tab}systemd-boot"
  echo "configured${tab}$(head -n1 /etc/kernel/cmdline)"
else
  echo "boot${tab}grub"
  line=$(grep -E '^GRUB_CMDLINE_LINUX_DEFAULT=' /etc/default/grub | tail -n1 || true)
  echo "configured${tab}${line#GRUB_CMDLINE_LINUX_DEFAULT=}"
fi
echo "running${tab}$(cat /proc/cmdline)"
for dev in /sys/bus/pci/devices/*; do
  [ "$(cat "$dev/vendor")" = 0x10de ] || continue
  case "$(cat "$dev/class" 2>/dev/null || echo 0x03)" in 0x03*) ;; *) continue ;; esac
  bdf=${dev##*/}
  driver=-; [ -L "$dev/driver" ] && driver=$(basename "$(readlink "$dev/driver")")
  override=$(cat "$dev/driver_override" 2>/dev/null || echo '(null)')
  group=-; gtype=-
  if [ -L "$dev/iommu_group" ]; then
    group=$(basename "$(readlink "$dev/iommu_group")")
    gtype=$(cat "/sys/kernel/iommu_groups/$group/type" 2>/dev/null || echo -)
  fi
  vendor=$(cat "$dev/vendor"); device=$(cat "$dev/device")
  echo "gpu${tab}${bdf}${tab}${vendor#0x}:${device#0x}${tab}$(cat "$dev/numa_node")${tab}${driver}${tab}${override}${tab}${group}${tab}${gtype}"
  info=/proc/driver/nvidia/gpus/$bdf/information
  if [ -f "$info" ]; then
    echo "minor${tab}${bdf}${tab}$(awk -F: '/^Device Minor/ {gsub(/[ \t]/, "", $2); print $2}' "$info")"
  fi
done
if [ -f /proc/driver/nvidia/params ]; then
  while IFS=: read -r key value; do
    echo "param${tab}${key}${tab}${value# }"
  done < /proc/driver/nvidia/params
fi
if command -v driverctl >/dev/null; then
  driverctl list-overrides 2>/dev/null | while read -r bdf drv; do echo "override${tab}${bdf}${tab}${drv}"; done
fi
for f in "$@"; do
  if [ -f "$f" ]; then echo "file${tab}${f}${tab}$(sha256sum "$f" | cut -d' ' -f1)"; else echo "file${tab}${f}${tab}-"; fi
done
