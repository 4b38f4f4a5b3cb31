set -euo pipefail
# Read-only: the host's NVIDIA kernel driver as loaded and as installed, one tab-separated record per line (parsed by
# transport/driverfacts.py; docs/driver-plan.md). Changes nothing: loads, unloads, stops and writes nothing. What the
# host does not show is said (`?`), never guessed:
#   loaded       VERSION          /sys/module/nvidia/version (none: not loaded)
#   flavour      LINE             the first line of /proc/driver/nvidia/version ("... Open Kernel Module ...")
#   running      KERNEL           uname -r
#   refcnt       MODULE N         each of the nvidia modules with a /sys/module/MODULE: its refcnt, `?` unreadable
#   holder       MODULE HOLDER    each entry of /sys/module/MODULE/holders/ (a module using it: nvidia_uvm of nvidia)
#   process      PID COMM CGROUP DEVICES   each process with /dev/nvidia* open (DEVICES: nvidia0,nvidiactl,... sorted);
#                                 CGROUP its unified-hierarchy path (`/lxc/<vmid>/ns/...`: container <vmid>'s), `?`
#                                 unreadable. Not this script, nor its children.
#   unreadable   N                the processes whose fd directory could not be read (always printed: no such record,
#                                 an older script; `?` the scan could not run - no GNU find - and found nothing)
#   persistenced STATE            systemctl is-active nvidia-persistenced (active, inactive, failed, ...); `absent` no
#                                 such unit; `?` no systemd to ask
#   dkms         LINE             each line of `dkms status -m nvidia` as it is; `none` no nvidia there; `absent` no
#                                 dkms; `?` dkms failed
#   kernel       KERNEL VERSION   each kernel of /lib/modules and the nvidia module installed for it (modinfo -k): `-` none
#                                 (a boot into it has no GPU driver), `?` modinfo missing
#   headers      KERNEL yes|no    that kernel's headers (/lib/modules/KERNEL/build resolves to a directory)
#   modules      absent           no /lib/modules at all
#   upgrade      STEP FROM TO     the program's driver upgrade as its job recorded it (/var/lib/gpuhost/driver/state:
#                                 its step - drain ... check, done, restored - and the versions); none recorded: no line
# With the argument `processes`, only the process and unreadable records (ct_gpu_holders.sh runs it so in a container).
tab=$'\t'
# A pipe's last part in this shell (what it reads stays here), and no here-string: bash before 5.1 writes those to a
# temporary file.
shopt -s lastpipe
oneline() { tr '\t\n\r' '   ' | sed 's/ *$//'; }

