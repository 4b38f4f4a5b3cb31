#!/usr/bin/env bash
# The Makefile's targets. Each one bootstraps first (idempotent, seconds when warm).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The lab stack's config holds no secrets (its credentials are files the lab generates), so its
# passphrase is fixed and public. Other stacks need the operator's PULUMI_CONFIG_PASSPHRASE(_FILE).
LAB_PASSPHRASE=gpuhost-lab

deps() {
  # The lab's SSH server is Debian's OpenSSH; a new machine may not have it yet.
  if [ ! -x /usr/sbin/sshd ]; then
    echo "run: installing openssh-server (the lab's SSH server)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
  fi
  tools/bootstrap.sh
  # shellcheck disable=SC1091
  . ./.env.sh
}

stack_env() {
  if [ "$1" = lab ] || [ "$1" = fleet ]; then
    export PULUMI_CONFIG_PASSPHRASE=$LAB_PASSPHRASE
    unset PULUMI_CONFIG_PASSPHRASE_FILE
  elif [ -z "${PULUMI_CONFIG_PASSPHRASE:-}${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
    echo "run: stack $1 has secure: values; set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE" >&2
    exit 2
  fi
}

select_stack() {
  stack_env "$1"
  pulumi stack select --create --secrets-provider passphrase "$1" >/dev/null
}

# The safety rules (policy/, README "Policy pack"), mandatory; policy/config.<stack>.json, when present,
# lowers rules to advisory or opts in (the pack prints what it relaxes on every run).
policy=()
policy_args() {
  policy=(--policy-pack policy)
  if [ -f "policy/config.$1.json" ]; then
    policy+=(--policy-pack-config "policy/config.$1.json")
  fi
}

cmd=${1:-}
shift || true
case "$cmd" in
  up)
    deps
    started=$(python -m lab.labctl up | python -c 'import json,sys; print(json.load(sys.stdin)["started"])')
    if [ "$started" = True ]; then
      # A fresh lab has no container, VM or host changes: any earlier lab state is stale.
      stack_env lab
      pulumi stack rm --yes --force --preserve-config lab >/dev/null 2>&1 || true
    fi
    select_stack lab
    policy_args lab
    # --refresh: reconcile with what the host runs now (a reboot, a hand edit) before planning.
    pulumi up --yes --skip-preview --refresh --suppress-progress "${policy[@]}"
    echo
    echo "Stack outputs (lab):"
    pulumi stack output --json
    echo
    pulumi stack output --json | python -m tools.fleet_summary
    ;;
  up-fleet)
    deps
    n=${1:?hosts}
    started=$(python -m lab.fleet up --hosts "$n" | python -c 'import json,sys; print(len(json.load(sys.stdin)["started"]))')
    stack_env fleet
    if [ "$started" = "$n" ]; then
      # Every host is fresh: any earlier fleet state is stale.
      pulumi stack rm --yes --force --preserve-config fleet >/dev/null 2>&1 || true
    fi
    select_stack fleet
    policy_args fleet
    pulumi up --yes --skip-preview --refresh --suppress-progress "${policy[@]}"
    echo
    echo "Fleet ($n hosts, stack fleet; every output: pulumi stack output --json --stack fleet):"
    pulumi stack output --json | python -m tools.fleet_summary
    ;;
  test)
    deps
    python -m pytest -q tests "$@"
    ;;
  lab)
    deps
    if [ -n "${1:-}" ]; then python -m lab.fleet up --hosts "$1"; else python -m lab.labctl up; fi
    ;;
  lab-down) deps; python -m lab.labctl down; python -m lab.fleet down >/dev/null ;;
  preview)
    deps
    select_stack "${1:?stack}"
    policy_args "$1"
    pulumi preview --diff "${policy[@]}"
    ;;
  render)
    deps
    python -m tools.render "${1:?stack}" "${2:?out dir}"
    ;;
  bench)
    deps
    python -m tools.bench "$@"
    ;;
  bench-fleet)
    deps
    python -m tools.bench_fleet "$@"
    ;;
  bench-serve)
    deps
    tools/bench-venv.sh
    stack=${1:?stack}
    shift
    stack_env "$stack"
    policy_args "$stack"
    # Every variant's `up` runs with the same policy pack as `make up`.
    python -m tools.bench_serve "$stack" "${policy[@]}" "$@"
    ;;
  *) echo "usage: tools/run.sh up|up-fleet N|test|lab [N]|lab-down|preview STACK|render STACK OUT|bench|bench-serve STACK [flags]" >&2; exit 2 ;;
esac
