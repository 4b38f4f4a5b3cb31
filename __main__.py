"""gpuhost: an 8-GPU Proxmox inference host as code. Load the config, build the components, export."""

import os

import pulumi

import config
from components import monitoring, outputs, preflight
from components.container import GpuContainer
from components.host import ProxmoxHost
from components.model import model_weights
from components.sglang import SglangService
from components.vm import SevSnpVm
from resources.state import end_quietly, host_provider
from transport import agent
from transport.operator import OperatorError


# Ctrl-C and a run the engine ended: the program stops quietly, never with a traceback (resources/state.py).
end_quietly()


def _preflight_all(fleet, inputs):
    """Every host's preflight at once (one thread and one SSH connection each); all refusals are
    reported together, each naming its host."""
    from concurrent.futures import ThreadPoolExecutor
    from transport.operator import describe_unexpected

    def one(h):
        connection, api = inputs[h.index][:2]
        try:
            preflight.run(h.deployment, connection, api, model_files=inputs[h.index][3],
                          runtime_files=inputs[h.index][2])
        except (config.ConfigError, OperatorError) as e:
            return (('host %s: ' % h.name) if fleet.is_fleet else '') + str(e)
        except Exception as e:  # noqa: BLE001 - never frames for the operator
            return (('host %s: ' % h.name) if fleet.is_fleet else '') + describe_unexpected(e)
        return None
    with ThreadPoolExecutor(max_workers=min(16, len(fleet.hosts))) as pool:
        problems = [p for p in pool.map(one, fleet.hosts) if p]
    if problems:
        raise OperatorError('\n'.join(problems) if len(problems) == 1 else
                            'preflight refused %d of %d hosts; nothing was changed on any host:\n  - %s' % (
                                len(problems), len(fleet.hosts), '\n  - '.join(problems)))


try:
    fleet, inputs, warnings = config.load_stack(os.getcwd())
    # The credentials the stack holds, read: no message of the program's may carry one (transport/errors.py).
    from transport.errors import remember
    remember(inputs)
    # ... and those only the models hold (sglang.api_key, host.api.token_secret).
    remember([h.deployment.model_dump() for h in fleet.hosts])
    for warning in warnings:
        pulumi.log.warn(warning)
    if not pulumi.runtime.is_dry_run():
        # `up` only (preview contacts no host): every host and its Proxmox are what the config describes,
        # before any step can delete, replace or write anything on any host.
        _preflight_all(fleet, inputs)
    # A credential the stack keeps in a file stays there: the provider's configuration names the file (the plugin
    # reads it) and the smoke test reaches the host through an SSH agent (transport/agent.py).
    stack = '%s/%s' % (pulumi.get_project(), pulumi.get_stack())
    provided = {h.index: config.provider_access(h.deployment, os.getcwd(), *inputs[h.index][:2]) for h in fleet.hosts}
    smoke = {h.index: agent.smoke_connection(stack, h.deployment, inputs[h.index][0], os.getcwd(),
                                             start_agent=not pulumi.runtime.is_dry_run()) for h in fleet.hosts}
except (config.ConfigError, OperatorError) as e:
    # RunError: shown as the reason the update failed, without a Python traceback.
    from transport.errors import scrub
    raise pulumi.RunError(scrub(str(e))) from None
except Exception as e:  # noqa: BLE001 - never frames for the operator; the traceback goes to a file
    from transport.operator import describe_unexpected
    raise pulumi.RunError(describe_unexpected(e)) from None

def canary_of(fleet, h):
    """The first host's canary inputs (gpuhost:rollout.canary): the judge's settings, its fleet name and the baseline's
    SGLang endpoints - the other hosts as they run, or (baseline: restart) the second host alone, with what its
    restart at the canary's moment needs. None for every other host and stack."""
    settings = fleet.canary_settings()
    if settings is None or h.index != 0:
        return None
    from resources.sglang import service_props
    if settings.pop('baseline') == 'restart':
        second = fleet.hosts[1]
        p = service_props(second.deployment)
        return dict(settings, host=h.name, baseline={second.name: p['endpoint']}, restart={
            'host': second.name, 'vmid': p['vmid'], 'unit_name': p['unit_name'], 'endpoint': p['endpoint'],
            'health_timeout': p['health_timeout']})
    return dict(settings, host=h.name,
                baseline={o.name: service_props(o.deployment)['endpoint'] for o in fleet.hosts if o is not h})


def baseline_connection_of(fleet, h):
    """With baseline: restart, the canary's unit restarts the baseline host's SGLang itself: that host's connection
    (as its own provider holds it: a key named by file stays a path the plugin reads), a secret. None otherwise."""
    settings = fleet.canary_settings()
    if settings is None or h.index != 0 or settings['baseline'] != 'restart':
        return None
    return pulumi.Output.secret(provided[fleet.hosts[1].index][0])


built = []
for h in fleet.hosts:
    d = h.deployment
    name = h.resource_name
    connection = pulumi.Output.secret(smoke[h.index])
    # Rolling changes: whatever may stop this host's SGLang (a reboot, a container change, a unit restart) waits
    # until the host before it in its rollout lane serves again (/health, /server_info). The plugin holds that
    # order where a step goes down (provider/rollout.py); every other step of every host runs at once.
    rollout = fleet.rollout_info(h.index)
    fleet_host = h.name if fleet.is_fleet else None
    # The gpuhost provider plugin (provider/) serves every custom resource of this host, with its connection and
    # Proxmox login as its configuration (and the fleet lock's password: never in a resource's inputs): components
    # pass it on to their children.
    lock_secret = fleet.fleet_lock_secret()
    own = host_provider(name('gpuhost'), *(pulumi.Output.secret(v) for v in provided[h.index]),
                        fleet_lock=pulumi.Output.secret(lock_secret) if lock_secret else None)
    served = pulumi.ResourceOptions(providers=[own])
    host = ProxmoxHost(name('host'), d, rollout=rollout, fleet_host=fleet_host, opts=served)
    after_host = pulumi.ResourceOptions.merge(served, pulumi.ResourceOptions(depends_on=[host]))
    container = GpuContainer(name('container'), d, opts=after_host,
                             fleet_host=fleet_host, rollout=rollout)
    vm = (SevSnpVm(name('vm'), d, opts=after_host, fleet_host=fleet_host) if d.vm else None)
    # The weights on the host, verified (gpuhost:model): the unit depends on them.
    weights = (model_weights(name('model'), d, inputs[h.index][3],
                             opts=pulumi.ResourceOptions(depends_on=[host], provider=own)) if d.model else None)
    service = SglangService(name('sglang'), d, connection, container, rollout=rollout,
                            fleet_host=fleet_host, runtime_files=inputs[h.index][2], model=weights,
                            model_files=inputs[h.index][3], host_boot_id=host.boot_id, opts=served,
                            canary=canary_of(fleet, h), baseline_connection=baseline_connection_of(fleet, h))
    # node_exporter textfiles: what only the program knows (gpuhost.prom, after the unit is known), and the
    # collector that writes the host's own state every 30 s between runs (gpuhost-collector.prom).
    monitoring.host_metrics(name('host-metrics'), d, container, service,
                            opts=pulumi.ResourceOptions(provider=own))
    # After the host's own files: the collector compares the host with them (and one SSH command at a time).
    monitoring.host_collector(name('collector'), d,
                              opts=pulumi.ResourceOptions(depends_on=[host], provider=own))
    built.append((host, container, vm, service, weights))

if fleet.is_fleet:
    outputs.export_fleet(fleet, built)
else:
    outputs.export(fleet.hosts[0].deployment, *built[0])
