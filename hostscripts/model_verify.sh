set -euo pipefail
# model_verify.sh JOB (JSON): verify a model directory on the host against its own files - config.json,
# model.safetensors.index.json and every shard it names (size from each shard's safetensors header, sha256
# where the job carries checksums, cached by size and mtime) - and, when the job names a source, first download
# what is missing (resumable, into a staging directory, progress lines on stderr). stdin: one line holding the
# source's token (empty without one; it goes into a root-only file removed on exit, never a command line),
# then the program (model_verify.py). The JSON report is the last line of stdout. The weights are never written
# in place: downloaded files are moved in once checked.
IFS= read -r token || true
if [ -n "$token" ]; then
  umask 077
  GPUHOST_TOKEN_FILE=$(mktemp /run/gpuhost-model-token.XXXXXX 2>/dev/null || mktemp)
  export GPUHOST_TOKEN_FILE
  trap 'rm -f "$GPUHOST_TOKEN_FILE"' EXIT
  printf '%s' "$token" > "$GPUHOST_TOKEN_FILE"
  umask 022
fi
unset token
python3 - "$@"
