#!/usr/bin/env bash
# Issue 25 on the lent H200 machine's CPU (no GPU used): the client's cost and errors against the
# exact-timing mock, beside vLLM's own client, in one device call.
#   bash benchmarks/gpu/client_cost.sh OUT [STREAMS]
# Writes OUT/measurement-error.md (measurement_error.py, --clients $CLIENTS, TTFT 100 ms, ITL 5 ms,
# 128-token replies, one process each), OUT/request-cost.txt (request_cost.py: CPU per request and
# per chunk, 16 users, 3 repeats) and OUT/waves.txt (request_cost.py --wave at 64 and 128 users).
# Environment: CLIENTS (suite,vllm), STREAMS (16,64,128,256), PARTS (error,cost,waves), DURATION (20).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -d /tmp/site ]]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1; fi
export VLLM_PYTHON=${VLLM_PYTHON:-$(command -v python3)}
py=${SUITE_PYTHON:-$VLLM_PYTHON}
out=${1:?out dir}; mkdir -p "$out"
[[ -f models/tiny/config.json ]] || "$py" launch/make_tiny_model.py models/tiny > /dev/null
parts=",${PARTS:-error,cost,waves},"
if [[ $parts == *,error,* ]]; then
  "$py" benchmarks/measurement_error.py --streams "${2:-${STREAMS:-16,64,128,256}}" --ttft-ms 100 --itl-ms 5 \
    --tokens 128 --duration "${DURATION:-20}" --clients "${CLIENTS:-suite,vllm}" --out "$out/measurement-error.md" \
    2> "$out/measurement-error.log" > /dev/null
fi
if [[ $parts == *,cost,* ]]; then
  "$py" benchmarks/request_cost.py --users 16 --repeat 3 > "$out/request-cost.txt" 2>&1
fi
if [[ $parts == *,waves,* ]]; then
  for n in 64 128; do "$py" benchmarks/request_cost.py --wave "$n" --repeat 3 --duration 15; done > "$out/waves.txt" 2>&1
fi
echo "client_cost: $(ls "$out" | tr '\n' ' ')"
