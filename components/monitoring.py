"""Monitoring as the program composes it: the host's metrics file (host_metrics: SGLang's upstream as the program
declares it) and the collector (host_collector), with the files the collector's resource installs - its script built
from the collector's modules (components/collector.py, hostscripts/exposition.py, hostscripts/host_state.py), its
config and its systemd units. The serving classes (MetricsFile, HostCollector) are resources/monitoring.py's."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re

import pulumi

from resources.monitoring import COLLECTOR_CONFIG, COLLECTOR_SCRIPT, COLLECTOR_SERVICE, COLLECTOR_STATE, \
    COLLECTOR_STATE_DIR, COLLECTOR_TEXTFILE, COLLECTOR_TIMEOUT_S, COLLECTOR_TIMER, TEXTFILE, TEXTFILE_DIR, UNIT_DIR, \
    CollectorProvider, HostCollector, MetricsFile, declared, numbers, textfile
from resources.runtime import declared as runtime_declared
from resources.state import moved


def _digest(values) -> str:
    return hashlib.sha256(json.dumps(numbers(values), sort_keys=True, default=str).encode()).hexdigest()


def upstream(d, container, service) -> pulumi.Output:
    """A digest that changes whenever the SGLang unit is created or updated for a declared reason: the
    unit's declared inputs (its text, version, name, container, API key).

    Why: a preview that updates the unit cannot know gpuhost.prom's content (the unit's outputs are
    unknown) and lists host-metrics; with this digest among its inputs the `up` then updates it too -
    rewriting the file only if the content differs - so preview lists what up changes. All of it is
    known at preview (never an output that may be null, which a preview reads as unknown)."""
    s = d.sglang
    unit = [service.unit, s.version, s.unit, d.container.vmid, runtime_declared(d)]
    if d.model is not None:
        unit.append([d.model.id, d.model.revision])   # a new revision restarts the unit
    token = pulumi.Output.all(container.identity).apply(lambda a: _digest(list(a) + unit))
    key = getattr(s, 'api_key', None)
    if key is not None:
        # A new API key restarts the unit; only its digest enters, and the result stays a secret.
        token = pulumi.Output.all(token, pulumi.Output.secret(key.get_secret_value())).apply(_digest)
    return token


def host_metrics(name, d, container, service, opts=None) -> MetricsFile:
    """The `host-metrics` resource: gpuhost.prom from the SGLang unit's outputs, written after it
    (`upstream`: see upstream())."""
    decl = declared(d)
    unit = service.service
    content = pulumi.Output.all(unit.resolved, unit.active, unit.enabled, unit.runtime_facts).apply(
        lambda a: textfile(decl, *a))
    opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(depends_on=[unit]), opts)
    return MetricsFile(name, {
        'path': TEXTFILE, 'mode': '0644', 'content': content,
        'upstream': upstream(d, container, service), 'sha256': None}, opts)




_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The modules the collector runs with, carried verbatim inside its script (the host has no copy of this
# program): the kernel command-line grammar, the exposition format and the host-state decisions. Each as
# (its name on the host, the path the script names it by, where it is in this tree): the script's text names
# them as release 0.1.0 laid the tree out (components/...), so a moved file leaves every host's collector as
# it was - no `HostCollector update [diff: ~files]` from a tidy-up. collector.py imports them by those names.
EMBEDDED = (('grammar.cmdline', 'grammar/cmdline.py', 'grammar/cmdline.py'),
            ('components.exposition', 'components/exposition.py', 'hostscripts/exposition.py'),
            ('components.host_state', 'components/host_state.py', 'hostscripts/host_state.py'))
COLLECTOR_MAIN = 'components/collector.py'
_LOADER = '''#!/usr/bin/python3
# gpuhost-collector - managed by gpuhost (Pulumi); edits are reverted on the next `pulumi up`.
# The host's live GPU safety and health metrics for node_exporter's textfile collector, run by
# gpuhost-collector.timer (see gpuhost-collector --help). Built from the program's own modules: %s are
# carried below verbatim and registered under their names; the collector itself
# (%s) follows them.
import sys as _sys
import types as _types


def _module(name, source):
    package, _, leaf = name.rpartition('.')
    if package not in _sys.modules:
        parent = _types.ModuleType(package)
        parent.__path__ = []
        _sys.modules[package] = parent
    module = _types.ModuleType(name)
    module.__file__ = '<gpuhost-collector: %%s>' %% name
    _sys.modules[name] = module
    exec(compile(source, module.__file__, 'exec'), module.__dict__)
    setattr(_sys.modules[package], leaf, module)


'''
_PLAIN_PATH = re.compile(r'^/[A-Za-z0-9/_.-]+$')


def _source(rel) -> str:
    with open(os.path.join(_ROOT, rel)) as f:
        return f.read()


def collector_script() -> str:
    """/usr/local/sbin/gpuhost-collector: a loader, the embedded modules as raw strings, then
    components/collector.py as the script's own code. A pure function of those files: the same program
    writes the same script (a second `up` changes nothing), a changed module shows in the diff."""
    parts = [_LOADER % (', '.join(rel for _, rel, _ in EMBEDDED), COLLECTOR_MAIN)]
    for name, rel, path in EMBEDDED:
        text = _source(path)
        # A raw triple-quoted string holds any text but its own delimiter and a trailing backslash.
        if "'''" in text or text.endswith('\\'):
            raise ValueError('%s cannot be carried in the collector script as a raw string (it holds \'\'\' or '
                             'ends in a backslash); rewrite that line' % rel)
        parts.append("_module(%r, r'''%s''')\n\n" % (name, text))
    parts.append('# --- %s\n' % COLLECTOR_MAIN)
    parts.append(_source(COLLECTOR_MAIN))
    return ''.join(parts)


def collector_config(d) -> str:
    """/etc/gpuhost/collector.json: the declared state the collector compares the host with (the same
    `expect` HostStatus uses, and the declared driver version: null where gpuhost:nvidia.driver is absent, the
    driver then being the operator's), checked with the collector's own validation before it is written."""
    from components import collector
    from resources.host import host_expect
    from grammar.gpu import BLACKWELL_IDS
    # The driver's version joins here, not in host_expect(): HostStatus's inputs stay as they were.
    expect = dict(host_expect(d), nvidia_driver=d.nvidia.driver.version if d.nvidia.driver is not None else None)
    doc = {'version': collector.CONFIG_VERSION, 'textfile': COLLECTOR_TEXTFILE, 'state': COLLECTOR_STATE,
           'interval_s': d.monitoring.collector_interval_s, 'blackwell_ids': sorted(BLACKWELL_IDS),
           'expect': expect}
    collector.validate_config(json.loads(json.dumps(doc)))
    return json.dumps(doc, indent=1, sort_keys=True) + '\n'


def collector_units(d) -> dict:
    """{unit name: text} of the service (one run) and the timer (every collector_interval_s)."""
    from resources.render import exec_start, render
    for path in (COLLECTOR_SCRIPT, COLLECTOR_TEXTFILE, TEXTFILE_DIR):
        if not _PLAIN_PATH.match(path):
            raise ValueError('%s is written unquoted into a unit file and must be a plain path' % path)
    interval = d.monitoring.collector_interval_s
    return {
        COLLECTOR_SERVICE: render('gpuhost-collector.service.j2', interval=interval, textfile=COLLECTOR_TEXTFILE,
                                  script=COLLECTOR_SCRIPT, textfile_dir=TEXTFILE_DIR, timeout=COLLECTOR_TIMEOUT_S,
                                  exec_start=exec_start([COLLECTOR_SCRIPT, '--config', COLLECTOR_CONFIG])),
        COLLECTOR_TIMER: render('gpuhost-collector.timer.j2', interval=interval),
    }


def collector_files(d) -> dict:
    """{path on the host: (content, mode)}: what the collector's resource installs."""
    units = collector_units(d)
    return {COLLECTOR_SCRIPT: (collector_script(), '0755'), COLLECTOR_CONFIG: (collector_config(d), '0644'),
            UNIT_DIR + '/' + COLLECTOR_SERVICE: (units[COLLECTOR_SERVICE], '0644'),
            UNIT_DIR + '/' + COLLECTOR_TIMER: (units[COLLECTOR_TIMER], '0644')}




def host_collector(name, d, opts=None) -> HostCollector:
    """The `collector` resource: everything it writes is known at preview (rendered from the config and
    the program's own modules), so preview shows the exact diff of each file."""
    files = collector_files(d)
    return HostCollector(name, {
        'files': {p: c for p, (c, _) in files.items()},
        'modes': {p: m for p, (_, m) in files.items()}, 'timer': CollectorProvider.TIMER_ON,
        'service_unit': COLLECTOR_SERVICE, 'timer_unit': COLLECTOR_TIMER, 'textfile_dir': TEXTFILE_DIR,
        'script': COLLECTOR_SCRIPT, 'config': COLLECTOR_CONFIG,
        # What the collector writes itself: removed with it.
        'generated': [COLLECTOR_TEXTFILE, COLLECTOR_STATE, COLLECTOR_STATE + '.lock'],
        'dirs': [posixpath.dirname(COLLECTOR_CONFIG), COLLECTOR_STATE_DIR]}, opts)


def __getattr__(name):
    """Release 0.1.0's name of a serving class, now resources/'s (resources/state.py, RELEASE_0_1_0)."""
    return moved(__name__, name)
