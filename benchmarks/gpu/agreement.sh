#!/usr/bin/env bash
# On the lent H200 after shared/gpu's staging (vLLM and the suite's wheels in /tmp/site): one vLLM
# server on a Qwen2.5-7B-shaped dummy-weight model, measured by the suite and by vLLM's own client
# (benchmarks/agreement.py). The server is started in its own session and left running, so a
# first call can start it (--start-only) and the next one measure while it is still up.
# Usage: bash benchmarks/gpu/agreement.sh OUT [--start-only | agreement.py options...]
# VLLM_SERVE_ARGS adds server flags, e.g. VLLM_SERVE_ARGS=--no-enable-prefix-caching.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?out dir}; shift
mkdir -p "$out"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 VLLM_PYTHON=python3
[[ -f models/qwen7b/config.json ]] || python3 launch/make_tiny_model.py models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
healthy() { python3 -c 'import urllib.request,sys; urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2)' 2>/dev/null; }
starting() { [[ -f /tmp/vllm-server.pid ]] && kill -0 "$(cat /tmp/vllm-server.pid)" 2>/dev/null; }
if ! healthy && ! starting; then  # one server: a start still under way (an earlier call's) is waited for
  setsid python3 -c 'from vllm.entrypoints.cli.main import main; main()' serve "$PWD/models/qwen7b" \
    --served-model-name qwen7b-dummy --load-format dummy --host 127.0.0.1 --port 8000 ${VLLM_SERVE_ARGS:-} \
    > /tmp/vllm-server.log 2>&1 < /dev/null &
  echo $! > /tmp/vllm-server.pid
  echo "started vLLM (pid $!), log /tmp/vllm-server.log"
fi
[[ "${1:-}" == "--start-only" ]] && exit 0
for _ in $(seq 480); do healthy && break; sleep 1; done
healthy || { tail -40 /tmp/vllm-server.log; exit 1; }
python3 -c 'import vllm, torch, locust; print("vllm", vllm.__version__, "torch", torch.__version__, "locust", locust.__version__)'
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
python3 benchmarks/agreement.py --url http://127.0.0.1:8000 --model qwen7b-dummy --tokenizer models/qwen7b \
  --vllm-python python3 --out "$out" "$@"
cp /tmp/vllm-server.log "$out/server.log" 2>/dev/null || true
