"""A credential written as plain text in a stack's config, refused before the Pulumi CLI starts (tools/run.sh, on
every target that runs an update, refresh, destroy or preview of a stack: make up, make preview, make up FLEET=N,
make bench-serve).

    python -m tools.plain_secrets STACK [pulumi flags]     (in the project directory)

The program refuses it too (config/load.py, check_secrets), but the program runs inside an update: by then the
CLI has taken the stack's config, this value with it, into the update it records in the backend's update history
(docs/operator-guide.md, "Credentials written as plain text"). This reads Pulumi.<stack>.yaml as the program reads
its config - the same credential paths (config.load.SECRET_PATHS) in the same places (the shared settings and each
gpuhost:hosts entry) - plus flat keys (gpuhost:host.api.password, `pulumi config set` without --path) and
`-c key=value` flags, and decrypts nothing: no passphrase needed. Never prints a value. Exit status 2 when something
is refused, else 0.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from config import load  # noqa: E402


def flag_config(args) -> list:
    """[(key, value)] of the -c/--config key=value flags of a pulumi command line (which the CLI saves into the
    stack's file, in plain text, and records with the update)."""
    out, i = [], 0
    while i < len(args):
        a, value = args[i], None
        if a in ('-c', '--config') and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        elif a.startswith('--config='):
            value = a[len('--config='):]
        elif a.startswith('-c') and len(a) > 2 and not a.startswith('--'):
            value = a[2:].lstrip('=')
        if value is not None and '=' in value:
            out.append(tuple(value.split('=', 1)))
        i += 1
    return out


def refusals(stack: str, args=()) -> list:
    """One message for each credential the stack's file (or a -c flag) holds in plain text."""
    name = stack.split('/')[-1]
    file = 'Pulumi.%s.yaml' % name
    lines = []
    for key, full, value, how in load.stack_file_plain_secrets(stack, tuple(flag_config(args))):
        target = load.secret_key(full)
        if how == 'flag':
            lines.append('%s is given as plain text on the command line (-c %s=...): pulumi would save it into %s and '
                         'record it in the backend\'s update history, unencrypted. Nothing was written. Drop the flag '
                         'and make it a secret: pulumi config set --secret --path %s' % (key, key, file, target))
            continue
        where = ('as the flat key %s, as `pulumi config set` without --path writes it - the program does not read it, '
                 'but an update records it' % key) if how == 'flat' else ''
        lines.append('%s is set as plain text in %s%s, so pulumi would record it unencrypted in the backend\'s update '
                     'history (and the state). Refused before pulumi runs: no update, refresh or destroy of this run '
                     'recorded it. %s. Make it a secret: %s' % (
                         target, file, ' (%s)' % where if where else '',
                         load.plain_text_note(full, value, name, dry_run=True),
                         load.secret_fix(target, key if how == 'flat' else None)))
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print('usage: python -m tools.plain_secrets STACK [pulumi flags]', file=sys.stderr)
        return 2
    lines = refusals(argv[0], argv[1:])
    for line in lines:
        print('run: stack %s: %s' % (argv[0], line), file=sys.stderr)
    return 2 if lines else 0


if __name__ == '__main__':
    sys.exit(main())
