"""Where release 0.1.0 had the serving class of the VM's PCI resource mappings (PciMappingProvider): a stack it
deployed holds that provider pickled by this module's name until its first `up` (resources/state.py, "The upgrade
path"). The class is resources/pcimap.py's; this module only answers its old name."""

from resources.state import moved


def __getattr__(name):
    return moved(__name__, name)
