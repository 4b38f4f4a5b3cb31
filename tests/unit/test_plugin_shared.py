"""The plugin's stub (provider/bin/gpuhost-stub, built from provider/stub/ by tools/bootstrap.sh, else provider/stub.py):
the engine starts the plugin once per provider instance (one per host) and pass; every instance is served by the
pass's one serving process, each on its own port, and nothing is left running after the pass. The engine's tests run
with both stubs."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import provider_pb2_grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = os.path.join(REPO, 'provider', 'pulumi-resource-gpuhost')
BUILT = os.path.join(REPO, 'provider', 'bin', 'gpuhost-stub')


class Engine:
    """What the plugin sees of the engine: an address that answers (provider/__main__.py exits when it stops)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(('127.0.0.1', 0))
        self.sock.listen(64)
        self.addr = '127.0.0.1:%d' % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.sock.accept()[0].close()
            except OSError:
                return

    def stop(self):
        self.sock.close()


def alive(pid) -> bool:
    try:
        return open('/proc/%d/stat' % pid).read().rpartition(')')[2].split()[0] != 'Z'
    except OSError:
        return False


def serving(addr):
    """PIDs of the serving processes of this engine address: started as such (--serve and the address on their
    command line), or forked by the zygote (named in their pass's directory, provider/passdir.py)."""
    from provider import passdir
    out = []
    for pid in os.listdir('/proc'):
        try:
            cmd = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\0')
        except OSError:
            continue
        if b'--serve' in cmd and addr.encode() in cmd and any(c.endswith(b'provider/__main__.py') for c in cmd):
            out.append(int(pid))
    root = passdir.base()
    for name in os.listdir(root):
        if name.endswith('-' + addr.rpartition(':')[2]):
            try:
                pid = int(open(os.path.join(root, name, 'plugin.pid')).read())
            except (OSError, ValueError):
                continue
            if alive(pid) and pid not in out:
                out.append(pid)
    return out


def answers(port) -> bool:
    with grpc.insecure_channel('127.0.0.1:%s' % port) as ch:
        try:
            provider_pb2_grpc.ResourceProviderStub(ch).GetPluginInfo(empty_pb2.Empty(), timeout=5)
            return True
        except grpc.RpcError:
            return False


def start(engine, n, env=None):
    procs = [subprocess.Popen([PLUGIN, engine.addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, **(env or {}))) for _ in range(n)]
    return procs, [int(p.stdout.readline()) for p in procs]


