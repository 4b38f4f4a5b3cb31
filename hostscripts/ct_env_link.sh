set -euo pipefail
# ct_env_link.sh VMID VENV TARGET ENVS_DIR KEEP...: after an environment was confirmed serving: VENV (the
# operators' name for it) becomes a link to TARGET - a new link renamed over the old one, so it is never
# missing - unless VENV is a real directory (an environment made by hand before: left as it is, said so);
# then every environment in ENVS_DIR not named in KEEP, and every unfinished build, is removed - only a
# directory (not a link) that carries the program's own marker naming it (.gpuhost-env.json: the builder writes
# it, with the environment's id and final path, as soon as the directory exists): whatever else sits in
# ENVS_DIR is not the program's to remove. One line per thing done: "kept<TAB>VENV", "removed<TAB>DIR".
vmid=$1 venv=$2 target=$3 envs=$4
shift 4
pct exec "$vmid" -- sh -c '
  set -eu
  venv=$1 target=$2 envs=$3
  shift 3
  if [ -L "$venv" ] || [ ! -e "$venv" ]; then
    if [ "$(readlink "$venv" 2>/dev/null || true)" != "$target" ]; then
      mkdir -p "$(dirname "$venv")"
      ln -sfn "$target" "$venv.gpuhost-new"
      mv -Tf "$venv.gpuhost-new" "$venv"
    fi
  else
    printf "kept\t%s\n" "$venv"
  fi
  [ -d "$envs" ] || exit 0
  for d in "$envs"/* "$envs"/.building-*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    name=${d##*/}
    case $name in
      .building-*) id=${name#.building-}; id=${id%-*} ;;   # .building-<id>-<pid>
      *) id=$name ;;
    esac
    case $id in
      [0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]) ;;
      *) continue ;;   # not an environment of ours
    esac
    # The marker as the builder writes it (json.dumps, sorted keys; paths hold no character JSON escapes).
    marker=$d/.gpuhost-env.json
    [ -f "$marker" ] && [ ! -L "$marker" ] || continue
    grep -qF "\"id\": \"$id\"" "$marker" && grep -qF "\"path\": \"$envs/$id\"" "$marker" || continue
    keep=no
    for k in "$@"; do [ "$name" = "$k" ] && keep=yes; done
    if [ $keep = no ]; then
      rm -rf -- "$d"
      printf "removed\t%s\n" "$d"
    fi
  done' sh "$venv" "$target" "$envs" "$@"
