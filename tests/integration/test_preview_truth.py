"""Preview tells the truth: for a set of config changes on a deployed stack, the resources `pulumi
preview` lists as changing are exactly the ones `pulumi up` then changes, and a changed SGLang flag
shows in the diff as that flag (not hidden in a long ExecStart= line)."""

import copy
import json
import re

import pytest

pytestmark = pytest.mark.slow
STACK = 'truth'
C, S = 'gpuhost:container', 'gpuhost:sglang'


def change(cfg, *pairs):
    cfg = copy.deepcopy(cfg)
    for path, value in pairs:
        node = cfg
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return cfg


CHANGES = [
    ('container cores', [((C, 'cores'), 16)]),
    ('MTP steps', [((S, 'speculative'), {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                         'num_draft_tokens': 3})]),
    ('nvidia option', [(('gpuhost:nvidia', 'dma_remap_peer_mmio'), 0)]),
    ('IOMMU strict', [(('gpuhost:iommu', 'domain'), 'DMA')]),
    ('service environment', [((S, 'environment'), {'NCCL_DEBUG': 'WARN'})]),
    ('cores and MTP', [((C, 'cores'), 24), ((S, 'speculative'), {'algorithm': 'NEXTN', 'num_steps': 3,
                                                                  'eagle_topk': 1, 'num_draft_tokens': 4})]),
    ('VM memory', [(('gpuhost:vm', 'memory_mb'), 131072)]),
]


@pytest.fixture(scope='module')
def deployed(lab):
    """The config the stack is deployed with now (the base first): each change goes from wherever the last
    one left the stack, so no up is spent going back - and the transitions (undo one change, make another)
    are checked too."""
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    return {'base': cfg, 'now': cfg}


def deploy(lab, deployed, cfg):
    if deployed['now'] != cfg:
        lab.write_stack(STACK, cfg)
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
        deployed['now'] = cfg


def planned(lab):
    plan = json.loads(lab.pulumi('preview', '--json', stack=STACK).stdout)
    return {s['urn'].split('::')[-1] for s in plan['steps']
            if s['op'] != 'same' and ('gpuhost:index:' in s['urn'] or 'command:remote' in s['urn'])}, plan


def applied(out):
    return set(re.findall(r'(?:gpuhost:index:\w+|command:remote:Command) (\S+) '
                          r'(?:updated|created|replaced|deleted)', out))


@pytest.mark.parametrize('name,pairs', CHANGES, ids=[c[0] for c in CHANGES])
def test_preview_lists_exactly_what_up_changes(lab, deployed, name, pairs):
    cfg = change(deployed['base'], *pairs)
    lab.write_stack(STACK, cfg)
    listed, _ = planned(lab)
    assert listed, '%s: preview lists no change' % name
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    deployed['now'] = cfg
    assert applied(res.stdout) == listed, (name, listed, res.stdout[-3000:])


def test_a_changed_flag_shows_as_that_flag(lab, deployed):
    base = deployed['base']
    deploy(lab, deployed, base)
    lab.write_stack(STACK, change(base, ((S, 'speculative'), {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                                              'num_draft_tokens': 3})))
    res = lab.pulumi('preview', '--diff', stack=STACK)
    assert '"--speculative-num-steps 1" => "--speculative-num-steps 2"' in res.stdout, res.stdout[-4000:]
    assert '"--speculative-num-draft-tokens 2" => "--speculative-num-draft-tokens 3"' in res.stdout
    lab.write_stack(STACK, base)