def gone(pred, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and not pred():
        time.sleep(0.2)
    return pred()


@pytest.fixture(params=['built', 'python'])
def engine(request, monkeypatch):
    """An engine address, and which stub the plugin runs: the built one (skipped where tools/bootstrap.sh had no Go)
    or provider/stub.py (GPUHOST_PLUGIN_STUB=python)."""
    if request.param == 'built':
        if not os.access(BUILT, os.X_OK):
            pytest.skip('provider/bin/gpuhost-stub is not built (tools/bootstrap.sh: no Go)')
        monkeypatch.delenv('GPUHOST_PLUGIN_STUB', raising=False)
    else:
        monkeypatch.setenv('GPUHOST_PLUGIN_STUB', 'python')
    e = Engine()
    e.stub = request.param
    yield e
    e.stop()
    for pid in serving(e.addr):
        os.kill(pid, signal.SIGKILL)


def test_instances_of_a_pass_share_one_serving_process_each_on_its_own_port(engine):
    procs, ports = start(engine, 4)
    try:
        exe = os.readlink('/proc/%d/exe' % procs[0].pid)
        assert exe == BUILT if engine.stub == 'built' else os.path.basename(exe).startswith('python'), exe
        assert len(set(ports)) == 4 and all(answers(p) for p in ports)
        assert len(serving(engine.addr)) == 1
        # The engine ends one instance (SIGINT, as its plugin Close does): that one stops, the others serve on.
        procs[0].send_signal(signal.SIGINT)
        assert procs[0].wait(timeout=10) == 0
        assert gone(lambda: not answers(ports[0]), 10)
        assert all(answers(p) for p in ports[1:])
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait(timeout=10)
    # The pass's instances ended and the CLI exits: the serving process ends too.
    engine.stop()
    assert gone(lambda: not serving(engine.addr), 15), serving(engine.addr)


def test_stubs_end_with_their_cli(engine):
    """A CLI that exits without ending its plugins: each stub notices its parent is gone and ends."""
    parent = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys; p = subprocess.Popen([sys.argv[1], '
                               'sys.argv[2]], stdout=subprocess.PIPE); print(p.pid, p.stdout.readline().decode().strip(),'
                               ' flush=True)', PLUGIN, engine.addr], stdout=subprocess.PIPE, text=True)
    pid, port = map(int, parent.stdout.readline().split())
    assert answers(port)
    parent.wait(timeout=10)
    assert gone(lambda: not os.path.exists('/proc/%d' % pid) or open('/proc/%d/stat' % pid).read().split()[2] == 'Z',
                10)
    assert gone(lambda: not answers(port), 10)


def test_a_killed_cli_leaves_no_process(engine):
    procs, ports = start(engine, 2)
    assert all(answers(p) for p in ports)
    engine.stop()          # the CLI killed: its address stops answering; the stubs are never told
    assert gone(lambda: not serving(engine.addr), 15), serving(engine.addr)
    for p in procs:
        assert p.wait(timeout=10) == 0


def test_a_process_per_instance_when_asked(engine):
    procs, ports = start(engine, 2, env={'GPUHOST_PLUGIN_SHARED': '0'})
    try:
        assert all(answers(p) for p in ports) and not serving(engine.addr)
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
            p.wait(timeout=10)


def test_a_cancel_reaches_the_waits_of_its_own_instance_only():
    """One process serves every instance of a pass: the engine's Cancel of one instance (a refresh's, closed before
    the update's of the same `up --refresh`) never ends a wait of another."""
    from transport import operator
    from provider.__main__ import GpuhostProvider
    a, b = GpuhostProvider(), GpuhostProvider()
    a.Cancel(empty_pb2.Empty(), None)
    assert a.cancelled.is_set() and not b.cancelled.is_set() and not operator.CANCELLED.is_set()
    token = operator.CANCELLED.serving(b.cancelled)
    try:
        operator.pause(0.01, 'host b', 'its job', 'it goes on')          # not interrupted
    finally:
        operator.CANCELLED.reset(token)
    token = operator.CANCELLED.serving(a.cancelled)
    try:
        with pytest.raises(operator.Interrupted, match='host a: interrupted'):
            operator.pause(5, 'host a', 'its job', 'it goes on')
    finally:
        operator.CANCELLED.reset(token)


def zygotes(project):
    """PIDs of the zygotes of a project's plugin (provider/__main__.py --zygote; the serving processes it forked share
    its command line, not its name)."""
    main = os.path.join(str(project), 'provider', '__main__.py').encode()
    out = []
    for pid in os.listdir('/proc'):
        try:
            cmd = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\0')
            name = open('/proc/%s/comm' % pid).read().strip()
        except OSError:
            continue
        if main in cmd and name == 'gpuhost-zygote' and alive(int(pid)):
            out.append(int(pid))
    return out


def one_pass(plugin, env=None, prefix=()):
    """A pass of one instance (its stub run by `prefix`, a command that execs it: `nice -n 5`): its serving process's
    pid and name, once the instance answered."""
    engine = Engine()
    try:
        proc = subprocess.Popen(list(prefix) + [plugin, engine.addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, **(env or {})))
        try:
            assert answers(int(proc.stdout.readline()))
            pids = serving(engine.addr)
            assert len(pids) == 1, pids
            return pids[0], open('/proc/%d/comm' % pids[0]).read().strip()
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
    finally:
        engine.stop()


@pytest.fixture
def project(tmp_path):
    """A copy of the plugin, with zygotes of its own (ended after the test)."""
    import shutil
    project = tmp_path / 'project'
    for name in ('provider', 'resources', 'transport', 'hostscripts', 'grammar', 'config'):
        shutil.copytree(os.path.join(REPO, name), str(project / name),
                        ignore=shutil.ignore_patterns('__pycache__', '*.log'))
    os.symlink(os.path.join(REPO, '.venv'), str(project / '.venv'))
    try:
        yield project
    finally:
        for pid in zygotes(project):
            os.kill(pid, signal.SIGKILL)


def test_each_pass_is_served_by_a_fork_of_the_zygote_which_a_changed_file_replaces(project):
    """The zygote has loaded what a serving process loads and forks one per pass; once a file it loaded changes (an
    upgrade of the plugin in place), the next pass gets a fresh zygote that runs the new code."""
    plugin = str(project / 'provider' / 'pulumi-resource-gpuhost')
    first, name = one_pass(plugin, env={'PULUMI_CONFIG_PASSPHRASE': 'the-first-cli-s-own'})
    assert name == 'gpuhost-serve'
    [zygote] = zygotes(project)
    # What it keeps of the CLI that started it: nothing of its environment but what decides Python's imports.
    assert b'the-first-cli-s-own' not in open('/proc/%d/environ' % zygote, 'rb').read()
    second, name = one_pass(plugin)
    assert name == 'gpuhost-serve' and second != first and zygotes(project) == [zygote]
    # Off: the pass's serving process started afresh (its own command line), the zygote not asked.
    third, name = one_pass(plugin, env={'GPUHOST_PLUGIN_ZYGOTE': '0'})
    assert name != 'gpuhost-serve' and b'--serve' in open('/proc/%d/cmdline' % third, 'rb').read()
    # The plugin's code changed: the zygote ends, a new one serves the pass.
    with open(str(project / 'provider' / 'VERSION'), 'a') as f:
        f.write('\n')
    fourth, name = one_pass(plugin)
    assert name == 'gpuhost-serve'
    assert gone(lambda: zygote not in zygotes(project), 10) and len(zygotes(project)) == 1


def nice(pid) -> int:
    return int(open('/proc/%d/stat' % pid).read().rpartition(')')[2].split()[16])


def open_files(pid) -> str:
    return next(' '.join(line.split()[3:5]) for line in open('/proc/%d/limits' % pid) if line.startswith('Max open'))


def can_unshare() -> bool:
    try:
        return subprocess.run(['unshare', '-n', 'true'], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_a_stub_of_another_nice_level_or_limit_gets_a_serving_process_that_has_them(project):
    """A fork has the zygote's nice level and limits: a stub that differs (`nice -n 5`, `prlimit`) is never served by
    a fork of the zygote of the stubs that do not (issue 58) - its serving process has its stub's."""
    plugin = str(project / 'provider' / 'pulumi-resource-gpuhost')
    default, _ = one_pass(plugin)
    [zygote] = zygotes(project)
    assert nice(default) == nice(os.getpid()) != 5 and open_files(default) == open_files(os.getpid()) != '512 1024'
    niced, _ = one_pass(plugin, prefix=['nice', '-n', '5'])
    assert nice(niced) == 5
    limited, _ = one_pass(plugin, prefix=['prlimit', '--nofile=512:1024'])
    assert open_files(limited) == '512 1024' and nice(limited) == nice(os.getpid())
    assert zygote in zygotes(project)


# A peer of the zygote: the answer to a request for a pass of a dead engine, whose serving process logs to argv[3].
ASK = ('import json, socket, sys\n'
       's = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n'
       's.connect(sys.argv[1])\n'
       's.sendall(json.dumps({"argv": [sys.argv[2]], "env": {"GPUHOST_PASS_DIR": sys.argv[4]}, "cwd": "/",\n'
       '                      "umask": 0o77, "log": sys.argv[3]}).encode())\n'
       's.shutdown(socket.SHUT_WR)\n'
       'print(s.makefile().readline().strip())\n')


def test_the_zygote_forks_for_no_peer_of_another_identity(project, tmp_path):
    """The zygote reads its peer's identity (provider/identity.py) from /proc/<peer pid> on every request and forks
    only for its own: a request from another nice level, limit, network or pid namespace is answered `other`, and
    nothing is forked (no serving process opened the request's log)."""
    plugin = str(project / 'provider' / 'pulumi-resource-gpuhost')
    one_pass(plugin)
    [zygote] = zygotes(project)
    path = open('/proc/%d/cmdline' % zygote, 'rb').read().split(b'\0')[-2].decode()
    assert path.endswith('.sock')
    others = [['nice', '-n', '5'], ['prlimit', '--nofile=512:1024']]
    if can_unshare():
        others += [['unshare', '-n'], ['unshare', '-p', '-f']]
    engine = Engine()
    try:
        for i, prefix in enumerate(others + [[]]):
            here, log = tmp_path / ('pass%d' % i), tmp_path / ('pass%d.log' % i)
            here.mkdir()
            answer = subprocess.run(prefix + [sys.executable, '-I', '-c', ASK, path, engine.addr, str(log), str(here)],
                                    capture_output=True, text=True, timeout=30)
            assert answer.returncode == 0, answer.stderr
            if prefix:
                assert (answer.stdout.strip(), log.exists()) == ('other', False), prefix
            else:
                # The same request from a peer of its own identity: forked.
                assert answer.stdout.strip() == 'ok'
                assert gone(lambda: (here / 'plugin.pid').exists(), 20)
                os.kill(int((here / 'plugin.pid').read_text()), signal.SIGKILL)
        assert zygotes(project) == [zygote]
    finally:
        engine.stop()


# In a network namespace of its own (its loopback up): a pass's stub and engine, and the serving process's namespace.
IN_NETNS = ('import fcntl, json, os, signal, socket, struct, subprocess, sys\n'
            's = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n'
            'flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]\n'
            'fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))\n'
            'from tests.unit.test_plugin_shared import Engine, answers, serving\n'
            'engine = Engine()\n'
            'proc = subprocess.Popen([sys.argv[1], engine.addr], stdout=subprocess.PIPE)\n'
            'out = {"answers": answers(int(proc.stdout.readline())), "serving": serving(engine.addr),\n'
            '       "mine": os.readlink("/proc/self/ns/net")}\n'
            'out["net"] = [os.readlink("/proc/%d/ns/net" % pid) for pid in out["serving"]]\n'
            'proc.send_signal(signal.SIGINT)\n'
            'proc.wait(timeout=10)\n'
            'engine.stop()\n'
            'for pid in out["serving"]:\n'
            '    os.kill(pid, signal.SIGKILL)\n'
            'print(json.dumps(out))\n')


def test_a_stub_in_another_network_namespace_is_served_in_its_own(project):
    """`make preview` in the default network namespace, then the same inside `unshare -n` within the zygote's minute:
    the second pass's serving process listens on its own namespace's loopback, which its engine reaches - not a fork
    of the first pass's zygote, which listened on the default one (issue 58)."""
    if not can_unshare():
        pytest.skip('unshare -n is not permitted here')
    import json
    plugin = str(project / 'provider' / 'pulumi-resource-gpuhost')
    one_pass(plugin)
    [zygote] = zygotes(project)
    res = subprocess.run(['unshare', '-n', sys.executable, '-c', IN_NETNS, plugin], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out['answers'] and len(out['serving']) == 1, out
    assert out['net'] == [out['mine']] and out['mine'] != os.readlink('/proc/%d/ns/net' % zygote), out
    assert zygote in zygotes(project)
