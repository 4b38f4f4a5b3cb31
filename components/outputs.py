"""Stack outputs for monitoring. The names are stable and documented in README ("Outputs")."""

import hashlib

import pulumi

from components.monitoring import file_sd
from components.sglang import expected_speculation


def export(d, host, container, vm, service):
    base = service.endpoint
    pulumi.export('openai_base_url', base + '/v1')
    pulumi.export('health_url', base + '/health')
    pulumi.export('server_info_url', base + '/server_info')
    pulumi.export('metrics_url', base + '/metrics')
    # SGLang's /metrics and the host's node_exporter (components/monitoring.py): write it to a file
    # Prometheus' file_sd_configs reads (`pulumi stack output prometheus_file_sd --json > ...`).
    pulumi.export('prometheus_file_sd', file_sd(d))
    pulumi.export('gpu_assignment', host.gpus)
    pulumi.export('iommu', {'declared_domain': d.iommu.domain, 'declared_kernel_args': d.iommu.kernel_args(),
                            'running_domain_types': host.iommu_domain_types, 'running_cmdline': host.running_cmdline,
                            'boot': host.boot, 'nccl_p2p_disabled': d.p2p_disabled})
    pulumi.export('speculation', {'requested': expected_speculation(d), 'resolved': service.resolved,
                                  'resolved_observed_at': service.observed_at})
    # The unit as the last run (or refresh) found it: systemd's ActiveState == active, UnitFileState == enabled.
    pulumi.export('sglang_unit', {'name': d.sglang.unit, 'active': service.active, 'enabled': service.enabled})
    # The last smoke test: one chat completion from the host after the unit (or its container) changed.
    from components.sglang import smoke_summary
    pulumi.export('smoke_test', service.smoke.stdout.apply(smoke_summary))
    pulumi.export('sglang_version', d.sglang.version)
    pulumi.export('sglang_unit_sha256', hashlib.sha256(service.unit.encode()).hexdigest())
    pulumi.export('reboot_required', host.reboot_required)
    pulumi.export('reboot_reasons', host.reboot_reasons)
    pulumi.export('container', {'vmid': d.container.vmid, 'address': d.container.address,
                                'status': container.status, 'gpus': list(d.container.gpus)})
    if vm is not None:
        pulumi.export('vm', {'vmid': d.vm.vmid, 'status': vm.status, 'pending_restart': vm.pending,
                             'gpus': list(d.vm.gpus), 'hostpci': vm.hostpci})


def host_summary(d, host, container, vm, service) -> dict:
    """One host of a fleet, as monitoring and the fleet table read it."""
    base = service.endpoint
    from components.sglang import smoke_summary
    out = {
        'node': d.host.node, 'address': d.host.address,
        'openai_base_url': base + '/v1', 'health_url': base + '/health', 'metrics_url': base + '/metrics',
        'reboot_required': host.reboot_required, 'reboot_reasons': host.reboot_reasons,
        'speculation': {'requested': expected_speculation(d), 'resolved': service.resolved,
                        'resolved_observed_at': service.observed_at},
        'sglang_unit': {'name': d.sglang.unit, 'active': service.active, 'enabled': service.enabled,
                        'sha256': hashlib.sha256(service.unit.encode()).hexdigest()},
        'sglang_version': d.sglang.version,
        'gpu_assignment': host.gpus,
        'iommu': {'declared_domain': d.iommu.domain, 'running_domain_types': host.iommu_domain_types,
                  'boot': host.boot},
        'container': {'vmid': d.container.vmid, 'address': d.container.address, 'status': container.status,
                      'gpus': list(d.container.gpus)},
        'smoke_test': service.smoke.stdout.apply(smoke_summary),
    }
    if vm is not None:
        out['vm'] = {'vmid': d.vm.vmid, 'status': vm.status, 'pending_restart': vm.pending, 'gpus': list(d.vm.gpus)}
    return out


def export_fleet(fleet, built) -> None:
    """A fleet's outputs: `hosts` (name -> host_summary), one `prometheus_file_sd` for every host (each
    target group labelled with its host), and `rollout` (the order and lanes of rolling changes)."""
    hosts, sd = {}, []
    for h, parts in zip(fleet.hosts, built):
        hosts[h.name] = host_summary(h.deployment, *parts)
        for group in file_sd(h.deployment):
            sd.append({'targets': group['targets'], 'labels': dict(group['labels'], host=h.name)})
    pulumi.export('hosts', hosts)
    pulumi.export('prometheus_file_sd', sd)
    pulumi.export('reboot_required', pulumi.Output.all(*[hosts[n]['reboot_required'] for n in hosts]).apply(
        lambda flags: sorted(n for n, f in zip(hosts, flags) if f)))
    pulumi.export('rollout', {'order': [h.name for h in fleet.hosts],
                              'max_unavailable': fleet.rollout.max_unavailable})
