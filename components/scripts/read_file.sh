set -euo pipefail
# read_file.sh PATH: the file's content, or exit 4 if it does not exist.
[ -f "$1" ] || { echo "gpuhost: $1 does not exist on $(hostname)" >&2; exit 4; }
cat "$1"
