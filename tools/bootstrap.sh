#!/usr/bin/env bash
# One idempotent set-up: the project's virtualenv, the Pulumi CLI with its Python language host,
# and the pulumi-command provider plugin (pulumi-resource-command) in the project's PULUMI_HOME.
#
# Where each binary comes from, first that works (each network attempt has a short timeout):
#   Pulumi CLI  1. a compatible `pulumi` on PATH (with its pulumi-language-python): nothing is fetched
#               2. ~/.cache/gpuhost (filled by 3 or 4 on an earlier run, shared by fresh clones and CI)
#               3. the official release archive from get.pulumi.com, checked against the release's
#                  published checksums
#               4. a Go build from Go modules: the CLI (pkg/v3) and upstream's Python language host,
#                  through the wrapper module tools/pulumi
#   command     1. ~/.cache/gpuhost
#               2. `pulumi plugin install resource command <version>` (Pulumi's release download)
#               3. a Go build through the wrapper module tools/pulumi-command
# If `../shared/goproxy` (a GOPROXY directory beside the checkout) exists, it is put in front of
# GOPROXY: it serves the two modules the public proxy refuses. Their hashes are committed in the
# wrappers' go.sum files, so what it serves is verified, not trusted (-mod=readonly).
#
# Writes .env.sh (PATH, PULUMI_HOME, backend, GPUHOST_COMMAND_PROVIDER ...), sourced by tools/run.sh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

PULUMI_VERSION=v3.274.1
COMMAND_VERSION=1.2.1
# Where the CLI's release archives and checksum files are (a company mirror of them works too).
PULUMI_RELEASES=${GPUHOST_PULUMI_RELEASES:-https://get.pulumi.com/releases/sdk}
# The Go builds' flags (part of their cache keys).
CLI_TAGS=osusergo,grpcnotrace
CLI_LDFLAGS="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$PULUMI_VERSION"
COMMAND_LDFLAGS="-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=$COMMAND_VERSION"
cache=${GPUHOST_CACHE:-$HOME/.cache/gpuhost}
log() { printf 'bootstrap: %s\n' "$*" >&2; }
die() { printf 'bootstrap: %s\n' "$*" >&2; exit 1; }

# The provider must be the one the pulumi-command wheel expects.
pinned=$(sed -n 's/^pulumi-command==\([^ ;#]*\).*/\1/p' requirements.txt)
[ "$pinned" = "$COMMAND_VERSION" ] ||
  die "requirements.txt pins pulumi-command==$pinned but tools/bootstrap.sh builds $COMMAND_VERSION (and tools/pulumi-command/go.mod its commit): change them together"

case "$(uname -m)" in
  x86_64 | amd64) rel_arch=x64 ;;
  aarch64 | arm64) rel_arch=arm64 ;;
  *) rel_arch="" ;;
esac

# Can we open a TCP connection to the URL's host within a few seconds? (No DNS or a dropped
# route fails here fast instead of in a download's retries.)
reachable() {
  timeout 5 python3 - "$1" >/dev/null 2>&1 <<'PY'
import socket, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
socket.create_connection((u.hostname, u.port or (443 if u.scheme == 'https' else 80)), timeout=4).close()
PY
}

# fetch URL FILE: download with a short connect timeout; curl if present, else Python.
fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --connect-timeout 5 --retry 2 --speed-time 30 --speed-limit 1024 -o "$2" "$1"
  else
    python3 - "$1" "$2" <<'PY'
import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as r, open(sys.argv[2], 'wb') as f:
    shutil.copyfileobj(r, f)
PY
  fi
}

# The environment of every go command: the shared mirror first when present, the two modules it
# serves exempt from the checksum database (go.sum holds their hashes), go.sum never rewritten.
# Where the mirror is looked for: $GPUHOST_GOPROXY_DIR, `../shared/goproxy` beside this checkout, and -
# for a clone of a local checkout (CI's fresh clone) - beside the checkout it was cloned from.
mirror_dir() {
  local origin cand
  origin=$(git -C "$root" config --get remote.origin.url 2>/dev/null || true)
  for cand in "${GPUHOST_GOPROXY_DIR:-}" "$root/../shared/goproxy" \
              ${origin:+$( [ -d "$origin" ] && printf '%s' "$origin/../shared/goproxy" )}; do
    if [ -n "$cand" ] && [ -d "$cand" ]; then (cd "$cand" && pwd); return 0; fi
  done
  return 1
}

go_env() {
  local mirror
  GOPROXY=$(go env GOPROXY)
  if mirror=$(mirror_dir); then
    log "go: module mirror $mirror in front of GOPROXY"
    GOPROXY="file://$mirror,$GOPROXY"
  fi
  GONOSUMDB=$(go env GONOSUMDB)
  GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/pulumi/pulumi-command/provider,github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python
  GOFLAGS="$(go env GOFLAGS) -mod=readonly"
  export GOPROXY GONOSUMDB GOFLAGS CGO_ENABLED=0 GOWORK=off
}

