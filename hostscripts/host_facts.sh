set -euo pipefail
# Read-only: the host facts the program decides from, one tab-separated record per line
# (parsed by components/remote.py:parse_facts). Changes nothing.
tab=$'\t'
oneline() { tr '\t\n\r' '   ' | sed 's/ *$//'; }
# The first line of a file into the variable named $1 without a process (a run reads sysfs a few hundred times;
# `$(cat ...)` made that a few hundred processes): rd VAR FILE [DEFAULT]. A file that cannot be opened gives DEFAULT,
# or without one fails (as `VAR=$(cat FILE)` failed the script); an empty file gives ''. link VAR PATH: the last
# component of a symlink's target, '' if it is gone (`basename "$(readlink PATH)"` in one process).
rd() {
  local -n _rd=$1
  _rd=
  if { IFS= read -r _rd || :; } 2>/dev/null < "$2"; then return 0; fi
  if [ $# -ge 3 ]; then _rd=$3; return 0; fi
  echo "host_facts.sh: cannot read $2" >&2
  return 1
}
link() { local -n _ln=$1; _ln=$(readlink "$2") || _ln=; _ln=${_ln##*/}; }
# The boot method: proxmox-boot-tool's answer is read whole first (a `| grep -q` under pipefail can
# kill the writer with SIGPIPE on a long answer and misreport the boot method).
pbt=
if [ -f /etc/kernel/proxmox-boot-uuids ] && [ -f /etc/kernel/cmdline ] && command -v proxmox-boot-tool >/dev/null; then
  pbt=$(proxmox-boot-tool status 2>/dev/null || true)
fi
case "$pbt" in
  *'configured with: uefi'*)
    echo "boot${tab}systemd-boot"
    echo "configured${tab}$(head -n1 /etc/kernel/cmdline | oneline)"
    ;;
  *)
    echo "boot${tab}grub"
    # What update-grub itself does: source /etc/default/grub, then /etc/default/grub.d/*.cfg, in a
    # clean shell. The kernel gets GRUB_CMDLINE_LINUX followed by GRUB_CMDLINE_LINUX_DEFAULT.
    grubvars() {
      env -i /bin/bash -c 'for f in "$@"; do [ -f "$f" ] && . "$f"; done >/dev/null 2>&1 </dev/null
        printf "%s\n%s\n" "${GRUB_CMDLINE_LINUX-}" "${GRUB_CMDLINE_LINUX_DEFAULT-}"' grubvars "$@" || true
    }
    own=$(grubvars /etc/default/grub)
    all=$(grubvars /etc/default/grub /etc/default/grub.d/*.cfg)
    echo "grub_linux${tab}$(printf '%s\n' "$own" | sed -n 1p | oneline)"
    echo "grub_default${tab}$(printf '%s\n' "$own" | sed -n 2p | oneline)"
    echo "configured${tab}$(printf '%s\n' "$all" | sed -n 1,2p | oneline)"
    ;;
esac
echo "running${tab}$(oneline < /proc/cmdline)"
rd bootid /proc/sys/kernel/random/boot_id ''
echo "boot_id${tab}${bootid}"
# The nvidia kernel module the host runs: what the containers' NVIDIA user space must equal.
if [ -r /sys/module/nvidia/version ]; then echo "nvidia_module${tab}$(head -n 1 /sys/module/nvidia/version | oneline)"; fi
for dev in /sys/bus/pci/devices/*; do
  rd vendor "$dev/vendor" -
  [ "$vendor" = 0x10de ] || continue
  rd class "$dev/class" 0x03
  case "$class" in 0x03*) ;; *) continue ;; esac
  bdf=${dev##*/}
  driver=-; if [ -L "$dev/driver" ]; then link driver "$dev/driver"; fi
  rd override "$dev/driver_override" '(null)'
  group=-; gtype=-
  if [ -L "$dev/iommu_group" ]; then
    link group "$dev/iommu_group"
    rd gtype "/sys/kernel/iommu_groups/$group/type" -
  fi
  rd device "$dev/device"; rd numa "$dev/numa_node" ''
  echo "gpu${tab}${bdf}${tab}${vendor#0x}:${device#0x}${tab}${numa}${tab}${driver}${tab}${override}${tab}${group}${tab}${gtype}"
  info=/proc/driver/nvidia/gpus/$bdf/information
  if [ -f "$info" ]; then
    minor=
    { while IFS=: read -r key value; do
        if [[ $key == 'Device Minor'* ]]; then minor=${value//[[:blank:]]/}; fi
      done < "$info"; } 2>/dev/null || :
    echo "minor${tab}${bdf}${tab}${minor}"
  fi
done
if [ -f /proc/driver/nvidia/params ]; then
  while IFS=: read -r key value; do
    echo "param${tab}${key}${tab}${value# }"
  done < /proc/driver/nvidia/params
fi
if command -v driverctl >/dev/null; then
  overrides=$(driverctl list-overrides 2>/dev/null || true)
  printf '%s\n' "$overrides" | while read -r bdf drv; do
    if [ -n "$bdf" ]; then echo "override${tab}${bdf}${tab}${drv}"; fi
  done
fi
# What the program needs and cannot install: driverctl (binds the VM's GPUs by address), an IOMMU (no groups:
# off in the firmware or on the command line), SEV/SEV-SNP as kvm_amd reports them (firmware and kernel).
if command -v driverctl >/dev/null; then echo "driverctl${tab}$(command -v driverctl)"; fi
groups=0
for g in /sys/kernel/iommu_groups/*; do if [ -e "$g" ]; then groups=$((groups + 1)); fi; done
echo "iommu_groups${tab}${groups}"
for p in sev sev_snp; do
  if [ -r "/sys/module/kvm_amd/parameters/$p" ]; then
    echo "kvm_amd${tab}${p}${tab}$(head -n 1 "/sys/module/kvm_amd/parameters/$p" | oneline)"
  fi
done
# modprobe's configuration from every directory it reads, except this program's own files: lines about
# the GPU modules (vfio-pci ids=, blacklists, install overrides, nvidia options) that decide the next boot.
for f in /etc/modprobe.d/*.conf /run/modprobe.d/*.conf /usr/local/lib/modprobe.d/*.conf /lib/modprobe.d/*.conf \
         /usr/lib/modprobe.d/*.conf; do
  [ -f "$f" ] || continue
  rd first "$f" ''
  if [[ $first == '# Managed by gpuhost'* ]]; then continue; fi
  { grep -nE '^[[:space:]]*(options|blacklist|install)[[:space:]]+(nvidia|vfio|pci[-_]stub)' "$f" || true; } |
    while IFS= read -r line; do echo "modprobe${tab}${f}${tab}$(printf '%s' "$line" | oneline)"; done
done
# Arguments: absolute paths of files (their hash, and whether a follow-up step is pending), device nodes
# (/dev/...: whether each is a character device) and PCI addresses (whatever device sits there, GPU or not: what a PCI resource mapping is checked against).
pci_re='^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$'
for f in "$@"; do
  if [[ $f =~ $pci_re ]]; then
    dev=/sys/bus/pci/devices/$f
    if [ ! -e "$dev/vendor" ]; then echo "pci${tab}${f}${tab}-"; continue; fi
    rd vendor "$dev/vendor"; rd device "$dev/device"
    sub=-
    if [ -f "$dev/subsystem_vendor" ] && [ -f "$dev/subsystem_device" ]; then
      rd sv "$dev/subsystem_vendor"; rd sd "$dev/subsystem_device"; sub=${sv#0x}:${sd#0x}
    fi
    driver=-; if [ -L "$dev/driver" ]; then link driver "$dev/driver"; fi
    group=-; if [ -L "$dev/iommu_group" ]; then link group "$dev/iommu_group"; fi
    rd class "$dev/class" -; rd numa "$dev/numa_node" -1
    echo "pci${tab}${f}${tab}${vendor#0x}:${device#0x}${tab}${sub}${tab}${class}${tab}${numa}${tab}${driver}${tab}${group}"
    continue
  fi
  case "$f" in
    /dev/*) if [ -c "$f" ]; then echo "devnode${tab}${f}${tab}c"; else echo "devnode${tab}${f}${tab}-"; fi; continue ;;
  esac
  if [ -f "$f" ]; then echo "file${tab}${f}${tab}$(sha256sum "$f" | cut -d' ' -f1)"; else echo "file${tab}${f}${tab}-"; fi
  # put_file.sh's marker: written, but its follow-up step (boot refresh, initramfs) never finished.
  marker="$(dirname "$f")/.gpuhost-pending.$(basename "$f")"
  if [ -f "$marker" ]; then echo "pending${tab}${f}${tab}$(head -n1 "$marker")"; fi
done
