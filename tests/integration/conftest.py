import os
import shutil

import pytest

from tests.lablib import Lab, claim_net, keep_logs


# Each module gets its own lab on a loopback /24 of its own (claim_net): modules may run in parallel.
@pytest.fixture(scope='module')
def lab(tmp_path_factory, request):
    if os.geteuid() != 0:
        # A skipped integration test would let the suite pass without testing anything: fail instead.
        pytest.fail('the integration tests need root: the lab host and its containers are machines of systemd-nspawn '
                    '(run `make test` as root)')
    base = str(tmp_path_factory.mktemp('lab'))
    net, lock = claim_net()
    failed = request.session.testsfailed
    try:
        lab = Lab(base, net).up()
        yield lab
        if request.session.testsfailed > failed:
            print('lab logs kept in %s' % keep_logs(base, request.module.__name__.rsplit('.', 1)[-1]))
        lab.down()
    finally:
        lock.close()
        shutil.rmtree(base, ignore_errors=True)
