"""Stack outputs for monitoring. The names are stable; docs/monitoring.md's "Outputs" tables are generated from
OUTPUTS and FLEET_OUTPUTS below (`python -m tools.docs outputs`), and tests/unit/test_docs.py fails when the program
exports a name without a row, or those tables differ from these."""

import hashlib

import pulumi

from resources.monitoring import file_sd
from resources.sglang import expected_speculation
from components.sglang import smoke_summary


# (names, what an operator reads there) for every output of a one-host stack, in docs/monitoring.md's order. Add a
# row with the output: an operator reads docs/monitoring.md before the code.
OUTPUTS = (
    (('openai_base_url', 'health_url', 'server_info_url', 'metrics_url'),
     '`http://<container>:30000/v1`, `/health`, `/server_info`, `/metrics`'),
    (('prometheus_file_sd',),
     'a Prometheus `file_sd` target list: SGLang\'s `/metrics` and the host\'s node_exporter, labelled `id` '
     '(`lxc/<vmid>`, `node/<node>`) and `node` (Monitoring; the labels changed, see below)'),
    (('gpu_assignment',),
     'address → `assigned_to` (container/vm/host), `numa`, `driver`, `id`, `iommu_group`, `iommu_group_type`, '
     '`minor`'),
    (('iommu',),
     'declared domain and kernel args, running domain types and command line, boot method, `nccl_p2p_disabled`'),
    (('speculation',),
     '`requested` and `resolved` (as `/server_info` reports it, incl. `avg_spec_accept_length`), and '
     '`resolved_observed_at` (UTC: when a run last read it — every apply, and a refresh that found it changed)'),
    (('sglang_unit',),
     '`name`, `active`, `enabled` (systemd\'s ActiveState/UnitFileState as the last run or refresh found them)'),
    (('smoke_test',),
     'the last smoke test: `latency_ms`, `model`, token counts, `finish_reason`'),
    (('sglang_version', 'sglang_unit_sha256'),
     'declared version, hash of the rendered unit'),
    (('runtime',),
     'what SGLang stands on, as the last run or refresh found it: `host_driver` (the host\'s nvidia module), '
     '`container_driver` (the container\'s NVIDIA libraries; must equal it), `cuda`, `sglang` (the version of the '
     'environment the unit runs from), `env` (its id), `declared_env`, `lock_sha256` (the sha256 of its lock\'s '
     'canonical text)'),
    (('gpu_proof',),
     'the last GPU proof before SGLang started on new ground (`gpuhost:sglang.proof`; null: never run, or the proof '
     'is off): '
     '`ok`, `at` (UTC), `message` (one line), `gpus`, `tp`, `per_gpu` (`bus_id`, `ok`, `tflops`, `memory_total`), '
     '`allreduce_bytes`, `busbw` (bytes/s, nccl-tests\' bus bandwidth), `transport` (what NCCL chose), `floor_gbps` '
     '(`gpuhost:sglang.proof.min_busbw_gbps`), `first` (the first figure for these GPUs: `busbw`, `bytes`, '
     '`transport`, `at`), `boot_id` (the host\'s boot it proved: after a reboot `up` proves again), `versions` '
     '(docs/gpu-proof.md)'),
    (('nvidia_driver',),
     'with `gpuhost:nvidia.driver`: the host\'s NVIDIA kernel driver, `declared` (version) against what the last run '
     'or refresh read: `loaded` (the loaded module\'s version; null: none), `modules` (open/proprietary), '
     '`installed` (each installed kernel → its nvidia module\'s version; `-` none built, `?` unknown), '
     '`kernels_missing` (installed kernels without the declared version built: a boot into one has no matching '
     'driver), `running_kernel`'),
    (('reboot_required', 'reboot_reasons'),
     'declared vs running (command line, module options, bindings, group types)'),
    (('model',),
     'with `gpuhost:model`: the weights as the last run or refresh verified them on the host: `id`, `revision`, '
     '`path` (`gpuhost:sglang.model_path`), `host_dir` (the revision\'s directory on the host), `shards`, `bytes`, '
     '`verified`, `verified_at` (UTC: when an `up` first found this revision in this directory as it is now; a later '
     'one finding it the same keeps the time), `summary` (one line)'),
    (('container', 'vm'),
     'vmid, address, status, GPUs; the VM (with `gpuhost:vm`): its `pending_restart` keys, `hostpci` (as declared), '
     '`gpu_binding`, and `gpu_mappings`: each mapping\'s entry for the node as Proxmox has it (`node`, `path`, '
     '`id`, `subsystem-id`, `iommugroup`; `{}` with `gpu_binding: address`)'),
)

# A fleet's (gpuhost:hosts) outputs instead: export_fleet().
FLEET_OUTPUTS = (
    (('hosts',), 'host name → that host\'s outputs as a one-host stack has them (above), without its '
                 '`prometheus_file_sd`'),
    (('prometheus_file_sd',), 'every host\'s target groups, each labelled `host` (its name) besides `id` and `node`'),
    (('reboot_required',), 'the names of the hosts that need a reboot'),
    (('rollout',), '`order` (the hosts in rollout order) and `max_unavailable`'),
    (('canary',),
     'with `gpuhost:rollout.canary`: the canary\'s last judgement as its host keeps it (`/var/lib/gpuhost/canary.json`; '
     'a refresh reads one that failed its `up`): `host`, `state` (`judging`, `interrupted`, `pass`, `fail`, '
     '`inconclusive`), `line` (the verdict in one line), `then` (what followed), `baseline` (the hosts it was '
     'judged against), `started`, `at` (UTC), `deadline` (Unix time), `unit_sha256` (the unit judged), `rows` (per band '
     'and metric: `canary`, `baseline`, `n_canary`, `n_baseline`, `p`, `effect`, `result`) and `table` (the same as '
     'text); null before the first judgement (docs/fleets.md)'),
)


