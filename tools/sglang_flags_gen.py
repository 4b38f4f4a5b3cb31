"""Generate grammar/sglang_flags_data/<version>.json from SGLang's own argument parser.

For every SGLang release in VERSIONS this downloads the wheel from PyPI (cached under
~/.cache/gpuhost/sglang-wheels), extracts its Python sources, imports `sglang.srt.server_args` in an
isolated subprocess (`python -I -S`, a clean environment, one process per version so nothing leaks
between versions) with every third-party module it needs replaced by a permissive stub (torch,
transformers, ...; only the small pure-data dependencies in REAL_DEPS are real), lets
`prepare_server_args` build its `argparse.ArgumentParser` exactly as `python -m
sglang.launch_server` does, stops it at `parse_args`, and dumps every action of that parser.

    .venv/bin/python tools/sglang_flags_gen.py                 # every version in VERSIONS
    .venv/bin/python tools/sglang_flags_gen.py 0.5.22 0.5.23   # some of them
    .venv/bin/python tools/sglang_flags_gen.py --check         # regenerate in memory, diff against the files
    .venv/bin/python tools/sglang_flags_gen.py --verify 0.5.23 # SGLang's parser vs grammar/sglang_argparse
                                                               # and vs the lab's simulated SGLang
    .venv/bin/python tools/sglang_flags_gen.py --verify --declared  # the versions the stacks declare (CI)
    .venv/bin/python tools/sglang_flags_gen.py --lab-table 0.5.23 --out sglang/lab_server_args.json

Each action is dumped with its option strings, dest, nargs, const, default (null unless JSON), choices,
type ("int", "float", "str", "bool", "json" or "other:<module.function>") and action kind (argparse's
registry name, "BooleanOptionalAction", or "other:<Class>" for SGLang's own action classes, whose
`behaviour` is recorded by calling them once: the error they stop SGLang with, or what they set).
`--verify` parses a few thousand generated command lines (every option of SGLang's parser and of the
committed table exact, as --opt=value, abbreviated, mistyped, with a bad or missing value, with each
of its choices) with SGLang's real parser and with the parser grammar/sglang_argparse rebuilds
from the committed table, and lists every disagreement; it checks the lab's simulated SGLang
(lab/fakesglang/sglang/lab_args.py with its lab table) the same way, down to the error line.

`--lab-table` writes the lab's simulated SGLang its argument table (lab_table(): the same dump, made
from the wheel when the lab is built, never read from components/), so a wrong committed table cannot
make the lab agree with the program. Cached by (version, wheel sha256, this file's hash, Python's
minor version) under ~/.cache/gpuhost/sglang-lab-tables ($GPUHOST_CACHE, as tools/bootstrap.sh).

The output is deterministic (sorted keys, sorted set-valued choices, no timestamps, PYTHONHASHSEED=0):
rerunning on the same wheels writes the same bytes. If importing a version is impossible even with
stubs, the version's data falls back to reading `add_cli_args` with `ast` and says so
(`"method": "ast"`); no current version needs it.
"""

