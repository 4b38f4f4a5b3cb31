"""gpuhost: an 8-GPU Proxmox inference host as code. Load the config, build the components, export."""

import os

import pulumi

import config
from components.container import GpuContainer
from components.host import ProxmoxHost
from components.sglang import SglangService
from components.vm import SevSnpVm
from components import outputs

try:
    deployment = config.from_pulumi()
    connection, api = config.connection_inputs(deployment, os.getcwd())
except config.ConfigError as e:
    # RunError: shown as the reason the update failed, without a Python traceback.
    raise pulumi.RunError(str(e)) from None

for warning in deployment.warnings:
    pulumi.log.warn(warning)

connection = pulumi.Output.secret(connection)
api = pulumi.Output.secret(api)

host = ProxmoxHost('host', deployment, connection)
container = GpuContainer('container', deployment, api, connection, opts=pulumi.ResourceOptions(depends_on=[host]))
vm = SevSnpVm('vm', deployment, api, opts=pulumi.ResourceOptions(depends_on=[host])) if deployment.vm else None
service = SglangService('sglang', deployment, connection, container)

outputs.export(deployment, host, container, vm, service)
