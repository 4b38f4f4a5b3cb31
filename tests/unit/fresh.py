"""A script run in a fresh interpreter in the project's directory - what a new process (the plugin, its zygote, the
dynamic-provider host) loads, without what the test process has loaded already - and the JSON it prints."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fresh_json(script: str, timeout: int = 120):
    res = subprocess.run([sys.executable, '-c', script], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)
