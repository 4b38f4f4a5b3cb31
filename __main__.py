"""gpuhost: an 8-GPU Proxmox inference host as code. Load the config, build the components, export."""

import os

import pulumi

import config
from components import monitoring, outputs, preflight
from components.container import GpuContainer
from components.host import ProxmoxHost
from components.sglang import SglangService
from components.state import OperatorError
from components.vm import SevSnpVm


def _cancelled(_signum, _frame):
    # Ctrl-C: the engine cancels the run and the language host asks the program to stop with SIGINT.
    # The program holds no state of its own (the engine does), so it ends here, quietly: no
    # KeyboardInterrupt traceback in the operator's output (the CLI says "update canceled").
    os._exit(130)


try:
    import signal
    signal.signal(signal.SIGINT, _cancelled)
except ValueError:  # not the main thread: the language host's default handling stays
    pass

try:
    deployment = config.from_pulumi()
    connection, api = config.connection_inputs(deployment, os.getcwd())
    for warning in deployment.warnings:
        pulumi.log.warn(warning)
    if not pulumi.runtime.is_dry_run():
        # `up` only (preview contacts no host): the host and Proxmox are what the config describes,
        # before any step can delete, replace or write anything.
        preflight.run(deployment, connection, api)
except (config.ConfigError, OperatorError) as e:
    # RunError: shown as the reason the update failed, without a Python traceback.
    raise pulumi.RunError(str(e)) from None
except Exception as e:  # noqa: BLE001 - never frames for the operator; the traceback goes to a file
    from components.state import describe_unexpected
    raise pulumi.RunError(describe_unexpected(e)) from None

connection = pulumi.Output.secret(connection)
api = pulumi.Output.secret(api)

host = ProxmoxHost('host', deployment, connection)
container = GpuContainer('container', deployment, api, connection, opts=pulumi.ResourceOptions(depends_on=[host]))
vm = SevSnpVm('vm', deployment, api, opts=pulumi.ResourceOptions(depends_on=[host])) if deployment.vm else None
service = SglangService('sglang', deployment, connection, container)
# node_exporter textfile with declared vs running state, after the host status and the unit are known.
monitoring.host_metrics('host-metrics', deployment, connection, host, container, service)

outputs.export(deployment, host, container, vm, service)
