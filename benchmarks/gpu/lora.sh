#!/usr/bin/env bash
# Issue 24's evidence on the GPU: what serving tenants on LoRA adapters costs against the same
# tenants on the base model, on ONE server start with LoRA enabled (so the only difference between
# the two labels is whether a request names an adapter). Two personas at weights 3:1, closed loop,
# the fixed workload; labels run alternately (base, adapters, base, adapters, ...), then the
# server is stopped.
#   bash benchmarks/gpu/lora.sh OUT [DEST]
# OUT/runs/{base,adapters}/c<C>/r<R>/ is the sweep's layout: python -m analysis OUT/runs --baseline base
# --allow-model-mismatch (the labels name different models by design) gives summary_by_persona.csv.
# DEST (e.g. $OUT on the device): after every run, what exists is packed into DEST/lora.tar.xz (with
# the per-chunk samples, which the analysis needs for ITL: SAMPLES=0 leaves them out), so a call cut
# short keeps its runs.
# Resumable: a finished run is never rerun (the sweep's run.json).
# Environment: REPEATS (2), WARMUP (8), DURATION (25), CONCURRENCY (64), WORKERS (2), PROMPT_TOKENS
# (512), MAX_TOKENS (128), RANK (16), TARGETS (q_proj,v_proj), EAGER (0: vLLM's default CUDA graphs and
# torch.compile, healthy after 203 s on a fresh H200; 1: --enforce-eager, a faster start, slower decode), MODELS_DIR (/tmp/models), PORT
# (8000), URL (measure a server already running there with lora-a and lora-b: no server started).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -d /tmp/site ]]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1; fi
VLLM_PYTHON=${VLLM_PYTHON:-$(command -v python3)}; SUITE_PYTHON=${SUITE_PYTHON:-$VLLM_PYTHON}
export VLLM_PYTHON SUITE_PYTHON
py=$SUITE_PYTHON
out=${1:?usage: lora.sh OUT [DEST]}; dest=${2:-}
mkdir -p "$out"; out=$(cd "$out" && pwd)
REPEATS=${REPEATS:-2} WARMUP=${WARMUP:-8} DURATION=${DURATION:-25} CONCURRENCY=${CONCURRENCY:-64}
WORKERS=${WORKERS:-2} PORT=${PORT:-8000} EAGER=${EAGER:-0} models=${MODELS_DIR:-/tmp/models}
say() { echo "[$(date +%H:%M:%S)] lora: $*" >&2; }
pack() {  # what the analysis reads, small enough to come back from the device (xz: ~6 MB for 4 runs)
  [[ -n "$dest" ]] || return 0
  mkdir -p "$dest"
  local skip=(--exclude='profiles'); [[ "${SAMPLES:-1}" == 1 ]] || skip+=(--exclude='samples-*')
  tar -C "$(dirname "$out")" -cf - "${skip[@]}" "$(basename "$out")" \
    | xz -T0 -3 > "$dest/lora.tar.xz.tmp" && mv "$dest/lora.tar.xz.tmp" "$dest/lora.tar.xz"
}

server_dir=$out/server pid_file=$out/server.pid
if [[ -n "${URL:-}" ]]; then
  url=$URL
else
  url=http://127.0.0.1:$PORT
  # The base (dummy weights) and two rank-RANK adapters of its shape, made here: nothing is downloaded.
  [[ -f $models/qwen7b/config.json ]] || "$py" launch/make_tiny_model.py "$models/qwen7b" --shape qwen2.5-7b --max-model-len 32768 >/dev/null
  for s in a:1 b:2; do
    [[ -f $models/lora-${s%%:*}/adapter_config.json ]] || "$py" launch/make_lora.py "$models/lora-${s%%:*}" \
      --base "$models/qwen7b" --rank "${RANK:-16}" --targets "${TARGETS:-q_proj,v_proj}" --seed "${s##*:}" >/dev/null
  done
  export MODEL=$models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy
  PROFILES_DIR=$out/profiles; mkdir -p "$PROFILES_DIR"
  for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$PROFILES_DIR/$(basename "$f")"; done
  { echo "include=baseline"; echo "enable-lora=true"; echo "max-loras=2"; echo "max-lora-rank=${RANK:-16}"
    echo "lora-modules=lora-a=$models/lora-a lora-b=$models/lora-b"
    [[ "$EAGER" == 1 ]] && echo "enforce-eager=true"; } > "$PROFILES_DIR/lora-gpu.conf"
  export PROFILES_DIR HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} PORT
