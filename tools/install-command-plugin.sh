#!/usr/bin/env bash
# Installs pulumi-command's provider plugin (resource command <version>) into a PULUMI_HOME from the
# binary tools/bootstrap.sh cached - no download, a fraction of a second, and nothing if it is there.
#
#   tools/install-command-plugin.sh [PULUMI_HOME [BINARY]]
#
# PULUMI_HOME defaults to $PULUMI_HOME; BINARY to $GPUHOST_COMMAND_PROVIDER (written into .env.sh by
# tools/bootstrap.sh; read from there when unset). `pulumi` must be on PATH (so is it after .env.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

home=${1:-${PULUMI_HOME:-}}
[ -n "$home" ] || { echo "install-command-plugin: no PULUMI_HOME given" >&2; exit 2; }
if [ -z "${2:-}" ] && [ -z "${GPUHOST_COMMAND_PROVIDER:-}" ]; then
  [ -f "$root/.env.sh" ] || { echo "install-command-plugin: run tools/bootstrap.sh first" >&2; exit 2; }
  # shellcheck disable=SC1091
  . "$root/.env.sh"
fi
bin=${2:-$GPUHOST_COMMAND_PROVIDER}
version=${GPUHOST_COMMAND_VERSION:-$(sed -n 's/^pulumi-command==\([^ ;#]*\).*/\1/p' "$root/requirements.txt")}
[ -x "$bin" ] || { echo "install-command-plugin: $bin is missing: run tools/bootstrap.sh" >&2; exit 2; }

installed=$home/plugins/resource-command-v$version/pulumi-resource-command
if [ -x "$installed" ] && cmp -s "$bin" "$installed"; then
  exit 0
fi
mkdir -p "$home"
PULUMI_HOME=$home PULUMI_SKIP_UPDATE_CHECK=true \
  pulumi plugin install --reinstall resource command "$version" --file "$bin" >/dev/null
[ -x "$installed" ] || { echo "install-command-plugin: $installed was not installed" >&2; exit 1; }