tmp=''
cleanup() { if [ -n "$tmp" ]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT
newtmp() { mkdir -p "$cache" && tmp=$(mktemp -d "$cache/tmp.XXXXXX"); }

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

# The official release archive, verified against the release's checksum file.
pulumi_from_release() { # -> $1 (bin dir)
  [ -n "$rel_arch" ] && reachable "$PULUMI_RELEASES" || return 1
  local v=${PULUMI_VERSION#v} archive="pulumi-$PULUMI_VERSION-linux-$rel_arch.tar.gz" want
  local base=$PULUMI_RELEASES
  log "pulumi: downloading $base/$archive"
  newtmp
  fetch "$base/pulumi-$v-checksums.txt" "$tmp/checksums.txt" || return 1
  fetch "$base/$archive" "$tmp/$archive" || return 1
  want=$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1 }' "$tmp/checksums.txt")
  [ -n "$want" ] || { log "pulumi: $archive is not in the release's checksum file"; return 1; }
  if [ "$(sha256sum "$tmp/$archive" | cut -d' ' -f1)" != "$want" ]; then
    log "pulumi: $archive does not match the release's checksum $want"
    return 1
  fi
  tar -xzf "$tmp/$archive" -C "$tmp" || return 1
  [ -x "$tmp/pulumi/pulumi" ] && [ -x "$tmp/pulumi/pulumi-language-python" ] || return 1
  mkdir -p "$(dirname "$1")" && rm -rf "$1" && mv "$tmp/pulumi" "$1" || return 1
  cleanup
}

# The CLI and upstream's Python language host from Go modules (tools/pulumi/go.mod).
pulumi_from_go() { # -> $1 (bin dir)
  command -v go >/dev/null 2>&1 || return 1
  log "pulumi: building $PULUMI_VERSION from Go modules into $1 (cold: a few minutes)"
  newtmp
  (
    cd tools/pulumi && go_env &&
      go build -trimpath -tags "$CLI_TAGS" -ldflags "$CLI_LDFLAGS" -o "$tmp/" \
        github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
        github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 &&
      # The two Python-side scripts ship in the sdk module, next to the Go code the CLI uses.
      sdk=$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi/sdk/v3) &&
      install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" \
        "$sdk/python/dist/pulumi-resource-pulumi-python" "$tmp/"
  ) || return 1
  mkdir -p "$(dirname "$1")" && rm -rf "$1" && mv "$tmp" "$1" || return 1
  tmp=''
}

if [ -z "${GPUHOST_BUILD_PULUMI:-}" ] && have_usable_pulumi; then
  bindir=$(dirname "$(command -v pulumi)")
  log "pulumi: using $(command -v pulumi) ($(pulumi version))"
else
  release_bindir=$cache/pulumi-$PULUMI_VERSION-release/bin
  # The Go build's cache key covers the wrapper module and this build recipe.
  key=$(cat tools/pulumi/go.mod tools/pulumi/go.sum tools/pulumi/tools.go <(echo "$CLI_TAGS $CLI_LDFLAGS") |
    sha256sum | cut -c1-12)
  go_bindir=$cache/pulumi-$PULUMI_VERSION-$key/bin
  if [ -z "${GPUHOST_BUILD_PULUMI:-}" ] && [ -x "$release_bindir/pulumi" ]; then
    bindir=$release_bindir
    log "pulumi: cached at $bindir"
  elif [ -x "$go_bindir/pulumi" ] && [ -x "$go_bindir/pulumi-language-python" ]; then
    bindir=$go_bindir
    log "pulumi: cached at $bindir"
  elif [ -z "${GPUHOST_BUILD_PULUMI:-}" ] && pulumi_from_release "$release_bindir"; then
    bindir=$release_bindir
  elif { cleanup; log "pulumi: no release download ($PULUMI_RELEASES unreachable or failed)"; } &&
    pulumi_from_go "$go_bindir"; then
    bindir=$go_bindir
  else
    die "no Pulumi CLI: install Go >= 1.26 (https://go.dev/dl/; it builds the CLI from a Go module proxy - set GOPROXY to your mirror if offline) or allow https://get.pulumi.com, or put pulumi $PULUMI_VERSION (with pulumi-language-python) on PATH"
  fi
fi
export PATH=$bindir:$PATH

# --- pulumi-command's provider plugin ------------------------------------------------------
export PULUMI_HOME=$root/.pulumi-home PULUMI_SKIP_UPDATE_CHECK=true
mkdir -p "$PULUMI_HOME"

