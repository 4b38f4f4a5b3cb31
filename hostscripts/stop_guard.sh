set -euo pipefail
# stop_guard.sh PID WAIT   (transport/remote.py, when it stops waiting for a command: its time limit)
# Asks the command's guard (guard.sh, which printed PID) to end the command's process group and waits up to WAIT
# seconds for the guard to be gone: the group's TERM, the script's own cleanup and the KILL of what is left are the
# guard's. Prints `stopped` (or `ended`: nothing of it ran any more) once nothing of the command runs; exits 1 with
# what still runs otherwise.
pid=$1 wait=$2
guard() {
  local state
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ] &&
    tr '\0' '\n' 2>/dev/null < "/proc/$pid/cmdline" | grep -q '^# guard\.sh '
}
guard || { echo ended; exit 0; }
kill -TERM "$pid" 2>/dev/null || true
for ((i = 0; i < wait * 10; i++)); do
  guard || { echo stopped; exit 0; }
  sleep 0.1
done
echo "gpuhost: the command (guard $pid on $(hostname)) still runs $wait s after it was told to stop:" \
  "$(ps -o pid=,args= --ppid "$pid" 2>/dev/null | head -3 | tr '\n' ';')" >&2
exit 1
