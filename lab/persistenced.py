#!/usr/bin/python3
"""nvidia-persistenced on the lab host - SIMULATED (lab/hostsim.py installs its unit, nvidia-persistenced.service,
disabled; a test enables it as an operator would). Like NVIDIA's daemon it keeps the driver's devices open while it
runs: /dev/nvidiactl and each usable GPU's /dev/nvidiaN (O_PATH: the lab's nodes have no driver behind them, and an
O_PATH descriptor still shows in /proc/<pid>/fd as the device, as a real holder's does), each open adding one user to
the nvidia module's refcnt (lab/kmod.py), given back when it stops. It fails to start, as NVIDIA's does, without a
loaded nvidia module. A SIGKILL leaves its users counted (a real kernel would drop them): stop it with systemctl.

Stdlib only (the host's python3)."""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import faketools  # noqa: E402
import hostsim  # noqa: E402
import kmod  # noqa: E402


def main():
    host = hostsim.Host(faketools.lab_dir())
    if not kmod.nvidia_loaded(host):
        sys.stderr.write('nvidia-persistenced failed to initialize. Check syslog for more details.\n')
        sys.exit(1)
    gpus = sorted(os.listdir(host.path('proc/driver/nvidia/gpus')))
    paths = ['/dev/nvidiactl'] + ['/dev/nvidia%d' % host.minor(bdf) for bdf in gpus]
    fds = [os.open(p, os.O_PATH) for p in paths if os.path.exists(p)]
    kmod.hold(host, kmod.NVIDIA, len(fds))
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    sys.stdout.write('Started (%d)\n' % os.getpid())
    sys.stdout.flush()
    while not stop:
        time.sleep(0.2)
    try:
        kmod.release(host, kmod.NVIDIA, len(fds))
    except (FileNotFoundError, ValueError, kmod.ModuleError):
        pass   # the module went away under it (a test moved it, the host is going down)
    sys.stdout.write('Shutdown (%d)\n' % os.getpid())


if __name__ == '__main__':
    main()
