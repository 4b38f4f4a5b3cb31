set -euo pipefail
# collector_enable.sh SERVICE TIMER RELOAD: after the collector's files were written. systemd re-reads
# the unit files (RELOAD yes: one of them changed), the timer is enabled and (re)started, and the service
# runs once now, as the timer runs it: a collector that cannot run on this host (no python3, a config it
# refuses, a directory it cannot write) fails this step with its own message, not silently later.
service=$1 timer=$2 reload=$3
if [ "$reload" = yes ]; then
  systemctl daemon-reload
fi
systemctl enable --quiet "$timer"
if [ "$reload" = yes ]; then
  systemctl restart "$timer"
else
  systemctl start "$timer"
fi
if ! systemctl start "$service"; then
  { journalctl --unit "$service" --lines 20 --no-pager --output cat 2>/dev/null || true; } >&2
  echo "gpuhost: $service failed on $(hostname); see journalctl -u $service" >&2
  exit 5
fi