fi
healthy() { curl -sf -o /dev/null --max-time 2 "$url/health"; }

# Two tenants, 3:1; the same names under both labels, so the analysis compares them persona by persona.
persona() { printf '[[persona]]\nname = "%s"\nweight = %s\nmodel = "%s"\n\n' "$1" "$2" "$3"; }
{ persona tenant_a 3 qwen7b-dummy; persona tenant_b 1 qwen7b-dummy; } > "$out/personas-base.toml"
{ persona tenant_a 3 lora-a; persona tenant_b 1 lora-b; } > "$out/personas-adapters.toml"

if [[ -z "${URL:-}" ]]; then
  if ! { [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
    healthy && { echo "lora: something already answers on $url; stop it first" >&2; exit 2; }
    rm -rf "$server_dir"
    setsid nohup bash launch/serve.sh lora-gpu --run-dir "$server_dir" > "$out/serve.log" 2>&1 < /dev/null &
    echo $! > "$pid_file"; say "serve.sh started (pid $!), log $out/serve.log"
  fi
  until [[ -f "$server_dir/manifest.json" ]]; do  # serve.sh writes it once healthy and smoke-tested
    kill -0 "$(cat "$pid_file")" 2>/dev/null || { say "the server did not start:"; tail -40 "$out/serve.log" >&2
      tail -40 "$server_dir/server.log" >&2 2>/dev/null; pack; exit 1; }
    sleep 2
  done
  say "server up: $(grep -o '"seconds_to_healthy": [0-9.]*' "$server_dir/manifest.json")"
fi
curl -sf --max-time 5 "$url/v1/models" > "$out/models.json"; say "served: $(tr -d ' \n' < "$out/models.json" | grep -o '"id":"[^"]*"' | tr '\n' ' ')"

for r in $(seq 1 "$REPEATS"); do
  for label in base adapters; do  # alternating, so a drift of the machine falls on both labels alike
    say "$label repeat $r"
    # LOCUST_PERSONAS too: the sweep starts its --workers without --personas (they would not know the classes).
    LOCUST_PERSONAS=$out/personas-$label.toml "$py" -m launch.sweep --external-url "$url" --label "$label" --out "$out/runs" --concurrency "$CONCURRENCY" \
      --repeats "$r" --warmup "$WARMUP" --duration "$DURATION" --workers "$WORKERS" -- \
      --personas "$out/personas-$label.toml" --workload fixed --prompt-tokens "${PROMPT_TOKENS:-512}" \
      --max-tokens "${MAX_TOKENS:-128}" > "$out/sweep-$label-r$r.log" 2>&1 || { tail -20 "$out/sweep-$label-r$r.log" >&2; pack; exit 1; }
    [[ -f "$server_dir/manifest.json" ]] && for m in "$out/runs/$label"/*/*/run.json; do
      [[ -f "$m" ]] && cp "$server_dir/manifest.json" "$(dirname "$m")/launch-manifest.json"; done
    pack
  done
done
if [[ -z "${URL:-}" ]] && [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  kill -TERM -- "-$(cat "$pid_file")" 2>/dev/null || kill -TERM "$(cat "$pid_file")"
  for _ in $(seq 60); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 1; done
  say "server stopped"
fi
[[ "${ANALYSE:-0}" == 1 ]] && "$py" -m analysis "$out/runs" --baseline base --allow-model-mismatch > "$out/analysis.log" 2>&1 || true
pack
say "done: $out/runs/{base,adapters}"
