"""The lab's simulated SGLang package as the lab installs it, for tests that run it outside a lab:
lab/fakesglang/sglang with its VERSION and its argument table (sglang/lab_server_args.json), made
from the release's wheel by tools/sglang_flags_gen.py --lab-table, never from components/."""

import os
import shutil

from tools import sglang_flags_gen

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install(lib, version):
    """The package at `lib`/sglang (a PYTHONPATH entry) for SGLang `version`; returns its path."""
    pkg = os.path.join(str(lib), 'sglang')
    shutil.copytree(os.path.join(REPO, 'lab', 'fakesglang', 'sglang'), pkg,
                    ignore=shutil.ignore_patterns('__pycache__'))
    with open(os.path.join(pkg, 'VERSION'), 'w') as f:
        f.write(version + '\n')
    sglang_flags_gen.lab_table(version, os.path.join(pkg, 'lab_server_args.json'))
    return pkg
