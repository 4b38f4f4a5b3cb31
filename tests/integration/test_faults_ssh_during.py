"""The SSH connection dropped during the uploads among the first ten remote commands of an `up` (half
their content sent), and a hung host tool stopped at the step's time limit (ssh_drops.py)."""

import pytest

from tests.integration.ssh_drops import cases, drop_at, hung_tool, ids, states  # noqa: F401 (states: the fixture)

pytestmark = pytest.mark.slow
CASES = cases('during')


@pytest.mark.parametrize('n,mode', CASES, ids=ids(CASES))
def test_drop_at_each_command(lab, states, n, mode):  # noqa: F811
    drop_at(lab, states, n, mode)


def test_a_hung_tool_is_stopped_and_named(lab, states):  # noqa: F811
    hung_tool(lab, states)
