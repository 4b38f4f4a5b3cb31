"""One host's whole configuration and the rules across its sections: a GPU on one side only and on
its NUMA node, tensor parallelism over every container GPU, the IOMMU and kernel parameters that would
brick a Blackwell GPU or break SEV-SNP, root@pam for the keys only root may set, the SGLang flags as the
declared release parses them. Also what follows from it: the launch flags, the unit's environment, the
container's devN entries, the warnings."""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from typing import Optional
from urllib.parse import urlsplit

from pydantic import ValidationError, model_validator

from config.container import Container
from config.errors import format_errors
from config.host import Host
from config.iommu import EXTRA_KERNEL_ARGS_MAX, Iommu
from config.model import ModelWeights
from config.monitoring import Monitoring
from config.nvidia import Nvidia
from config.runtime import CUDA_MIN_DRIVER, Runtime, toolkit_dir
from config.sglang import Sglang
from config.values import ConfigError, Model, show
from config.vm import Vm
from grammar import cmdline, sglang_flags, systemd
from grammar.installers import PLACEHOLDER_SHA256, where_sums
from grammar.gpu import BLACKWELL_IDS, FSP_EXPLANATION, NVIDIA_CONTROL_DEVICES
from grammar.sglang_flags import API_KEY_VAR


class Deployment(Model):
    host: Host
    iommu: Iommu = Iommu()
    nvidia: Nvidia = Nvidia()
    container: Container
    vm: Optional[Vm] = None
    sglang: Sglang
    runtime: Optional[Runtime] = None
    model: Optional[ModelWeights] = None
    monitoring: Monitoring = Monitoring()

    @model_validator(mode='after')
    def _cross(self):
        host = self.host
        sides = [('container', self.container)] + ([('vm', self.vm)] if self.vm else [])
        if self.vm and self.vm.vmid == self.container.vmid:
            raise ValueError('gpuhost:vm.vmid: %d is the container\'s vmid too; each guest needs its own (e.g. vm.vmid: '
                             '%d)' % (self.vm.vmid, self.container.vmid + 100))
        bind = ipaddress.ip_address(self.sglang_host)
        if not bind.is_unspecified and bind != ipaddress.ip_address(self.container.address):
            raise ValueError('gpuhost:sglang.host: %s is not the container\'s address (gpuhost:container.ip: %s): %s, '
                             'while /health, the smoke test and monitoring reach SGLang at %s. Use %s (the container\'s '
                             'own address only: leave gpuhost:sglang.host out) or 0.0.0.0 (all of its addresses, with the '
                             'policy opt-in allow_public_bind)' % (
                                 self.sglang.host, self.container.ip,
                                 'SGLang would answer only inside the container' if bind.is_loopback else
                                 'SGLang could not listen there (the restart would fail)',
                                 self.container.address, self.container.address))
        seen = {}
        for side, guest in sides:
            for addr in guest.gpus:
                if addr in seen:
                    raise ValueError('gpuhost:%s.gpus: %s is already given to the %s; a GPU goes to one side only '
                                     '- remove it from one of the lists' % (side, addr, seen[addr]))
                seen[addr] = side
                gpu = host.gpu(addr)
                if gpu is None:
                    raise ValueError('gpuhost:%s.gpus: %s is not in gpuhost:host.gpus; add it to the inventory '
                                     '(address, numa, id as lspci -D -nn -d 10de: shows) or fix the address' % (side, addr))
                if gpu.numa != guest.numa:
                    raise ValueError('gpuhost:%s.gpus: %s sits on NUMA node %d but the %s is placed on NUMA node %d;'
                                     ' give it to the other side or change gpuhost:%s.numa' % (
                                         side, addr, gpu.numa, side, guest.numa, side))
            if guest.numa not in host.numa_cpus:
                raise ValueError('gpuhost:%s.numa: %d has no CPU list in gpuhost:host.numa_cpus; add it' % (
                    side, guest.numa))
        if self.sglang.tp != len(self.container.gpus):
            raise ValueError('gpuhost:sglang.tp: %d but the container has %d GPUs; tensor parallelism must use '
                             'every container GPU - set tp: %d' % (self.sglang.tp, len(self.container.gpus),
                                                                   len(self.container.gpus)))
        self._check_iommu()
        self._check_api_auth()
        self._follow_driver()
        self._check_runtime()
        self._check_model()
        try:
            sglang_flags.check(self.sglang.version, self.managed_launch_args(), list(self.sglang.extra_args))
        except sglang_flags.FlagError as e:
            raise ValueError(str(e)) from None
        return self

    def kernel_policy(self):
        """What decides which kernel parameters are dangerous on this host (grammar/cmdline.py)."""
        return {'blackwell': self.host.has_blackwell, 'snp': bool(self.vm and self.vm.sev == 'snp'),
                'vfio': bool(self.vm and self.vm.gpus)}

    def _check_iommu(self):
        host = self.host
        policy = self.kernel_policy()
        managed = self.iommu.managed_args()
        for i, arg in enumerate(self.iommu.extra_kernel_args):
            why = cmdline.check_extra(arg, managed, policy)
            if why:
                raise ValueError('gpuhost:iommu.extra_kernel_args[%d]: %s %s%s' % (
                    i, show(arg), why, '' if 'identity' not in why else '. Use gpuhost:iommu.domain: DMA-FQ (the '
                    'default) and drop it'))
        total = len(' '.join(list(managed) + list(self.iommu.extra_kernel_args)).encode())
        if total > EXTRA_KERNEL_ARGS_MAX:
            raise ValueError('gpuhost:iommu.extra_kernel_args: with the managed arguments they make %d bytes; the kernel '
                             'keeps only %d bytes of its whole command line (the host\'s root=, BOOT_IMAGE= and '
                             'others included) and silently drops the rest, so keep these under %d' % (
                                 total, cmdline.COMMAND_LINE_MAX, EXTRA_KERNEL_ARGS_MAX))
        if self.iommu.domain == 'identity':
            if host.has_blackwell:
                raise ValueError('gpuhost:iommu.domain: identity asks for identity (passthrough) domains, but the host '
                                 'has Blackwell GPUs (%s): %s. Use domain: DMA-FQ (the default)' % (
                                     ', '.join(sorted({g.id for g in host.gpus} & BLACKWELL_IDS)), FSP_EXPLANATION))
            if self.vm and self.vm.sev == 'snp':
                raise ValueError('gpuhost:iommu.domain: identity disables SEV-SNP on the host ("SNP: IOMMU disabled or '
                                 'configured in passthrough mode"), which gpuhost:vm.sev: snp needs; use DMA-FQ')

    def _check_api_auth(self):
        api = self.host.api
        root_only = []
        if self.container.gpus:
            root_only.append('devN (container GPUs)')
        if self.vm and self.vm.gpus and self.vm.gpu_binding == 'address':
            # Through a resource mapping, hostpciN needs only Mapping.Use on /mapping/pci/<id>
            # (docs/operator-guide.md, "Why API tokens are refused"); a raw address is root@pam's.
            root_only.append('raw hostpciN')
        if self.vm and self.vm.sev != 'none':
            root_only.append('amd-sev')
        if self.vm:
            root_only.append('affinity')
        if self.model is not None:
            root_only.append('bind mount points (mpN)')
        if api.token_id or api.token_secret:
            raise ValueError('gpuhost:host.api.token_id: %s - Proxmox lets only root@pam with a password ticket set '
                             '%s; an API token, even root\'s, is refused. Remove token_id/token_secret and set '
                             'host.api.password (secret) for root@pam' % (show(api.token_id), ', '.join(root_only)))
        if api.user != 'root@pam':
            raise ValueError('gpuhost:host.api.user: %s - only root@pam may set %s; set user: root@pam' % (
                show(api.user), ', '.join(root_only)))
        if api.password is None and api.password_file is None:
            raise ValueError('gpuhost:host.api: no password for root@pam; set host.api.password as a secret '
                             '(pulumi config set --secret --path gpuhost:host.api.password)')

    def _follow_driver(self):
        """gpuhost:runtime.nvidia follows gpuhost:nvidia.driver: one version for the host's module and the container's
        user space (NVML refuses any other pair: "Driver/library version mismatch"). Absent, it is the driver's
        installer at the driver's version; declared, it must name the same version."""
        driver = self.nvidia.driver
        if driver is None:
            return
        rt = self.runtime
        if rt is not None and rt.nvidia is not None:
            if rt.nvidia.version != driver.version:
                raise ValueError('gpuhost:runtime.nvidia.version: %s, but gpuhost:nvidia.driver.version is %s: the '
                                 'container\'s user space must be the host module\'s version, or NVML fails with '
                                 '"Driver/library version mismatch". Remove gpuhost:runtime.nvidia (it follows the driver) '
                                 'or set its version to %s' % (rt.nvidia.version, driver.version, driver.version))
            return
        from config.runtime import NvidiaRuntime
        nvidia = NvidiaRuntime(**driver.runtime())
        # Derived once, here, where the model is made (it is frozen from then on): every reader of runtime.nvidia -
        # the unit's installers, the preflight, the outputs - sees the user space the driver brings.
        object.__setattr__(self, 'runtime', rt.model_copy(update={'nvidia': nvidia}) if rt is not None else
                           Runtime(nvidia=nvidia))

    def _check_runtime(self):
        rt, s = self.runtime, self.sglang
        if rt is None:
            return
        if rt.cuda is not None:
            why = toolkit_dir(s.cuda_home)
            if why:
                raise ValueError('gpuhost:sglang.cuda_home: %s %s, and gpuhost:runtime.cuda installs the toolkit there '
                                 '(a reinstall moves the directory aside and back); give CUDA a directory of its '
                                 'own, e.g. /usr/local/cuda-%s' % (show(s.cuda_home), why,
                                                                   '.'.join(rt.cuda.version.split('.')[:2])))
            m = re.match(r'^cuda-(\d+\.\d+)$', posixpath.basename(s.cuda_home))
            minor = '.'.join(rt.cuda.version.split('.')[:2])
            if m and m.group(1) != minor:
                raise ValueError('gpuhost:sglang.cuda_home: %s names CUDA %s, but gpuhost:runtime.cuda.version installs '
                                 '%s there; set cuda_home: %s' % (s.cuda_home, m.group(1), rt.cuda.version,
                                                                  posixpath.join(posixpath.dirname(s.cuda_home),
                                                                                 'cuda-' + minor)))
            need = CUDA_MIN_DRIVER.get(int(rt.cuda.version.split('.')[0]))
            if rt.nvidia is not None and need and int(rt.nvidia.version.split('.')[0]) < need:
                raise ValueError('gpuhost:runtime.nvidia.version: %s is too old for CUDA %s, which needs a %d-series '
                                 'driver or newer (on the host and in the container); upgrade the host driver first' % (
                                     rt.nvidia.version, rt.cuda.version, need))
        if rt.python is not None:
            envs, venv = rt.python.envs_dir, s.venv
            if envs == venv or envs.startswith(venv + '/') or venv.startswith(envs + '/'):
                raise ValueError('gpuhost:runtime.python.envs_dir: %s and gpuhost:sglang.venv %s overlap; the '
                                 'environments live in envs_dir and venv becomes a link to the current one - give '
                                 'them separate paths, e.g. /opt/sglang/envs and /opt/sglang/venv' % (envs, venv))

    def _check_model(self):
        m, s = self.model, self.sglang
        if m is None:
            return
        rel = m.relative(s.model_path)
        if rel is None:
            raise ValueError('gpuhost:sglang.model_path: %s is not inside the model mount gpuhost:model.mount (%s): '
                             'the container sees the weights only there; set model_path: %s' % (
                                 show(s.model_path), m.mount, posixpath.join(m.mount, m.id)))
        if m.mount == s.venv or s.venv.startswith(m.mount + '/') or s.cuda_home.startswith(m.mount + '/'):
            raise ValueError('gpuhost:model.mount: %s would hide gpuhost:sglang.venv or cuda_home under the weights; '
                             'use a path of its own, e.g. /models' % m.mount)

    # -------------------------------------------------------------- derived

    @property
    def warnings(self):
        out = []
        for a in self.iommu.kernel_args():
            name, value = cmdline.param(a)
            if cmdline.norm(name) == 'amd_iommu' and any(i == 'on' for i in cmdline.items(value)):
                out.append('gpuhost:iommu.extra_kernel_args: %s is not a valid value (the kernel logs "Unknown option '
                           '- \'on\'"); the AMD IOMMU is on by default, so it does nothing - drop it' % a)
        if self.vm and self.vm.sev != 'none' and self.vm.gpus:
            out.append('gpuhost:vm: SEV-%s together with PCI passthrough is listed by Proxmox as not supported '
                       '("very experimental"); this deployment runs it knowingly' % self.vm.sev.upper())
        for side, guest in (('container', self.container), ('vm', self.vm)):
            if guest is not None and not guest.protect:
                out.append('gpuhost:%s.protect: false - this `up` may delete or replace %s %d and its disk; set it '
                           'back to true afterwards' % (side, side, guest.vmid))
        if self.model is not None and self.model.writable:
            out.append('gpuhost:model.writable: true - container %d can write the weights at %s (mp%d without ro=1); '
                       'SGLang only reads them, and a write there corrupts them for the next start. Set it back to '
                       'false once done' % (self.container.vmid, self.model.mount, self.model.mp))
        out.extend(sglang_flags.warnings(self.sglang.version, self.launch_args(), self.sglang.environment,
                                         bool(self.sglang.speculative)))
        if not self.sglang.proof.enabled:
            out.append('gpuhost:sglang.proof.enabled: false - SGLang starts on GPUs nobody proved: a GPU that did not '
                       'come up after a reboot, a user space that does not match the host module or an NCCL transport '
                       'that hangs under the IOMMU shows only as SGLang hanging at start-up or in its first '
                       'all-reduce (docs/gpu-proof.md). Set it back to true')
        for key in ('nvidia', 'cuda'):
            part = getattr(self.runtime, key) if self.runtime else None
            if part is not None and part.sha256 == PLACEHOLDER_SHA256:
                name = posixpath.basename(part.host_path)
                out.append('gpuhost:runtime.%s.sha256 is the example\'s placeholder (64 zeros): `up` installs nothing '
                           'until it is %s\'s real sha256 - %s; then pulumi config set --path gpuhost:runtime.%s.sha256 '
                           '<sha256>' % (key, name, where_sums(key, name), key))
        index = self.runtime.python.index if self.runtime and self.runtime.python else None
        if index is not None and index.username and index.url.startswith('http://'):
            host = urlsplit(index.url).hostname or ''
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = host == 'localhost'
            if not loopback:
                out.append('gpuhost:runtime.python.index.url: %s is plain http: the index password crosses the network '
                           'unencrypted at every environment build; use https' % index.url)
        return out

    @property
    def sglang_host(self) -> str:
        """Where SGLang listens: gpuhost:sglang.host, by default the container's own address (private, as the
        policy pack's sglang-private-bind wants, and where /health and monitoring reach it)."""
        return self.sglang.host or self.container.address

    @property
    def p2p_disabled(self):
        """Translated IOMMU: GPU peer-to-peer DMA does not work, so NCCL must not try it."""
        return self.iommu.domain != 'identity'

    def managed_launch_args(self):
        """The flags this program sets (a list, never a string); extra_args may not touch them."""
        s = self.sglang
        # With gpuhost:model: the declared revision's own directory (config/model.py container_dir).
        model_path = self.model.container_dir(s.model_path) if self.model else s.model_path
        args = ['--model-path', model_path, '--served-model-name', s.served_model_name,
                '--host', self.sglang_host, '--port', str(s.port), '--tp-size', str(s.tp),
                '--mem-fraction-static', repr(s.mem_fraction_static), '--enable-metrics']
        spec = s.speculative
        if spec:
            args += ['--speculative-algorithm', spec.algorithm,
                     '--speculative-num-steps', str(spec.num_steps),
                     '--speculative-eagle-topk', str(spec.eagle_topk),
                     '--speculative-num-draft-tokens', str(spec.num_draft_tokens)]
        if s.mamba_radix_cache_strategy:
            try:
                args += sglang_flags.mamba_strategy_args(s.version, s.mamba_radix_cache_strategy)
            except sglang_flags.FlagError as e:
                raise ValueError(str(e)) from None
        if s.disable_custom_all_reduce:
            args.append('--disable-custom-all-reduce')
        return args

    def launch_args(self):
        """`python -m sglang.launch_server` arguments for the declared version. The API key is a
        reference to the root-only environment file's variable, never its value."""
        key = ['--api-key', systemd.EnvRef(API_KEY_VAR)] if self.sglang.api_key else []
        return self.managed_launch_args() + key + list(self.sglang.extra_args)

    def service_environment(self, python_prefix=None):
        """The unit's environment. python_prefix: the environment SGLang runs from (a managed one's own
        directory, resources/runtime.py), else gpuhost:sglang.venv."""
        s = self.sglang
        env = {'CUDA_HOME': s.cuda_home, 'PATH': '%s/bin:%s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:'
                                                 '/sbin:/bin' % (python_prefix or s.venv, s.cuda_home)}
        if self.p2p_disabled:
            env['NCCL_P2P_DISABLE'] = '1'
        env.update(s.environment)
        return env

    def container_devices(self):
        """devN entries: one /dev/nvidiaN per container GPU, then the control devices.

        The nvidia driver numbers the GPUs it owns in bus order; with the VM's GPUs on vfio-pci the
        container's are /dev/nvidia0..N-1 (checked against /proc/driver/nvidia/gpus at apply)."""
        nodes = ['/dev/nvidia%d' % i for i in range(len(self.container.gpus))] + list(NVIDIA_CONTROL_DEVICES)
        return {'dev%d' % i: '%s,mode=0666' % path for i, path in enumerate(nodes)}

    def container_mounts(self):
        """mpN entries: the model storage, bind-mounted read-only (gpuhost:model)."""
        if self.model is None:
            return {}
        return {'mp%d' % self.model.mp: self.model.mount_entry()}


def parse(data: dict) -> Deployment:
    """Build the model from the `gpuhost` config namespace; raises ConfigError with readable messages."""
    try:
        return Deployment.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as e:
        raise ConfigError(format_errors(e, Deployment)) from None
    except (TypeError, ValueError) as e:  # a value json cannot carry
        raise ConfigError('invalid stack configuration: %s' % e) from None
