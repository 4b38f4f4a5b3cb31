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
# The guard's own helpers (the watch and its sleep) are in the guard's group - sshd makes each session's command a
# session leader - never the script's: ending that group at the end leaves nothing of the guard either.
done_() {
  local pgrp=
  trap '' TERM
  read -r _ _ _ _ pgrp _ < "/proc/$$/stat" || true
  [ "$pgrp" != "$$" ] || kill -TERM -- -"$$" 2>/dev/null || true
  [ -z "$watch" ] || kill "$watch" 2>/dev/null || true
  exit "$1"
}
stop() {
  trap '' TERM HUP INT
  kill -TERM -- -"$child" 2>/dev/null || true
  # The script's cleanup, and whatever else of its group, within GRACE; then KILL. (Waiting on sleep reaps the
  # script once it ended: a zombie would keep its group alive to kill -0.)
  local n=0
  while kill -0 -- -"$child" 2>/dev/null && [ "$n" -lt $((grace * 10)) ]; do
    sleep 0.1
    n=$((n + 1))
  done
  kill -KILL -- -"$child" 2>/dev/null || true
  done_ 143
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
done_ "$code"
