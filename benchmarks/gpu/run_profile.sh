#!/usr/bin/env bash
# One profile's sweep on a GPU host whose vLLM is importable from PYTHONPATH (as staged on the lent
# H200 by shared/gpu: /tmp/site), on a Qwen2.5-7B-shaped dummy-weight model made here.
# Usage: bash benchmarks/gpu/run_profile.sh PROFILE OUT_DIR [sweep.sh options...]
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${1:?profile}; out=${2:?out dir}; shift 2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
VLLM_PYTHON=$(command -v python3); SUITE_PYTHON=$VLLM_PYTHON; export VLLM_PYTHON SUITE_PYTHON
[[ -f models/qwen7b/config.json ]] || python3 launch/make_tiny_model.py models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
# The model has no weights: every profile gets load-format=dummy (random weights), nothing else changes.
dummy=$(mktemp -d)
for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$dummy/$(basename "$f")"; done
PROFILES_DIR=$dummy MODEL=$PWD/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} \
  bash launch/sweep.sh --profiles "$profile" --out "$out" "$@"
