set -euo pipefail
# ct_runtime_check.sh VMID CUDA_HOME: what the installed runtime says about itself, read-only: nvidia-smi's
# driver version (it fails with NVML's "Driver/library version mismatch" when the container's user space is
# not the host module's) and nvcc's release line. One line each: name<TAB>exit status<TAB>first line.
vmid=$1 cuda=$2
pct exec "$vmid" -- sh -c '
  out=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1); rc=$?
  printf "nvidia_smi\t%s\t%s\n" "$rc" "$(printf "%s\n" "$out" | head -n 1)"
  out=$("$1/bin/nvcc" --version 2>&1); rc=$?
  printf "nvcc\t%s\t%s\n" "$rc" "$(printf "%s\n" "$out" | grep -m 1 -i release || printf "%s\n" "$out" | head -n 1)"
' sh "$cuda"
