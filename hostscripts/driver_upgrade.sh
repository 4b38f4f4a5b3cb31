set -euo pipefail
# driver_upgrade.sh NEW INSTALLER SHA256 VMID UNIT CT_GPUS VM_GPUS [HOW]: the host's NVIDIA kernel driver to version NEW, as a
# durable job on the host (resources/driver.py; docs/driver-plan.md step 3). A job, never a plain command: a command is
# ended on the host at its time limit (hostscripts/guard.sh), and an install cut in half leaves a host with no driver.
# driver_upgrade.sh build VERSION KERNEL...: the loaded VERSION built with DKMS for each KERNEL that lacks it (a kernel
# update installed without the module), as the same job: nothing stopped, nothing unloaded, the loaded module untouched.
#
#   NEW        the version (580.105.08)          INSTALLER  its .run on the host, checked against SHA256
#   VMID UNIT  the container and its SGLang unit, stopped for the reload (`-`: none)
#   CT_GPUS    the container's GPUs (comma list): on nvidia and in nvidia-smi at NEW before anything serves
#   VM_GPUS    the VM's GPUs (comma list, or `-`): on vfio-pci, never touched - their bindings compared before and after
#   HOW        reload (the default: unload in place) or reboot (the modules are held by what only a reboot ends: after
#              the drain they are held back at the next boot by /etc/modprobe.d/gpuhost-driver-hold.conf - blacklisted,
#              and their loads by name refused -,
#              the job ends with `reboot FROM NEW`; the caller reboots the host and starts the job again, which finds
#              the new boot with nothing loaded and goes on to the install). A started upgrade keeps its HOW.
#
# Steps, each recorded in /var/lib/gpuhost/driver/state before it starts (a job started again after the host or the
# job died goes on from the step it was in - never a second install over a half one: an install found cut short is
# uninstalled first): drain (SGLang stopped), persistenced (stopped), unload (rmmod, nvidia last), install (the .run
# with DKMS for the running kernel, then `dkms install` for every other installed kernel), load (modprobe), check (the
# version, each container GPU on nvidia and in nvidia-smi, the kernel log since the load free of NVRM's GPU
# initialisation failures, the IOMMU still translating), done. A check that fails puts the previous version back
# (its installer, kept on the host) and starts what was stopped; a module still in use is loaded again as it was.
# A build records nothing: `dkms install` of a version already installed for a kernel does it again, harmlessly.
#
# stdout's last line is the outcome: `upgraded FROM NEW`, `reboot FROM NEW` (the host must reboot now, then the job is
# started again), `restored FROM NEW` (exit 5), `in use` (exit 4), `built VERSION KERNEL...`. Progress and the reasons
# are stderr lines `gpuhost: ...` (the job's log). Exit 3: refused before anything changed.
say() { echo "gpuhost: $*" >&2; }
kernels() { for t in /lib/modules/*/; do [ -d "$t" ] && { t=${t%/}; echo "${t##*/}"; }; done; }
headers() {   # KERNEL...: refused (exit 3) at the first without headers, before anything changes
  local k
  for k in "$@"; do
    if [ ! -d "/lib/modules/$k/build/" ]; then
      say "kernel $k has no headers (/lib/modules/$k/build), so DKMS cannot build the module for it: apt install proxmox-headers-$k (or remove the kernel) and re-run; nothing was changed"
      exit 3
    fi
  done
}
no_dkms() {   # VERSION: why DKMS cannot build VERSION, in $why and what to do first in $fix (why empty: it can)
  why= fix=
  if ! command -v dkms >/dev/null; then
    why="dkms is not installed on the host" fix="install dkms (apt install dkms), then "
  elif [ -z "$(dkms status -m nvidia -v "$1" 2>/dev/null)" ]; then
    why="\`dkms status -m nvidia\` has no nvidia/$1 - the running driver was not installed with DKMS"
  fi
}

