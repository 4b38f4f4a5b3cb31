"""The stack's configuration: one validated model, the single source of truth for every default.

Loaded from structured Pulumi config (namespace `gpuhost`, one object per top-level key below).
Everything that can be refused without touching a host is refused here, at preview, with a message
that names the config key, the bad value and the fix. Warnings are collected on the model
(`Deployment.warnings`) and shown by the program with pulumi.log.warn.

Hostile or careless input is the normal case. So:
  * types are strict (no bool -> int, no "30000" -> 30000, no 1.0 -> 1), unknown keys and config
    namespaces that look like ours are refused with a "did you mean";
  * every string that lands in a file, a command, a path, a Proxmox property string or the kernel
    command line is checked against that grammar here (no control characters anywhere, Proxmox's
    formats for names, systemd's for the unit name, the kernel's rules for its parameters,
    SGLang's own argument parser for its flags);
  * secrets must arrive as Pulumi secrets; keys and certificates are parsed before any host is
    contacted.

`python -m config schema` prints the JSON schema (docs/config.schema.json is generated from it).

Where each thing is (every key's model, default and rule is in the file of its section):
  values.py      what one value may be (names, paths, addresses, CPU lists, keys, certificates)
  host.py        gpuhost:host          iommu.py   gpuhost:iommu        nvidia.py   gpuhost:nvidia
  container.py   gpuhost:container     vm.py      gpuhost:vm           sglang.py   gpuhost:sglang
  runtime.py     gpuhost:runtime       (the NVIDIA user space, CUDA and the Python environment in the container)
  monitoring.py  gpuhost:monitoring
  deployment.py  one host's whole config: the rules across sections, and what follows from it
  fleet.py       gpuhost:hosts and gpuhost:rollout: several hosts, merged and checked across
  errors.py      refusals as the operator reads them (key, value, fix, "did you mean")
  load.py        reading the running stack's Pulumi config and the files it names (load_stack)
  schema.py      JSON schemas of the model and of Pulumi.<stack>.yaml
The grammars these build on (kernel command line, systemd, Proxmox, SGLang's flags, the GPUs) are one
floor down, in grammar/, which imports nothing of ours.
"""

from config.deployment import Deployment, parse
from config.errors import format_errors
from config.fleet import Fleet, FleetHost, Rollout, deep_merge, parse_fleet
from config.load import (check_namespaces, check_secrets, connection_inputs, fleet_from_data, fleet_from_pulumi,
                         load_stack, model_inputs, provider_access,
                         runtime_inputs, stack_file_secure_paths)
from config.schema import stack_schema
from config.sglang import Speculative, Sglang
from config.values import ConfigError, parse_host_key

__all__ = ['ConfigError', 'Deployment', 'Fleet', 'FleetHost', 'Rollout', 'Speculative', 'Sglang', 'check_namespaces',
           'check_secrets', 'connection_inputs', 'fleet_from_data', 'deep_merge', 'fleet_from_pulumi', 'format_errors', 'load_stack',
           'model_inputs', 'parse', 'provider_access', 'parse_fleet', 'parse_host_key', 'runtime_inputs', 'stack_file_secure_paths', 'stack_schema']