import argparse
import ast
import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, 'grammar', 'sglang_flags_data')
GPUHOST_CACHE = os.environ.get('GPUHOST_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'gpuhost')
CACHE = os.path.join(GPUHOST_CACHE, 'sglang-wheels')
LAB_TABLES = os.path.join(GPUHOST_CACHE, 'sglang-lab-tables')
FAKE_ARGS = os.path.join(ROOT, 'lab', 'fakesglang', 'sglang', 'lab_args.py')

# Every sglang release from 0.5.0 to 0.5.23 published on PyPI as a wheel (`pip index versions
# sglang`, 2026-11-30): there is no 0.5.0. Post releases are separate releases and are covered too.
VERSIONS = [
    '0.5.1', '0.5.1.post1', '0.5.1.post2', '0.5.1.post3', '0.5.2', '0.5.3', '0.5.3.post1', '0.5.3.post2',
    '0.5.3.post3', '0.5.4', '0.5.4.post1', '0.5.4.post2', '0.5.4.post3', '0.5.5', '0.5.5.post1', '0.5.5.post2',
    '0.5.5.post3', '0.5.6', '0.5.6.post1', '0.5.6.post2', '0.5.7', '0.5.8', '0.5.8.post1', '0.5.9', '0.5.10',
    '0.5.10.post1', '0.5.11', '0.5.12', '0.5.12.post1', '0.5.13', '0.5.13.post1', '0.5.14', '0.5.15',
    '0.5.15.post1', '0.5.16', '0.5.17', '0.5.18', '0.5.19', '0.5.20', '0.5.21', '0.5.22', '0.5.23',
]

# Small dependencies that shape the parser itself, real wheels, pinned, downloaded like sglang's:
# 0.5.23 declares its arguments as msgspec Structs, and json_list_type refuses bad JSON via orjson.
# Everything else third-party is stubbed.
REAL_DEPS = ['msgspec==0.23.0', 'orjson==3.13.0']

# Only these reach the subprocess: no SGLANG_* variable may change choices or defaults.
CLEAN_ENV = {'PATH': '/usr/bin:/bin', 'LANG': 'C.UTF-8', 'PYTHONHASHSEED': '0', 'HOME': '/nonexistent',
             'CUDA_VISIBLE_DEVICES': ''}


# ---------------------------------------------------------------------------------------------
# Parent side: wheels, subprocesses, files.

@contextlib.contextmanager
def locked(path):
    """An exclusive lock on file `path`: labs started in parallel share one cache."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'a') as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pip_download(spec, dest):
    """The wheel for `spec` (name==version) in dest, downloaded once; returns its path."""
    name, version = spec.split('==')
    prefix = '%s-%s-' % (name.replace('-', '_'), version)
    os.makedirs(dest, exist_ok=True)

    def find():
        hits = sorted(f for f in os.listdir(dest) if f.startswith(prefix) and f.endswith('.whl'))
        return os.path.join(dest, hits[0]) if hits else None

    path = find()
    if path is None:
        # pip writes the wheel into dest as it downloads: another process must not find it half-written.
        with locked(os.path.join(dest, '.download.lock')):
            path = find()
            if path is None:
                with tempfile.TemporaryDirectory(prefix='.download-', dir=dest) as tmp:
                    subprocess.run([sys.executable, '-m', 'pip', 'download', spec, '--no-deps',
                                    '--only-binary=:all:', '-q', '-d', tmp], check=True)
                    for f in os.listdir(tmp):
                        os.replace(os.path.join(tmp, f), os.path.join(dest, f))
                path = find()
        if path is None:
            raise SystemExit('pip download %s left no %s*.whl in %s' % (spec, prefix, dest))
    return path


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            h.update(chunk)
    return h.hexdigest()


def extract(wheel, dest, only_py):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith('/') or '.dist-info/' in name or (only_py and not name.endswith('.py')):
                continue
            z.extract(name, dest)


def generate(version, probe=False, extra=()):
    wheel = pip_download('sglang==' + version, CACHE)
    deps = [pip_download(d, os.path.join(CACHE, 'deps')) for d in REAL_DEPS]
    with tempfile.TemporaryDirectory(prefix='sglang-flags-') as tmp:
        src, lib = os.path.join(tmp, 'src'), os.path.join(tmp, 'lib')
        extract(wheel, src, only_py=True)
        for d in deps:
            extract(d, lib, only_py=False)
        proc = subprocess.run([sys.executable, '-I', '-S', os.path.abspath(__file__), '--dump', src, lib]
                              + (['--probe'] if probe else []), input=json.dumps(list(extra)),
                              env=CLEAN_ENV, cwd=tmp, capture_output=True, text=True)
        if probe:
            if proc.returncode != 0:
                raise SystemExit('sglang %s: cannot load the real parser to verify against:\n%s'
                                 % (version, proc.stderr))
            return json.loads(proc.stdout)
        if proc.returncode == 0:
            data = json.loads(proc.stdout)
        else:
            sys.stderr.write(proc.stderr)
            sys.stderr.write('sglang %s: import with stubs failed; falling back to ast\n' % version)
            data = ast_dump(src)
            data['import_error'] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'exit %d' % proc.returncode
    data['version'] = version
    data['source'] = {'wheel': os.path.basename(wheel), 'sha256': sha256(wheel),
                      'real_dependencies': [os.path.basename(d) for d in deps]}
    return data


def render(data):
    """Stable text: top-level keys sorted, one action per line (keys sorted). In an action a missing
    choices/const/default/nargs/type means null and a missing required means false."""
    lines = ['{']
    keys = sorted(data)
    for i, key in enumerate(keys):
        comma = ',' if i < len(keys) - 1 else ''
        if key == 'actions':
            lines.append('  "actions": [')
            acts = data['actions']
            for j, a in enumerate(acts):
                a = {k: v for k, v in a.items() if not (v is None or (k == 'required' and v is False))}
                lines.append('    ' + json.dumps(a, sort_keys=True, separators=(',', ':'))
                             + (',' if j < len(acts) - 1 else ''))
            lines.append('  ]' + comma)
        else:
            lines.append('  %s: %s%s' % (json.dumps(key), json.dumps(data[key], sort_keys=True,
                                                                   separators=(',', ':')), comma))
    lines.append('}')
    return '\n'.join(lines) + '\n'


def code_hash():
    """What a dump depends on besides the wheel: this file (the stubs, the dump, REAL_DEPS' pins) and
    the interpreter's argparse (its minor version)."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), 'rb') as f:
        h.update(f.read())
    h.update(('python %d.%d' % sys.version_info[:2]).encode())
    return h.hexdigest()


def write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', dir=d)
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def lab_table_text(version):
    """The lab's simulated SGLang's argument table for SGLang `version` (lab_server_args.json's text):
    the parser of the release's wheel dumped as for grammar/sglang_flags_data, but made here from
    the wheel, never read from there. Cached by (version, wheel sha256, code_hash()): after the first
    time it costs a hash of the cached wheel."""
    wheel = pip_download('sglang==' + version, CACHE)
    path = os.path.join(LAB_TABLES, '%s-%s-%s.json' % (version, sha256(wheel)[:16], code_hash()[:16]))
    if not os.path.exists(path):
        with locked(os.path.join(LAB_TABLES, '.lock')):
            if not os.path.exists(path):
                data = generate(version)
                if data['method'] != 'import':
                    # The ast fallback keeps only literal arguments: a lab parser built from it would accept
                    # what SGLang refuses.
                    raise SystemExit('sglang %s: its parser could not be imported (%s); no lab table from the '
                                     'ast fallback' % (version, data.get('import_error')))
                write_atomic(path, render(data))
    with open(path) as f:
        return f.read()


def lab_table(version, out):
    """Write the lab's simulated SGLang's argument table for SGLang `version` to file `out` (replaced
    atomically), for the package's sglang/lab_server_args.json. Returns `out`."""
    write_atomic(out, lab_table_text(version))
    return out


def declared_versions():
    """The SGLang versions the program is set to install: config's default and the version every stack
    file (Pulumi.<stack>.yaml) declares, a fleet host's own included. Oldest first."""
    sys.path.insert(0, ROOT)
    import yaml
    import config
    found = {config.Sglang.model_fields['version'].default}
    for name in sorted(os.listdir(ROOT)):
        if not (name.startswith('Pulumi.') and name.endswith('.yaml')) or name == 'Pulumi.yaml':
            continue
        with open(os.path.join(ROOT, name)) as f:
            cfg = (yaml.safe_load(f) or {}).get('config') or {}
        hosts = cfg.get('gpuhost:hosts') if isinstance(cfg.get('gpuhost:hosts'), list) else []
        for sg in [cfg.get('gpuhost:sglang')] + [h.get('sglang') for h in hosts if isinstance(h, dict)]:
            if isinstance(sg, dict) and sg.get('version'):
                found.add(str(sg['version']))
    return sorted(found, key=version_key)


def version_key(version):
    head, _, post = version.partition('.post')
    return tuple(int(x) for x in head.split('.')) + (int(post) + 1 if post else 0,)


def real_answers(version, extra=()):
    """SGLang's own parser on the command lines probes() makes from its actions and on `extra` ones:
    [(argv, answer)], answer {"exit": None, "values": {dest: value}} (JSON values only) or {"exit":
    status or "exception", "message": its last line on stderr}."""
    real = generate(version, probe=True, extra=extra)
    unordered = set(real['unordered_choices'])
    out, first = [], None
    for argv, r in zip(real['probes'], real['results']):
        if r['exit'] is None and 'changed' in r:
            values = dict(first)
            values.update(r['changed'])
            for k in r['opaque']:
                values.pop(k, None)
            r = {'exit': None, 'values': values}
        elif r['exit'] is None:
            first = r['values']
        else:
            m = CHOICE_ERROR.match(r['message'])
            if m and m.group(2) in unordered:
                r = dict(r, unordered=True)
        out.append((argv, r))
    return out


# argparse's message for a value outside the choices (Python 3.11: quoted with repr).
CHOICE_ERROR = re.compile(r'^(.*: error: argument (\S+): invalid choice: .*\(choose from )(.*)\)$')


def same_error(want, got):
    """Is error line `got` SGLang's `want`? A set's choices are listed in any order."""
    if want['message'] == got or not want.get('unordered'):
        return want['message'] == got
    a, b = CHOICE_ERROR.match(want['message']), CHOICE_ERROR.match(got or '')
    return bool(b) and a.group(1) == b.group(1) and sorted(a.group(3).split(', ')) == sorted(b.group(3).split(', '))


def verify(version):
    """Parse generated command lines with SGLang's real parser, with grammar/sglang_argparse rebuilt
    from the committed table and with the lab's simulated SGLang (its table from lab_table_text());
    returns (number of command lines, {parser: [(argv, disagreement), ...]}).
    The command lines come from SGLang's actions and from the committed table's: a flag or a choice
    the table has and SGLang lacks is tried too."""
    sys.path.insert(0, ROOT)
    from grammar import sglang_argparse
    answers = real_answers(version, probes(sglang_argparse.table(version)['actions']))
    return len(answers), {'grammar/sglang_argparse': verify_program(sglang_argparse, version, answers),
                          'lab/fakesglang': verify_lab(version, answers)}


def verify_program(sglang_argparse, version, answers):
    table = sglang_argparse.table(version)
    kinds = {}
    for a in table['actions']:
        kinds[a['dest']] = a.get('type') or ''
    bad = []
    for argv, want in answers:
        try:
            got, _ = sglang_argparse.parse(version, argv)
            err = None
        except sglang_argparse.FlagError as e:
            got, err = None, e
        if want['exit'] is None:
            if err is not None:
                bad.append((argv, 'SGLang accepts, rebuilt refuses: %s' % err))
                continue
            for dest, value in want['values'].items():
                if kinds.get(dest, '').startswith('other:') or dest not in got:
                    continue  # a stubbed custom type's value (e.g. orjson.loads) is not comparable
                if got[dest] != value:
                    bad.append((argv, '%s: SGLang %r, rebuilt %r' % (dest, value, got[dest])))
        elif err is None:
            bad.append((argv, 'SGLang refuses (%s), rebuilt accepts' % want['message']))
        elif want['exit'] == 0 and err.kind != 'help':
            bad.append((argv, 'SGLang prints help, rebuilt: %s' % err))
    return bad


def verify_lab(version, answers):
    """The lab's simulated SGLang (lab/fakesglang/sglang/lab_args.py, a plain argparse parser built from
    its table) against SGLang's: the same exit status and last stderr line, or the same values."""
    import importlib.util
    import io
    spec = importlib.util.spec_from_file_location('gpuhost_lab_args', FAKE_ARGS)
    lab_args = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab_args)
    parser = lab_args.build_parser(json.loads(lab_table_text(version)))
    # argparse formats the whole usage (~500 options) before each error; only the error line is compared.
    usage = parser.format_usage()
    parser.format_usage = lambda: usage
    bad = []
    for argv, want in answers:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                got = vars(parser.parse_args(argv))
            status = message = None
        except SystemExit as e:
            got = None
            lines = err.getvalue().strip().splitlines()
            status, message = ('exception', e.code) if isinstance(e.code, str) else (e.code, lines[-1] if lines else '')
        if want['exit'] is not None or status is not None:
            if status != want['exit'] or not same_error(want, message):
                bad.append((argv, 'SGLang: %s %r, lab: %s %r' % (want['exit'], want.get('message'), status, message)))
            continue
        for dest, value in want['values'].items():
            if dest not in got or got[dest] != value:
                bad.append((argv, '%s: SGLang %r, lab %r' % (dest, value, got.get(dest, '(none)'))))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('versions', nargs='*', help='default: every version in VERSIONS')
    ap.add_argument('--check', action='store_true', help='regenerate and compare with the committed files; '
                                                         'exit 1 on any difference')
    ap.add_argument('--verify', action='store_true', help='parse generated command lines with SGLang\'s real '
                    'parser, with grammar/sglang_argparse and with the lab\'s simulated SGLang; exit 1 on any '
                    'disagreement')
    ap.add_argument('--declared', action='store_true', help='the versions config\'s default and the stacks '
                    '(Pulumi.<stack>.yaml) declare, instead of listing them')
    ap.add_argument('--lab-table', metavar='VERSION', help='write the lab\'s simulated SGLang its argument table '
                    'for VERSION (to --out), from the wheel\'s parser')
    ap.add_argument('--out', metavar='FILE', help='where --lab-table writes (e.g. <package>/sglang/lab_server_args.json)')
    args = ap.parse_args(argv)
    if args.lab_table or args.out:
        if not (args.lab_table and args.out) or args.versions or args.check or args.verify or args.declared:
            ap.error('--lab-table VERSION goes with --out FILE and nothing else')
        lab_table(args.lab_table, args.out)
        return 0
    versions = args.versions or (declared_versions() if args.declared else VERSIONS)
    if args.verify:
        failed = False
        for version in versions:
            try:
                n, bad = verify(version)
            except ValueError as e:  # no committed table for it
                print('%-12s %s' % (version, e))
                failed = True
                continue
            for who, found in bad.items():
                print('%-12s %-28s %5d command lines, %d disagreements' % (version, who, n, len(found)))
                for argv_, why in found[:20]:
                    print('    %s: %s' % (' '.join(argv_), why))
                failed = failed or bool(found)
        return 1 if failed else 0
    os.makedirs(OUT, exist_ok=True)
    different = []
    for version in versions:
        text = render(generate(version))
        path = os.path.join(OUT, version + '.json')
        old = open(path).read() if os.path.exists(path) else None
        if args.check:
            if old != text:
                different.append(version)
            continue
        if old != text:
            with open(path, 'w') as f:
                f.write(text)
        n = text.count('\n    {')
        print('%-12s %4d actions %7d bytes%s' % (version, n, len(text), '' if old != text else ' (unchanged)'))
    if args.check:
        print('differ: %s' % (', '.join(different) or 'none'))
        return 1 if different else 0
    return 0


# ---------------------------------------------------------------------------------------------
# Child side (`--dump SRC LIB`, run with -I -S): stubs, the real parser, the dump.

STUB_VERSION = '0.0.0'
# The reference platform is Linux with CUDA: what SGLang's platform probes read from torch says so,
# and the other accelerators' modules are absent (a stub would make e.g. `import torch_npu` succeed).
STUB_ATTRIBUTES = {
    'torch': {'__version__': '2.9.1+cu130'},
    'torch.version': {'cuda': '13.0', 'hip': None, 'musa': None, 'xpu': None, 'git_version': ''},
}
# Attributes real torch lacks on that platform (`hasattr(torch, "npu")` is how SGLang detects Ascend).
STUB_MISSING = {'torch.npu', 'torch.musa', 'torch.hpu', 'torch.mlu'}
ABSENT = {'torch_npu', 'torch_musa', 'torchada', 'habana_frameworks', 'intel_extension_for_pytorch', 'mlx',
          'aiter', 'java', 'org', 'vllm', 'torch_xla', 'tpu_inference', 'sgl_kernel_npu'}


def install_stubs(src, lib):
    import importlib
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import types

    stubbed, failed, absent = set(), set(), set()

    def ignore(*a, **k):
        return None

    class StubMeta(type):
        """Classes standing in for anything in a stubbed module: attributes, calls, subscripts,
        unions and iteration all succeed; a stub called with just a function returns it unchanged,
        so stubbed decorators keep the decorated function."""

        def __getattr__(cls, name):
            if name.startswith('__') and name.endswith('__'):
                raise AttributeError(name)
            sub = make_class(cls.__qualname__ + '.' + name, cls.__module__)
            type.__setattr__(cls, name, sub)
            return sub

        def __call__(cls, *a, **k):
            if cls.__dict__.get('_gpuhost_stub') and len(a) == 1 and not k and callable(a[0]):
                return a[0]
            return type.__call__(cls, *a, **k)

        def __getitem__(cls, item):
            return cls

        def __or__(cls, other):
            return cls

        __ror__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __or__
        __rtruediv__ = __floordiv__ = __mod__ = __pow__ = __and__ = __rand__ = __or__

        def __neg__(cls):
            return cls

        __pos__ = __abs__ = __invert__ = __neg__

        def __iter__(cls):
            return iter(())

        def __len__(cls):
            return 0

        def __bool__(cls):
            return False

        def __instancecheck__(cls, obj):
            return cls.__dict__.get('_gpuhost_stub') is None and type.__instancecheck__(cls, obj)

    class Stub(metaclass=StubMeta):
        _gpuhost_stub = True

        def __init__(self, *a, **k):
            pass

        def __getattr__(self, name):
            if name.startswith('__') and name.endswith('__'):
                raise AttributeError(name)
            return Stub()

        def __call__(self, *a, **k):
            if len(a) == 1 and not k and callable(a[0]):
                return a[0]
            return Stub()

        def __getitem__(self, item):
            return Stub()

        def __setitem__(self, key, value):
            pass

        def __iter__(self):
            return iter(())

        def __len__(self):
            return 0

        def __bool__(self):
            return False

        def __int__(self):
            return 0

        __index__ = __int__

        def __float__(self):
            return 0.0

        def __str__(self):
            return ''

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def __eq__(self, other):
            return other is self

        def __hash__(self):
            return id(self)

        def __lt__(self, other):
            return False

        __le__ = __gt__ = __ge__ = __lt__

        def __add__(self, other):
            return self

        __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __floordiv__ = __add__
        __mod__ = __pow__ = __or__ = __ror__ = __and__ = __rand__ = __add__

        def __neg__(self):
            return self

        __pos__ = __abs__ = __invert__ = __neg__

        def __contains__(self, item):
            return False

    def make_class(qualname, module):
        cls = StubMeta(qualname.rsplit('.', 1)[-1], (Stub,), {'_gpuhost_stub': True, '__module__': module})
        cls.__qualname__ = qualname
        return cls

    class StubModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith('__') and name.endswith('__') or self.__name__ + '.' + name in STUB_MISSING:
                raise AttributeError(name)
            value = make_class(name, self.__name__)
            setattr(self, name, value)
            return value

    class StubLoader(importlib.abc.Loader):
        def create_module(self, spec):
            m = StubModule(spec.name)
            m.__path__ = []
            m.__version__ = STUB_VERSION
            return m

        def exec_module(self, module):
            for key, value in STUB_ATTRIBUTES.get(module.__name__, {}).items():
                setattr(module, key, value)
            for name in STUB_ATTRIBUTES:
                if name.rpartition('.')[0] == module.__name__:
                    setattr(module, name.rpartition('.')[2], importlib.import_module(name))

    class Fallback(importlib.abc.MetaPathFinder):
        """Last on sys.meta_path: whatever no real finder has becomes a stub module."""

        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ABSENT:
                absent.add(name.split('.')[0])
                return None
            stubbed.add(name)
            return importlib.machinery.ModuleSpec(name, StubLoader(), is_package=True)

    class Guarded(importlib.abc.Loader):
        """Runs an sglang module; if it raises, keeps what it defined and stubs the rest."""

        def __init__(self, inner):
            self.inner = inner

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            try:
                self.inner.exec_module(module)
            except Exception as e:
                if module.__name__ == 'sglang.srt.server_args':
                    raise
                import traceback
                sys.stderr.write('stubbing %s after it raised:\n%s' % (module.__name__, traceback.format_exc()))
                failed.add('%s (%s: %s)' % (module.__name__, type(e).__name__, str(e).splitlines()[0][:120]
                                            if str(e) else ''))
                module.__class__ = StubModule
                sys.modules[module.__name__] = module

    class SglangFinder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != 'sglang' and not name.startswith('sglang.'):
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path if path is not None else [src])
            if spec is None or spec.loader is None:
                return None
            spec.loader = Guarded(spec.loader)
            return spec

    sys.path[:0] = [src, lib]
    sys.meta_path.insert(0, SglangFinder())
    sys.meta_path.append(Fallback())
    # Silence whatever the stubs make sglang print or warn at import time.
    import logging
    import warnings
    logging.disable(logging.CRITICAL)
    warnings.simplefilter('ignore')
    return stubbed, failed, absent