# Pulumi's own release download, into a scratch PULUMI_HOME; the binary is kept in the cache.
command_from_release() { # -> $1 (binary)
  { reachable https://github.com || reachable https://get.pulumi.com; } || return 1
  log "command: pulumi plugin install resource command $COMMAND_VERSION"
  newtmp
  PULUMI_HOME=$tmp/home timeout 300 pulumi plugin install resource command "$COMMAND_VERSION" >&2 || return 1
  local bin=$tmp/home/plugins/resource-command-v$COMMAND_VERSION/pulumi-resource-command
  [ -x "$bin" ] || return 1
  mkdir -p "$(dirname "$1")" && install -m 0755 "$bin" "$1" || return 1
  cleanup
}

command_from_go() { # -> $1 (binary)
  command -v go >/dev/null 2>&1 || return 1
  log "command: building pulumi-resource-command $COMMAND_VERSION from Go modules into $1"
  newtmp
  (
    cd tools/pulumi-command && go_env &&
      go build -trimpath -ldflags "$COMMAND_LDFLAGS" -o "$tmp/pulumi-resource-command" \
        github.com/pulumi/pulumi-command/provider/cmd/pulumi-resource-command
  ) || return 1
  mkdir -p "$(dirname "$1")" && install -m 0755 "$tmp/pulumi-resource-command" "$1" || return 1
  cleanup
}

command_release=$cache/pulumi-resource-command-$COMMAND_VERSION-release/pulumi-resource-command
key=$(cat tools/pulumi-command/go.mod tools/pulumi-command/go.sum tools/pulumi-command/tools.go \
  <(echo "$COMMAND_LDFLAGS") | sha256sum | cut -c1-12)
command_go=$cache/pulumi-resource-command-$COMMAND_VERSION-$key/pulumi-resource-command
if [ -x "$command_release" ]; then
  command_bin=$command_release
elif [ -x "$command_go" ]; then
  command_bin=$command_go
elif command_from_release "$command_release"; then
  command_bin=$command_release
elif { cleanup; log "command: no release download (github.com and get.pulumi.com unreachable or failed)"; } &&
  command_from_go "$command_go"; then
  command_bin=$command_go
else
  die "no pulumi-resource-command $COMMAND_VERSION: install Go >= 1.26 (https://go.dev/dl/; set GOPROXY to your module mirror if offline) or allow https://github.com/pulumi/pulumi-command/releases"
fi
log "command: $command_bin"
tools/install-command-plugin.sh "$PULUMI_HOME" "$command_bin"

# --- the gpuhost plugin's stub ---------------------------------------------------------------
# The engine starts the gpuhost plugin once per host and pass (provider/pulumi-resource-gpuhost): a stub that asks
# the pass's one serving process for an instance. provider/stub/ (Go, standard library only: no module download)
# builds it as provider/bin/gpuhost-stub, ~7 ms of CPU a start against ~39 for provider/stub.py (python -m
# tools.bench_stub), which serves where this is not built (no Go) or is older than its source.
stub=provider/bin/gpuhost-stub
if [ "$stub" -nt provider/stub/main.go ] && [ "$stub" -nt provider/stub/go.mod ]; then
  :
elif command -v go >/dev/null 2>&1; then
  newtmp
  if (cd provider/stub && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
    -o "$tmp/gpuhost-stub" .); then
    mkdir -p provider/bin && install -m 0755 "$tmp/gpuhost-stub" "$stub.new" && mv -f "$stub.new" "$stub" &&
      log "stub: built $stub"
  else
    log "stub: the Go build of provider/stub failed: provider/stub.py serves (a Python start per host and pass)"
  fi
  cleanup
else
  log "stub: no Go: provider/stub.py serves (a Python start per host and pass)"
fi

# Everything Pulumi keeps (plugins, credentials, workspace settings) stays in the project's
# working area. State goes where PULUMI_BACKEND_URL says when the operator set it (S3, Azure Blob, GCS,
# Pulumi Cloud, a shared file path - decided when .env.sh is sourced), else to the checkout's own file
# backend, .state (docs/operator-guide.md, "Where state lives").
cat > "$root/.env.sh" <<ENV
export PATH=$(printf %q "$venv/bin:$bindir"):\$PATH
export PULUMI_HOME=$(printf %q "$root/.pulumi-home")
export PULUMI_BACKEND_URL=\${PULUMI_BACKEND_URL:-$(printf %q "file://$root/.state")}
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK=false
# The language host runs pip list before every pulumi command; pip asks PyPI for a newer pip once a week otherwise.
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pulumi-command's provider; tools/install-command-plugin.sh [PULUMI_HOME] installs it elsewhere.
export GPUHOST_COMMAND_VERSION=$COMMAND_VERSION
export GPUHOST_COMMAND_PROVIDER=$(printf %q "$command_bin")
ENV
# shellcheck disable=SC1091
. "$root/.env.sh"
case "$PULUMI_BACKEND_URL" in file://"$root"/.state) mkdir -p "$root/.state" ;; esac
log "ready: pulumi $(pulumi version) at $(command -v pulumi), command $COMMAND_VERSION in $PULUMI_HOME"
