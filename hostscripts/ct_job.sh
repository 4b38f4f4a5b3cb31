set -euo pipefail
# ct_job.sh VMID JOB_SH ACTION NAME ...: job.sh (its text, JOB_SH) run inside container VMID with the container's
# own systemd, stdin passed on (components/jobs.py). A job in the container outlives this command like one on
# the host: `pct exec` only starts, polls or stops it.
vmid=$1 jobsh=$2
shift 2
exec pct exec "$vmid" -- bash -c "$jobsh" job.sh "$@"
