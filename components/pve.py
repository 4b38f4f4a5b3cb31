"""Where release 0.1.0 had the serving class of the Proxmox guests (PveGuestProvider): a stack it deployed holds that
provider pickled by this module's name until its first `up` (resources/state.py, "The upgrade path"). The class is
resources/pve.py's; this module only answers its old name."""

from resources.state import moved


def __getattr__(name):
    return moved(__name__, name)
