set -euo pipefail
# model_remove.sh STORAGE DIR CACHE: a previous revision's directory (DIR, <STORAGE>/<model>@<revision>), removed
# once the revision that replaced it has served (components/sglang.py), with its verification cache. Only a
# directory below STORAGE whose own name carries a revision (@) is removed: never the storage itself, a staging
# directory or a path that climbs out (..).
storage=${1%/}; dir=${2%/}; cache=$3
case "$dir" in
    "$storage"/*@*) ;;
    *) echo "model_remove.sh: $dir is not a revision directory below $storage; not removed" >&2; exit 2 ;;
esac
rel=${dir#"$storage"/}
case "$rel" in .*|*/.*|*..*) echo "model_remove.sh: $dir is not a model directory below $storage; not removed" >&2; exit 2 ;; esac
case "${rel##*/}" in *@*) ;; *) echo "model_remove.sh: $dir names no revision; not removed" >&2; exit 2 ;; esac
rm -f -- "$cache"
if [ -d "$dir" ] && [ ! -L "$dir" ]; then
    rm -rf -- "$dir"
    echo "removed $dir"
else
    echo "absent $dir"
fi
