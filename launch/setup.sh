#!/usr/bin/env bash
# One-time setup, idempotent: the load generator's venv (.venv), the CPU vLLM server's venv
# (.venv-vllm) and the tiny dummy-weight model (models/tiny). Safe to rerun; skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Reinstall when requirements.txt changed since the last install (a reused machine keeps .venv).
stamp=.venv/.requirements.sha1
want=$(sha1sum requirements.txt | cut -d' ' -f1)
if [[ ! -x .venv/bin/python ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup: installing the load generator into .venv"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  echo "$want" > "$stamp"
fi

if [[ -z "${VLLM_PYTHON:-}" ]]; then
  bash launch/install_server.sh cpu .venv-vllm
fi

if [[ ! -f models/tiny/config.json ]]; then
  .venv/bin/python launch/make_tiny_model.py models/tiny >/dev/null
  echo "setup: made models/tiny"
fi