if [ "${1:-}" = build ]; then
  version=${2:?usage: driver_upgrade.sh build VERSION KERNEL...}
  shift 2
  [ "$#" -gt 0 ] || { say "no kernel to build $version for"; exit 2; }
  no_dkms "$version"
  if [ -n "$why" ]; then
    say "$why, so $version cannot be built for kernel${2:+s} $*: ${fix}re-install $version with the installer's --dkms (docs/operator-guide.md: the host's NVIDIA driver), or remove the kernel; nothing was changed"
    exit 3
  fi
  headers "$@"
  for k in "$@"; do
    say "building $version for kernel $k with DKMS"
    dkms install "nvidia/$version" -k "$k" >&2
  done
  echo "built $version $*"
  exit 0
fi

new=$1 installer=$2 sha=$3 vmid=$4 unit=$5 ct_gpus=$6 vm_gpus=$7 how=${8:-reload}
case $how in reload|reboot) ;; *) echo "gpuhost: HOW is reload or reboot, not $how" >&2; exit 2 ;; esac
dir=/var/lib/gpuhost/driver
# The modules held back at the boot a reboot upgrade asks for: its own file (no other file of /etc/modprobe.d is
# touched), gone once NEW loads or the previous version is back.
HOLD=/etc/modprobe.d/gpuhost-driver-hold.conf
state=$dir/state
mkdir -p "$dir"
chmod 0700 "$dir"
get() { if [ -f "$state" ]; then sed -n "s/^$1 //p" "$state" | tail -n 1; fi; }
put() {
  { grep -v "^$1 " "$state" 2>/dev/null || true; echo "$1 $2"; } > "$state.tmp"
  mv -f "$state.tmp" "$state"
}
loaded() { head -n 1 /sys/module/nvidia/version 2>/dev/null || echo -; }
bindings() {   # the VM's GPUs' drivers and the driverctl overrides: what must be the same after
  local b
  [ "$vm_gpus" = - ] && return 0
  for b in ${vm_gpus//,/ }; do echo "$b $(readlink "/sys/bus/pci/devices/$b/driver" 2>/dev/null || echo none)"; done
  driverctl list-overrides 2>/dev/null || true
}
boot_id() { cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -; }
hold() {   # the modules not loaded at the next boot: neither by udev (blacklist) nor by name (nvidia-modprobe, a unit)
  local m
  {
    echo "# gpuhost: the NVIDIA driver upgrade $(get from) -> $new holds the nvidia modules back at the next boot, so that"
    echo "# it can install $new with nothing loaded (resources/driver.py); removed by it once $new loads or $(get from) is back."
    for m in nvidia nvidia_uvm nvidia_modeset nvidia_drm nvidia_peermem; do
      echo "blacklist $m"
      echo "install $m /bin/false"
    done
  } > "$HOLD.tmp"
  mv -f "$HOLD.tmp" "$HOLD"
  # Where the modules load from the initramfs, its copy of /etc/modprobe.d is what the boot reads.
  update-initramfs -u -k all >&2
  put held yes
}
unhold() {   # the hold gone, from the initramfs too (a boot with it would come up without a GPU driver)
  if [ -f "$HOLD" ] || [ "$(get held)" = yes ]; then
    rm -f "$HOLD"
    update-initramfs -u -k all >&2 || say "update-initramfs failed: the initramfs may still hold the nvidia modules back; run update-initramfs -u -k all"
    put held no
  fi
}
ct_running() { [ "$vmid" != - ] && pct status "$vmid" 2>/dev/null | grep -q 'status: running'; }
unload() {
  local m
  for m in nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia; do
    if [ -d "/sys/module/$m" ]; then rmmod "$m" || return 1; fi
  done
}
load() { modprobe nvidia && modprobe nvidia_uvm && modprobe nvidia_modeset; }
installed_run() {   # INSTALLER: the .run with DKMS for the running kernel, then DKMS for every other installed kernel
  local k version
  version=$(basename "$1" | sed -E 's/^NVIDIA-Linux-[a-z0-9_]+-([0-9][0-9.]*[0-9])(-no-compat32)?\.run$/\1/')
  sh "$1" --silent --dkms --kernel-module-type=open --skip-module-load
  for k in $(kernels); do
    [ "$k" = "$(uname -r)" ] && continue
    dkms install "nvidia/$version" -k "$k"
  done
}
resume() {   # start what the drain stopped
  if [ "$(get persistenced)" = active ]; then systemctl start nvidia-persistenced || say "nvidia-persistenced did not start again"; fi
  if [ "$(get sglang)" = active ] && ct_running; then
    pct exec "$vmid" -- systemctl start "$unit" || say "$unit did not start again in container $vmid"
  fi
}
cursor() { journalctl --dmesg --output=json --no-pager | tail -n 1 | python3 -c 'import json, sys
t = sys.stdin.read().strip()
print(json.loads(t).get("__CURSOR", "") if t else "")'; }
# NVRM's GPU initialisation failures, by their format (shared/notes: the FSP boot-complete poll, the GSP firmware,
# RmInitAdapter, and the Xids of a GPU that did not come up or fell off the bus) - never one code.
FAILURES='NVRM: .*(RmInitAdapter failed|while polling for FSP boot complete|Cannot initialize GSP firmware|GPU has fallen off the bus)|NVRM: Xid \(PCI:[^)]*\): (79|119|120|143)[,:]'
since() {   # the kernel's messages after cursor $1
  journalctl --dmesg --output=json --no-pager ${1:+--after-cursor="$1"} | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line).get("MESSAGE", "")
    print(m if isinstance(m, str) else bytes(m).decode("utf-8", "replace"))'
}
check() {   # what must hold before anything serves on NEW; prints the first reason it does not, exit 1
  local b got smi t
  got=$(loaded)
  [ "$got" = "$new" ] || { echo "the loaded module is $got, not $new"; return 1; }
  bad=$(since "$(get cursor)" | grep -E "$FAILURES" | head -n 4 | tr '\n' '|' | sed 's/|$//; s/|/ | /g') || true
  [ -z "$bad" ] || { echo "the kernel log since the load: $bad"; return 1; }
  for b in ${ct_gpus//,/ }; do
    got=$(readlink "/sys/bus/pci/devices/$b/driver" 2>/dev/null || echo none)
    [ "${got##*/}" = nvidia ] || { echo "container GPU $b is bound to ${got##*/}, not nvidia"; return 1; }
    t=$(cat "/sys/bus/pci/devices/$b/iommu_group/type" 2>/dev/null || echo '?')
    case $t in DMA|DMA-FQ) ;; *) echo "container GPU $b's IOMMU group is $t, not translated (DMA/DMA-FQ)"; return 1 ;; esac
  done
  smi=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1) || { echo "nvidia-smi: $(echo "$smi" | head -n 1)"; return 1; }
  n=$(echo "$smi" | grep -cx "$new" || true)
  want=$(echo "${ct_gpus//,/ }" | wc -w)
  [ "$n" -ge "$want" ] || { echo "nvidia-smi lists $n GPUs at $new, the container has $want: $(echo "$smi" | tr '\n' ' ')"; return 1; }
}

