#!/bin/sh
# uname on the lab host (/usr/local/sbin, before /usr/bin on root's PATH): the real one, with the running kernel's
# release the simulated host's (/proc/sys/kernel/osrelease: the spec's kernel, lab/hostsim.py) in place of the
# machine's - what `uname -r` tells NVIDIA's installer, DKMS and `modinfo -k "$(uname -r)"` on a real host.
out=$(/bin/uname "$@") || exit $?
real=$(/bin/uname -r)
release=$(cat /proc/sys/kernel/osrelease)
case $out in
  *"$real"*) out="${out%%"$real"*}$release${out#*"$real"}" ;;
esac
printf '%s\n' "$out"
