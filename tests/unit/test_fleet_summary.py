"""The fleet table at the end of `make up`, from the stack's outputs."""

from tools.fleet_summary import table


def host(active=True, reboot=False, steps=1, sha='ab' * 32, latency=80):
    return {'sglang_unit': {'active': active}, 'sglang_unit_sha256': sha, 'reboot_required': reboot,
            'speculation': {'resolved': {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': steps}},
            'gpu_assignment': {'a': {'assigned_to': 'container'}, 'b': {'assigned_to': 'vm'}},
            'smoke_test': {'latency_ms': latency}}


def test_one_line_per_host_with_what_an_operator_checks_first():
    text = table({'hosts': {'gpu01': host(), 'gpu02': host(active=False, reboot=True, steps=2, latency=None)}})
    lines = text.splitlines()
    assert lines[0].split() == ['host', 'sglang', 'reboot', 'speculation', 'unit', 'sha256', 'GPUs', 'smoke', 'test']
    assert lines[2].split() == ['gpu01', 'active', 'no', 'EAGLE/1', 'abababababab', 'container:1', 'vm:1', '80', 'ms']
    assert lines[3].split() == ['gpu02', 'DOWN', 'yes', 'EAGLE/2', 'abababababab', 'container:1', 'vm:1', '-']


def test_a_one_host_stack_prints_its_line():
    out = dict(host(sha='cd' * 32), container={'address': '127.0.0.4'})
    assert table(out).splitlines()[2].split()[:5] == ['127.0.0.4', 'active', 'no', 'EAGLE/1', 'cdcdcdcdcdcd']
