"""make check STACK=<name>: every prerequisite of the stack's hosts, read-only, each with a ✓ or a ✗ and the fix.

    python -m tools.check prod          (in the project directory; PULUMI_CONFIG_PASSPHRASE(_FILE) set)

What is checked is what `up` checks before any step (components/preflight.py, the same code), plus what only
matters later and `up` cannot refuse for (IOMMU and SEV-SNP in the firmware). It contacts each host over SSH
with the pinned host key and its Proxmox API, and changes nothing on either: one read-only SSH command
(host_facts.sh), one more to look for the unit name in the container (ct_unit_owner.sh), and API GETs - and, with
gpuhost:rollout.fleet_lock, one read of the lock's slots in etcd (who holds them; nothing taken).

The stack's config is read the way the program gets it - `pulumi config --show-secrets`, secure values
decrypted with the stack's passphrase - and no secret is ever printed. Exit status: 0 when everything holds,
1 when something is missing, 2 when the config itself is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import config  # noqa: E402
from components import preflight  # noqa: E402
from transport.operator import OperatorError, describe_unexpected  # noqa: E402

OK, BAD, SKIP = '\u2713', '\u2717', '-'


def stack_fleet(stack: str, project: str):
    """The stack's fleet as the program gets it: `gpuhost:*` config with secure leaves decrypted, credentials
    written as plain text refused as `up` refuses them (config.fleet_from_data)."""
    try:
        res = subprocess.run(['pulumi', 'config', '--json', '--show-secrets', '--stack', stack], cwd=project,
                             capture_output=True, text=True)
    except OSError as e:
        raise config.ConfigError('running pulumi to read the config of stack %s: %s (make check sets up the CLI)'
                                 % (stack, e)) from None
    if res.returncode != 0:
        raise config.ConfigError('reading the config of stack %s: %s' % (stack, res.stderr.strip()[-2000:]))
    try:
        keys = json.loads(res.stdout or '{}')
    except ValueError:
        raise config.ConfigError('reading the config of stack %s: pulumi config --json printed no JSON' % stack) \
            from None
    config.check_namespaces(list(keys))
    data = {}
    for key, entry in keys.items():
        ns, _, name = key.partition(':')
        if ns != 'gpuhost':
            continue
        raw = entry.get('value')
        try:
            data[name] = json.loads(raw)
        except (TypeError, ValueError):
            data[name] = raw
    secret = {k for k, entry in keys.items() if entry.get('secret')}
    # (Pulumi.<stack>.yaml's secure: leaves, read from the project directory, where main() runs)
    return config.fleet_from_data(data, lambda key: key in secret, config.stack_file_secure_paths(stack), stack=stack)


def host_lines(results) -> list:
    lines = []
    for r in results:
        if r.skipped:
            lines.append('  %s %s (not checked: %s)' % (SKIP, r.check.title, r.skipped))
        elif r.problem:
            lines.append('  %s %s' % (BAD, r.check.title))
            lines += ['      ' + line for line in r.problem.splitlines()]
        else:
            lines.append('  %s %s' % (OK, r.check.title))
    return lines


def fleet_lock_line(fleet) -> tuple:
    """(line, problem) for gpuhost:rollout.fleet_lock: etcd answers (and takes the login) and who holds the slots
    now - one range read, nothing taken. (None, False) without the lock."""
    from transport import fleetlock
    lock = fleet.rollout.fleet_lock
    if lock is None:
        return None, False
    settings = fleetlock.Settings.of(lock.plain(), fleet.fleet_lock_secret())
    try:
        held = fleetlock.Client(settings).holders()
    except fleetlock.Refused as e:
        return '  %s %s' % (BAD, e), True
    return '  %s %s answers%s: %d of %d slot%s held%s' % (
        OK, settings.words(), ' (user %s)' % settings.user if settings.user else '', len(held), settings.slots,
        '' if settings.slots == 1 else 's', ''.join('%s %d: %s' % (',' if i else ' -', k, v)
                                                    for i, (k, v) in enumerate(sorted(held.items())))), False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print('usage: python -m tools.check STACK', file=sys.stderr)
        return 2
    stack, project = argv[0], os.getcwd()
    try:
        fleet = stack_fleet(stack, project)
        # The lock as the preview reads it: pinned, hashed, its wheels fit for the container's template
        # (grammar/wheeltags.py); the preflight's check judges them against the running container's own.
        hosts = [(h, config.connection_inputs(h.deployment, project), config.model_inputs(h.deployment, project),
                  config.runtime_inputs(h.deployment, project, read_secrets=False)) for h in fleet.hosts]
    except (config.ConfigError, OperatorError) as e:
        print('check: stack %s: %s' % (stack, e), file=sys.stderr)
        return 2
    missing = 0
    for h, (connection, api), model_files, runtime_files in hosts:
        d = h.deployment
        print('%shost %s (ssh %s@%s:%d, Proxmox API %s:%d, node %s):' % (
            '' if not fleet.is_fleet else '[%s] ' % h.name, d.host.address, connection['user'], connection['host'],
            connection['port'], api['host'], api['port'], d.host.node))
        try:
            results = preflight.report(d, connection, api, model_files, runtime_files)
        except Exception as e:  # noqa: BLE001 - never frames for the operator
            print('  %s %s' % (BAD, describe_unexpected(e)))
            missing += 1
            continue
        print('\n'.join(host_lines(results)))
        missing += sum(1 for r in results if r.problem or r.skipped)
    line, problem = fleet_lock_line(fleet)
    if line:
        print('the fleet lock (gpuhost:rollout.fleet_lock):')
        print(line)
        missing += int(problem)
    print()
    if missing:
        print('%d prerequisite%s missing or not checked; nothing was changed. Fix them (each ✗ says how) and run '
              'make check STACK=%s again.' % (missing, '' if missing == 1 else 's', stack))
        return 1
    print('Every prerequisite holds; nothing was changed. Next: make preview STACK=%s, then make up STACK=%s.'
          % (stack, stack))
    return 0


if __name__ == '__main__':
    sys.exit(main())
