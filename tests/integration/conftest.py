import fcntl
import os
import shutil
import socket

import pytest

from tests.lablib import Lab

# Each module gets its own lab on its own loopback /24 (127.0.N.0, N from 21), apart from `make lab`'s.
# Several pytest processes may run at once (two people, or a test run next to a bench): a net is
# claimed with a lock file held for the module's lifetime, and skipped if its ports are taken.
NET_LOCKS = '/tmp/gpuhost-lab-nets'
FIRST_NET, LAST_NET = 21, 120
RESERVED = {29}  # test_grub.py's own lab


def _ports_free(net):
    for addr, port in (('127.0.%d.2' % net, 8006), ('127.0.%d.3' % net, 2222)):
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def claim_net():
    """(net, open lock file): the first free loopback /24; the lock is released when the file is closed."""
    os.makedirs(NET_LOCKS, exist_ok=True)
    for net in range(FIRST_NET, LAST_NET):
        if net in RESERVED:
            continue
        f = open(os.path.join(NET_LOCKS, '%d.lock' % net), 'w')
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        if _ports_free(net):
            return net, f
        f.close()
    raise RuntimeError('no free loopback net for a lab in 127.0.%d-%d.0/24' % (FIRST_NET, LAST_NET - 1))


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    if os.geteuid() != 0:
        # A skipped integration test would let the suite pass without testing anything: fail instead.
        pytest.fail('the integration tests need root: the lab uses mount namespaces for the simulated host '
                    '(run `make test` as root)')
    base = str(tmp_path_factory.mktemp('lab'))
    net, lock = claim_net()
    try:
        lab = Lab(base, net).up()
        yield lab
        lab.down()
    finally:
        lock.close()
        shutil.rmtree(base, ignore_errors=True)
