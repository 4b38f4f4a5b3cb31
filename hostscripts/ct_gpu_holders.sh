set -euo pipefail
# ct_gpu_holders.sh VMID   (on stdin: driver_facts.sh's text) Read-only: the processes inside container VMID with
# /dev/nvidia* open, as driver_facts.sh's own `process` and `unreadable` records - its scan, run in the container
# (`bash -s processes`): PIDs and cgroups as the container sees them. Prints "absent" when the container does not exist
# or is not running. Needed where the host's /proc does not show the container's processes (the lab's containers are
# machines of their own); on a Proxmox host it does, under the cgroup /lxc/VMID/ (transport/driverfacts.py says which
# view counts).
vmid=$1
if [ "$(pct status "$vmid" 2>/dev/null | awk '{print $2}')" != running ]; then
  echo absent
  exit 0
fi
pct exec "$vmid" -- bash -s processes
