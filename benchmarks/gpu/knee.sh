#!/usr/bin/env bash
# Issue 43's evidence on the GPU, one server start (profiles/baseline.conf, the dummy 7B model):
#   1. the offline search: launch/boundary.py --external-url (one Locust run per probe), timed;
#   2. the live search: one Locust run with --ramp-until-slo (the rate steered window by window), timed;
#   3. the live run's schedule (schedule-<run_id>.toml) replayed headless with --schedule;
#   then python -m analysis on 2 and 3 (phases.csv: one row per step, delivered rates side by side).
#   bash benchmarks/gpu/knee.sh --pass OUT DEST
#       runs the study in a background driver (once; it survives the device call), waits up to WAIT_S
#       (540) for it, packs what exists into DEST; the same command in the next call waits and packs again.
# Staging: benchmarks/gpu/install_split.sh in each call (.gpu-stage/v0, v1, v2, c1, c2 with d, then e:
# the suite's wheels for Python 3.12 with pandas, tabulate and matplotlib, which the analysis needs there).
# Results: docs/results/knee-h100.md.
# Environment: SLO (ttft:1000,itl:60), START (4), TOLERANCE (0.15), WARMUP (5), WINDOW (15), WORKERS (4),
# MAX_CONCURRENCY (512), PROMPT_TOKENS (1024), MAX_TOKENS (128); a dry run on vLLM's CPU build:
# MODEL=models/tiny SERVED_MODEL_NAME=tiny PROFILE=baseline-cpu VLLM_PYTHON=.venv-vllm/bin/python
# SUITE_PYTHON=.venv/bin/python WORKERS=1 and a small SLO.
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
  tail -12 "$out/driver.log"
  tar -C "$(dirname "$out")" -cf - --exclude='samples-*' --exclude='client-*' --exclude='profiles' "$(basename "$out")" \
    | xz -T0 -6 > "$dest/knee.tar.xz"
  ls -la "$dest"; exit 0
fi

[[ "${1:-}" == run ]] || { echo "usage: knee.sh --pass OUT DEST" >&2; exit 2; }
out=${2:?out dir}; mkdir -p "$out"; out=$(cd "$out" && pwd)
SLO=${SLO:-ttft:1000,itl:60} START=${START:-4} TOLERANCE=${TOLERANCE:-0.15} WARMUP=${WARMUP:-5} WINDOW=${WINDOW:-15}
WORKERS=${WORKERS:-4} MAXC=${MAX_CONCURRENCY:-512} PORT=${PORT:-8000}
LOAD=(--prompt-tokens "${PROMPT_TOKENS:-1024}" --max-tokens "${MAX_TOKENS:-128}" --prompt-pool 256)
say() { echo "[$(date +%H:%M:%S)] knee: $*" >&2; }
"$VLLM_PYTHON" -c 'import vllm; print("vllm", vllm.__version__)'

if [[ -z "${MODEL:-}" ]]; then
  [[ -f /tmp/models/qwen7b/config.json ]] || "$py" launch/make_tiny_model.py /tmp/models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
  export MODEL=/tmp/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy
fi
PROFILE=${PROFILE:-baseline}
export PROFILES_DIR=$out/profiles HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} PORT
mkdir -p "$PROFILES_DIR"
for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$PROFILES_DIR/$(basename "$f")"; done
url=http://127.0.0.1:$PORT
procs=(); (( WORKERS > 1 )) && procs=(--processes "$WORKERS")

dir=$out/server
if ! curl -sf -o /dev/null --max-time 2 "$url/health"; then
  rm -rf "$dir"
  setsid nohup bash launch/serve.sh "$PROFILE" --run-dir "$dir" > "$out/serve.log" 2>&1 < /dev/null &
  echo $! > "$out/server.pid"
  until [[ -f "$dir/manifest.json" ]]; do
    kill -0 "$(cat "$out/server.pid")" 2>/dev/null || { tail -20 "$out/serve.log" >&2; exit 1; }
    sleep 2
  done
  say "$PROFILE up: $(grep -o '"seconds_to_healthy": [0-9.]*' "$dir/manifest.json")"
fi

if [[ ! -f "$out/offline.done" ]]; then
  began=$SECONDS
  "$py" -m launch.boundary --external-url "$url" --label "$PROFILE" --slo "$SLO" --start "$START" \
    --tolerance "$TOLERANCE" --warmup "$WARMUP" --duration "$WINDOW" --workers "$WORKERS" \
    --max-concurrency "$MAXC" --out "$out/boundary" -- "${LOAD[@]}" > "$out/boundary.log" 2>&1 || true
  echo "$((SECONDS - began))" > "$out/offline.done"
  say "offline search: $(grep 'highest' "$out/boundary.log" | tail -1) in $(cat "$out/offline.done") s"
fi
if [[ ! -f "$out/live.done" ]]; then
  began=$SECONDS
  "$py" -m locust -f locustfile.py --headless --host "$url" -u "$MAXC" -r "$MAXC" "${procs[@]}" \
    --samples-dir "$out/ramp" --ramp-until-slo "$SLO" --ramp-start "$START" --ramp-tolerance "$TOLERANCE" \
    --ramp-window "$WINDOW" --steer-warmup "$WARMUP" "${LOAD[@]}" > "$out/ramp.log" 2>&1 || true
  echo "$((SECONDS - began))" > "$out/live.done"
  say "live search: $(grep -o 'ramp: highest.*' "$out/ramp.log" | tail -1) in $(cat "$out/live.done") s"
fi
if [[ ! -f "$out/replay.done" ]]; then
  schedule=$(ls "$out"/ramp/schedule-*.toml | head -1)
  began=$SECONDS
  "$py" -m locust -f locustfile.py --headless --host "$url" -u "$MAXC" -r "$MAXC" "${procs[@]}" \
    --samples-dir "$out/replay" --schedule "$schedule" --steer-warmup "$WARMUP" "${LOAD[@]}" \
    > "$out/replay.log" 2>&1 || true
  echo "$((SECONDS - began))" > "$out/replay.done"
  say "replay of $(basename "$schedule"): $(cat "$out/replay.done") s"
fi
kill -TERM -- "-$(cat "$out/server.pid")" 2>/dev/null || true
"$py" -m analysis "$out/ramp" > "$out/analysis-ramp.log" 2>&1 || true
"$py" -m analysis "$out/replay" > "$out/analysis-replay.log" 2>&1 || true
touch "$out/all.done"
say "done"
