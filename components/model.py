"""The model's weights as the program declares them: model_weights, the ModelWeights resource of a host. Its serving
class is resources/model.py's."""

from __future__ import annotations

import pulumi

from resources.model import ModelProvider, ModelWeightsResource, TEXTFILE
from resources.state import moved


def model_weights(name, d, model_files=None, opts=None):
    m = d.model
    token = (model_files or {}).get('token')
    props = {'id': m.id, 'revision': m.revision,
             'dir': m.host_dir(d.sglang.model_path), 'storage': m.storage, 'source': m.base_url(),
             'token': pulumi.Output.secret(token) if token else None,
             'checksums': (model_files or {}).get('checksums'), 'verified': True, 'textfile': TEXTFILE,
             'timeout_s': m.timeout_s, 'stall_timeout_s': m.stall_timeout_s, 'rehash_days': m.rehash_days,
             **m.download_options(),
             **dict.fromkeys(ModelProvider.OUTPUTS)}
    return ModelWeightsResource(name, props, opts)


def __getattr__(name):
    """Release 0.1.0's name of a serving class, now resources/'s (resources/state.py, RELEASE_0_1_0)."""
    return moved(__name__, name)
