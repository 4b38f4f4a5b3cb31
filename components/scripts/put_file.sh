set -euo pipefail
# put_file.sh PATH MODE EXPECTED_SHA256|any NEW_SHA256 POST   (new content on stdin)
# Replace PATH atomically (temp file in the same directory, then mv -f) if its content differs,
# but only if it still has the content the program read (EXPECTED_SHA256): a concurrent edit
# is reported, never overwritten. Content whose hash is not NEW_SHA256 (a connection dropped
# mid-transfer ends stdin early) is never installed. Then run POST; if POST fails the old file is
# put back, so a re-run sees the difference again and retries the whole step.
path=$1 mode=$2 expected=$3 want=$4 post=$5
dir=$(dirname "$path")
[ -d "$dir" ] || { echo "gpuhost: directory $dir does not exist on $(hostname)" >&2; exit 4; }
current=-
[ -f "$path" ] && current=$(sha256sum "$path" | cut -d' ' -f1)
if [ "$expected" != any ] && [ "$expected" != "$current" ]; then
  echo "gpuhost: $path changed on $(hostname) since it was read (sha256 $current, expected $expected); re-run" >&2
  exit 3
fi
tmp=$(mktemp "$dir/.gpuhost.XXXXXX")
backup=
cleanup() { rm -f "$tmp" ${backup:+"$backup"}; }
trap cleanup EXIT
cat > "$tmp"
chmod "$mode" "$tmp"
new=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$new" != "$want" ]; then
  echo "gpuhost: content for $path arrived incomplete (sha256 $new, sent $want); nothing was changed" >&2
  exit 6
fi
if [ "$new" = "$current" ]; then
  echo "unchanged $new"
  exit 0
fi
if [ -f "$path" ]; then
  backup=$(mktemp "$dir/.gpuhost-old.XXXXXX")
  cp -p "$path" "$backup"
fi
mv -f "$tmp" "$path"
run_post() {
  case "$post" in
    none) ;;
    initramfs) update-initramfs -u -k all ;;
    boot-systemd) proxmox-boot-tool refresh ;;
    boot-grub) update-grub ;;
    *) echo "gpuhost: unknown post step $post" >&2; return 2 ;;
  esac
}
if ! run_post >&2; then
  if [ -n "$backup" ]; then mv -f "$backup" "$path"; backup=; else rm -f "$path"; fi
  echo "gpuhost: $post failed after writing $path on $(hostname); the old file is back in place" >&2
  exit 5
fi
echo "changed $new"
