set -euo pipefail
# job.sh ACTION NAME ...: a long step (a model download, an environment build, an installer) as a transient
# systemd unit NAME-<start time>.service, not tied to the SSH session that starts it (components/jobs.py). The SSH command
# only starts, polls or stops it; the unit keeps running when the connection drops or `pulumi` is killed, and
# the next `up` re-attaches to it by its name. Runs on the host, or in a container through ct_job.sh.
#
#   start NAME SPEC LIMIT INTERP BODY [ARGS...]   stdin: the job's input (may hold a secret: a root-only file
#        that is removed when the job ends). Prints `started`, `attached` (NAME runs with the same SPEC: never a
#        second copy) or `busy<TAB><spec>` (NAME runs another declaration: the caller stops it first). LIMIT:
#        RuntimeMaxSec in seconds, 0 for none. The unit runs `INTERP <dir>/body ARGS...`.
#   poll NAME          one line per fact, `key<TAB>value`: state, sub, cpu (CPUUsageNSec), spec, started, now,
#                      progress (the job's progress.json), result (written when it ended), stop; once it ended
#                      also out (stdout's last line) and log (stderr's last lines, one `log` line each).
#   stop NAME REASON   stop it (its whole cgroup), recording why; then as poll.
#   forget NAME        remove what it left (its directory), unless it runs.
#
# Layout, /var/lib/gpuhost/jobs/NAME/ (root only): spec, started, body, input, stdout, log (its stderr: `tail -f`
# it to watch), unit (the unit's name), progress.json (the job rewrites it atomically), result (`<SERVICE_RESULT> <EXIT_CODE>
# <EXIT_STATUS> <time>`, by ExecStopPost), stop (why it was stopped). Watch one with `systemctl status 'NAME-*'`,
# `tail -f /var/lib/gpuhost/jobs/NAME/log`; stop one with `systemctl stop 'NAME-*'` (the next `up` starts it again).
action=$1 name=$2
shift 2
case $name in
  gpuhost-[a-z0-9]*) [[ $name =~ ^gpuhost-[a-z0-9][a-z0-9.-]{0,80}$ ]] || { echo "job.sh: not a job name: $name" >&2; exit 2; } ;;
  *) echo "job.sh: not a job name: $name" >&2; exit 2 ;;
esac
jobs=/var/lib/gpuhost/jobs
dir=$jobs/$name
# Each start is a unit of its own, NAME-<start time>.service (recorded in the job's directory): a job started right
# after the last one of its name ended does not wait for systemd to collect that one's unit ("already loaded").
unit=$(cat "$dir/unit" 2>/dev/null || echo "$name.service")
if ! command -v systemd-run >/dev/null 2>&1 || [ ! -d /run/systemd/system ]; then
  echo "job.sh: $(hostname) does not run systemd (no /run/systemd/system): long steps run as systemd units" >&2
  exit 6
fi

# The unit's ActiveState and SubState: `systemctl list-units` lists loaded units only, so asking about a job that
# ended (and was collected) does not make systemd try to load it again ("Failed to open /run/systemd/transient/
# ...", once per ask, in the host's journal). `unknown`: systemd did not answer (a loaded host): ask again.
unit_state() {
  local line
  if ! line=$(systemctl list-units --all --plain --no-legend --full "$unit" 2>/dev/null); then
    echo 'unknown unknown'
  elif [ -z "$line" ]; then
    echo 'inactive dead'
  else
    set -- $line
    # A start still queued (systemd-run --no-block returns once it is): as good as running.
    if [ "$3" = inactive ] && [ -n "$(systemctl list-jobs --plain --no-legend "$unit" 2>/dev/null)" ]; then
      echo 'activating queued'
    else
      echo "$3 $4"
    fi
  fi
}

active() {
  local state
  state=$(unit_state)
  case ${state%% *} in
    active | activating | deactivating | reloading | refreshing) return 0 ;;
    unknown) echo "job.sh: systemd did not say whether $unit runs; not starting a second copy" >&2; exit 7 ;;
  esac
  return 1
}

one_line() { # FILE: its content on one line, or -
  if [ -s "$1" ]; then tr -d '\n\t' < "$1"; else printf -- '-'; fi
}

poll() {
  local state sub cpu=-
  read -r state sub <<< "$(unit_state)"
  case $state in
    active | activating | deactivating | reloading | refreshing)
      cpu=$(systemctl show "$unit" -p CPUUsageNSec --value 2>/dev/null || echo -) ;;
  esac
  printf 'state\t%s\nsub\t%s\ncpu\t%s\n' "$state" "$sub" "$cpu"
  printf 'spec\t%s\nstarted\t%s\nnow\t%s\n' "$(one_line "$dir/spec")" "$(one_line "$dir/started")" "$(date +%s)"
  printf 'output\t%s\n' "$(( $(stat -c %s "$dir/log" 2>/dev/null || echo 0) + $(stat -c %s "$dir/stdout" 2>/dev/null || echo 0) ))"
  printf 'progress\t%s\nresult\t%s\nstop\t%s\n' "$(one_line "$dir/progress.json")" "$(one_line "$dir/result")" \
    "$(one_line "$dir/stop")"
  case $state in
    active | activating | deactivating | reloading | refreshing) return 0 ;;
  esac
  if [ -f "$dir/result" ]; then
    printf 'out\t%s\n' "$( (tail -n 1 "$dir/stdout" 2>/dev/null || true) | tr -d '\t')"
    (tail -n 5 "$dir/log" 2>/dev/null || true) | tr -d '\t' | sed 's/^/log\t/'
  elif [ -f "$dir/spec" ]; then
    # Ended without its outcome written (systemd could not even start it, say): systemd's own words.
    (journalctl -u "$unit" -n 5 -o cat --no-pager 2>/dev/null || true) | tr -d '\t' | sed 's/^/journal\t/'
  fi
}

