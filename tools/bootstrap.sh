#!/usr/bin/env bash
# One idempotent set-up: the project's virtualenv, the Pulumi CLI and its Python language host.
#
# The Pulumi CLI is not on PyPI and get.pulumi.com is unreachable from our machines, so it is
# built from the Go module proxy (tools/pulumi/go.mod) and cached by version outside the clone,
# under ~/.cache/gpuhost, where fresh clones and CI reuse it. A compatible `pulumi` already on
# PATH (with its pulumi-language-python) wins and nothing is built.
#
# Prints the environment lines to use (sourced by tools/env.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

PULUMI_VERSION=v3.274.1
cache=${GPUHOST_CACHE:-$HOME/.cache/gpuhost}
log() { printf 'bootstrap: %s\n' "$*" >&2; }

# --- Python virtualenv -------------------------------------------------------------------
venv=$root/.venv
reqs_hash=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.reqs" 2>/dev/null)" != "$reqs_hash" ]; then
  log "virtualenv: installing requirements-dev.txt into .venv"
  python3 -m venv "$venv"
  # Wheels are cached by pip itself (~/.cache/pip), so a fresh clone installs offline-fast.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$reqs_hash" > "$venv/.reqs"
else
  log "virtualenv: up to date"
fi

# --- Pulumi CLI --------------------------------------------------------------------------
have_usable_pulumi() {
  command -v pulumi >/dev/null 2>&1 || return 1
  command -v pulumi-language-python >/dev/null 2>&1 ||
    [ -x "$(dirname "$(command -v pulumi)")/pulumi-language-python" ] || return 1
  local v
  v=$(pulumi version 2>/dev/null) || return 1
  # Structured config and the Automation API version check need a 3.2xx CLI.
  [[ "$v" =~ ^v3\.(2[0-9][0-9])\. ]]
}

if [ -z "${GPUHOST_BUILD_PULUMI:-}" ] && have_usable_pulumi; then
  bindir=$(dirname "$(command -v pulumi)")
  log "pulumi: using $(command -v pulumi) ($(pulumi version))"
else
  # The cache key covers the CLI version and our wrapper module (which holds our language host).
  key=$(cat tools/pulumi/go.mod tools/pulumi/go.sum tools/pulumi/cmd/pulumi-language-python/*.go | sha256sum | cut -c1-12)
  bindir=$cache/pulumi-$PULUMI_VERSION-$key/bin
  if [ ! -x "$bindir/pulumi" ] || [ ! -x "$bindir/pulumi-language-python" ]; then
    command -v go >/dev/null || { log "go is required to build the Pulumi CLI (no pulumi on PATH)"; exit 1; }
    log "pulumi: building $PULUMI_VERSION from the Go module proxy into $bindir (cold: a few minutes)"
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/build.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    ldflags="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION"
    (cd tools/pulumi &&
      CGO_ENABLED=0 go build -trimpath -tags osusergo,grpcnotrace -ldflags "$ldflags" \
        -o "$tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi &&
      CGO_ENABLED=0 go build -trimpath -tags osusergo,grpcnotrace -ldflags "$ldflags" \
        -o "$tmp/pulumi-language-python" ./cmd/pulumi-language-python)
    # The two Python-side scripts ship in the sdk module, next to the Go code the CLI uses.
    sdk=$(cd tools/pulumi && go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3)
    install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$tmp/"
    install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$tmp/"
    mkdir -p "$(dirname "$bindir")"
    rm -rf "$bindir" && mv "$tmp" "$bindir"
    trap - EXIT
  else
    log "pulumi: cached at $bindir"
  fi
fi

# Everything Pulumi keeps (plugins, credentials, workspace settings) stays in the project's
# working area; state goes to a local file backend, never a cloud service.
cat > "$root/.env.sh" <<ENV
export PATH=$(printf %q "$venv/bin:$bindir"):\$PATH
export PULUMI_HOME=$(printf %q "$root/.pulumi-home")
export PULUMI_BACKEND_URL=$(printf %q "file://$root/.state")
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK=false
ENV
mkdir -p "$root/.state" "$root/.pulumi-home"
# shellcheck disable=SC1091
. "$root/.env.sh"
log "ready: $(pulumi version) at $(command -v pulumi)"
