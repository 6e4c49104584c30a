#!/usr/bin/env bash
# Create bench/.venv-litellm with LiteLLM's proxy (the peer in the benchmark) and write its
# config pointing at the mock upstream.
#
#   bench/setup_litellm.sh [MOCK_BASE_URL] [CONFIG_PATH]
#
# MOCK_BASE_URL defaults to http://127.0.0.1:8790/v1, CONFIG_PATH to
# bench/results/raw/litellm-config.yaml. The venv is only created when it is missing, so
# bench/run.py calls this script on every run to rewrite the config for the mock's port.
# Start the proxy the way bench/run.py does:
#   bench/.venv-litellm/bin/litellm --config CONFIG_PATH --host 127.0.0.1 --port P --num_workers 1
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv-litellm"
MOCK_BASE_URL="${1:-http://127.0.0.1:8790/v1}"
CONFIG="${2:-$HERE/results/raw/litellm-config.yaml}"
# The version PERFORMANCE-NOTES.md was measured with; override with LITELLM_VERSION=... (empty = latest).
LITELLM_VERSION="${LITELLM_VERSION-1.108.7}"
PYTHON="${PYTHON:-python3}"
LITELLM_MASTER_KEY="${LITELLM_MASTER_KEY:-sk-bench-litellm-7f3a9c2e5b1d4f6a8c0e2b4d6f8a1c3e}"

if [ ! -x "$VENV/bin/litellm" ]; then
    echo "creating $VENV (litellm[proxy]${LITELLM_VERSION:+==$LITELLM_VERSION})" >&2
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "litellm[proxy]${LITELLM_VERSION:+==$LITELLM_VERSION}"
fi

mkdir -p "$(dirname "$CONFIG")"
cat >"$CONFIG" <<YAML
# Written by bench/setup_litellm.sh: LiteLLM proxy, one worker, no database, in front of the mock.
model_list:
  - model_name: m
    litellm_params:
      model: openai/m
      api_base: ${MOCK_BASE_URL}
      api_key: sk-bench-xxxxxxxxxxxxxxxxxxxx
litellm_settings:
  telemetry: false
  drop_params: true
  set_verbose: false
  json_logs: false
general_settings:
  # LiteLLM refuses to start without a strong master key; clients send it as the bearer token.
  master_key: ${LITELLM_MASTER_KEY}
YAML
echo "$CONFIG"
