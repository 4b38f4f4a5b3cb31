set -euo pipefail
# put_file.sh PATH MODE EXPECTED_SHA256|any NEW_SHA256 POST   (new content on stdin)
# Replace PATH atomically (temp file in the same directory, then mv -f) if its content differs,
# but only if it still has the content the program read (EXPECTED_SHA256): a concurrent edit
# is reported, never overwritten. Content whose hash is not NEW_SHA256 (a connection dropped
# mid-transfer ends stdin early) is never installed. Then run POST; if POST fails the old file is
# put back, so a re-run sees the difference again and retries the whole step. While POST runs, a
# marker file (.gpuhost-pending.<name>) says so: if this script is killed or hangs mid-POST, the
# marker stays, the readers report the file as not done, and the re-run runs POST again.
# The marker holds this run's token. A run whose POST fails late (a tool that hung past the
# program's time limit, killed later) puts its old file back only while the marker is still its
# own: a re-run that took the file over meanwhile keeps what it wrote. The checks and moves
# around the marker hold a lock on the directory (never while POST runs).
path=$1 mode=$2 expected=$3 want=$4 post=$5
dir=$(dirname "$path")
[ -d "$dir" ] || { echo "gpuhost: directory $dir does not exist on $(hostname)" >&2; exit 4; }
marker="$dir/.gpuhost-pending.$(basename "$path")"
token="$post $$ $(date +%s%N)"
exec 9<"$dir"
ours() { [ "$(cat "$marker" 2>/dev/null)" = "$token" ]; }
current=-
[ -f "$path" ] && current=$(sha256sum "$path" | cut -d' ' -f1)
tmp=$(mktemp "$dir/.gpuhost.XXXXXX")
backup=
cleanup() { rm -f "$tmp" ${backup:+"$backup"}; }
trap cleanup EXIT
# Told to stop (guard.sh: the program stopped waiting, or its session is gone): end here, temp files removed - but
# while POST runs, its tool gets the same signal and its failure puts the old file back first (below).
trap 'exit 143' TERM HUP INT
cat > "$tmp"
new=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$new" != "$want" ]; then
  echo "gpuhost: content for $path arrived incomplete (sha256 $new, sent $want); nothing was changed" >&2
  exit 6
fi
run_post() {
  case "$post" in
    none) ;;
    initramfs) update-initramfs -u -k all ;;
    boot-systemd) proxmox-boot-tool refresh ;;
    boot-grub) update-grub ;;
    *) echo "gpuhost: unknown post step $post" >&2; return 2 ;;
  esac
}
if [ "$new" = "$current" ]; then
  flock 9
  if [ -f "$marker" ]; then
    # An earlier run installed this content but its $post never finished: finish it now.
    printf '%s\n' "$token" > "$marker"
    flock -u 9
    trap : TERM HUP INT
    if ! run_post >&2; then
      echo "gpuhost: $post failed again for $path on $(hostname); the file has the new content, $post is still to run" >&2
      exit 5
    fi
    flock 9
    if ours; then rm -f "$marker"; fi
    echo "changed $new (finished $post)"
    exit 0
  fi
  echo "unchanged $new"
  exit 0
fi
flock 9
[ -f "$path" ] && current=$(sha256sum "$path" | cut -d' ' -f1)
if [ "$expected" != any ] && [ "$expected" != "$current" ]; then
  echo "gpuhost: $path changed on $(hostname) since it was read (sha256 $current, expected $expected); re-run" >&2
  exit 3
fi
chmod "$mode" "$tmp"
if [ -f "$path" ]; then
  backup=$(mktemp "$dir/.gpuhost-old.XXXXXX")
  cp -p "$path" "$backup"
fi
[ "$post" = none ] || printf '%s\n' "$token" > "$marker"
mv -f "$tmp" "$path"
flock -u 9
trap : TERM HUP INT
if ! run_post >&2; then
  flock 9
  if [ "$post" != none ] && ! ours; then
    echo "gpuhost: $post failed after writing $path on $(hostname); a later run has taken the file over since, so it is left as that run made it" >&2
    exit 5
  fi
  if [ -n "$backup" ]; then mv -f "$backup" "$path"; backup=; else rm -f "$path"; fi
  rm -f "$marker"
  echo "gpuhost: $post failed after writing $path on $(hostname); the old file is back in place" >&2
  exit 5
fi
flock 9
if ours; then rm -f "$marker"; fi
echo "changed $new"
