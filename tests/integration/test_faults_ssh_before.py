"""The SSH connection dropped before each of the first ten remote commands of an `up` runs (ssh_drops.py)."""

import pytest

from tests.integration.ssh_drops import cases, drop_at, ids, states  # noqa: F401 (states: the module's fixture)

pytestmark = pytest.mark.slow
CASES = cases('before')


@pytest.mark.parametrize('n,mode', CASES, ids=ids(CASES))
def test_drop_at_each_command(lab, states, n, mode):  # noqa: F811
    drop_at(lab, states, n, mode)
