set -euo pipefail
# collector_facts.sh TIMER PATH...: read-only, for the collector's resource (components/monitoring.py):
# each PATH's content as one line of base64 ('-' when it does not exist), then the timer's unit-file and
# active state as systemctl reports them. Changes nothing.
timer=$1
shift
for f in "$@"; do
  if [ -f "$f" ]; then
    printf 'file\t%s\t%s\n' "$f" "$(base64 -w0 < "$f")"
  else
    printf 'file\t%s\t-\n' "$f"
  fi
done
# Both print their answer and exit non-zero unless enabled/active: the answer is what counts. No answer at all
# (systemd did not reply in time on a loaded host - a refresh then showed the timer as drift) is asked again.
for try in 1 2 3; do
  enabled=$(systemctl is-enabled "$timer" 2>/dev/null || true)
  active=$(systemctl is-active "$timer" 2>/dev/null || true)
  if [ -n "$active" ] && { [ -n "$enabled" ] || [ "$active" = inactive ]; }; then break; fi
  [ "$try" = 3 ] || sleep 1
done
printf 'timer\t%s\t%s\n' "${enabled:-not-found}" "${active:-unknown}"
