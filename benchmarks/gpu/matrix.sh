#!/usr/bin/env bash
# The seed's matrix for one profile on ONE server start, measured by the suite and by vLLM's own
# client: the sweep on the fixed workload (512/128) and on the mixed one (short and long prompts),
# at every concurrency and repeat, then `vllm bench serve` (benchmarks/agreement.py --clients vllm)
# at the same concurrencies on the fixed workload, then the server is stopped.
# Usage: bash benchmarks/gpu/matrix.sh PROFILE OUT
# Resumable and split-able across calls of limited length: the server runs in its own session
# (serve.sh, manifest in OUT/server-PROFILE/), finished runs are kept, so `timeout -s INT N bash
# matrix.sh ...` followed by the same command carries on where the first stopped.
# Environment: LEVELS (32,64,128), REPEATS (3), MIXED_REPEATS (REPEATS), WARMUP (5), DURATION (15),
# WAVES (8, vLLM's client: prompts = waves x concurrency), WORKERS (auto), MODEL (default: a
# Qwen2.5-7B-shaped dummy-weight model made in models/qwen7b, served as qwen7b-dummy; every profile
# then gets load-format=dummy), VLLM_PYTHON / SUITE_PYTHON (python3 with PYTHONPATH=/tmp/site, as
# staged on the lent H200), PROFILES_DIR (profiles/ when MODEL is given).
set -euo pipefail
cd "$(dirname "$0")/../.."
profile=${1:?profile}; out=${2:?out dir}
mkdir -p "$out"; out=$(cd "$out" && pwd)
if [[ -d /tmp/site ]]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1; fi
VLLM_PYTHON=${VLLM_PYTHON:-$(command -v python3)}; SUITE_PYTHON=${SUITE_PYTHON:-$VLLM_PYTHON}
export VLLM_PYTHON SUITE_PYTHON
LEVELS=${LEVELS:-32,64,128} REPEATS=${REPEATS:-3} WARMUP=${WARMUP:-5} DURATION=${DURATION:-15}
MIXED_REPEATS=${MIXED_REPEATS:-$REPEATS} WAVES=${WAVES:-8} WORKERS=${WORKERS:-auto} PORT=${PORT:-8000}
url=http://127.0.0.1:$PORT
if [[ -z "${MODEL:-}" ]]; then
  [[ -f models/qwen7b/config.json ]] || "$SUITE_PYTHON" launch/make_tiny_model.py models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
  export MODEL=$PWD/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy
  PROFILES_DIR=$out/profiles; mkdir -p "$PROFILES_DIR"
  for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$PROFILES_DIR/$(basename "$f")"; done
fi
export PROFILES_DIR=${PROFILES_DIR:-$PWD/profiles} HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} PORT
say() { echo "[$(date +%H:%M:%S)] matrix $profile: $*" >&2; }

server_dir=$out/server-$profile pid_file=$out/server-$profile.pid
healthy() { curl -sf -o /dev/null --max-time 2 "$url/health"; }
if [[ ! -f "$out/$profile.done" ]]; then
  if ! { [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
    healthy && { echo "matrix: something already answers on $url; stop it first" >&2; exit 2; }
    rm -rf "$server_dir"
    setsid nohup bash launch/serve.sh "$profile" --run-dir "$server_dir" > "$out/serve-$profile.log" 2>&1 < /dev/null &
    echo $! > "$pid_file"; say "serve.sh started (pid $!), log $out/serve-$profile.log"
  fi
  until [[ -f "$server_dir/manifest.json" ]]; do  # serve.sh writes it once healthy and smoke-tested
    kill -0 "$(cat "$pid_file")" 2>/dev/null || { tail -20 "$out/serve-$profile.log" >&2; exit 1; }
    sleep 2
  done
  say "server up: $(grep -o '"seconds_to_healthy": [0-9.]*' "$server_dir/manifest.json")"
  sweep() {  # WORKLOAD REPEATS LOCUST_ARGS...: the suite's runs of one workload against this server
    local workload=$1 repeats=$2; shift 2
    "$SUITE_PYTHON" -m launch.sweep --external-url "$url" --label "$profile" --out "$out/$workload" \
      --concurrency "$LEVELS" --repeats "$repeats" --warmup "$WARMUP" --duration "$DURATION" --workers "$WORKERS" \
      -- --workload "$workload" "$@"
    # The sweep saw a running server; the launch's own manifest (the exact command) goes beside its own.
    local m; for m in "$out/$workload/$profile"/*/manifest.json; do cp "$server_dir/manifest.json" "$(dirname "$m")/launch-manifest.json"; done
  }
  sweep fixed "$REPEATS" --prompt-tokens 512 --max-tokens 128
  sweep mixed "$MIXED_REPEATS" --prompt-tokens 512 --long-prompt-tokens 2048 --long-fraction 0.1 --max-tokens 128
  bench=$out/vllm-bench/$profile
  if [[ ! -f "$bench/agreement.md" ]]; then
    served=$("$SUITE_PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"])' "$server_dir/manifest.json")
    "$SUITE_PYTHON" benchmarks/agreement.py --url "$url" --model "$served" --tokenizer "$MODEL" --vllm-python "$VLLM_PYTHON" --clients vllm --levels "$LEVELS" --waves "$WAVES" \
      --input-len 512 --output-len 128 --out "$bench"
  fi
  touch "$out/$profile.done"
fi
if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  kill -TERM -- "-$(cat "$pid_file")" 2>/dev/null || kill -TERM "$(cat "$pid_file")"
  for _ in $(seq 120); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 1; done
  say "server stopped"
fi
for _ in $(seq 60); do healthy || break; sleep 1; done
say "done: $out/{fixed,mixed}/$profile, $out/vllm-bench/$profile"
