import itertools
import os
import shutil

import pytest

from tests.lablib import Lab

# Each module gets its own lab on its own loopback /24 (127.0.2x.0), apart from `make lab`'s.
_nets = itertools.count(21)


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip('the lab needs root (mount namespaces for the simulated host)')
    base = str(tmp_path_factory.mktemp('lab'))
    lab = Lab(base, next(_nets)).up()
    yield lab
    lab.down()
    shutil.rmtree(base, ignore_errors=True)
