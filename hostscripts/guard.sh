set -euo pipefail
# guard.sh LIMIT GRACE BODY ARG...   ($0: the script's name; transport/remote.py sends every script inside it)
# Runs `bash -c BODY NAME ARG...` - the script exactly as it would run alone, with this command's stdin and outputs -
# as the leader of a process group of its own, and ends that whole group (TERM, then KILL after GRACE seconds; the
# script's own cleanup - put_file.sh's rollback - runs in between) when:
# - the program stops waiting for it: at its time limit it sends this guard TERM (stop_guard.sh);
# - the SSH session it runs under is gone (its parent, the session's sshd, ended: the program's connection dropped,
#   its process was killed): a command sshd started outlives its session otherwise, and races the re-run;
# - LIMIT seconds have passed (the program's limit plus a margin: the end is on the host even when the program
#   cannot reach it to say so).
# Before anything else it prints `gpuhost-guard PID` as the first line of stderr: whom the program's stop signals.
# Exits with the script's status (143 once stopped). Long work is not a command but a durable job (job.sh), a
# systemd unit of its own, outside this group.
limit=$1 grace=$2 body=$3
shift 3
printf 'gpuhost-guard %d\n' "$$" >&2
parent=$PPID
watch=
# An explicit stdin: a background command's would be /dev/null.
setsid bash -c "$body" "$0" "$@" <&0 &
child=$!
stop() {
  trap '' TERM HUP INT
  kill -TERM -- -"$child" 2>/dev/null || true
  (sleep "$grace"; kill -KILL -- -"$child" 2>/dev/null) </dev/null >/dev/null 2>&1 &
  local killer=$! n=0
  # The script first (its cleanup), then whatever is left of its group.
  wait "$child" 2>/dev/null || true
  while kill -0 -- -"$child" 2>/dev/null && [ "$n" -lt $((grace * 10 + 20)) ]; do
    sleep 0.1
    n=$((n + 1))
  done
  kill -KILL -- -"$child" 2>/dev/null || true
  kill "$killer" ${watch:+"$watch"} 2>/dev/null || true
  exit 143
}
trap stop TERM HUP INT
# The watch holds none of the session's pipes: sshd ends the command's channel only once they are all closed.
(
  end=$((SECONDS + limit))
  while sleep 1; do
    read -r _ _ _ ppid _ < "/proc/$$/stat" || exit 0
    if [ "$ppid" != "$parent" ] || [ "$SECONDS" -ge "$end" ]; then
      kill -TERM "$$" 2>/dev/null || true
      exit 0
    fi
  done
) </dev/null >/dev/null 2>&1 &
watch=$!
code=0
# A signal ends this wait early and its trap (stop) exits: never back here.
wait "$child" || code=$?
kill "$watch" 2>/dev/null || true
exit "$code"
