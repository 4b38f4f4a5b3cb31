set -euo pipefail
# collector_remove.sh SERVICE TIMER FILE... -- DIR...: destroy. The timer is disabled and stopped, the
# service stopped (systemd ends a run in flight), each FILE removed with the temporary files a run
# killed mid-write leaves beside it (.<name>.*.tmp), systemd told; each DIR removed if it is empty.
service=$1 timer=$2
shift 2
systemctl disable --now --quiet "$timer" 2>/dev/null || true
systemctl stop "$service" 2>/dev/null || true
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  [ ! -d "$1" ] || { echo "gpuhost: $1 is a directory on $(hostname), not removed" >&2; exit 2; }
  rm -f -- "$1" "$(dirname "$1")/.$(basename "$1")".*.tmp
  shift
done
[ $# -eq 0 ] || shift
systemctl daemon-reload
systemctl reset-failed "$service" 2>/dev/null || true
for d in "$@"; do
  rmdir --ignore-fail-on-non-empty -- "$d" 2>/dev/null || true
done
