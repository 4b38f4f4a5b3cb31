"""What the simulated SGLang checks of --model-path at start, as SGLang's loader would find it.

A local directory with model.safetensors.index.json: every shard its weight_map names must be on disk
(SGLang's filter_duplicate_safetensors_files raises for the missing ones since sgl-project/sglang#32279,
"incomplete download?"), and each shard must be as long as its own header says (safetensors' loader
refuses another length; safetensors 0.8.0's safe_open says "Error while deserializing header: incomplete
metadata, file not fully covered", checked against the real library on a lab shard cut short). config.json's
architectures must be ones SGLang implements (sglang/srt/models/registry.py's message otherwise). A path that is not
a directory is left alone: the lab's stacks without gpuhost:model serve without weights, as before."""

import json
import os
import struct

INDEX = 'model.safetensors.index.json'
# The architectures the lab's models use, as SGLang's model registry names them.
SUPPORTED = ('Qwen3MoeForCausalLM', 'Qwen3NextForCausalLM', 'Qwen3_5MoeForConditionalGeneration',
             'Qwen3ForCausalLM', 'Qwen2ForCausalLM', 'LlamaForCausalLM')


def problem(model_path):
    """The message SGLang would die with, or None."""
    if not model_path or not os.path.isdir(model_path):
        return None
    config = os.path.join(model_path, 'config.json')
    if os.path.isfile(config):
        with open(config) as f:
            archs = json.load(f).get('architectures') or []
        if archs and not any(a in SUPPORTED for a in archs):
            return ('ValueError: Model architectures %s are not supported for now. Supported architectures: '
                    'dict_keys(%s)' % (archs, list(SUPPORTED)))
    index = os.path.join(model_path, INDEX)
    if not os.path.isfile(index):
        return None
    with open(index) as f:
        weight_map = json.load(f)['weight_map']
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not os.path.isfile(os.path.join(model_path, s))]
    if missing:
        return ('RuntimeError: Safetensors index %s references %d shard file(s) that are not on disk: %s. '
                'Incomplete download?' % (index, len(missing), ', '.join(missing)))
    for s in shards:
        path = os.path.join(model_path, s)
        with open(path, 'rb') as f:
            raw = f.read(8)
            n = struct.unpack('<Q', raw)[0] if len(raw) == 8 else None
            header = f.read(n) if n is not None and n < (100 << 20) else b''
        try:
            end = 8 + n + max([int(t['data_offsets'][1]) for k, t in json.loads(header).items()
                               if k != '__metadata__'] or [0])
        except (TypeError, ValueError, KeyError):
            return 'safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge'
        if os.path.getsize(path) != end:
            return ('safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not '
                    'fully covered')
    return None
