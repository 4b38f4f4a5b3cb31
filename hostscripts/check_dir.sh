set -euo pipefail
# check_dir.sh PATH: the path is a directory on the host (a bind mount's source: Proxmox checks it only when
# the container starts). Exit 4 and "missing" / "not-a-directory" when it is not.
if [ -d "$1" ]; then echo ok; exit 0; fi
if [ -e "$1" ]; then echo not-a-directory; else echo missing; fi
exit 4
