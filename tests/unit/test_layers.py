"""The arrows between the layers go one way: grammar/ -> config/ -> hostscripts/ (the Python the host runs, which the
program reads too) -> transport/ (SSH, the Proxmox API, durable jobs) -> resources/ (the serving classes) -> components/
(the program's ComponentResources) and provider/ (the plugin), siblings: neither imports the other - never back. Read
from the modules' imports (ast), every one, also those inside a function and those named to importlib.import_module, so
a lazy import cannot slip a circle back in."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Lowest first: a layer may import those before it, never those after it - except its SIBLINGS.
LAYERS = ('grammar', 'config', 'hostscripts', 'transport', 'resources', 'components', 'provider')
SIBLINGS = {'components': ('provider',), 'provider': ('components',)}
# What no layer imports: the program's and the tools' sides, and the tests.
OUTSIDE = ('tools', 'tests', 'policy', 'lab')


def imported(path: str, root: str = REPO) -> set:
    """The absolute module names a file imports (relative imports resolved against its package)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = os.path.relpath(os.path.dirname(path), root).replace(os.sep, '.')
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.update('%s.%s' % (base, a.name) if base else a.name for a in node.names)
            names.add(base)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                isinstance(node.args[0].value, str) and (
                    getattr(node.func, 'attr', None) == 'import_module' or getattr(node.func, 'id', None) in (
                        '__import__', 'import_module')):
            names.add(node.args[0].value)
    return {n for n in names if n}


def modules(layer: str, root: str = REPO):
    for top, dirs, files in os.walk(os.path.join(root, layer)):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(files):
            if name.endswith('.py'):
                yield os.path.join(top, name)


def upward(layer: str, root: str = REPO) -> list:
    """'<file>: <module>' for each import of `layer`'s modules that reaches a layer above it or outside them."""
    above = LAYERS[LAYERS.index(layer) + 1:] + OUTSIDE + SIBLINGS.get(layer, ())
    return sorted('%s: %s' % (os.path.relpath(path, root), name) for path in modules(layer, root)
                  for name in imported(path, root) if name.split('.')[0] in above)


@pytest.mark.parametrize('layer', LAYERS)
def test_no_module_imports_a_layer_above_its_own(layer):
    assert list(modules(layer)), 'no modules under %s/' % layer
    assert upward(layer) == []


def test_the_check_sees_every_kind_of_import(tmp_path):
    """Each way a module can reach the plugin is caught: at the top, inside a function, by name, relative."""
    package = tmp_path / 'components'
    package.mkdir()
    for i, line in enumerate(('import provider.registry', 'from provider import registry',
                              'def f():\n    from provider.registry import token',
                              'import importlib\nimportlib.import_module("provider.registry")',
                              'from ..provider import registry', 'from components import state')):
        (package / ('m%d.py' % i)).write_text(line + '\n')
    assert sorted({line.split(': ')[0] for line in upward('components', str(tmp_path))}) == [
        'components/m%d.py' % i for i in range(5)]


def test_siblings_and_the_layers_below_them_are_kept_apart(tmp_path):
    """The plugin never imports a component, and a serving class or the transport never reaches up to either."""
    for layer, line in (('provider', 'from components import host'), ('resources', 'import components.host'),
                        ('resources', 'from provider import registry'), ('transport', 'from resources import state'),
                        ('hostscripts', 'from transport import remote')):
        (tmp_path / layer).mkdir(exist_ok=True)
        (tmp_path / layer / ('m%d.py' % len(list((tmp_path / layer).iterdir())))).write_text(line + '\n')
    assert [line.split(': ')[1] for layer in ('provider', 'resources', 'transport', 'hostscripts')
            for line in upward(layer, str(tmp_path))] == [
        'components', 'components.host', 'components.host', 'provider', 'provider.registry', 'resources',
        'resources.state', 'transport', 'transport.remote']


def test_the_plugin_loads_no_module_of_the_program():
    """The plugin's process - its server, what its zygote loads (provider/__main__.py WARM) and every class its
    registry serves, loaded - holds no module of components/ (the program's ComponentResources), nor the tools' or
    the tests': the serving classes are resources/'s."""
    from tests.unit.fresh import fresh_json
    loaded = set(fresh_json(
        'import importlib, importlib.util, json, sys\n'
        'spec = importlib.util.spec_from_file_location("gpuhost_plugin", "provider/__main__.py")\n'
        'plugin = importlib.util.module_from_spec(spec)\n'
        'spec.loader.exec_module(plugin)\n'
        'for module in plugin.WARM:\n'
        '    importlib.import_module(module)\n'
        'from provider import registry\n'
        'for module, name in list(registry.CLASSES.values()) + list(registry.GUEST_KINDS.values()):\n'
        '    getattr(importlib.import_module(module), name)\n'
        'print(json.dumps(sorted(sys.modules)))\n'))
    assert 'resources.host' in loaded and 'provider.registry' in loaded, sorted(loaded)
    assert sorted(m for m in loaded if m.split('.')[0] == 'components') == []
    assert not any(m.split('.')[0] in OUTSIDE for m in loaded), sorted(loaded)
