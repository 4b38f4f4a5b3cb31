"""What each SGLang version accepts, from SYSTEM.md's history of renamed and removed flags.

Every launch flag the program renders (and every `extra_args` flag) is checked against the declared
version before any host is touched: a flag SGLang would reject at start-up is refused at preview.
"""


def v(text):
    return tuple(int(x) for x in text.split('.')[:3])


# flag -> (first version accepting it or None, first version rejecting it or None, advice when refused)
FLAG_RANGES = {
    '--mamba-scheduler-strategy': (None, '0.5.20', 'use --mamba-radix-cache-strategy (gpuhost:sglang.'
                                                   'mamba_radix_cache_strategy), which replaced it in 0.5.14'),
    '--mamba-radix-cache-strategy': ('0.5.14', None, 'before 0.5.14 the flag is --mamba-scheduler-strategy; '
                                                     'gpuhost:sglang.mamba_radix_cache_strategy renders it'),
    '--cuda-graph-max-bs': (None, '0.5.23', '0.5.23 has --cuda-graph-max-bs-decode and -prefill, so the old '
                                            'name is ambiguous: use --cuda-graph-max-bs-decode'),
    '--cuda-graph-max-bs-decode': ('0.5.23', None, 'before 0.5.23 the flag is --cuda-graph-max-bs'),
}
# Deprecated aliases: accepted, but worth a warning.
ALIASES = {'--mamba-scheduler-strategy': ('0.5.14', '--mamba-radix-cache-strategy')}


def flags(args):
    return [a.split('=', 1)[0] for a in args if a.startswith('--')]


def check(version, args, environment):
    """Raise ValueError naming the flag, the version and the fix, for a flag this version rejects."""
    ver = v(version)
    for flag in flags(args):
        if flag not in FLAG_RANGES:
            continue
        since, until, advice = FLAG_RANGES[flag]
        if (since and ver < v(since)) or (until and ver >= v(until)):
            raise ValueError('gpuhost:sglang: flag %s is not accepted by SGLang %s (gpuhost:sglang.version)%s; %s'
                             % (flag, version, ' - rejected from %s on' % until if until and ver >= v(until)
                                else ' - added in %s' % since, advice))
    if '--served-model-name' in args:
        name = args[args.index('--served-model-name') + 1]
        if ':' in name:
            raise ValueError('gpuhost:sglang.extra_args: served model name %r contains ":"' % name)


def mamba_strategy_args(version, strategy):
    if v(version) >= v('0.5.14'):
        return ['--mamba-radix-cache-strategy', strategy]
    if strategy not in ('no_buffer', 'extra_buffer'):
        raise ValueError('gpuhost:sglang.mamba_radix_cache_strategy: %r needs SGLang 0.5.14 or later (declared %s);'
                         ' use extra_buffer or no_buffer' % (strategy, version))
    return ['--mamba-scheduler-strategy', strategy]


def warnings(version, args, environment, speculative):
    ver = v(version)
    out = []
    fl = flags(args)
    for flag, (since, new) in ALIASES.items():
        if flag in fl and ver >= v(since):
            out.append('gpuhost:sglang: %s is a deprecated alias in SGLang %s and is rejected from 0.5.20; use %s'
                       % (flag, version, new))
    if speculative:
        strategy = None
        for name in ('--mamba-radix-cache-strategy', '--mamba-scheduler-strategy'):
            if name in args:
                strategy = args[args.index(name) + 1]
        # auto resolves to extra_buffer for Qwen3.5's hybrid Mamba layers.
        if strategy in (None, 'auto', 'extra_buffer') and ver >= v('0.5.14'):
            out.append('gpuhost:sglang: NEXTN speculative decoding with the extra_buffer mamba cache (%s) has an '
                       'open upstream report of drift at high KV usage; consider mamba_radix_cache_strategy: '
                       'extra_buffer_lazy' % ('auto picks it for this model' if strategy in (None, 'auto')
                                              else 'declared'))
        elif strategy == 'extra_buffer':
            out.append('gpuhost:sglang: NEXTN with extra_buffer has a known drift at high KV usage; SGLang %s has '
                       'no extra_buffer_lazy - consider upgrading' % version)
        out.append('gpuhost:sglang: NEXTN on Blackwell has an open upstream report of silently choosing a slow '
                   'attention backend; check the resolved attention backend in /server_info after start-up')
    if 'SGLANG_ENABLE_SPEC_V2' in environment and ver >= v('0.5.22'):
        out.append('gpuhost:sglang.environment: SGLANG_ENABLE_SPEC_V2 is ignored from SGLang 0.5.22 (declared %s);'
                   ' drop it' % version)
    return out


