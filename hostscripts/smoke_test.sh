set -euo pipefail
# smoke_test.sh URL MODEL (the API key, if any, on stdin): one real chat completion through the
# OpenAI API, from the host, as a client would make it. Prints one JSON line: latency and usage.
# The key goes to curl through a file descriptor, never on a command line.
url=$1 model=$2
key=$(cat)
body=$(printf '{"model": "%s", "messages": [{"role": "user", "content": "Reply with OK."}], "max_tokens": 8, "temperature": 0}' "$model")
start=$(date +%s%N)
if [ -n "$key" ]; then
  out=$(curl -sS --fail-with-body --max-time 300 -H 'Content-Type: application/json' \
        -H @<(printf 'Authorization: Bearer %s\n' "$key") -d "$body" "$url/v1/chat/completions")
else
  out=$(curl -sS --fail-with-body --max-time 300 -H 'Content-Type: application/json' -d "$body" "$url/v1/chat/completions")
fi
end=$(date +%s%N)
printf '{"latency_ms": %d, "response": %s}\n' $(( (end - start) / 1000000 )) "$out"
