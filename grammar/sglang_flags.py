"""SGLang's launch flags, checked with each version's own argument parser.

The parser tables (grammar/sglang_flags_data/<version>.json) are generated from SGLang's real
argparse definitions by tools/sglang_flags_gen.py; grammar/sglang_argparse.py rebuilds the parser
from them. So every unknown, mistyped, ambiguous or removed flag is refused at preview exactly as
`python -m sglang.launch_server` would refuse it at start-up - and a prefix SGLang's argparse would
accept (`--tp 8`) is recognised as the flag it abbreviates.

The flags this program renders itself (model, parallelism, speculation, ...) may not be set again
through `extra_args`, in any spelling: argparse lets the last occurrence win, so a second
`--speculative-algorithm` or `--tp-size 8` would silently override the declared state.
"""

from __future__ import annotations

from grammar import sglang_argparse as sa


# The environment variable that carries SGLang's --api-key value into the unit's command line: set in a
# root-only environment file, referenced from ExecStart= (the unit's own text never holds the key).
API_KEY_VAR = 'SGLANG_API_KEY'


class FlagError(ValueError):
    pass


# ---------------------------------------------------------------------- sglang

def suggest_triple(steps, topk, draft) -> str:
    """A consistent (num_steps, eagle_topk, num_draft_tokens) built from what the operator gave: with
    topk 1 SGLang forces draft = steps + 1 (MTP on this model: 1, 1, 2)."""
    if topk in (None, 1):
        if steps is None:
            steps = max(1, draft - 1) if draft else 1
        topk, draft = 1, steps + 1
    else:
        steps = steps or 1
        draft = draft or steps * topk + 1
    return '{num_steps: %d, eagle_topk: %d, num_draft_tokens: %d}' % (steps, topk, draft)


# Destinations (argparse dest names) this program decides; `extra_args` may not set them. Besides
# the flags it renders: anything that changes which GPUs or how many are used, which model is
# served, where, or that loads settings from elsewhere.
MANAGED_DESTS = {
    'model_path': 'gpuhost:sglang.model_path', 'served_model_name': 'gpuhost:sglang.served_model_name',
    'host': 'gpuhost:sglang.host', 'port': 'gpuhost:sglang.port', 'tp_size': 'gpuhost:sglang.tp',
    'dp_size': 'gpuhost:sglang.tp (every container GPU serves one tensor-parallel group)',
    'pp_size': 'gpuhost:sglang.tp (every container GPU serves one tensor-parallel group)',
    'ep_size': 'gpuhost:sglang.tp', 'nnodes': 'one node: the container', 'node_rank': 'one node: the container',
    'dist_init_addr': 'one node: the container', 'device': 'the container\'s GPUs',
    'base_gpu_id': 'gpuhost:container.gpus', 'gpu_id_step': 'gpuhost:container.gpus',
    'mem_fraction_static': 'gpuhost:sglang.mem_fraction_static', 'enable_metrics': 'always on (monitoring)',
    'disable_custom_all_reduce': 'gpuhost:sglang.disable_custom_all_reduce',
    'mamba_radix_cache_strategy': 'gpuhost:sglang.mamba_radix_cache_strategy',
    'mamba_scheduler_strategy': 'gpuhost:sglang.mamba_radix_cache_strategy',
    'config': 'the unit\'s flags (a config file would override them unseen)',
    'api_key': 'gpuhost:sglang.api_key, a secret kept out of the unit\'s text',
    'admin_api_key': 'a secret: never in the unit\'s world-readable text',
}
# Older releases spell the parallel sizes out; newer ones add more ways to split the GPUs.
for _dest in ('tensor_parallel_size', 'pipeline_parallel_size', 'data_parallel_size', 'expert_parallel_size',
              'attention_context_parallel_size', 'moe_data_parallel_size', 'attn_dp_size', 'attn_cp_size',
              'dcp_size', 'moe_dp_size', 'dwdp_size', 'moe_dense_tp_size', 'shared_experts_tp_size',
              'enable_dp_attention'):
    MANAGED_DESTS[_dest] = 'gpuhost:sglang.tp (every container GPU serves one tensor-parallel group)'
MANAGED_PREFIXES = {'speculative_': 'gpuhost:sglang.speculative'}
# Environment variables the unit sets from other settings.
MANAGED_ENV = {
    'CUDA_HOME': 'gpuhost:sglang.cuda_home',
    'PATH': 'gpuhost:sglang.venv and cuda_home',
    'NCCL_P2P_DISABLE': 'the IOMMU translates, so GPU peer-to-peer DMA must stay off (SYSTEM.md)',
    'NCCL_P2P_LEVEL': 'the IOMMU translates, so GPU peer-to-peer DMA must stay off (SYSTEM.md)',
    'CUDA_VISIBLE_DEVICES': 'the container sees exactly its GPUs, gpuhost:container.gpus',
    'SGLANG_API_KEY': 'gpuhost:sglang.api_key, a secret kept in a root-only file',
}


