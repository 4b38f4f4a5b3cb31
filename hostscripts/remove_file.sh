set -euo pipefail
# remove_file.sh PATH: remove PATH if it exists (a file the program wrote; never a directory).
[ ! -d "$1" ] || { echo "gpuhost: $1 is a directory on $(hostname), not removed" >&2; exit 2; }
rm -f -- "$1"
