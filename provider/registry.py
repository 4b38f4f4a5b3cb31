"""Which class serves each of the plugin's resource types (gpuhost:index:<Name>). The tokens, and the type each had as
a dynamic resource (pulumi-python:dynamic/gpuhost:<Name>: the alias that moves a stack deployed before the plugin
onto it without replacing anything), are the resources' own (resources/resource.py): the program declares them
without importing the plugin."""

import importlib

from resources.resource import PACKAGE, token
from transport.operator import OperatorError

# name -> (module, class); ProxmoxGuest picks by its `kind` input (lxc: the container's checks on top).
CLASSES = {
    'KernelCmdline': ('resources.host', 'KernelCmdlineProvider'),
    'HostFile': ('resources.host', 'HostFileProvider'),
    'VfioBinding': ('resources.host', 'VfioProvider'),
    'HostStatus': ('resources.host', 'HostStatusProvider'),
    'NvidiaDriver': ('resources.driver', 'NvidiaDriverProvider'),
    'ModelWeights': ('resources.model', 'ModelProvider'),
    'MetricsFile': ('resources.monitoring', 'MetricsFileProvider'),
    'HostCollector': ('resources.monitoring', 'CollectorProvider'),
    'PciMappings': ('resources.pcimap', 'PciMappingProvider'),
    'SglangUnit': ('resources.sglang', 'SglangUnitProvider'),
    'ProxmoxGuest': ('resources.pve', 'PveGuestProvider'),
}
GUEST_KINDS = {'lxc': ('resources.container', 'ContainerProvider'), 'qemu': ('resources.pve', 'PveGuestProvider')}


def name_of(type_token: str) -> str:
    """The resource name of a type token this plugin serves; UnknownType for any other."""
    pkg, _, rest = type_token.partition(':')
    module, _, name = rest.partition(':')
    if pkg != PACKAGE or module != 'index' or name not in CLASSES:
        raise UnknownType('the gpuhost provider serves no resource type %s (its types: %s)' % (
            type_token, ', '.join(token(n) for n in sorted(CLASSES))))
    return name


class UnknownType(OperatorError):
    """A type token this plugin does not serve (a stack of a newer release, or a mistyped import)."""


_instances = {}


def provider_for(type_token: str, props: dict):
    """The (stateless) provider object serving a resource of this type with these properties."""
    name = name_of(type_token)
    where = CLASSES[name]
    if name == 'ProxmoxGuest' and props.get('kind') in GUEST_KINDS:
        where = GUEST_KINDS[props['kind']]
    obj = _instances.get(where)
    if obj is None:
        obj = _instances[where] = getattr(importlib.import_module(where[0]), where[1])()
    return obj


def serving_classes(name: str) -> list:
    """The classes that serve a resource type: one, or one per kind (ProxmoxGuest). Their INPUTS and OUTPUTS declare
    its properties (resources/fields.py)."""
    out = []
    for module, cls in [CLASSES[name]] + (list(GUEST_KINDS.values()) if name == 'ProxmoxGuest' else []):
        found = getattr(importlib.import_module(module), cls)
        if found not in out:
            out.append(found)
    return out


def describe(name: str) -> str:
    """The first paragraph of the serving class's docstring: the resource's description in the schema."""
    cls = getattr(importlib.import_module(CLASSES[name][0]), CLASSES[name][1])
    doc = (cls.__doc__ or '').strip().split('\n\n')[0]
    return ' '.join(line.strip() for line in doc.splitlines())
