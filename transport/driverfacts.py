"""The host's NVIDIA kernel driver as loaded and as installed (hostscripts/driver_facts.sh's records; issue 59,
docs/driver-plan.md): what is read, never guessed - a host that does not show something gives None or '?'."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional


@dataclasses.dataclass
class DriverFacts:
    loaded: Optional[str] = None          # the loaded nvidia module's version; None: not loaded
    flavour_line: Optional[str] = None    # /proc/driver/nvidia/version's first line
    running: Optional[str] = None         # the running kernel
    # Each kernel of /lib/modules -> the nvidia module version installed for it: '' none, '?' unknown (no modinfo).
    kernels: Dict[str, str] = dataclasses.field(default_factory=dict)
    tree: bool = True                     # False: the host has no /lib/modules at all

    @property
    def flavour(self) -> Optional[str]:
        """'open' (NVIDIA's open kernel modules - Blackwell runs no other), 'proprietary', or None (not loaded)."""
        if not self.flavour_line:
            return None
        return 'open' if 'Open Kernel Module' in self.flavour_line else 'proprietary'

    def without_module(self) -> list:
        """The installed kernels with no nvidia module built for them: a boot into one has no GPU driver."""
        return sorted(k for k, v in self.kernels.items() if v == '')


def parse(text: str) -> DriverFacts:
    """driver_facts.sh's output (pure; golden-tested)."""
    facts = DriverFacts()
    for line in text.splitlines():
        kind, _, rest = line.partition('\t')
        fields = rest.split('\t')
        if kind == 'loaded':
            facts.loaded = rest.strip() or None
        elif kind == 'flavour':
            facts.flavour_line = rest.strip() or None
        elif kind == 'running':
            facts.running = rest.strip() or None
        elif kind == 'kernel' and len(fields) >= 2 and fields[0]:
            facts.kernels[fields[0]] = '' if fields[1].strip() == '-' else fields[1].strip()
        elif kind == 'modules' and rest.strip() == 'absent':
            facts.tree = False
    return facts
