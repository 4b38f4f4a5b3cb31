"""The ground floor: the grammars of the places this program writes into, with no Pulumi and nothing else
of ours in them (stdlib only), imported by the config (config/), the components (components/) and the
policy pack (policy/) alike.

  cmdline.py          the kernel command line, read as the kernel reads it (next_arg, -/_, kstrtobool)
  systemd.py          systemd unit values, written in systemd's own quoting (the renderer)
  systemd_unit.py     unit files read the way systemd 252 reads them (the parser, the renderer's inverse)
  pve.py              Proxmox property strings and a guest config's raw lxc.* lines
  sglang_argparse.py  SGLang's argument parser rebuilt from a release's table (sglang_flags_data/)
  sglang_flags.py     what the program may and may not pass SGLang, per version; SGLang's API key variable
  gpu.py              the GPUs: PCI address and ID formats, the Blackwell IDs and why they need care
"""
