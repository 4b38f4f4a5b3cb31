set -euo pipefail
# reboot.sh: reboot in the background so this session can return first.
nohup sh -c 'sleep 1; reboot' >/dev/null 2>&1 &
echo "reboot scheduled on $(hostname)"