case $action in
  start)
    spec=$1 limit=$2 interp=$3 body=$4
    shift 4
    install -d -m 0700 "$jobs"
    exec 9> "$jobs/.lock"
    flock 9
    unit=$(cat "$dir/unit" 2>/dev/null || echo "$name.service")   # as it is now, under the lock
    if active; then
      running=$(cat "$dir/spec" 2>/dev/null || echo -)
      if [ "$running" = "$spec" ]; then echo attached; else printf 'busy\t%s\n' "$running"; fi
      exit 0
    fi
    rm -rf "$dir"
    install -d -m 0700 "$dir"
    unit=$name-$(date +%s%N | cut -c1-13).service
    printf '%s\n' "$unit" > "$dir/unit"
    printf '%s\n' "$spec" > "$dir/spec"
    date +%s > "$dir/started"
    printf '%s' "$body" > "$dir/body"
    (umask 077 && cat > "$dir/input")
    # Runs when the job's process has ended, however it ended (exit, a signal, RuntimeMaxSec, a stop, the host
    # shutting down): the outcome for the next poll, and the input (a token, a password) gone. systemd opens the
    # input as this command's stdin too, so the job itself must not remove it (208/STDIN).
    cat > "$dir/stopped" <<EOF
printf '%s %s %s %s\n' "\${SERVICE_RESULT:-unknown}" "\${EXIT_CODE:-unknown}" "\${EXIT_STATUS:-unknown}" "\$(date +%s)" > '$dir/result.tmp'
mv -f '$dir/result.tmp' '$dir/result'
rm -f '$dir/input'
EOF
    # The job's own wrapper records how its process exited; ExecStopPost records it again in systemd's words
    # (a timeout, a signal) - and where that control process cannot run (219/CGROUP, seen on a loaded cgroup-v1
    # host), the wrapper's record stands.
    cat > "$dir/run" <<EOF
"\$@"
rc=\$?
: > '$dir/input'   # the secret gone now; the file itself stays for ExecStopPost's stdin, which removes it
if [ \$rc = 0 ]; then r=success; else r=exit-code; fi
printf '%s exited %s %s\n' "\$r" "\$rc" "\$(date +%s)" > '$dir/result.tmp' && mv -f '$dir/result.tmp' '$dir/result'
exit \$rc
EOF
    props=(-p "StandardInput=file:$dir/input" -p "StandardOutput=file:$dir/stdout" -p "StandardError=file:$dir/log"
           -p "ExecStopPost=/bin/bash $dir/stopped" -p TimeoutStopSec=30 -p CPUAccounting=yes
           --setenv=GPUHOST_JOB_DIR="$dir" --setenv=GPUHOST_PROGRESS="$dir/progress.json"
           --setenv=GPUHOST_INPUT="$dir/input")
    if [ "$limit" != 0 ]; then props+=(-p "RuntimeMaxSec=$limit"); fi
    # --no-block: back once the start is queued. Waiting for it (systemd-run's default) hung for minutes in a
    # loaded lab container whose systemd had long finished the job (`systemctl list-jobs`: none) - the command
    # timeout then named a hang. The polls that follow read the unit (a queued start counts as running) and, if
    # it failed to start, systemd's own words from the journal.
    systemd-run --no-block --unit="$unit" --description="gpuhost job $name" --collect --quiet "${props[@]}" \
      -- /bin/bash "$dir/run" "$interp" "$dir/body" "$@"
    echo started
    ;;
  poll)
    poll
    ;;
  stop)
    reason=${1:-stopped}
    if active; then
      printf '%s\n' "$reason" > "$dir/stop"
      systemctl stop "$unit" || true
      printf 'stopped\tyes\n'
    else
      printf 'stopped\tno\n'
    fi
    poll
    ;;
  forget)
    install -d -m 0700 "$jobs"
    exec 9> "$jobs/.lock"
    flock 9
    unit=$(cat "$dir/unit" 2>/dev/null || echo "$name.service")
    if active; then
      echo "job.sh: $name is running; stop it first" >&2
      exit 3
    fi
    rm -rf "$dir"
    # The last job of a deployment that goes (destroy): the jobs' directory and its lock go with it, and
    # /var/lib/gpuhost when nothing else of the program's is left there.
    if [ -z "$(find "$jobs" -mindepth 1 -maxdepth 1 -type d -print -quit)" ]; then
      rm -f "$jobs/.lock"
      rmdir "$jobs" 2>/dev/null || true
      rmdir "$(dirname "$jobs")" 2>/dev/null || true
    fi
    ;;
  *)
    echo "job.sh: unknown action $action" >&2
    exit 2
    ;;
esac
