set -euo pipefail
# model_verify.sh JOB (JSON): verify a model directory on the host against its own files - config.json,
# model.safetensors.index.json and every shard it names (size from each shard's safetensors header, sha256
# where the job carries checksums, cached by size and mtime). The program (model_verify.py) arrives on
# stdin; the JSON report is the last line of stdout. Reads the weights, never writes them.
exec python3 - "$@"
