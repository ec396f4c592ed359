#!/usr/bin/env bash
# The tuner's pass on a GPU host whose vLLM is importable from PYTHONPATH (the lent H200: /tmp/site),
# on the Qwen2.5-7B-shaped dummy-weight model, against the `baseline` profile.
# Usage: bash benchmarks/gpu/tune.sh KNOBS_FILE OUT_DIR [launch.tune / sweep options...]
# Resumable: rerun the same command and finished runs are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
knobs=${1:?knobs file}; out=${2:?out dir}; shift 2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
VLLM_PYTHON=$(command -v python3); SUITE_PYTHON=$VLLM_PYTHON; export VLLM_PYTHON SUITE_PYTHON
[[ -f models/qwen7b/config.json ]] || python3 launch/make_tiny_model.py models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
dummy=${TUNE_PROFILES:-/tmp/tune-profiles}
mkdir -p "$dummy"
for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$dummy/$(basename "$f")"; done
PROFILES_DIR=$dummy MODEL=$PWD/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} \
  python3 -m launch.tune --base baseline --knobs "$knobs" --out "$out" "$@"
