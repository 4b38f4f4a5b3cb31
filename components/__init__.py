"""The program's ComponentResources and its wiring (see docs/architecture.md)."""


def __getattr__(name):
    """The collector's modules by the names its script registers them under on the host (components/collector.py
    imports `from components import exposition, host_state`, text carried to every host byte for byte:
    components/monitoring.py EMBEDDED); in this tree they are hostscripts/'s."""
    if name in ('exposition', 'host_state'):
        import importlib
        return importlib.import_module('hostscripts.' + name)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
