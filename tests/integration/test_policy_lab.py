"""The policy pack during `pulumi up` (what `make up` runs, tools/run.sh) on the lab: the lab stack with
its policy config passes every rule and deploys; without its opt-in, a changed unit that binds SGLang to
0.0.0.0 is stopped before its step writes anything into the container."""

import os

from tests.lablib import REPO

POLICY = os.path.join(REPO, 'policy')
LAB_CONFIG = os.path.join(POLICY, 'config.lab.json')
STACK = 'lab'
UNIT = os.path.join('etc', 'systemd', 'system', 'sglang-qwen.service')


def up(lab, *extra, check=True):
    res = lab.pulumi('up', '--yes', '--skip-preview', '--suppress-progress', '--policy-pack', POLICY, *extra,
                     stack=STACK, check=check)
    return res, res.stdout + res.stderr


def test_up_with_the_pack_deploys_the_lab_and_stops_a_violating_change_before_it_writes(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    res, out = up(lab, '--policy-pack-config', LAB_CONFIG)
    assert '[advisory]  relaxed-rules' in out and 'opt-ins: sglang-private-bind: allow_public_bind: true' in out
    assert '[mandatory]' not in out
    with open(os.path.join(lab.ct_root(), UNIT)) as f:
        unit = f.read()
    assert '--port 30000' in unit

    # A valid config change (config/ accepts it), without the lab's opt-in: the unit's step must not run.
    cfg['gpuhost:sglang']['port'] = 30001
    lab.write_stack(STACK, cfg)
    res, out = up(lab, check=False)
    assert res.returncode != 0, out[-4000:]
    assert '[mandatory]  sglang-private-bind' in out and '--host 0.0.0.0, port 30001' in out, out[-4000:]
    with open(os.path.join(lab.ct_root(), UNIT)) as f:
        assert f.read() == unit
    assert lab.unit_starts() == 1
