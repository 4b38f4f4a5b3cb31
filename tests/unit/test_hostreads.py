"""transport/hostreads.py: the reads of a host that arrive together share one command, each asked once a pass,
and a command that changes the host forgets them; read_batch.sh's output read back byte for byte."""

import threading

import pytest

from transport import hostreads, remote


def test_batch_output_is_read_back_byte_for_byte():
    keys = [('read_file.sh', ('/a',)), ('host_facts.sh', ())]
    body = 'x\tgpuhost-batch\t9\n\xe9\n'.encode()
    data = (b'gpuhost-batch\t0\t4\t%d\t12\n' % len(body) + body + b'missing file' +
            b'gpuhost-batch\t1\t0\t5\t0\nboot\n')
    got = hostreads.parse_batch(data, keys, remote.Result)
    assert got[keys[0]] == remote.Result('x\tgpuhost-batch\t9\n\xe9\n', 'missing file', 4)
    assert got[keys[1]] == remote.Result('boot\n', '', 0)
    with pytest.raises(ValueError, match='before the results of host_facts.sh'):
        hostreads.parse_batch(data[:data.index(b'gpuhost-batch\t1')], keys, remote.Result)


def test_batch_arguments_name_the_reads_and_carry_each_script_once():
    keys = [('host_facts.sh', ('/etc/kernel/cmdline',)), ('host_facts.sh', ()), ('read_file.sh', ('/a b',))]
    args = hostreads.batch_args(keys, lambda name: 'body of ' + name)
    assert args == ['host_facts.sh,read_file.sh', '3', '-1', 'host_facts.sh', '1', '/etc/kernel/cmdline', 'host_facts.sh',
                    '0', 'read_file.sh', '1', '/a b', 'host_facts.sh', 'body of host_facts.sh', 'read_file.sh',
                    'body of read_file.sh']


class Host:
    """run_batch stand-in: counts batches, answers each key with its name and arguments."""

    def __init__(self, fail=None, hold=None):
        self.batches, self.fail, self.hold = [], fail, hold

    def __call__(self, keys):
        self.batches.append(list(keys))
        if self.hold is not None:
            self.hold.wait(5)
        if self.fail is not None:
            raise self.fail
        return {k: remote.Result('%s %s' % k[:2], '', 0 if k[0] != 'read_file.sh' else 4) for k in keys}


@pytest.fixture(autouse=True)
def patient_gather(monkeypatch):
    """The threads released together all join the first batch, however loaded the machine (the window is what
    groups them; its length is not what these tests are about)."""
    monkeypatch.setattr(hostreads, 'GATHER_S', 1.0)


def ask_together(key, asks, host):
    out, gate = [None] * len(asks), threading.Barrier(len(asks))

    def one(i):
        gate.wait()
        try:
            out[i] = hostreads.read(key, *asks[i][:2], host, *asks[i][2:])
        except Exception as e:  # noqa: B902
            out[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_reads_arriving_together_go_out_once_and_are_reused_until_the_host_changes():
    key, host = ('h1', 22), Host()
    asks = [('host_facts.sh', ()), ('host_facts.sh', ()), ('check_dir.sh', ('/x',)), ('read_file.sh', ('/a',))]
    got = ask_together(key, asks, host)
    assert len(host.batches) == 1 and sorted(host.batches[0]) == sorted({(n, a) for n, a in asks})
    assert [r.stdout for r in got] == ["host_facts.sh ()", "host_facts.sh ()", "check_dir.sh ('/x',)",
                                       "read_file.sh ('/a',)"]
    # Succeeded: reused; failed on the host (exit 4): asked again.
    assert hostreads.read(key, 'host_facts.sh', [], host).stdout == 'host_facts.sh ()'
    hostreads.read(key, 'read_file.sh', ['/a'], host)
    assert len(host.batches) == 2
    hostreads.forget(key)
    hostreads.read(key, 'host_facts.sh', [], host)
    assert len(host.batches) == 3


def test_a_read_that_overlaps_a_change_is_not_kept():
    key, hold = ('h2', 22), threading.Event()
    host = Host(hold=hold)
    t = threading.Thread(target=lambda: hostreads.read(key, 'host_facts.sh', [], host))
    t.start()
    while not host.batches:
        threading.Event().wait(0.01)
    hostreads.forget(key)        # a write while the read is on the wire
    hold.set()
    t.join()
    host.hold = None
    hostreads.read(key, 'host_facts.sh', [], host)
    assert len(host.batches) == 2


def test_a_batch_that_fails_fails_each_read_in_it():
    key = ('h3', 22)
    host = Host(fail=remote.ConnectionLost('connection to root@h3:22 lost during reading the host'))
    got = ask_together(key, [('host_facts.sh', ()), ('read_file.sh', ('/a',))], host)
    assert all(isinstance(e, remote.ConnectionLost) and 'lost during reading the host' in str(e) for e in got)
    assert len(host.batches) == 1


def test_one_read_with_input_a_batch_gets_the_batchs_stdin():
    """The model's quick look gets its verifier on stdin: it joins the host's other reads; a second quick look with
    another input waits for the next batch, the same one is asked once."""
    keys = [('host_facts.sh', ()), ('model_verify.sh', ('{"dir": "/m"}',), b'\nprogram'), ('check_dir.sh', ('/x',))]
    args = hostreads.batch_args(keys, lambda name: 'body of ' + name)
    assert args[:3] == ['check_dir.sh,host_facts.sh,model_verify.sh', '3', '1']
    assert hostreads.batch_stdin(keys) == b'\nprogram' and hostreads.batch_stdin(keys[:1]) is None
    key, host = ('h4', 22), Host()
    asks = [('host_facts.sh', ()), ('model_verify.sh', ('a',), b'one'), ('model_verify.sh', ('a',), b'one'),
            ('model_verify.sh', ('b',), b'two')]
    got = ask_together(key, asks, host)
    assert [r.stdout for r in got] == ["host_facts.sh ()", "model_verify.sh ('a',)", "model_verify.sh ('a',)",
                                       "model_verify.sh ('b',)"]
    assert len(host.batches) == 2
    assert all(sum(len(k) > 2 for k in b) == 1 for b in host.batches), host.batches


def test_read_batch_script_gives_its_stdin_to_that_request_alone():
    import os
    import subprocess
    from transport.remote import Result
    script = os.path.join(remote.SCRIPTS, 'read_batch.sh')
    keys = [('first.sh', ('a',)), ('reader.sh', ('b',), b'the input'), ('first.sh', ('c d',))]
    bodies = {'first.sh': 'cat; echo "$0:$1"', 'reader.sh': 'echo "$0:$1:$(cat)"; exit 3'}
    out = subprocess.run(['bash', script, 'x'] + hostreads.batch_args(keys, bodies.get)[1:], input=b'the input',
                         capture_output=True, check=True).stdout
    got = hostreads.parse_batch(out, keys, Result)
    assert got == {keys[0]: Result('first.sh:a\n', '', 0), keys[1]: Result('reader.sh:b:the input\n', '', 3),
                   keys[2]: Result('first.sh:c d\n', '', 0)}
