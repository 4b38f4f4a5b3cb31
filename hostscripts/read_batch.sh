set -euo pipefail
# read_batch.sh NAMES K S [NAME NARGS ARG...]xK [NAME BODY]...: several of the program's read-only scripts in one SSH
# command (components/hostreads.py: the reads of one refresh that arrive together). NAMES: what is read, for logs and
# messages. Each request runs as `bash -c BODY NAME ARG...` - exactly as it would alone - side by side, stdin empty
# but for request S (-1: none), which reads this command's stdin;
# then, in request order, a header `gpuhost-batch<TAB>I<TAB>EXIT<TAB>STDOUT BYTES<TAB>STDERR BYTES` followed by its
# stdout and stderr, byte for byte. Changes nothing on the host (its outputs wait in a private temporary directory,
# removed at the end).
shift
k=$1 s=$2
shift 2
exec 3<&0
a=("$@")
p=0
starts=() counts=() names=()
for ((i = 0; i < k; i++)); do
  names+=("${a[p]}") counts+=("${a[p + 1]}") starts+=($((p + 2)))
  p=$((p + 2 + a[p + 1]))
done
declare -A body
while ((p < ${#a[@]})); do
  body[${a[p]}]=${a[p + 1]}
  p=$((p + 2))
done
d=$(mktemp -d) || exit 3
trap 'rm -rf "$d"' EXIT
trap 'exit 129' HUP
trap 'exit 143' TERM
pids=()
for ((i = 0; i < k; i++)); do
  name=${names[i]}
  if ((i == s)); then
    bash -c "${body[$name]}" "$name" "${a[@]:${starts[i]}:${counts[i]}}" > "$d/$i.out" 2> "$d/$i.err" <&3 &
  else
    bash -c "${body[$name]}" "$name" "${a[@]:${starts[i]}:${counts[i]}}" > "$d/$i.out" 2> "$d/$i.err" < /dev/null &
  fi
  pids+=($!)
done
for ((i = 0; i < k; i++)); do
  rc=0
  wait "${pids[i]}" || rc=$?
  printf 'gpuhost-batch\t%d\t%d\t%d\t%d\n' "$i" "$rc" "$(stat -c %s "$d/$i.out")" "$(stat -c %s "$d/$i.err")"
  cat "$d/$i.out" "$d/$i.err"
done
