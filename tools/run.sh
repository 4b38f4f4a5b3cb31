#!/usr/bin/env bash
# The Makefile's targets. Each one bootstraps first (idempotent, seconds when warm).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# The lab stack's config holds no secrets (its credentials are files the lab generates), so its
# passphrase is fixed and public. Other stacks need the operator's PULUMI_CONFIG_PASSPHRASE(_FILE).
LAB_PASSPHRASE=gpuhost-lab
# The backend the operator named, before .env.sh defaults PULUMI_BACKEND_URL to the checkout's .state: a
# missing stack's message says which of the two was in use.
operator_backend=${PULUMI_BACKEND_URL:-}

deps() {
  # The lab makes its SSH keys with OpenSSH's ssh-keygen; its host and containers boot with systemd-nspawn
  # over Debian bases mmdebstrap builds (lab/labhost.py, lab/container.py, lab/ctbase.py; the host's sshd is
  # its base's). A new machine may not have them yet.
  local missing=()
  command -v ssh-keygen >/dev/null || missing+=(openssh-client)
  command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  # The lab host's kernel module trees are indexed by the real depmod (lab/hostsim.py install_kernel).
  command -v depmod >/dev/null || [ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || missing+=(kmod)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "run: installing ${missing[*]} (the lab's SSH keys, host and containers)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  tools/bootstrap.sh
  # shellcheck disable=SC1091
  . ./.env.sh
  # The checkout's own Python compiled once: every pulumi command starts the program and its dynamic
  # providers, the lab's tools are Python too, and where PYTHONDONTWRITEBYTECODE is set (CI machines) each
  # interpreter would compile them from source again (0.1-0.2 s of CPU each). A .pyc older than its source
  # is not used.
  python -m compileall -q -j 0 components resources transport hostscripts config grammar lab policy provider tools tests __main__.py >/dev/null || true
}

stack_env() {
  if is_lab_stack "$1"; then
    # The lab's stacks describe this machine's lab: their state stays in the checkout, whatever backend the
    # operator set for real hosts (a fresh lab forgets its stack - never a shared backend's `lab` stack).
    mkdir -p "$root/.state"
    export PULUMI_BACKEND_URL="file://$root/.state"
    export PULUMI_CONFIG_PASSPHRASE=$LAB_PASSPHRASE
    unset PULUMI_CONFIG_PASSPHRASE_FILE
  elif [ -z "${PULUMI_CONFIG_PASSPHRASE:-}${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
    echo "run: stack $1 has secure: values; set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE (the committed prod example: PULUMI_CONFIG_PASSPHRASE=gpuhost-prod-example)" >&2
    exit 2
  fi
}

# The engine runs at most PULUMI_PARALLEL resource operations at once; the CLI's default is 4 per CPU (8 on a
# 2-core machine), so a fleet's hosts would take turns at it - a refresh of 8 hosts reads them 8 resources at a
# time. What one host gets at once is the program's cap (transport/remote.py MAX_CHANNELS, one SSH connection a
# host), so this only has to let every host work at once. An operator's own PULUMI_PARALLEL (or --parallel) wins.
engine_parallel() {
  export PULUMI_PARALLEL=${PULUMI_PARALLEL:-64}
}

is_lab_stack() {
  [ "$1" = lab ] || [ "$1" = lab-fleet ]
}

# select_stack STACK: the lab's stacks are made when missing (a fresh lab forgets its stack). Any other stack
# must exist already: a shell or CI job that forgot PULUMI_BACKEND_URL would otherwise create an empty one in
# .state, whose `up` plans to create (or adopt) everything on a real host. Making one is the operator's act.
select_stack() {
  stack_env "$1"
  if is_lab_stack "$1"; then
    pulumi stack select --create --secrets-provider passphrase "$1" >/dev/null
    return
  fi
  local err where
  if err=$(pulumi stack select "$1" 2>&1 >/dev/null); then
    return
  fi
  if ! grep -q "no stack named" <<<"$err"; then
    echo "$err" >&2
    echo "run: cannot select stack $1 in the backend $PULUMI_BACKEND_URL (pulumi's error above)" >&2
    exit 1
  fi
  if [ -n "$operator_backend" ]; then
    where="the backend $PULUMI_BACKEND_URL (PULUMI_BACKEND_URL)"
  else
    where="the default backend $PULUMI_BACKEND_URL (this checkout's .state: PULUMI_BACKEND_URL is not set)"
  fi
  echo "run: stack $1 does not exist in $where, and only the lab's stacks are created here; if its state lives elsewhere, export PULUMI_BACKEND_URL=<that backend> (s3://..., azblob://..., gs://..., file://...) and re-run; to start a new stack in this backend on purpose: . ./.env.sh && pulumi stack init --secrets-provider passphrase $1" >&2
  exit 2
}

# refuse_plain_secrets STACK [pulumi flags]: a credential written as plain text in the stack's config
# (Pulumi.<stack>.yaml, or a -c key=value flag) stops the target here, before the CLI starts: pulumi records the
# stack's config, plain values in plain text, in the backend's update history with an update, refresh or destroy -
# whatever the program (which refuses it too) or the policy pack decide later (docs/operator-guide.md, "Credentials
# written as plain text"). Reads the file only: no passphrase, no backend call (about 0.25 s).
refuse_plain_secrets() {
  local backend=${PULUMI_BACKEND_URL:-}
  if is_lab_stack "$1"; then backend="file://$root/.state"; fi
  PULUMI_BACKEND_URL=$backend python -m tools.plain_secrets "$@" || exit $?
}

# The safety rules (policy/, docs/operator-guide.md, "Policy pack"), mandatory; policy/config.<stack>.json, when
# present,
# lowers rules to advisory or opts in (the pack prints what it relaxes on every run).
policy=()
policy_args() {
  policy=(--policy-pack policy)
  if [ -f "policy/config.$1.json" ]; then
    policy+=(--policy-pack-config "policy/config.$1.json")
  fi
}

# A lab that was just started (every simulated host new: new host keys, no container, VM or host change yet)
# makes any earlier state of its stack stale: it goes, whichever target started the lab (make lab, check, up),
# or the next `up --refresh` would read the new hosts with the old ones' pinned keys and fail.
forget_stack() {
  stack_env "$1"
  pulumi stack rm --yes --force --preserve-config "$1" >/dev/null 2>&1 || true
}

# start_lab [show]: start the lab unless it runs (show: print what labctl says about it).
start_lab() {
  local info
  info=$(python -m lab.labctl up)
  if [ "${1:-}" = show ]; then echo "$info"; fi
  if [ "$(python -c 'import json,sys; print(json.load(sys.stdin)["started"])' <<<"$info")" = True ]; then
    forget_stack lab
  fi
}

# start_fleet N [show]
start_fleet() {
  local info
  info=$(python -m lab.fleet up --hosts "$1")
  if [ "${2:-}" = show ]; then echo "$info"; fi
  if [ "$(python -c 'import json,sys; d=json.load(sys.stdin); print(len(d["started"]) == len(d["hosts"]))' <<<"$info")" = True ]; then
    forget_stack lab-fleet
  fi
}

# deploy_lab STACK: `pulumi up` a lab stack.
deploy_lab() {
  select_stack "$1"
  policy_args "$1"
  # --refresh: reconcile with what the hosts run now (a reboot, a hand edit) before planning. A new container
  # is bare (as debian-12-standard): the same `up` installs what SGLang needs
  # (docs/operator-guide.md, "The first `up` on a bare host").
  pulumi up --yes --skip-preview --refresh --suppress-progress "${policy[@]}"
}

cmd=${1:-}
shift || true
case "$cmd" in
  up)
    deps
    engine_parallel
    stack=${1:-lab}
    shift || true
    refuse_plain_secrets "$stack" "$@"
    if [ "$stack" = lab ]; then
      start_lab
      deploy_lab lab
    else
      # A real host: no lab. The same way in as the lab's - the policy pack, --refresh (reconcile with what the
      # host runs now before planning) - and the plan is shown for the operator to confirm (ARGS=--yes: not).
      select_stack "$stack"
      policy_args "$stack"
      pulumi up --refresh --diff "${policy[@]}" "$@"
    fi
    echo
    echo "Stack outputs ($stack):"
    pulumi stack output --json
    echo
    pulumi stack output --json | python -m tools.fleet_summary --stack "$stack" --canary-page "monitoring/$stack/canary.md"
    ;;
  up-fleet)
    deps
    engine_parallel
    n=${1:?hosts}
    start_fleet "$n"
    refuse_plain_secrets lab-fleet
    deploy_lab lab-fleet
    echo
    echo "Fleet ($n hosts, stack lab-fleet; every output: pulumi stack output --json --stack lab-fleet):"
    pulumi stack output --json | python -m tools.fleet_summary
    ;;
  test)
    deps
    # Test modules in parallel, each whole in one worker (it owns its lab on a loopback net of its own),
    # the longest first (tests/conftest.py orders them by tests/durations.json): the integration tests
    # mostly wait - on the CLI, SSH, a service starting - so more workers than cores keep both busy
    # (docs/bench.md has the measurements behind the number).
    python -m pytest -q -n "${GPUHOST_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder tests "$@"
    ;;
  lab)
    deps
    if [ -n "${1:-}" ]; then start_fleet "$1" show; else start_lab show; fi
    ;;
  lab-down) deps; python -m lab.labctl down; python -m lab.fleet down >/dev/null ;;
  preview)
    deps
    engine_parallel
    stack=${1:?stack}
    shift
    refuse_plain_secrets "$stack" "$@"
    select_stack "$stack"
    policy_args "$stack"
    pulumi preview --diff "${policy[@]}" "$@"
    ;;
  fleet)
    deps
    engine_parallel
    # Every shard stack at once (tools/fleet.py): the stacks, their passphrase and plain-text credentials are
    # checked there, each shard with the policy pack as `make preview`/`make up` run it.
    python -m tools.fleet "$@"
    ;;
  check)
    deps
    # The lab stack's host is the lab: started unless running (its config names the lab's generated keys).
    if [ "${1:?stack}" = lab ]; then start_lab; fi
    # Read-only on the hosts (components/preflight.py) and on the backend: a stack that does not exist there
    # stops it (select_stack), as it stops `make preview` and `make up`.
    select_stack "${1:?stack}"
    python -m tools.check "$1"
    ;;
  render)
    deps
    python -m tools.render "${1:?stack}" "${2:?out dir}"
    ;;
  bench)
    deps
    engine_parallel
    python -m tools.bench "$@"
    ;;
  bench-fleet)
    deps
    engine_parallel
    python -m tools.bench_fleet "$@"
    ;;
  bench-state)
    # No lab: a throwaway project and file backend in a temp dir (tools/bench_state.py).
    tools/bootstrap.sh
    # shellcheck disable=SC1091
    . ./.env.sh
    engine_parallel
    python -m tools.bench_state "$@"
    ;;
  bench-serve)
    deps
    engine_parallel
    tools/bench-venv.sh
    stack=${1:?stack}
    shift
    refuse_plain_secrets "$stack"
    stack_env "$stack"
    policy_args "$stack"
    # Every variant's `up` runs with the same policy pack as `make up`.
    python -m tools.bench_serve "$stack" "${policy[@]}" "$@"
    ;;
  *) echo "usage: tools/run.sh up [STACK [flags]]|up-fleet N|check STACK|test|lab [N]|lab-down|preview STACK [flags]|fleet preview|up [--stack S]... [--parallel K] [--yes]|render STACK OUT|bench|bench-fleet|bench-state|bench-serve STACK [flags]" >&2; exit 2 ;;
esac
