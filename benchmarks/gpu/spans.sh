#!/usr/bin/env bash
# Issue 42's evidence on the GPU, two server starts: profiles/tracing.conf (vLLM's defaults with its
# request spans sent to the suite's receiver) then profiles/baseline.conf, the same dummy 7B model.
#   1. tracing: an open-loop rate above capacity (RATE req/s, one step of SAT_WARMUP + SAT_DURATION s),
#      --server-spans: the tail attribution of a saturated server;
#   2. tracing and baseline: closed loop at CONCURRENCY, REPEATS runs each of WARMUP + DURATION s,
#      --server-spans on both (the same client work): what tracing costs vLLM, p95 ITL and throughput
#      with intervals (python -m analysis, baseline as the baseline).
#   bash benchmarks/gpu/spans.sh --pass OUT DEST
#       runs the study in a background driver (once; it survives the device call), waits up to WAIT_S
#       (540) for it, packs what exists into DEST; the same command in the next call waits and packs again.
# Environment: RATE (40), SAT_WARMUP (10), SAT_DURATION (40), MAX_CONCURRENCY (512), CONCURRENCY (64),
# REPEATS (3), WARMUP (10), DURATION (30), WORKERS (4), PROMPT_TOKENS (1024), MAX_TOKENS (128); a dry run on
# vLLM's CPU build: MODEL=models/tiny SERVED_MODEL_NAME=tiny TRACED_PROFILE=tracing-cpu PLAIN_PROFILE=baseline-cpu
# VLLM_PYTHON=.venv-vllm/bin/python SUITE_PYTHON=.venv/bin/python and small loads.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -d /tmp/site ]]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1; fi
VLLM_PYTHON=${VLLM_PYTHON:-$(command -v python3)}; SUITE_PYTHON=${SUITE_PYTHON:-$VLLM_PYTHON}
export VLLM_PYTHON SUITE_PYTHON
py=$SUITE_PYTHON

if [[ "${1:-}" == "--pass" ]]; then
  out=${2:?out dir}; dest=${3:?dest dir}
  mkdir -p "$out" "$dest"; out=$(cd "$out" && pwd)
  if ! { [[ -f "$out/driver.pid" ]] && kill -0 "$(cat "$out/driver.pid")" 2>/dev/null; } && [[ ! -f "$out/all.done" ]]; then
    setsid nohup bash "$0" run "$out" >> "$out/driver.log" 2>&1 < /dev/null &
    echo $! > "$out/driver.pid"
  fi
  end=$((SECONDS + ${WAIT_S:-540}))
  while (( SECONDS < end )) && kill -0 "$(cat "$out/driver.pid")" 2>/dev/null; do sleep 2; done
  tail -8 "$out/driver.log"
  tar -C "$(dirname "$out")" -cf - --exclude='samples-*' --exclude='client-*' --exclude='profiles' "$(basename "$out")" \
    | xz -T0 -6 > "$dest/spans.tar.xz"
  ls -la "$dest"; exit 0
fi

[[ "${1:-}" == run ]] || { echo "usage: spans.sh --pass OUT DEST" >&2; exit 2; }
out=${2:?out dir}; mkdir -p "$out"; out=$(cd "$out" && pwd)
RATE=${RATE:-40} CONCURRENCY=${CONCURRENCY:-64} REPEATS=${REPEATS:-3} WORKERS=${WORKERS:-4} PORT=${PORT:-8000}
SPANS_PORT=${SPANS_PORT:-4318}
LOAD=(--prompt-tokens "${PROMPT_TOKENS:-1024}" --max-tokens "${MAX_TOKENS:-128}" --prompt-pool 256)
say() { echo "[$(date +%H:%M:%S)] spans: $*" >&2; }
"$py" -c 'import google.protobuf, opentelemetry.proto; print("suite: protobuf", google.protobuf.__version__)'
"$VLLM_PYTHON" -c 'import vllm, opentelemetry.sdk; print("vllm", vllm.__version__)'

if [[ -z "${MODEL:-}" ]]; then
  [[ -f /tmp/models/qwen7b/config.json ]] || "$py" launch/make_tiny_model.py /tmp/models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
  export MODEL=/tmp/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy
fi
TRACED=${TRACED_PROFILE:-tracing} PLAIN=${PLAIN_PROFILE:-baseline}
export PROFILES_DIR=$out/profiles HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} PORT
unset SPANS_ENDPOINT  # only the traced profile exports spans (serve.sh adds them to any profile while it is set)
mkdir -p "$PROFILES_DIR"
for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$PROFILES_DIR/$(basename "$f")"; done
url=http://127.0.0.1:$PORT
healthy() { curl -sf -o /dev/null --max-time 2 "$url/health"; }

serve() {  # serve PROFILE [SPANS_ENDPOINT]: started and healthy (serve.sh writes the manifest once smoke-tested)
  local profile=$1 dir=$out/server-$1 spans=(${2:+SPANS_ENDPOINT=$2})
  rm -rf "$dir"
  setsid nohup env "${spans[@]}" bash launch/serve.sh "$profile" --run-dir "$dir" > "$out/serve-$profile.log" 2>&1 < /dev/null &
  echo $! > "$out/server.pid"
  until [[ -f "$dir/manifest.json" ]]; do
    kill -0 "$(cat "$out/server.pid")" 2>/dev/null || { tail -20 "$out/serve-$profile.log" >&2; exit 1; }
    sleep 2
  done
  say "$profile up: $(grep -o '"seconds_to_healthy": [0-9.]*' "$dir/manifest.json")"
}
stop() {
  kill -TERM -- "-$(cat "$out/server.pid")" 2>/dev/null || true
  for _ in $(seq 120); do kill -0 "$(cat "$out/server.pid")" 2>/dev/null || break; sleep 1; done
  for _ in $(seq 60); do healthy || break; sleep 1; done
  say "server stopped"
}
cost() {  # cost LABEL: the closed-loop repeats against the server up now
  "$py" -m launch.sweep --external-url "$url" --label "$1" --out "$out/cost" --concurrency "$CONCURRENCY" \
    --repeats "$REPEATS" --warmup "${WARMUP:-10}" --duration "${DURATION:-30}" --workers "$WORKERS" \
    -- --server-spans "$SPANS_PORT" --server-spans-wait 3 "${LOAD[@]}"
}

serve "$TRACED" "http://127.0.0.1:$SPANS_PORT/v1/traces"
say "saturation: $RATE req/s"
"$py" -m launch.sweep --external-url "$url" --label tracing --out "$out/saturated" --request-rate "$RATE" \
  --max-concurrency "${MAX_CONCURRENCY:-512}" --repeats 1 --warmup "${SAT_WARMUP:-10}" --duration "${SAT_DURATION:-40}" \
  --workers "$WORKERS" -- --server-spans "$SPANS_PORT" --server-spans-wait 3 "${LOAD[@]}"
cost tracing
stop
serve "$PLAIN"
cost baseline
stop
"$py" -m analysis "$out/saturated" > "$out/analysis-saturated.log" 2>&1 || true
"$py" -m analysis "$out/cost" --baseline baseline > "$out/analysis-cost.log" 2>&1 || true
touch "$out/all.done"
say "done"
