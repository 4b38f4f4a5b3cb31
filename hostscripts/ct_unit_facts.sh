set -euo pipefail
# ct_unit_facts.sh VMID UNIT PATH VENV [CUDA_HOME ENVS_DIR CHECKER]: read-only facts of the service and of what it
# stands on, tab-separated lines (components/runtime.py parse_facts). On the host: the loaded nvidia module's
# version; in the container, in one `pct exec` (each one is a process on the host, a container entered): the
# unit file (sha256 and text), its drop-ins, its state, the NVIDIA user space's library versions, CUDA's
# version.json, and either the SGLang of VENV (ENVS_DIR -: an operator-managed environment) or the
# environments in ENVS_DIR with their markers and where VENV links, and (CHECKER: ct_env_check.py's source) whether
# the environment the unit runs from still holds what was built.
vmid=$1 unit=$2 path=$3 venv=$4 cuda=${5:--} envs=${6:--} checker=${7:--}
# The host's boot: a GPU proof from another boot proved GPUs that have been reset since (components/sglang.py).
echo "boot_id	$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)"
# The version the container's libraries must equal: the module the host runs (not what it would load next).
if [ -r /sys/module/nvidia/version ]; then
  echo "host_driver	$(head -n 1 /sys/module/nvidia/version)"
elif [ -r /proc/driver/nvidia/version ]; then
  echo "host_driver	$(sed -n 's/^NVRM version:.*[[:space:]]\([0-9][0-9]*\.[0-9][0-9.]*\)[[:space:]].*/\1/p' /proc/driver/nvidia/version | head -n 1)"
else
  echo "host_driver	-"
fi
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
pct exec "$vmid" -- sh -c '
  unit=$1 path=$2 venv=$3 cuda=$4 envs=$5 checker=$6
  if [ -f "$path" ]; then
    echo "unit	$(sha256sum "$path" | cut -d" " -f1)"
    echo "unit_text	$(base64 -w 0 < "$path")"
  else
    echo "unit	-"
  fi
  # Drop-ins (systemctl edit) change the unit as systemd loads it, whatever the unit file says.
  for f in /etc/systemd/system/"$unit".d/*.conf /run/systemd/system/"$unit".d/*.conf; do
    if [ -e "$f" ]; then printf "dropin\t%s\n" "$f"; fi
  done
  systemctl show "$unit" -p ActiveState -p InvocationID -p UnitFileState | sed "s/=/\t/"
  # The NVIDIA user space: the versions in the libraries file names (libcuda.so.580.95.05), all of them.
  for lib in libcuda.so libnvidia-ml.so; do
    found=
    for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
      for f in "$d/$lib".*.*; do
        [ -e "$f" ] && found="$found ${f##*/$lib.}"
      done
    done
    printf "%s\t%s\n" "$lib" "$(echo $found)"
  done
  if [ "$cuda" != - ]; then
    if [ -f "$cuda/version.json" ]; then
      printf "cuda\t%s\n" "$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[\"cuda\"][\"version\"])" \
        "$cuda/version.json" 2>/dev/null || echo "?")"
    else
      echo "cuda	-"
    fi
    if [ -x "$cuda/bin/nvcc" ]; then echo "nvcc	yes"; else echo "nvcc	-"; fi
  fi
  if [ "$envs" = - ]; then
    if [ -x "$venv/bin/python" ]; then
      echo "sglang	$("$venv/bin/python" -c "import sglang; print(sglang.__version__)" 2>/dev/null || echo -)"
    else
      echo "sglang	-"
    fi
  else
    for d in "$envs"/* "$envs"/.building-*; do
      [ -d "$d" ] || continue
      if [ -f "$d/.gpuhost-env.json" ]; then
        printf "envdir\t%s\t%s\n" "${d##*/}" "$(tr -d "\n\t" < "$d/.gpuhost-env.json")"
      else
        printf "envdir\t%s\t-\n" "${d##*/}"
      fi
    done
    if [ -L "$venv" ]; then printf "venv_link\t%s\n" "$(readlink "$venv")"
    elif [ -e "$venv" ]; then echo "venv_link	(a directory)"
    else echo "venv_link	-"; fi
    # The environment the unit runs from (the python of its ExecStart), checked against what was built.
    running=$(sed -n "s|^ExecStart=\($envs/[0-9a-f]*\)/bin/python .*|\1|p" "$path" 2>/dev/null | head -n 1)
    if [ "$checker" != - ] && [ -n "$running" ] && [ -d "$running" ]; then
      printf "env_check\t%s\t%s\n" "${running##*/}" "$(python3 -c "$checker" "$running" 2>&1 | tail -n 1 | tr -d "\t")"
    fi
  fi
' sh "$unit" "$path" "$venv" "$cuda" "$envs" "$checker"