step=$(get step)
if [ "$(get to)" != "$new" ] || [ "$step" = done ] || [ "$step" = restored ] || [ -z "$step" ]; then
  if [ "$(loaded)" = "$new" ] && [ "$step" = done ]; then echo "upgraded $(get from) $new"; exit 0; fi
  # A fresh upgrade: refused here, before anything changes, for what would stop it half-way.
  got=$(sha256sum "$installer" 2>/dev/null | cut -d' ' -f1) || got=
  if [ "$got" != "$sha" ]; then
    say "$installer: ${got:+its sha256 is $got, declared $sha}${got:-not on the host}; nothing was changed"
    exit 3
  fi
  from=$(loaded)
  previous=-
  for p in "$(dirname "$installer")/NVIDIA-Linux-x86_64-$from.run" "/var/lib/gpuhost/installers/NVIDIA-Linux-x86_64-$from.run"; do
    if [ -f "$p" ]; then previous=$p; break; fi
  done
  if [ "$from" != - ] && [ "$previous" = - ]; then
    where=$(dirname "$installer")
    [ "$where" = /var/lib/gpuhost/installers ] || where="$where or /var/lib/gpuhost/installers"
    say "the installer of the running version $from (NVIDIA-Linux-x86_64-$from.run) is not in $where: it is what a failed upgrade goes back to. Put it there and re-run; nothing was changed"
    exit 3
  fi
  if ! command -v dkms >/dev/null; then
    say "dkms is not installed on the host, and the module is built with DKMS for every installed kernel (a kernel update rebuilds it): apt install dkms and re-run; nothing was changed"
    exit 3
  fi
  # shellcheck disable=SC2046
  headers $(kernels)
  rm -f "$state"
  put to "$new"; put from "$from"; put previous "$previous"; put vm "$(bindings | sha256sum | cut -d' ' -f1)"
  put how "$how"
  put step drain
  step=drain
