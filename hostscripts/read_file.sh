set -euo pipefail
# read_file.sh PATH: the file's content; exit 4 if it does not exist, exit 7 (content still printed)
# if an earlier put_file.sh installed it but its follow-up step (initramfs, boot refresh) never
# finished - the file counts as not done.
[ -f "$1" ] || { echo "gpuhost: $1 does not exist on $(hostname)" >&2; exit 4; }
cat "$1"
marker="$(dirname "$1")/.gpuhost-pending.$(basename "$1")"
if [ -f "$marker" ]; then
  echo "gpuhost: $1 was written but '$(cat "$marker")' did not finish" >&2
  exit 7
fi