class Captured(BaseException):
    def __init__(self, parser):
        self.parser = parser


def capture_parser():
    """The parser `sglang.launch_server` parses with: prepare_server_args builds it and is stopped at
    its parse call. Returns (parser, how it was obtained)."""
    orig = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def grab(self, *a, **k):
        raise Captured(self)

    import sglang.srt.server_args as sa
    prepare = getattr(sa, 'prepare_server_args', None)
    if prepare is not None:
        argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = grab
        try:
            prepare([])
        except Captured as c:
            return c.parser, 'sglang.srt.server_args.prepare_server_args'
        finally:
            argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = orig
    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    return parser, 'argparse.ArgumentParser() + ServerArgs.add_cli_args'


def jsonable(value):
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError):
        return False


def type_name(t):
    if t is None:
        return None
    if t in (int, float, str, bool):
        return t.__name__
    if t is json.loads:
        return 'json'
    name = getattr(t, '__qualname__', None) or getattr(t, '__name__', None) or type(t).__name__
    return 'other:%s.%s' % (getattr(t, '__module__', '?'), name)


def action_kinds():
    reg = argparse.ArgumentParser()._registries['action']
    kinds = {cls: name for name, cls in reg.items() if name is not None and isinstance(cls, type)}
    kinds[argparse.BooleanOptionalAction] = 'BooleanOptionalAction'
    return kinds


