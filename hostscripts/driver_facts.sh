set -euo pipefail
# Read-only: the host's NVIDIA kernel driver as loaded and as installed, one tab-separated record per line (parsed by
# transport/driverfacts.py; docs/driver-plan.md). Changes nothing. What the host does not show is said (`?`), never
# guessed:
#   loaded   VERSION          /sys/module/nvidia/version (none: not loaded)
#   flavour  LINE             the first line of /proc/driver/nvidia/version ("... Open Kernel Module ...")
#   running  KERNEL           uname -r
#   kernel   KERNEL VERSION   each kernel of /lib/modules and the nvidia module installed for it (modinfo -k): `-` none
#                             (a boot into it has no GPU driver), `?` modinfo missing
#   modules  absent           no /lib/modules at all
tab=$'\t'
oneline() { tr '\t\n\r' '   ' | sed 's/ *$//'; }
if [ -r /sys/module/nvidia/version ]; then echo "loaded${tab}$(head -n 1 /sys/module/nvidia/version | oneline)"; fi
if [ -r /proc/driver/nvidia/version ]; then echo "flavour${tab}$(head -n 1 /proc/driver/nvidia/version | oneline)"; fi
echo "running${tab}$(uname -r | oneline)"
if [ ! -d /lib/modules ]; then
  echo "modules${tab}absent"
  exit 0
fi
for tree in /lib/modules/*/; do
  [ -d "$tree" ] || continue
  kernel=${tree%/}
  kernel=${kernel##*/}
  if ! command -v modinfo >/dev/null; then
    version='?'
  else
    version=$(modinfo -k "$kernel" -F version nvidia 2>/dev/null | head -n 1 | oneline) || version=
  fi
  echo "kernel${tab}$(printf '%s' "$kernel" | oneline)${tab}${version:--}"
done
