"""The policy pack's test program: gpuhost's own components, with inputs the config model would refuse.

The case comes from $GPUHOST_POLICY_CASE (JSON):
  model:  {"iommu.extra_kernel_args": [...], "sglang.tp": 2, ...}  dotted paths into the Deployment
          parsed from the repo's Pulumi.lab.yaml, set with model_copy (no validation: config/ is bypassed)
  api:    {"user": "...", "token_id": "..."}                       merged into the guests' `api` input
  props:  {"<resource name>": {"key": value}}                       merged into a gpuhost resource's inputs
          just before it registers (dicts merge, None deletes a key, {"__sub__": [[old, new], ...]} edits
          a string) - a program that writes what it likes, components or not.
Preview only: nothing here contacts a host. The credentials are made up at each run, but well formed: the gpuhost
provider's CheckConfig judges them as it judges a real stack's (a made-up login the provider refuses never reaches
the pack).
"""

import copy
import json
import os
import sys

REPO = os.environ.get('GPUHOST_REPO') or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import pulumi  # noqa: E402
import yaml  # noqa: E402

import config  # noqa: E402
from components.container import GpuContainer  # noqa: E402
from components.host import ProxmoxHost  # noqa: E402
from components.sglang import SglangService  # noqa: E402
from resources.state import GpuhostResource, end_quietly, host_provider  # noqa: E402
from components.vm import SevSnpVm  # noqa: E402

CASE = json.loads(os.environ.get('GPUHOST_POLICY_CASE') or '{}')


# As the program's own: a run the engine ended (here also: a provider configuration its CheckConfig refused) ends
# quietly.
end_quietly()


def merge(base, over):
    if isinstance(over, dict) and '__sub__' in over:
        text = base
        for old, new in over['__sub__']:
            assert old in text, 'case edits %r, which is not in the value' % old
            text = text.replace(old, new)
        return text
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(base.get(k), v)
        return out
    return copy.deepcopy(over)


def doctored(model, path, value):
    """model with the field at a dotted path set to value - model_copy, so nothing is validated."""
    head, _, rest = path.partition('.')
    if rest:
        value = doctored(getattr(model, head), rest, value)
    return model.model_copy(update={head: value})


_register = GpuhostResource.__init__


def _init(self, name, props, opts=None):
    over = (CASE.get('props') or {}).get(name)
    if over:
        props = merge(props, over)
    _register(self, name, props, opts)


GpuhostResource.__init__ = _init

with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
    data = {k.split(':', 1)[1]: v for k, v in yaml.safe_load(f)['config'].items()}
d = config.parse(data)
for path, value in (CASE.get('model') or {}).items():
    d = doctored(d, path, value)



def made_up_credentials():
    """(an ed25519 client key, a host key line, a CA's PEM), new at every run."""
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import NameOID
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode()
    host = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'policy test CA')])
    now = datetime.datetime.now(datetime.timezone.utc)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=1)).sign(ca_key, hashes.SHA256()))
    return private, host, ca.public_bytes(serialization.Encoding.PEM).decode()


private_key, host_key, ca_pem = made_up_credentials()
connection = pulumi.Output.secret({'host': d.host.address, 'port': 2222, 'user': 'root', 'private_key': private_key,
                                   'host_key': host_key, 'timeout': 5, 'command_timeout': 60})
api = pulumi.Output.secret(merge({'host': d.host.address, 'port': 8006, 'user': 'root@pam',
                                  'password': 'policy-test-password', 'ca_cert': ca_pem, 'timeout': 30},
                                 CASE.get('api') or {}))

# The host's provider instance holds the connection and login, as the program's (resources/state.py host_provider):
# the pack reads a guest's api from it.
served = pulumi.ResourceOptions(providers=[host_provider('gpuhost', connection, api)])
host = ProxmoxHost('host', d, opts=served)
after_host = pulumi.ResourceOptions.merge(served, pulumi.ResourceOptions(depends_on=[host]))
container = GpuContainer('container', d, opts=after_host)
if d.vm:
    SevSnpVm('vm', d, opts=after_host)
SglangService('sglang', d, connection, container, opts=served)