# The processes with a /dev/nvidia* node open: one find over every process's fd directory (a fork per process or per
# fd, as readlink would need, is seconds on a busy host; lsof and fuser may be absent). A process may end mid-scan:
# its directory's error is dropped, and a holder whose /proc entry is gone by the time it is read is dropped too (it
# no longer holds anything) - which also drops find itself. A directory that cannot be read is counted, not hidden.
# No scan at all (a find without GNU's predicates: busybox's) is `unreadable ?`, never "nothing holds the GPUs".
gpu_processes() {
  local line dir target pid dev unreadable=0 comm cgroup stat ppid cg ended=
  local -A devs=()
  if ! find /proc/self/fd -maxdepth 0 -readable -lname x -printf '' </dev/null >/dev/null 2>&1; then
    echo "unreadable${tab}?"
    return 0
  fi
  # `E` last: the loop ran to its end in this shell (lastpipe), so devs holds what it read.
  { find /proc/[0-9]*/fd -maxdepth 1 \( -path '/proc/*/fd' ! -readable -printf 'U\n' \) \
      -o \( -lname '/dev/nvidia*' -printf 'F\t%h\t%l\n' \) </dev/null 2>/dev/null || true; echo E; } |
  while IFS= read -r line; do
    case $line in
      U) unreadable=$((unreadable + 1)); continue ;;
      E) ended=1; continue ;;
      F"$tab"*) ;;
      *) continue ;;
    esac
    line=${line#F$tab}
    dir=${line%%$tab*}
    target=${line#*$tab}
    pid=${dir#/proc/}
    pid=${pid%/fd}
    case $pid in ''|*[!0-9]*) continue ;; esac
    dev=${target#/dev/}
    dev=${dev% (deleted)}
    dev=${dev//,/_}
    case ",${devs[$pid]:-}," in *",$dev,"*) ;; *) devs[$pid]=${devs[$pid]:+${devs[$pid]},}$dev ;; esac
  done
  if [ -z "$ended" ]; then
    echo "unreadable${tab}?"
    return 0
  fi
  for pid in $(printf '%s\n' "${!devs[@]}" | LC_ALL=C sort -n); do
    [ "$pid" != "$$" ] && [ "$pid" != "$BASHPID" ] || continue
    # The parent, from stat after the comm's closing parenthesis (a comm may hold spaces and parentheses).
    { read -r stat < "/proc/$pid/stat"; } 2>/dev/null || continue
    ppid=${stat##*) }
    ppid=${ppid#* }
    ppid=${ppid%% *}
    [ "$ppid" != "$$" ] || continue
    { IFS= read -r comm < "/proc/$pid/comm"; } 2>/dev/null || continue
    comm=$(printf '%s' "$comm" | oneline)
    cgroup='?'
    if [ -r "/proc/$pid/cgroup" ]; then
      while IFS= read -r cg; do
        case $cg in
          0::*) cgroup=${cg#0::}; break ;;
          *:name=systemd:*) cgroup=${cg#*:name=systemd:} ;;   # a cgroup v1 host: the systemd hierarchy's path
        esac
      done 2>/dev/null < "/proc/$pid/cgroup" || true
    fi
    cgroup=$(printf '%s' "$cgroup" | oneline)
    dev=$(printf '%s' "${devs[$pid]}" | tr "," "\n" | LC_ALL=C sort | paste -sd, | oneline)
    echo "process${tab}${pid}${tab}${comm}${tab}${cgroup:-?}${tab}${dev}"
  done
  echo "unreadable${tab}${unreadable}"
}

if [ "${1:-}" = processes ]; then
  gpu_processes
  exit 0
fi

if [ -r /sys/module/nvidia/version ]; then echo "loaded${tab}$(head -n 1 /sys/module/nvidia/version | oneline)"; fi
if [ -r /proc/driver/nvidia/version ]; then echo "flavour${tab}$(head -n 1 /proc/driver/nvidia/version | oneline)"; fi
echo "running${tab}$(uname -r | oneline)"

for module in nvidia nvidia_uvm nvidia_modeset nvidia_drm nvidia_peermem; do
  [ -d "/sys/module/$module" ] || continue
  n=
  if [ -r "/sys/module/$module/refcnt" ]; then
    n=$(head -n 1 "/sys/module/$module/refcnt" 2>/dev/null | oneline) || n=
  fi
  case $n in ''|*[!0-9]*) n='?' ;; esac
  echo "refcnt${tab}${module}${tab}${n}"
  for holder in "/sys/module/$module/holders/"*; do
    [ -e "$holder" ] || [ -L "$holder" ] || continue
    echo "holder${tab}${module}${tab}$(printf '%s' "${holder##*/}" | oneline)"
  done
done

gpu_processes

if ! command -v systemctl >/dev/null; then
  echo "persistenced${tab}?"
else
  load=$(systemctl show -p LoadState --value nvidia-persistenced.service 2>/dev/null </dev/null | oneline) || load=
  if [ -z "$load" ]; then
    echo "persistenced${tab}?"          # no systemd answered (a container without it as init)
  elif [ "$load" = not-found ]; then
    echo "persistenced${tab}absent"
  else
    # is-active exits non-zero for every state but active: its word is the answer.
    state=$(systemctl is-active nvidia-persistenced.service 2>/dev/null </dev/null | oneline) || true
    echo "persistenced${tab}${state:-?}"
  fi
fi

if ! command -v dkms >/dev/null; then
  echo "dkms${tab}absent"
elif status=$(dkms status -m nvidia 2>/dev/null </dev/null); then
  n=0
  printf '%s\n' "$status" | while IFS= read -r line; do
    line=$(printf '%s' "$line" | oneline)
    [ -n "$line" ] || continue
    echo "dkms${tab}${line}"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || echo "dkms${tab}none"
else
  echo "dkms${tab}?"
fi

upgrade_state=/var/lib/gpuhost/driver/state
if [ -r "$upgrade_state" ]; then
  step=$(sed -n 's/^step //p' "$upgrade_state" | tail -n 1 | oneline)
  from=$(sed -n 's/^from //p' "$upgrade_state" | tail -n 1 | oneline)
  to=$(sed -n 's/^to //p' "$upgrade_state" | tail -n 1 | oneline)
  if [ -n "$step" ]; then echo "upgrade${tab}${step}${tab}${from:--}${tab}${to:--}"; fi
fi

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
  name=$(printf '%s' "$kernel" | oneline)
  echo "kernel${tab}${name}${tab}${version:--}"
  if [ -d "${tree}build/" ]; then headers=yes; else headers=no; fi
  echo "headers${tab}${name}${tab}${headers}"
done
