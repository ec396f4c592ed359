#!/usr/bin/env bash
# One-time setup, idempotent: the load generator's venv (.venv), the CPU vLLM server's venv
# (.venv-vllm; not with --no-server) and the tiny dummy-weight model (models/tiny). Safe to rerun;
# skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Reinstall when requirements.txt or pyproject.toml changed since the last install (a reused
# machine keeps .venv). The package itself goes in editable (its commands in .venv/bin, importable
# from any folder), built offline by the setuptools that requirements.txt pins; its dependencies
# are the pinned ones already installed (--no-deps).
stamp=.venv/.requirements.sha1
want=$(cat requirements.txt pyproject.toml | sha1sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup: installing the load generator into .venv"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

# --no-server: the load generator and the models only (tests/run.sh --fast needs no vLLM).
if [[ -z "${VLLM_PYTHON:-}" && "${1:-}" != "--no-server" ]]; then
  bash launch/install_server.sh cpu .venv-vllm
fi

# A tokenizer made before every printable character was a token cannot write a forced tool call's JSON.
if [[ ! -f models/tiny/config.json ]] || ! .venv/bin/python -c 'import json, sys
vocab = json.load(open("models/tiny/tokenizer.json"))["model"]["vocab"]
sys.exit(any(chr(c) not in vocab for c in range(33, 127)))' 2>/dev/null; then
  .venv/bin/python launch/make_tiny_model.py models/tiny >/dev/null
  echo "setup: made models/tiny"
fi
for a in a:1 b:2; do [[ -f models/lora-${a%:*}/adapter_config.json ]] || .venv/bin/python launch/make_lora.py models/lora-${a%:*} --base models/tiny --seed ${a#*:} >/dev/null; done  # two LoRA adapters (profiles/lora-cpu.conf)
