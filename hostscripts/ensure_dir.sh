set -euo pipefail
# ensure_dir.sh DIR MODE: create DIR (and its parents) with MODE if it does not exist; an existing
# directory is left as it is.
[ -d "$1" ] || install -d -m "$2" "$1"
