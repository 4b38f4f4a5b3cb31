"""A stand-in for the sglang package inside lab containers (see launch_server.py)."""
import os

with open(os.path.join(os.path.dirname(__file__), 'VERSION')) as _f:
    __version__ = _f.read().strip()