def runtime_output(facts, env) -> dict:
    f = facts or {}
    return {'host_driver': f.get('host_driver'), 'container_driver': f.get('container_driver'), 'cuda': f.get('cuda'),
            'sglang': f.get('sglang') if f.get('sglang') != '-' else None, 'env': f.get('env'),
            'lock_sha256': f.get('lock_sha256'), 'declared_env': env['id'] if env else None}


def host_outputs(d, host, container, vm, service, weights=None) -> dict:
    """A host's outputs: a one-host stack's top-level outputs, and each entry of a fleet's `hosts`."""
    base = service.endpoint
    out = {
        'openai_base_url': base + '/v1',
        'health_url': base + '/health',
        'server_info_url': base + '/server_info',
        'metrics_url': base + '/metrics',
        # SGLang's /metrics and the host's node_exporter (resources/monitoring.py): write it to a file
        # Prometheus' file_sd_configs reads (`pulumi stack output prometheus_file_sd --json > ...`).
        'prometheus_file_sd': file_sd(d),
        'gpu_assignment': host.gpus,
        'iommu': {'declared_domain': d.iommu.domain, 'declared_kernel_args': d.iommu.kernel_args(),
                  'running_domain_types': host.iommu_domain_types, 'running_cmdline': host.running_cmdline,
                  'boot': host.boot, 'nccl_p2p_disabled': d.p2p_disabled},
        'speculation': {'requested': expected_speculation(d), 'resolved': service.resolved,
                        'resolved_observed_at': service.observed_at},
        # The unit as the last run (or refresh) found it: systemd's ActiveState == active, UnitFileState == enabled.
        'sglang_unit': {'name': d.sglang.unit, 'active': service.active, 'enabled': service.enabled},
        # The last smoke test: one chat completion from the host after the unit (or its container) changed.
        'smoke_test': service.smoke.stdout.apply(smoke_summary),
        'sglang_version': d.sglang.version,
        # What SGLang stands on, as the last run (or refresh) found it: the host's nvidia module and the
        # container's NVIDIA libraries (equal, or SGLang cannot start), CUDA, the environment it runs from.
        'runtime': service.runtime_facts.apply(lambda f: runtime_output(f, service.env)),
        # The last GPU proof before SGLang started (gpuhost:sglang.proof; null: never run): per GPU, the all-reduce's
        # bus bandwidth (bytes/s, nccl-tests' busbw) and transport, when (docs/gpu-proof.md).
        'gpu_proof': service.proven,
        'sglang_unit_sha256': hashlib.sha256(service.unit.encode()).hexdigest(),
        'reboot_required': host.reboot_required,
        'reboot_reasons': host.reboot_reasons,
        'container': {'vmid': d.container.vmid, 'address': d.container.address, 'status': container.status,
                      'gpus': list(d.container.gpus)},
    }
    if weights is not None:
        # The weights as the last run (or refresh) verified them on the host (resources/model.py).
        out['model'] = {'id': d.model.id, 'revision': d.model.revision, 'path': d.sglang.model_path,
                        'host_dir': d.model.host_dir(d.sglang.model_path), 'shards': weights.shards,
                        'bytes': weights.bytes, 'verified': weights.verified, 'verified_at': weights.verified_at,
                        'summary': weights.summary}
    if host.driver is not None:
        # The host's driver (gpuhost:nvidia.driver) as the last run or refresh read it (resources/driver.py).
        out['nvidia_driver'] = {'declared': d.nvidia.driver.version, 'loaded': host.driver.version,
                                'modules': host.driver.modules, 'installed': host.driver.installed,
                                'kernels_missing': host.driver.kernels_missing,
                                'running_kernel': host.driver.running_kernel}
    if vm is not None:
        # gpu_mappings: each PCI resource mapping's entry for the node as Proxmox has it (address, IDs and IOMMU
        # group recorded), what the VM's hostpci `mapping=` names; {} with gpu_binding: address.
        out['vm'] = {'vmid': d.vm.vmid, 'status': vm.status, 'pending_restart': vm.pending, 'gpus': list(d.vm.gpus),
                     'hostpci': vm.hostpci, 'gpu_binding': d.vm.gpu_binding, 'gpu_mappings': vm.gpu_mappings}
    return out


def export(d, host, container, vm, service, weights=None):
    for key, value in host_outputs(d, host, container, vm, service, weights).items():
        pulumi.export(key, value)


def export_fleet(fleet, built) -> None:
    """A fleet's outputs: `hosts` (name -> the outputs a one-host stack has, without its file_sd), one
    `prometheus_file_sd` for every host (each target group labelled with its host), `reboot_required`
    (the hosts that need one) and `rollout` (the order and lanes of rolling changes)."""
    hosts, sd = {}, []
    for h, parts in zip(fleet.hosts, built):
        hosts[h.name] = host_outputs(h.deployment, *parts)
        for group in hosts[h.name].pop('prometheus_file_sd'):
            sd.append({'targets': group['targets'], 'labels': dict(group['labels'], host=h.name)})
    pulumi.export('hosts', hosts)
    pulumi.export('prometheus_file_sd', sd)
    pulumi.export('reboot_required', pulumi.Output.all(*[hosts[n]['reboot_required'] for n in hosts]).apply(
        lambda flags: sorted(n for n, f in zip(hosts, flags) if f)))
    pulumi.export('rollout', {'order': [h.name for h in fleet.hosts],
                              'max_unavailable': fleet.rollout.max_unavailable})
    if fleet.rollout.canary is not None:
        # The first host is the canary (__main__.py canary_of): its unit keeps the last judgement.
        pulumi.export('canary', built[0][3].canary_verdict)
