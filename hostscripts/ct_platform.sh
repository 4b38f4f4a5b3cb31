set -euo pipefail
# ct_platform.sh VMID: the C library and the Python the container builds SGLang's environment with (its python3).
# Prints "absent" (no such container, or not running) or "glibc <version> python <major.minor>" (a value it could not
# read is left empty).
vmid=$1
if [ "$(pct status "$vmid" 2>/dev/null | awk '{print $2}')" != running ]; then
  echo absent
  exit 0
fi
pct exec "$vmid" -- sh -c '
  g=$(getconf GNU_LIBC_VERSION 2>/dev/null) || g=
  p=$(python3 -c "import sys; print(\"%d.%d\" % sys.version_info[:2])" 2>/dev/null) || p=
  echo "glibc ${g#glibc } python $p"'
