#!/bin/sh
# PID 1 of the lab's simulated Proxmox host for its first moment (lab/labhost.py starts it with
# systemd-nspawn): lays the simulated host (LAB/host, bind-mounted at $1) over the real paths, then execs
# systemd, which boots the host. Everything here is in the host's own mount namespace: the machine's /etc,
# /sys and /proc stay untouched, and it all goes away when the host is powered off.
#
#   host-init.sh IN_LAB
set -eu
LAB=$1
H=$LAB/host
# nspawn bound LAB here with what was mounted below it on the machine: this host's own root (with nspawn's
# /proc, /sys, /dev on it) and the roots of containers running now. Not the host's business, and each
# would be one more mount for its systemd to track and to unmount at shutdown.
for root in "$LAB"/host-os/rootfs "$LAB"/ct/*/rootfs; do
  if mountpoint -q "$root"; then mount --make-rprivate "$root"; umount -l "$root"; fi
done
# /etc and /var: overlays whose upper layers are LAB/host/etc and LAB/host/var, so what the program writes
# there (its units, /etc/gpuhost, /var/lib/gpuhost, the model storage) outlives a reboot and lies where the
# tests read it. The /etc directories the tests and the lab daemon write from outside are bind mounts of
# LAB/host/etc/<dir>, not files of the overlay's upper layer: changing an overlay's upper layer behind its
# back is undefined behaviour (an in-place edit from outside left `mv` over that file failing with "Stale
# file handle"); through a bind mount a write from either side is an ordinary write to one directory, and a
# rename inside is seen outside at once, as on a real host (and pmxcfs).
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$H/etc,workdir=$LAB/work/etc" /etc
for d in pve kernel default modprobe.d driverctl.d; do
  mkdir -p "$H/etc/$d"
  mount --bind "$H/etc/$d" "/etc/$d"
done
mount -t overlay overlay -o "lowerdir=/var,upperdir=$H/var,workdir=$LAB/work/var" /var
# The simulated hardware and kernel: PCI devices and IOMMU groups, the loaded modules (the nvidia module's
# version, kvm_amd's SEV parameters), the running command line and the nvidia driver's /proc files. nspawn
# mounts /proc and /sys itself, so these go on top of its mounts here.
mount --bind "$H/sys/bus/pci" /sys/bus/pci
mount --bind "$H/sys/kernel/iommu_groups" /sys/kernel/iommu_groups
mount --bind "$H/sys/module" /sys/module
mount --bind "$H/proc/cmdline" /proc/cmdline
mount --bind "$H/proc/driver" /proc/driver
# The boot id is the simulated host's (a reboot makes a new one: lab/hostsim.py), and it must be in place
# before systemd and journald read it. nspawn made up one of its own and bound it here from a file it
# deleted at once - nothing can be mounted on a deleted file, so its mount goes first.
umount /proc/sys/kernel/random/boot_id
mount --bind "$H/proc/boot_id" /proc/sys/kernel/random/boot_id
# The running kernel's release (the spec's kernel: lab/hostsim.py), read by the lab's `uname` (lab/uname.sh). A lab
# made before it had the file boots with the machine's.
if [ -f "$H/proc/osrelease" ]; then mount --bind "$H/proc/osrelease" /proc/sys/kernel/osrelease; fi
# The fake Proxmox tools (and the program's collector script), and root's home (the operator's installers).
mount --bind "$H/sbin" /usr/local/sbin
mount --bind "$H/root" /root
# The kernels' module trees (LAB/host/lib/modules, lab/hostsim.py install_kernel): each kernel's nvidia module as
# NVIDIA's installer with DKMS leaves it, indexed by depmod, read by the real modinfo.
mkdir -p /lib/modules "$H/lib/modules"
mount --bind "$H/lib/modules" /lib/modules
# The device nodes the nvidia driver makes at boot (lab/hostsim.py keeps them in LAB/host/dev; the
# containers' devN entries bind them from there). /dev is the host's own tmpfs: a node removed here is gone
# until the next boot, as on a real host.
cp -a "$H/dev/." /dev/
# The host's OpenSSH server (Debian's ssh.service) serves the lab's sshd_config: the spec's address and
# port, the lab's host key, every command through the lab's ForceCommand (lab/sshcmd.sh). A runtime drop-in:
# made again at every boot, nothing of it on the host's disk.
# ifupdown's units act on the network, which is the machine's own here (and ifupdown-pre's `udevadm settle` has
# no udev to wait for, so it failed on a loaded machine): masked for this boot, as a runtime mask.
mkdir -p /run/systemd/system
ln -sf /dev/null /run/systemd/system/ifupdown-pre.service
ln -sf /dev/null /run/systemd/system/networking.service
mkdir -p /run/systemd/system/ssh.service.d
cat > /run/systemd/system/ssh.service.d/gpuhost-lab.conf <<EOF
[Service]
ExecStartPre=
ExecStartPre=/usr/sbin/sshd -t -f $LAB/ssh/sshd_config
ExecStart=
ExecStart=/usr/sbin/sshd -D -e -f $LAB/ssh/sshd_config
ExecReload=
ExecReload=/usr/sbin/sshd -t -f $LAB/ssh/sshd_config
ExecReload=/bin/kill -HUP \$MAINPID
StandardError=append:$LAB/sshd.log
EOF
exec /lib/systemd/systemd