fi
from=$(get from) previous=$(get previous) how=$(get how)
how=${how:-reload}

if [ "$step" = drain ]; then
  if ct_running && pct exec "$vmid" -- systemctl is-active --quiet "$unit"; then
    put sglang active
    say "stopping $unit in container $vmid"
    pct exec "$vmid" -- systemctl stop "$unit"
  fi
  if systemctl is-active --quiet nvidia-persistenced 2>/dev/null; then
    put persistenced active
    say "stopping nvidia-persistenced"
    systemctl stop nvidia-persistenced
  fi
  if [ "$how" = reboot ]; then put step hold; step=hold; else put step unload; step=unload; fi
fi

if [ "$step" = hold ]; then
  say "holding the nvidia modules back at the next boot ($HOLD)"
  hold
  put boot "$(boot_id)"
  put step reboot; step=reboot
fi

if [ "$step" = reboot ]; then
  if [ "$(boot_id)" = "$(get boot)" ]; then
    say "the host must reboot now: $from stays loaded until then"
    echo "reboot $from $new"
    exit 0
  fi
  if [ "$(loaded)" = - ]; then
    say "rebooted with the nvidia modules held back: nothing is loaded"
    put step install; step=install
  else
    say "rebooted, but $(loaded) is loaded despite $HOLD (in the initramfs?): unloading it in place"
    put step unload; step=unload
  fi
fi

if [ "$step" = unload ]; then
  say "unloading the nvidia modules ($from)"
  if ! err=$(unload 2>&1); then
    say "$err"
    unhold
    load >/dev/null 2>&1 || true
    resume
    rm -f "$state"
    say "the nvidia modules are in use, so $new was not installed; $from is loaded as it was and what was stopped runs again"
    echo "in use"
    exit 4
  fi
  put step install; step=install
fi

if [ "$step" = install ] || [ "$step" = installing ]; then
  if [ "$step" = installing ]; then
    # The last install was cut short (the host or the job died in it): what it left is removed first.
    say "an install of $new was cut short: removing what it left first"
    sh "$installer" --uninstall --silent || say "the uninstall of the cut-short install failed; installing over it"
  fi
  put step installing
  say "installing $new with DKMS for kernels $(kernels | tr '\n' ' ')"
  installed_run "$installer" >&2
  put step load; step=load
fi

if [ "$step" = load ]; then
  unhold
  put cursor "$(cursor)"
  say "loading $new"
  load >&2 || true     # a load that fails is what the check reads
  put step check; step=check
fi

if [ "$step" = check ]; then
  if why=$(check); then
    [ "$(bindings | sha256sum | cut -d' ' -f1)" = "$(get vm)" ] || say "WARNING: the VM's GPU bindings changed during the upgrade"
    if [ "$(get persistenced)" = active ]; then systemctl start nvidia-persistenced || say "nvidia-persistenced did not start again"; fi
    put step done
    say "$new is loaded and every container GPU is up on it"
    echo "upgraded $from $new"
    exit 0
  fi
  say "$new did not bring the GPUs up: $why"
  put failed "$why"
  put step restore; step=restore
fi

if [ "$step" = restore ]; then
  say "putting $from back ($previous)"
  unhold
  unload >&2 || true
  sh "$installer" --uninstall --silent >&2 || true
  installed_run "$previous" >&2
  load >&2 || say "$from did not load again either"
  resume
  say "$new did not bring the GPUs up: $(get failed). $from is back and loaded"
  put step restored
  echo "restored $from $new"
  exit 5
fi
say "unknown step $step in $state"
exit 2