def sample_values(a):
    """What argparse would hand action `a` for one ordinary use of it."""
    if a.choices is not None:
        one = sorted(a.choices, key=str)[0] if isinstance(a.choices, (set, frozenset)) else list(a.choices)[0]
    elif a.type in (int, float):
        one = a.type(1)
    else:
        one = 'v'
    if a.nargs == 0:
        return []
    if a.nargs is None or a.nargs == '?':
        return one
    return [one] * (a.nargs if isinstance(a.nargs, int) else 1)


def behaviour(a, parser):
    """What a custom action does when used: called once with sample values on an empty namespace.
    {"error": message, "raises": "parser.error" | exception class} when it stops SGLang, else
    {"sets": {attribute: {"from_values": true} | {"value": constant}}}."""
    import contextlib
    import io
    ns = argparse.Namespace()
    values = sample_values(a)
    opt = a.option_strings[0] if a.option_strings else None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            a(parser, ns, values, opt)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        msg = lines[-1].split(': error: ', 1)[-1] if lines else ''
        return {'raises': 'parser.error', 'error': msg}
    except Exception as e:
        return {'raises': type(e).__name__, 'error': str(e)}
    sets = {}
    for k, v in sorted(vars(ns).items()):
        if v == values or (isinstance(v, list) and v == ([values] if not isinstance(values, list) else values)):
            sets[k] = {'from_values': True}
        else:
            sets[k] = {'value': v if jsonable(v) else None}
    return {'sets': sets}


