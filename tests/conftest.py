import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


@pytest.fixture(autouse=True)
def _provider_traceback_limit(monkeypatch):
    # A failing provider method sets sys.tracebacklimit = 0 for its process (components/state.py: the
    # engine prints no frames). Called in a test, that would outlive the test, and Pulumi's mocks then
    # hang (tests/unit/test_components.py after test_fleet_config.py, as pytest-xdist orders them).
    monkeypatch.setattr(sys, 'tracebacklimit', getattr(sys, 'tracebacklimit', 1000), raising=False)
