set -euo pipefail
# ct_put_file.sh VMID PATH MODE NEW_SHA256 EXPECTED_SHA256|-|any  (content on stdin): replace PATH inside
# container VMID atomically (pct push to a temp name in the same directory, then mv -f inside the
# container) if it differs, and only if it still has the content the program read (EXPECTED): a
# concurrent edit is reported, never overwritten. Content that did not arrive whole (hash not
# NEW_SHA256) is never installed.
vmid=$1 path=$2 mode=$3 want=$4 expected=${5:-any}
tmp=$(mktemp /tmp/.gpuhost-ct.XXXXXX)
trap 'rm -f "$tmp"' EXIT
cat > "$tmp"
new=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$new" != "$want" ]; then
  echo "gpuhost: content for $path in CT $vmid arrived incomplete (sha256 $new, sent $want); nothing was changed" >&2
  exit 6
fi
current=$(pct exec "$vmid" -- sh -c 'if [ -f "$1" ]; then sha256sum "$1" | cut -d" " -f1; else echo -; fi' sh "$path")
if [ "$new" = "$current" ]; then
  echo "unchanged $new"
  exit 0
fi
if [ "$expected" != any ] && [ "$expected" != "$current" ]; then
  echo "gpuhost: $path in CT $vmid changed since it was read (sha256 $current, expected $expected); re-run" >&2
  exit 3
fi
pct exec "$vmid" -- mkdir -p "$(dirname "$path")"
pct push "$vmid" "$tmp" "$path.gpuhost-new" --perms "$mode"
pct exec "$vmid" -- mv -f "$path.gpuhost-new" "$path"
echo "changed $new"
