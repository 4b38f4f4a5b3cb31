"""The lab's model: a small directory SGLang's loader would accept the shape of - a real config.json, a real
model.safetensors.index.json and a few real (tiny) safetensors shards - on the lab host's model storage,
where Pulumi.lab.yaml's gpuhost:model says it is. Its checksum file (sha256sum's format) goes into the lab
directory (.lab/model/<id>.sha256), which the lab stack names as gpuhost:model.checksums.

safetensors, written with the standard library: an 8-byte little-endian header length, a JSON header
(dtype, shape, data_offsets of every tensor, relative to the end of the header; padded with spaces to a
multiple of 8) and the raw data. The content is deterministic (a hash stream), so every lab has the same
files and sums."""

import hashlib
import json
import os
import posixpath
import struct

# A tiny Qwen3-MoE-shaped text model: enough tensors for three shards; BF16 like the real checkpoint.
HIDDEN, LAYERS, VOCAB, EXPERTS, INTER = 64, 2, 512, 4, 32
DTYPE_BYTES = {'BF16': 2, 'F32': 4}
HUB_ORG = 'gpuhost-lab'   # the lab mirror's hub serves the lab model as gpuhost-lab/<id> (lab/mirror.py)


def config_json(model_id):
    return {
        'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe', 'torch_dtype': 'bfloat16',
        'hidden_size': HIDDEN, 'num_hidden_layers': LAYERS, 'vocab_size': VOCAB, 'num_attention_heads': 4,
        'num_key_value_heads': 2, 'head_dim': 16, 'intermediate_size': INTER * 2, 'moe_intermediate_size': INTER,
        'num_experts': EXPERTS, 'num_experts_per_tok': 2, 'max_position_embeddings': 4096,
        'rms_norm_eps': 1e-06, 'rope_theta': 1000000.0, 'tie_word_embeddings': False,
        '_name_or_path': model_id, 'gpuhost_lab': 'a tiny stand-in for %s built by lab/labmodel.py' % model_id,
    }


def tensors():
    """[(shard number, name, dtype, shape)] in order."""
    out = [(1, 'model.embed_tokens.weight', 'BF16', [VOCAB, HIDDEN])]
    for layer in range(LAYERS):
        shard = 1 + layer + (1 if layer else 0)   # layer 0 in shard 1, layer 1 in shard 3 (shard 2: experts of 0)
        p = 'model.layers.%d.' % layer
        out += [(shard, p + 'input_layernorm.weight', 'BF16', [HIDDEN]),
                (shard, p + 'post_attention_layernorm.weight', 'BF16', [HIDDEN]),
                (shard, p + 'self_attn.q_proj.weight', 'BF16', [HIDDEN, HIDDEN]),
                (shard, p + 'self_attn.k_proj.weight', 'BF16', [32, HIDDEN]),
                (shard, p + 'self_attn.v_proj.weight', 'BF16', [32, HIDDEN]),
                (shard, p + 'self_attn.o_proj.weight', 'BF16', [HIDDEN, HIDDEN]),
                (shard, p + 'mlp.gate.weight', 'BF16', [EXPERTS, HIDDEN])]
        for e in range(EXPERTS):
            for w, shape in (('gate_proj', [INTER, HIDDEN]), ('up_proj', [INTER, HIDDEN]),
                             ('down_proj', [HIDDEN, INTER])):
                out.append((2 if layer == 0 else shard, p + 'mlp.experts.%d.%s.weight' % (e, w), 'BF16', shape))
    out += [(3, 'model.norm.weight', 'BF16', [HIDDEN]), (3, 'lm_head.weight', 'BF16', [VOCAB, HIDDEN])]
    return out


def stream(seed, n):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(('%s/%d' % (seed, i)).encode()).digest()
        i += 1
    return bytes(out[:n])


def safetensors_bytes(items, seed):
    """items: [(name, dtype, shape)] -> the file's bytes."""
    header, blobs, offset = {'__metadata__': {'format': 'pt'}}, [], 0
    for name, dtype, shape in items:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [offset, offset + n]}
        blobs.append(stream('%s/%s' % (seed, name), n))
        offset += n
    raw = json.dumps(header, separators=(',', ':')).encode()
    raw += b' ' * (-len(raw) % 8)
    return struct.pack('<Q', len(raw)) + raw + b''.join(blobs)


def files(model_id, revision):
    """{file name: bytes} of the model directory."""
    all_t = tensors()
    count = max(s for s, _, _, _ in all_t)
    names = {s: 'model-%05d-of-%05d.safetensors' % (s, count) for s in range(1, count + 1)}
    out, weight_map, total = {}, {}, 0
    for s in range(1, count + 1):
        items = [(n, dt, sh) for shard, n, dt, sh in all_t if shard == s]
        out[names[s]] = safetensors_bytes(items, '%s@%s' % (model_id, revision))
        for n, dt, sh in items:
            weight_map[n] = names[s]
            size = DTYPE_BYTES[dt]
            for d in sh:
                size *= d
            total += size
    out['model.safetensors.index.json'] = (json.dumps({'metadata': {'total_size': total},
                                                        'weight_map': weight_map}, indent=2) + '\n').encode()
    out['config.json'] = (json.dumps(config_json(model_id), indent=2) + '\n').encode()
    return out


def build(directory, model_id, revision):
    """Write the model into `directory` (world-readable, as an unprivileged container needs); returns the
    checksum file's text (sha256sum's format, every file)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    os.chmod(directory, 0o755)
    lines = []
    for name, data in sorted(files(model_id, revision).items()):
        path = os.path.join(directory, name)
        with open(path, 'wb') as f:
            f.write(data)
        os.chmod(path, 0o644)
        lines.append('%s  %s' % (hashlib.sha256(data).hexdigest(), name))
    return '\n'.join(lines) + '\n'


def declared(pulumi_yaml):
    """(model section, sglang.model_path) from a stack file, or (None, None)."""
    import yaml
    with open(pulumi_yaml) as f:
        cfg = (yaml.safe_load(f) or {}).get('config') or {}
    return cfg.get('gpuhost:model'), (cfg.get('gpuhost:sglang') or {}).get('model_path')


def host_dir(model, model_path):
    rel = posixpath.relpath(model_path, model.get('mount', '/models'))
    return '%s@%s' % (posixpath.join(model['storage'], rel), model['revision'])   # config/model.py host_dir
