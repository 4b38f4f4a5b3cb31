#!/bin/sh
# Runs inside `unshare -m --propagation private`: lays the simulated host (LAB/host) over the
# real paths, for this mount namespace only, then becomes the lab's SSH server. Nothing here is
# visible outside the namespace; the machine's own /etc, /sys and /proc stay untouched.
set -eu
LAB=$1
hostname "$2"
H=$LAB/host
# The /etc directories the program and the tests write: bind mounts of LAB/host/etc/<dir>, not
# files of the /etc overlay's upper layer. Changing an overlay's upper layer behind its back is
# undefined behaviour (an in-place edit from outside left `mv` over that file failing with "Stale
# file handle"); through a bind mount a write from either side is an ordinary write to one
# directory, and a rename inside is seen outside at once, as on a real host (and pmxcfs).
ETC_DIRS="pve kernel default modprobe.d driverctl.d"
mkdir -p "$LAB/work/etc" "$LAB/work/var" "$LAB/work/dev" "$H/var"
for d in $ETC_DIRS; do mkdir -p "$H/etc/$d"; done
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$H/etc,workdir=$LAB/work/etc" /etc
for d in $ETC_DIRS; do mount --bind "$H/etc/$d" "/etc/$d"; done
mount -t overlay overlay -o "lowerdir=/var,upperdir=$H/var,workdir=$LAB/work/var" /var
mount -t overlay overlay -o "lowerdir=/dev,upperdir=$H/dev,workdir=$LAB/work/dev" /dev
mount --bind "$H/sys/bus/pci" /sys/bus/pci
mount --bind "$H/sys/kernel/iommu_groups" /sys/kernel/iommu_groups
# The loaded modules' sysfs (the nvidia module's version): the host's own, not the machine's.
mkdir -p "$H/sys/module"
mount --bind "$H/sys/module" /sys/module
mount --bind "$H/proc/cmdline" /proc/cmdline
mount --bind "$H/proc/driver" /proc/driver
# /sys/module of the simulated host: its nvidia module's version (lab/hostsim.py), nothing of the machine's.
mount --bind "$H/sys/module" /sys/module
mount --bind "$H/proc/boot_id" /proc/sys/kernel/random/boot_id
mount --bind "$H/sbin" /usr/local/sbin
# root's home is the simulated host's own (LAB/host/root, Debian's dot files), not the machine's.
mkdir -p "$H/root"
mount --bind "$H/root" /root
mkdir -p /run/sshd
exec /usr/sbin/sshd -D -e -f "$LAB/ssh/sshd_config"