def dump_action(a, kinds, parser):
    cls = type(a)
    out = {'option_strings': list(a.option_strings), 'dest': a.dest, 'required': bool(a.required)}
    if cls in kinds:
        out['action'] = kinds[cls]
    else:
        out['action'] = 'other:' + cls.__name__
        base = next((kinds[b] for b in cls.__mro__[1:] if b in kinds), None)
        if base:
            out['action_base'] = base
        # What a custom action was configured with (new_flag, const_value, error_message, ...).
        std = set(vars(argparse.Action([], 'x')))
        extra = {k: v for k, v in sorted(vars(a).items()) if k not in std and jsonable(v)}
        if extra:
            out['action_attrs'] = extra
        out['behaviour'] = behaviour(a, parser)
    out['nargs'] = a.nargs
    out['const'] = a.const if jsonable(a.const) else None
    if not jsonable(a.const):
        out['const_repr'] = type(a.const).__name__
    out['default'] = a.default if jsonable(a.default) else None
    if not jsonable(a.default):
        out['default_repr'] = type(a.default).__name__
    choices = a.choices
    if choices is None:
        out['choices'] = None
    else:
        items = list(choices)
        if isinstance(choices, (set, frozenset)) or not isinstance(choices, (list, tuple, range)):
            items = sorted(items, key=lambda x: (type(x).__name__, str(x)))
        # Non-JSON choices (enum members) are kept as their str(); argparse compares against them.
        out['choices'] = [c if jsonable(c) else str(c) for c in items]
    out['type'] = type_name(a.type)
    return out


