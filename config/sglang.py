"""gpuhost:sglang - the SGLang service: version (its flags are checked with that release's own parser),
paths, model, parallelism, port and bind address, MTP speculation, extra flags and environment, the
OpenAI API key (a secret) and the start-up timeout."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from config.values import (SECRET_ENV_RE, Model, Path, Text, bind_address, env_key, grammar, model_ref, no_control, show,
                           unit_name)
from grammar import sglang_flags
from grammar.sglang_flags import suggest_triple


class Speculative(Model):
    algorithm: Literal['NEXTN', 'EAGLE', 'EAGLE3'] = 'NEXTN'
    num_steps: Optional[int] = Field(None, ge=1, le=16)
    eagle_topk: Optional[int] = Field(None, ge=1, le=64)
    num_draft_tokens: Optional[int] = Field(None, ge=1, le=256)

    @model_validator(mode='after')
    def _triple(self):
        triple = {'num_steps': self.num_steps, 'eagle_topk': self.eagle_topk,
                  'num_draft_tokens': self.num_draft_tokens}
        unset = [k for k, v in triple.items() if v is None]
        if unset:
            given = ', '.join('%s=%s' % (k, v) for k, v in triple.items() if v is not None)
            raise ValueError('gpuhost:sglang.speculative: %s%s missing; set all three - from your numbers: %s - or '
                             'speculative: null to run without speculative decoding' % (
                                 given + ' set but ' if given else '', ', '.join(unset),
                                 suggest_triple(self.num_steps, self.eagle_topk, self.num_draft_tokens)))
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError('gpuhost:sglang.speculative.num_draft_tokens: %d with eagle_topk 1 and num_steps %d; '
                             'SGLang forces draft tokens = steps + 1 when topk is 1, so set num_draft_tokens: %d'
                             % (self.num_draft_tokens, self.num_steps, self.num_steps + 1))
        return self


class Proof(Model):
    """The GPU proof (hostscripts/gpu_proof.py, docs/gpu-proof.md): run in the container with the service's own
    environment in the window where SGLang is stopped anyway - before the restart onto a new NVIDIA user space, CUDA
    or Python environment, and before its first start - and the start refused when it fails."""
    enabled: bool = Field(True, description='Run the GPU proof before SGLang starts on new ground, its first start '
                                            'and after a host reboot (docs/gpu-proof.md); false: SGLang starts on '
                                            'GPUs nobody checked, said in every preview')
    time_limit_s: int = Field(60, ge=10, le=600, description='The whole proof ends within this: a hang is killed and '
                                                             'is a failure')
    min_busbw_gbps: Optional[float] = Field(
        None, gt=0, le=100000, description='The floor for the all-reduce\'s bus bandwidth across the tensor-parallel '
                                           'group (GB/s, nccl-tests\' busbw at the largest size): below it the proof '
                                           'fails. Default none: every proof\'s figure is shown beside the first one '
                                           '(stack output gpu_proof) - set the floor from it')


class Sglang(Model):
    version: Annotated[str, grammar(r'^\d+\.\d+\.\d+(\.post\d+)?$', 'a release number', '0.5.23', 24)] = Field(
        '0.5.23', description='The SGLang version installed in the container\'s virtualenv; flags are rendered and '
                              'checked with that version\'s own argument parser')
    venv: Path = '/opt/sglang/venv'
    cuda_home: Path = '/usr/local/cuda-13.0'
    unit: Annotated[str, AfterValidator(unit_name)] = 'sglang-qwen.service'
    model_path: Annotated[str, AfterValidator(model_ref)]
    served_model_name: str = 'qwen3.5-122b-a10b'
    tp: int = Field(4, ge=1, le=64)
    port: int = Field(30000, ge=1, le=65535)
    host: Optional[Annotated[str, AfterValidator(bind_address)]] = Field(
        None, description='The address SGLang listens on; default: the container\'s own (gpuhost:container.ip), the '
                          'one /health, monitoring and clients reach. 0.0.0.0 or :: (all of its addresses) only with '
                          'the stack\'s policy opt-in (sglang-private-bind: allow_public_bind)')
    mem_fraction_static: float = 0.75
    speculative: Optional[Speculative] = Speculative(num_steps=1, eagle_topk=1, num_draft_tokens=2)
    mamba_radix_cache_strategy: Optional[Literal['auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy']] = None
    disable_custom_all_reduce: bool = Field(True, description='RTX PRO 6000 owners report custom all-reduce '
                                                              'trouble without P2P')
    extra_args: list[Text] = Field(default_factory=list, max_length=256,
                                   description='More launch_server flags, parsed with the declared version\'s '
                                               'own argument parser; flags this program sets are refused')
    environment: dict[Annotated[str, AfterValidator(env_key)], Annotated[Text, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=128)
    api_key: Optional[SecretStr] = Field(None, description='Bearer key for the OpenAI API (SGLang --api-key); a '
                                         'secret, kept in a root-only file in the container, never in the unit. '
                                         '/health and /metrics stay open for monitoring')
    health_timeout_s: float = Field(900.0, gt=0, le=86400,
                                    description='How long a (re)start may take to pass /health')
    proof: Proof = Field(default_factory=Proof, description='The GPU proof before SGLang starts on new ground')

    @model_validator(mode='after')
    def _floor(self):
        if self.proof.min_busbw_gbps is not None and self.tp == 1:
            raise ValueError('gpuhost:sglang.proof.min_busbw_gbps: %g GB/s, but with tp 1 the all-reduce moves no data '
                             'and has no bandwidth; remove the floor' % self.proof.min_busbw_gbps)
        return self

    @field_validator('version')
    @classmethod
    def _version(cls, v):
        if v not in sglang_flags.supported_versions():
            raise ValueError('SGLang %s has no flag table here; supported: %s (tools/sglang_flags_gen.py adds a '
                             'release)' % (v, ', '.join(sglang_flags.supported_versions())))
        return v

    @field_validator('served_model_name')
    @classmethod
    def _name(cls, v):
        no_control(v)
        if ':' in v:
            raise ValueError('%s contains ":", which SGLang refuses; use e.g. %s' % (show(v), show(v.replace(':', '-'))))
        return _served_name(v)

    @field_validator('mem_fraction_static')
    @classmethod
    def _mem(cls, v):
        if not 0 < v < 1:
            raise ValueError('%r is outside (0, 1); 0.75 leaves room for the MTP draft model' % v)
        return v

    @field_validator('api_key')
    @classmethod
    def _api_key(cls, v):
        if v is not None and not re.match(r'^[A-Za-z0-9._~+/=\-]{16,256}$', v.get_secret_value()):
            raise ValueError('must be 16-256 characters of letters, digits and ._~+/=- (not shown); make one with: '
                             'openssl rand -base64 32 | pulumi config set --secret --path gpuhost:sglang.api_key')
        return v

    @field_validator('environment')
    @classmethod
    def _env(cls, v):
        for key in v:
            why = sglang_flags.MANAGED_ENV.get(key)
            if why:
                raise ValueError('%s is set by this program (%s); remove it from gpuhost:sglang.environment' % (key, why))
            if SECRET_ENV_RE.search(key):
                raise ValueError('%s looks like a credential: gpuhost:sglang.environment is written into the unit file, '
                                 'which every user of the container can read, and into the stack\'s state as plain '
                                 'text. Remove it; the OpenAI API key goes into gpuhost:sglang.api_key (a secret), and '
                                 'a model is served from a local path (gpuhost:sglang.model_path) with no hub token'
                                 % key)
        return v


def _served_name(v):
    rx = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._/+\-]{0,127}$')
    if not rx.match(v):
        raise ValueError('%s is not a model name SGLang serves (letters, digits, ._/+-, up to 128); write e.g. '
                         'qwen3.5-122b-a10b' % show(v))
    return v
