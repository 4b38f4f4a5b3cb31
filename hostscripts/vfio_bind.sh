set -euo pipefail
# vfio_bind.sh DRIVER BDF...: persistent driver override per PCI address (driverctl keeps it in
# /etc/driverctl.d with a udev rule) and a runtime rebind. Prints "changed BDF" per device set.
driver=$1; shift
for bdf in "$@"; do
  [ -e "/sys/bus/pci/devices/$bdf" ] || { echo "gpuhost: no PCI device $bdf on $(hostname)" >&2; exit 4; }
  current=$(driverctl list-overrides 2>/dev/null | awk -v b="$bdf" '$1 == b {print $2}')
  bound=-
  [ -L "/sys/bus/pci/devices/$bdf/driver" ] && bound=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/driver")")
  if [ "$current" = "$driver" ] && [ "$bound" = "$driver" ]; then
    continue
  fi
  driverctl set-override "$bdf" "$driver" >&2
  echo "changed $bdf"
done