def probes(actions):
    """Command lines exercising every option: exact, --opt=value, abbreviated, mistyped, a bad
    value, a missing value, every choice. Deterministic."""
    base = ['--model-path', '/m']
    opts = [o for a in actions for o in a['option_strings']]
    out = [[], list(base), base + ['--'], base + ['-h'], base + ['--no-such-flag', '1'], base + ['-x']]

    def value(a):
        t = a.get('type') or ''
        if a.get('choices'):
            return str(a['choices'][0])
        return {'int': '3', 'float': '0.5', 'json': '{}'}.get(t) or (
            '1k' if t.endswith('human_readable_int') else '[]' if t.endswith('json_list_type')
            else '{}' if t.endswith('config_arg') else 'breakable' if t.endswith('backend_arg') else 'v')

    def bad(a):
        t = a.get('type') or ''
        if a.get('choices'):
            return 'zzz'
        if t in ('int', 'float') or t.endswith('human_readable_int'):
            return 'abc'
        if t == 'json' or t.endswith('json_list_type') or t.endswith('config_arg'):
            return '{'
        return None

    for a in actions:
        if a['dest'] == 'help':
            continue
        nargs = a.get('nargs')
        takes = nargs != 0
        vals = [] if not takes else [value(a)] * (nargs if isinstance(nargs, int) else 1)
        for o in a['option_strings']:
            out.append(base + [o] + vals)
            if takes:
                out.append(base + ['%s=%s' % (o, vals[0])])
                out.append(base + [o])
                if bad(a) is not None:
                    out.append(base + [o, bad(a)])
            if o.startswith('--') and len(o) > 4:
                for cut in (1, 3, len(o) // 2):
                    out.append(base + [o[:-cut]] + vals)
                swapped = o[:3] + o[4] + o[3] + o[5:]
                if swapped not in opts:
                    out.append(base + [swapped] + vals)
        if takes and a['option_strings'] and a.get('choices'):
            for c in a['choices'][1:]:
                out.append(base + [a['option_strings'][0]] + [str(c)] * len(vals))
    return out


def real_results(parser, argvs):
    """What SGLang's own parser does with each argv: ok (and the values) or its exit status and message.
    The first accepted argv has every JSON value ("values"); the others only the values that differ from
    it ("changed", and "opaque": those no longer JSON), which real_answers() expands."""
    import io
    # argparse formats the whole usage (~500 options) before each error: 40% of the run's time. It depends
    # on the parser only and is not compared, so it is formatted once.
    usage = parser.format_usage()
    parser.format_usage = lambda: usage
    results = []
    first = None
    for argv in argvs:
        err, outp = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(outp):
                ns = parser.parse_args(argv)
        except SystemExit as e:
            lines = err.getvalue().strip().splitlines()
            results.append({'exit': e.code, 'message': lines[-1] if lines else ''})
            continue
        except Exception as e:  # an assert in a custom action, say
            results.append({'exit': 'exception', 'message': '%s: %s' % (type(e).__name__, e)})
            continue
        values = vars(ns)
        if first is None:
            first = values
            results.append({'exit': None, 'values': {k: v for k, v in sorted(values.items()) if jsonable(v)}})
            continue
        changed = sorted(k for k, v in values.items() if k not in first or not same(v, first[k]))
        results.append({'exit': None, 'changed': {k: values[k] for k in changed if jsonable(values[k])},
                        'opaque': [k for k in changed if not jsonable(values[k])]})
    return results


def same(a, b):
    return a is b or (type(a) is type(b) and a == b)


def field_renames(sa):
    """{argparse dest: ServerArgs field} for the copies ServerArgs.from_cli_args makes before it reads
    the namespace (0.5.1-0.5.13: `args.tp_size = args.tensor_parallel_size`, ...)."""
    import inspect
    import textwrap
    fn = getattr(getattr(sa, 'ServerArgs', None), 'from_cli_args', None)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (TypeError, OSError, SyntaxError):
        return {}
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t, v = node.targets[0], node.value
            if (isinstance(t, ast.Attribute) and isinstance(v, ast.Attribute) and isinstance(t.value, ast.Name)
                    and isinstance(v.value, ast.Name) and t.value.id == v.value.id == 'args'):
                out[v.attr] = t.attr
    return out


def child_dump(src, lib, probe=False):
    # As under `python -m sglang.launch_server`: the parser's default prog is this file's name.
    sys.argv[:] = [os.path.join(src, 'sglang', 'launch_server.py')]
    stubbed, failed, absent = install_stubs(src, lib)
    parser, how = capture_parser()
    kinds = action_kinds()
    groups = []
    for g in parser._mutually_exclusive_groups:
        groups.append({'required': bool(g.required), 'dests': [a.dest for a in g._group_actions]})
    data = {
        'method': 'import',
        'parser': {'allow_abbrev': parser.allow_abbrev, 'prefix_chars': parser.prefix_chars, 'prog': parser.prog,
                   'add_help': parser.add_help, 'built_by': how, 'mutually_exclusive_groups': groups,
                   'dest_to_field': field_renames(sys.modules['sglang.srt.server_args']),
                   'fromfile_prefix_chars': parser.fromfile_prefix_chars},
        'actions': [dump_action(a, kinds, parser) for a in parser._actions],
        'stubs': {'third_party': sorted({n.split('.')[0] for n in stubbed if not n.startswith('sglang')}),
                  'sglang_missing': sorted(n for n in stubbed if n.startswith('sglang')),
                  'sglang_failed': sorted(failed), 'absent': sorted(absent)},
    }
    if probe:
        argvs = probes(data['actions'])
        seen = set(map(tuple, argvs))
        for argv in json.load(sys.stdin):  # verify(): the committed table's own command lines
            if tuple(argv) not in seen:
                seen.add(tuple(argv))
                argvs.append(argv)
        # The arguments whose choices the dump sorted (a set's order changes with the hash seed: SGLang
        # lists them in a different order on every start).
        unordered = sorted('/'.join(a.option_strings) for a in parser._actions if a.choices is not None
                           and not isinstance(a.choices, (list, tuple, range)))
        data = {'probes': argvs, 'results': real_results(parser, argvs), 'unordered_choices': unordered}
    sys.stdout.write(json.dumps(data, sort_keys=True))


# ---------------------------------------------------------------------------------------------
# Fallback: read add_cli_args with ast (only literal arguments survive).

def ast_dump(src):
    path = os.path.join(src, 'sglang', 'srt', 'server_args.py')
    with open(path) as f:
        tree = ast.parse(f.read())
    actions = [{'option_strings': ['-h', '--help'], 'dest': 'help', 'action': 'help', 'nargs': 0, 'const': None,
                'default': '==SUPPRESS==', 'choices': None, 'type': None, 'required': False}]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == 'add_argument'):
            continue
        opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not opts or not opts[0].startswith('-'):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}

        def lit(name, default=None):
            try:
                return ast.literal_eval(kw[name]) if name in kw else default
            except ValueError:
                return default

        action = lit('action', 'store')
        if not isinstance(action, str):
            action = 'other:' + ast.unparse(kw['action'])
        long_opts = [o for o in opts if o.startswith('--')]
        dest = lit('dest') or (long_opts[0] if long_opts else opts[0]).lstrip('-').replace('-', '_')
        t = kw.get('type')
        tname = None if t is None else {'int': 'int', 'float': 'float', 'str': 'str', 'json.loads': 'json'}.get(
            ast.unparse(t), 'other:' + ast.unparse(t))
        choices = lit('choices')
        nargs = lit('nargs', 0 if action in ('store_true', 'store_false', 'store_const', 'count') else None)
        actions.append({'option_strings': opts, 'dest': dest, 'action': action, 'nargs': nargs,
                        'const': lit('const', True if action == 'store_true' else False if action == 'store_false'
                                     else None),
                        'default': lit('default', False if action == 'store_true' else True
                                       if action == 'store_false' else None),
                        'choices': list(choices) if isinstance(choices, (list, tuple)) else None,
                        'type': tname, 'required': bool(lit('required', False))})
    return {'method': 'ast', 'actions': actions,
            'parser': {'allow_abbrev': True, 'prefix_chars': '-', 'prog': None, 'add_help': True, 'dest_to_field': {},
                       'built_by': 'ast of add_cli_args (literal arguments only)',
                       'mutually_exclusive_groups': [], 'fromfile_prefix_chars': None}}


if __name__ == '__main__':
    if len(sys.argv) in (4, 5) and sys.argv[1] == '--dump':
        child_dump(sys.argv[2], sys.argv[3], probe=sys.argv[4:] == ['--probe'])
    else:
        sys.exit(main())
