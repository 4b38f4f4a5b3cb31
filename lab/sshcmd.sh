# The lab's sshd ForceCommand (run by bash): every SSH command is counted and logged, then run
# exactly as sshd would run it - the user's shell with -c and the client's command line, same
# stdin, stdout, stderr, environment (SSH_ORIGINAL_COMMAND removed) and exit status - unless a test
# armed a connection drop for this command number, which lab/sshcmd.py then carries out.
#
#   LAB/control/ssh-count         commands run so far (every session, since the lab was created)
#   LAB/control/ssh-commands.raw  one record per command, fields NUL-terminated: number, time,
#                                 drop mode ('' for none), kind (command|shell), command line
#                                 (tests/lablib.py ssh_log() reads it)
#   LAB/control/ssh-drop.json     {"at": N, "mode": ..., "stdin_bytes": ..., "match": "NAME[|NAME...]"}
#                                 (lablib drop_ssh_at(); with "match", N counts only the scripts of those
#                                 names, in LAB/control/ssh-match-count)
#
# Shell builtins only on this path (plus one flock), so a command costs little more than without
# the wrapper; python starts only for the armed command.
LAB=$1
CTL=$LAB/control
[ -d "$CTL" ] || mkdir -p "$CTL"
drop=
{
  flock 9
  n=0
  [ -f "$CTL/ssh-count" ] && read -r n < "$CTL/ssh-count"
  n=$((n + 1))
  printf '%s\n' "$n" > "$CTL/ssh-count.tmp" && mv -f "$CTL/ssh-count.tmp" "$CTL/ssh-count"
  if [ -f "$CTL/ssh-drop.json" ]; then
    arm=$(< "$CTL/ssh-drop.json")
    hit=
    [[ $arm =~ \"at\":\ *([0-9]+) ]] && at=${BASH_REMATCH[1]}
    if [[ $arm =~ \"match\":\ *\"([A-Za-z0-9_.|-]+)\" ]]; then
      # "at" counts only the program's scripts of those names (`bash -c '<script>' NAME args`).
      matched=
      IFS='|' read -r -a names <<< "${BASH_REMATCH[1]}"
      for name in "${names[@]}"; do
        [[ ${SSH_ORIGINAL_COMMAND-} == *"' $name "* ]] && matched=1
      done
      if [ -n "$matched" ]; then
        m=0
        [ -f "$CTL/ssh-match-count" ] && read -r m < "$CTL/ssh-match-count"
        m=$((m + 1))
        printf '%s\n' "$m" > "$CTL/ssh-match-count"
        [ "$at" = "$m" ] && hit=1
      fi
    elif [ "$at" = "$n" ]; then
      hit=1
    fi
    if [ -n "$hit" ]; then
      rm -f "$CTL/ssh-drop.json"
      drop=before
      [[ $arm =~ \"mode\":\ *\"([a-z]+)\" ]] && drop=${BASH_REMATCH[1]}
    fi
  fi
  if [ "${SSH_ORIGINAL_COMMAND+set}" = set ]; then kind=command; else kind=shell; fi
  printf '%s\0%s\0%s\0%s\0%s\0' "$n" "$EPOCHREALTIME" "$drop" "$kind" "${SSH_ORIGINAL_COMMAND-}" \
    >> "$CTL/ssh-commands.raw"
} 9>> "$CTL/ssh.lock"
if [ -n "$drop" ]; then
  exec /usr/bin/python3 -S "$(dirname "$BASH_SOURCE")/sshcmd.py" "$LAB" "$n" "$arm"
fi
shell=${SHELL:-/bin/sh}
if [ "$kind" = shell ]; then
  unset SHLVL
  exec -a "-${shell##*/}" "$shell"
fi
cmd=$SSH_ORIGINAL_COMMAND
# As sshd leaves them for the command: no SSH_ORIGINAL_COMMAND, the shell's level counted from 1.
unset SSH_ORIGINAL_COMMAND SHLVL
case $cmd in
  internal-sftp|/usr/lib/openssh/sftp-server) exec /usr/lib/openssh/sftp-server ;;
esac
exec -a "${shell##*/}" "$shell" -c "$cmd"
