"""The SSH connection dropped after each of the writes of an `up` (the nvidia options, the kernel command
line, the collector's config, the unit file, the unit's restart) ran to completion, before its exit status
reached the program (ssh_drops.py)."""

import pytest

from tests.integration.ssh_drops import cases, drop_at, ids, states  # noqa: F401 (states: the module's fixture)

pytestmark = pytest.mark.slow
CASES = cases('after')


@pytest.mark.parametrize('n,mode', CASES, ids=ids(CASES))
def test_drop_at_each_command(lab, states, n, mode):  # noqa: F811
    drop_at(lab, states, n, mode)