def v(text):
    return tuple(int(x) for x in text.split('.')[:3])


def supported_versions():
    return sa.supported_versions()


def option_strings(version):
    return {o for a in sa.table(version)['actions'] for o in a['option_strings']}


def managed_by(dest):
    if dest in MANAGED_DESTS:
        return MANAGED_DESTS[dest]
    for prefix, key in MANAGED_PREFIXES.items():
        if dest.startswith(prefix):
            return key
    return None


def check(version, managed_args, extra_args):
    """Raise FlagError naming the flag, the version and the fix for what SGLang `version` would reject,
    and for any extra_args flag that sets what the program manages."""
    managed_args, extra_args = list(managed_args), list(extra_args)
    for i, arg in enumerate(extra_args):
        if arg.startswith('-') and any(c.isspace() for c in arg):
            raise FlagError('gpuhost:sglang.extra_args[%d]: %r holds a flag and more; each list item is one '
                            'argument, e.g. [%s]' % (i, arg, ', '.join(repr(w) for w in arg.split())))
    try:
        _, own = sa.parse(version, managed_args)
    except sa.FlagError as e:
        raise FlagError('gpuhost:sglang: SGLang %s would refuse the flags this program renders: %s' % (
            version, e)) from None
    try:
        # Parsed behind the managed flags, as in the unit: what the extra tokens resolve to there.
        _, given = sa.parse(version, managed_args + extra_args)
    except sa.FlagError as e:
        raise FlagError('gpuhost:sglang.extra_args: %s (gpuhost:sglang.version: %s)' % (e, version)) from None
    for token, dest in given[len(own):]:
        action = _action(version, dest)
        if action and action.get('action') in ('help', 'version'):
            raise FlagError('gpuhost:sglang.extra_args: %s prints and exits; SGLang would never serve - remove it'
                            % token)
        key = managed_by(dest)
        if key:
            raise FlagError('gpuhost:sglang.extra_args: %s sets %s, which this program manages (%s); set it there '
                            'and remove it from extra_args' % (token, dest, key))


def _action(version, dest):
    return next((a for a in sa.table(version)['actions'] if a['dest'] == dest), None)


def mamba_strategy_args(version, strategy):
    opts = option_strings(version)
    if '--mamba-radix-cache-strategy' in opts:
        return ['--mamba-radix-cache-strategy', strategy]
    if '--mamba-scheduler-strategy' in opts:
        choices = (_action(version, 'mamba_scheduler_strategy') or {}).get('choices') or []
        if choices and strategy not in choices:
            raise FlagError('gpuhost:sglang.mamba_radix_cache_strategy: %r needs a newer SGLang than %s, which only '
                            'knows --mamba-scheduler-strategy {%s}; use one of those' % (
                                strategy, version, ','.join(choices)))
        return ['--mamba-scheduler-strategy', strategy]
    raise FlagError('gpuhost:sglang.mamba_radix_cache_strategy: SGLang %s has no mamba cache strategy flag; leave it '
                    'unset' % version)


def warnings(version, args, environment, speculative):
    out = []
    try:
        parsed, given = sa.parse(version, list(args))
    except sa.FlagError:
        return out
    for token, dest, new in sa.deprecated(version, list(args)):
        out.append('gpuhost:sglang: %s is deprecated in SGLang %s%s' % (
            token, version, '; use %s (%s)' % (new, managed_by(dest) or 'gpuhost:sglang.extra_args') if new else ''))
    if speculative:
        strategy = parsed.get('mamba_radix_cache_strategy') or parsed.get('mamba_scheduler_strategy')
        lazy = any('extra_buffer_lazy' in (a.get('choices') or []) for a in sa.table(version)['actions'])
        if strategy in (None, 'auto', 'extra_buffer') and lazy:
            # auto resolves to extra_buffer for Qwen3.5's hybrid Mamba layers.
            out.append('gpuhost:sglang: NEXTN speculative decoding with the extra_buffer mamba cache (%s) has an '
                       'open upstream report of drift at high KV usage; consider mamba_radix_cache_strategy: '
                       'extra_buffer_lazy' % ('auto picks it for this model' if strategy in (None, 'auto')
                                              else 'declared'))
        elif strategy == 'extra_buffer':
            out.append('gpuhost:sglang: NEXTN with extra_buffer has a known drift at high KV usage; SGLang %s has '
                       'no extra_buffer_lazy - consider upgrading' % version)
        out.append('gpuhost:sglang: NEXTN on Blackwell has an open upstream report of silently choosing a slow '
                   'attention backend; check the resolved attention backend in /server_info after start-up')
    if 'SGLANG_ENABLE_SPEC_V2' in environment and v(version) >= v('0.5.22'):
        out.append('gpuhost:sglang.environment: SGLANG_ENABLE_SPEC_V2 is ignored from SGLang 0.5.22 (declared %s);'
                   ' drop it' % version)
    return out
