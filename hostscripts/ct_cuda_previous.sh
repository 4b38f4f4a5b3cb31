set -euo pipefail
# ct_cuda_previous.sh VMID CUDA_HOME restore|drop: the toolkit an install into CUDA_HOME moved aside to
# CUDA_HOME.gpuhost-previous (the installer job does, runtime.RUN_INSTALLER) - put back (the new one removed:
# SGLang did not serve on it) or removed (SGLang served on the new one). One line: "restored<TAB>VERSION",
# "dropped", or "none" when there is no previous toolkit.
vmid=$1 home=$2 what=$3
case $what in restore|drop) ;; *) echo "ct_cuda_previous.sh: restore or drop, not $what" >&2; exit 2 ;; esac
case $home in /*) ;; *) echo "ct_cuda_previous.sh: not an absolute path: $home" >&2; exit 2 ;; esac
pct exec "$vmid" -- sh -c '
  set -eu
  home=$1 what=$2 prev=$1.gpuhost-previous
  if [ ! -d "$prev" ] || [ -L "$prev" ]; then echo none; exit 0; fi
  if [ "$what" = drop ]; then rm -rf -- "$prev"; echo dropped; exit 0; fi
  rm -rf -- "$home.gpuhost-failed"
  if [ -e "$home" ] || [ -L "$home" ]; then mv -T -- "$home" "$home.gpuhost-failed"; fi
  mv -T -- "$prev" "$home"
  rm -rf -- "$home.gpuhost-failed"
  v=$(sed -n "s/.*\"version\" *: *\"\([0-9][0-9.]*\)\".*/\1/p" "$home/version.json" 2>/dev/null | head -n 1)
  printf "restored\t%s\n" "${v:-?}"
' sh "$home" "$what"
