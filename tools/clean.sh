#!/usr/bin/env bash
# make clean: the project's set-up (.venv, .pulumi-home, render/) and the lab's state go; the state of any
# other stack in the local backend (.state) stays - it may be the only record of a real host's deployment.
# A backend set elsewhere (PULUMI_BACKEND_URL: S3, Azure Blob, GCS, Pulumi Cloud, a shared path) is never
# touched. To move a kept stack: pulumi stack export --stack <name> --file <name>.json, then, logged in to
# the other backend, pulumi stack init <name> --secrets-provider passphrase && pulumi stack import --stack <name> --file <name>.json.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
shopt -s nullglob
# Only in this checkout (a copied or linked script must not delete another directory's .venv and .state).
grep -q '^name: gpuhost$' Pulumi.yaml 2>/dev/null || { echo "clean: $root is not the gpuhost checkout" >&2; exit 1; }

LAB_STACKS=(lab lab-fleet)

rm -rf .venv .pulumi-home render
meta=.state/.pulumi
if [ -d "$meta" ]; then
  for s in "${LAB_STACKS[@]}"; do
    # Project-scoped layout (stacks/<project>/<stack>.json) and the older flat one (stacks/<stack>.json).
    rm -f "$meta"/stacks/"$s".json* "$meta"/stacks/*/"$s".json*
    rm -rf "$meta"/history/"$s" "$meta"/history/*/"$s" "$meta"/backups/"$s" "$meta"/backups/*/"$s" \
      "$meta"/locks/*/*/"$s" "$meta"/locks/*/"$s"
  done
  kept=()
  # Any other stack's file counts - its .bak too (all that is left of a stack after `pulumi stack rm`) - and
  # any other stack's history or backups (project layout: <kind>/gpuhost/<stack>; the flat one: <kind>/<stack>).
  add() { if [[ " ${kept[*]} " != *" $1 "* ]]; then kept+=("$1"); fi; }
  for f in "$meta"/stacks/* "$meta"/stacks/*/*; do
    if [ -f "$f" ]; then name=${f##*/}; add "${name%%.json*}"; fi
  done
  for f in "$meta"/history/* "$meta"/backups/* "$meta"/history/*/* "$meta"/backups/*/*; do
    if [ -d "$f" ] && [ "${f##*/}" != gpuhost ]; then add "${f##*/}"; fi
  done
  if [ ${#kept[@]} -eq 0 ]; then
    rm -rf .state
  else
    echo "clean: kept .state: it holds the state of stack(s) ${kept[*]}, not the lab's (only the lab's was removed)." >&2
    echo "clean: to move it to a shared backend: pulumi stack export --stack <name> --file <name>.json, then with" >&2
    echo "clean: PULUMI_BACKEND_URL set to it: pulumi stack init <name> --secrets-provider passphrase && pulumi stack import --stack <name> --file <name>.json" >&2
  fi
elif [ -d .state ]; then
  rmdir .state 2>/dev/null || echo "clean: kept .state (not a Pulumi file backend: look before deleting it)" >&2
fi
