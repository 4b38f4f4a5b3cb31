set -euo pipefail
# model_forget.sh TEXTFILE CACHE: what the program wrote about a model on the host - its node_exporter textfile
# and its verification cache - removed (destroy). The weights and the staging directory are the operator's data:
# never touched. /var/lib/gpuhost/model-verify and /var/lib/gpuhost go when empty.
rm -f -- "$1" "$2"
rmdir -- "$(dirname "$2")" 2>/dev/null || true
rmdir -- "$(dirname "$(dirname "$2")")" 2>/dev/null || true
