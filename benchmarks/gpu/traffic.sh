#!/usr/bin/env bash
# Issue 23's evidence on the GPU: real-traffic shapes against one profile on ONE server start, the
# multi-turn conversation workload (closed loop, sessions with think time) and a Mooncake-style
# trace with shared prefixes (replayed at its own times), each repeated, then the server is stopped.
#   bash benchmarks/gpu/traffic.sh PROFILE OUT          one profile, in the foreground
#   bash benchmarks/gpu/traffic.sh --pass P1,P2 OUT DEST
#       the profiles in turn in a background driver (started once, so runs survive the end of a
#       device call), waits up to WAIT_S (540) for it, then packs what exists into DEST; the same
#       command in the next call waits on and packs again. When every profile is done: the analysis.
# Resumable: a finished run is never rerun (the sweep's run.json; a trace repeat's .done marker).
# Environment: URL (measure a server already running there: no serve.sh, no model; for a dry run
# against the mock), CONV_REPEATS (3), CONV_WARMUP (10), CONV_DURATION (40), CONCURRENCY (64),
# CONVERSATIONS (400), TURNS (5), TURN_WORDS (280: ~512 tokens of the dummy model's tokenizer),
# REPLY_WORDS (70: ~128), THINK_S (1), TRACE_REPEATS (3), TRACE_REQUESTS (270), TRACE_RATE (6),
# TRACE_PREFIXES (16), TRACE_PREFIX_BLOCKS (4), TRACE_OWN_BLOCKS (3), TRACE_USERS (256),
# WORKERS (2: Locust processes), PARTS (conversation,trace), MODEL/SERVED_MODEL_NAME as matrix.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -d /tmp/site ]]; then export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1; fi
VLLM_PYTHON=${VLLM_PYTHON:-$(command -v python3)}; SUITE_PYTHON=${SUITE_PYTHON:-$VLLM_PYTHON}
export VLLM_PYTHON SUITE_PYTHON
py=$SUITE_PYTHON

if [[ "${1:-}" == "--pass" ]]; then
  profiles=${2:?profiles}; out=${3:?out dir}; dest=${4:?dest dir}
  mkdir -p "$out" "$dest"; out=$(cd "$out" && pwd)
  if ! { [[ -f "$out/driver.pid" ]] && kill -0 "$(cat "$out/driver.pid")" 2>/dev/null; } && [[ ! -f "$out/all.done" ]]; then
    setsid nohup bash -c 'for p in ${1//,/ }; do bash "$0" "$p" "$2" || exit 1; done; touch "$2/all.done"' \
      "$0" "$profiles" "$out" >> "$out/driver.log" 2>&1 < /dev/null &
    echo $! > "$out/driver.pid"
  fi
  end=$((SECONDS + ${WAIT_S:-540}))
  while (( SECONDS < end )) && kill -0 "$(cat "$out/driver.pid")" 2>/dev/null; do sleep 2; done
  if [[ -f "$out/all.done" ]]; then
    for w in conversation trace; do
      [[ -d "$out/$w" && ! -f "$out/$w/comparison.csv" ]] && \
        "$py" -m analysis "$out/$w" --baseline "${BASELINE:-baseline}" > "$out/analysis-$w.log" 2>&1
    done
    echo "traffic: all profiles done"
  fi
  tail -5 "$out/driver.log"
  base=$(dirname "$out") name=$(basename "$out")
  tar -C "$base" -cf - --exclude='samples-*' --exclude='requests-*' --exclude='client-*' --exclude='profiles' \
    --exclude='data' "$name" | xz -T0 -3 > "$dest/traffic-small.tar.xz"
  for w in conversation trace; do for p in ${profiles//,/ }; do  # the raw rows, one file per workload and label
    [[ -d "$out/$w/$p" ]] && tar -C "$base" -cf - "$name/$w/$p" | xz -T0 -6 > "$dest/raw-$w-$p.tar.xz"
  done; done
  ls -la "$dest"; exit 0
fi

profile=${1:?profile}; out=${2:?out dir}
mkdir -p "$out"; out=$(cd "$out" && pwd)
CONV_REPEATS=${CONV_REPEATS:-3} CONV_WARMUP=${CONV_WARMUP:-10} CONV_DURATION=${CONV_DURATION:-40}
CONCURRENCY=${CONCURRENCY:-64} THINK_S=${THINK_S:-1} WORKERS=${WORKERS:-2} TRACE_REPEATS=${TRACE_REPEATS:-3}
TRACE_USERS=${TRACE_USERS:-256} PARTS=${PARTS:-conversation,trace} PORT=${PORT:-8000}
say() { echo "[$(date +%H:%M:%S)] traffic $profile: $*" >&2; }

# The workloads: made once in OUT/data, the same files for every profile.
data=$out/data; mkdir -p "$data"
conv=$data/conv.json trace=$data/trace.jsonl
[[ -s "$conv" ]] || { "$py" -m vllm_locust.core.conversationgen --out "$conv.tmp" --conversations "${CONVERSATIONS:-400}" \
  --turns "${TURNS:-5}" --turn-words "${TURN_WORDS:-280}" --reply-words "${REPLY_WORDS:-70}" --seed 0 && mv "$conv.tmp" "$conv"; }
[[ -s "$trace" ]] || { "$py" -m vllm_locust.core.tracegen --out "$trace.tmp" --requests "${TRACE_REQUESTS:-270}" \
  --rate "${TRACE_RATE:-6}" --prefixes "${TRACE_PREFIXES:-16}" --prefix-blocks "${TRACE_PREFIX_BLOCKS:-4}" \
  --input-blocks-mean "${TRACE_OWN_BLOCKS:-3}" --output-tokens-mean 128 --seed 0 && mv "$trace.tmp" "$trace"; }

server_dir=$out/server-$profile pid_file=$out/server-$profile.pid
if [[ -n "${URL:-}" ]]; then
  url=$URL
else
  url=http://127.0.0.1:$PORT
  if [[ -z "${MODEL:-}" ]]; then
    [[ -f /tmp/models/qwen7b/config.json ]] || "$py" launch/make_tiny_model.py /tmp/models/qwen7b --shape qwen2.5-7b --max-model-len 32768 >/dev/null
    export MODEL=/tmp/models/qwen7b SERVED_MODEL_NAME=qwen7b-dummy
    PROFILES_DIR=$out/profiles; mkdir -p "$PROFILES_DIR"
    for f in profiles/*.conf; do { cat "$f"; echo; echo "load-format=dummy"; } > "$PROFILES_DIR/$(basename "$f")"; done
  fi
  export PROFILES_DIR=${PROFILES_DIR:-$PWD/profiles} HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-480} PORT
fi
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
healthy() { curl -sf -o /dev/null --max-time 2 "$url/health"; }

if [[ ! -f "$out/$profile.done" ]]; then
  if [[ -z "${URL:-}" ]] && ! { [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }; then
    healthy && { echo "traffic: something already answers on $url; stop it first" >&2; exit 2; }
    rm -rf "$server_dir"
    setsid nohup bash launch/serve.sh "$profile" --run-dir "$server_dir" > "$out/serve-$profile.log" 2>&1 < /dev/null &
    echo $! > "$pid_file"; say "serve.sh started (pid $!), log $out/serve-$profile.log"
  fi
  if [[ -z "${URL:-}" ]]; then
    until [[ -f "$server_dir/manifest.json" ]]; do  # serve.sh writes it once healthy and smoke-tested
      kill -0 "$(cat "$pid_file")" 2>/dev/null || { tail -20 "$out/serve-$profile.log" >&2; exit 1; }
      sleep 2
    done
    say "server up: $(grep -o '"seconds_to_healthy": [0-9.]*' "$server_dir/manifest.json")"
  fi
  served=$(curl -sf --max-time 5 "$url/v1/models" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
  # What a user turn and a reply cost by the server's own count (the request rows say it again, per request).
  "$py" - "$url" "$served" "$conv" > "$out/tokens-per-turn-$profile.txt" 2>&1 <<'EOF' || true
import json, sys, urllib.request
url, model, conv = sys.argv[1:]
entry = json.load(open(conv))[0]["conversations"]
for m in entry[:4]:
    body = json.dumps({"model": model, "prompt": m["value"], "add_special_tokens": False}).encode()
    req = urllib.request.Request(url + "/tokenize", body, {"Content-Type": "application/json"})
    n = json.load(urllib.request.urlopen(req, timeout=10))["count"]
    print(m["from"], len(m["value"].split()), "words", n, "tokens")
EOF
  cat "$out/tokens-per-turn-$profile.txt" >&2

  if [[ ",$PARTS," == *,conversation,* ]]; then
    "$py" -m launch.sweep --external-url "$url" --label "$profile" --out "$out/conversation" \
      --concurrency "$CONCURRENCY" --repeats "$CONV_REPEATS" --warmup "$CONV_WARMUP" --duration "$CONV_DURATION" \
      --workers "$WORKERS" -- --workload conversation --dataset-path "$conv" --prompt-pool "${CONVERSATIONS:-400}" \
      --think-time "$THINK_S" --max-tokens 128
    if [[ -f "$server_dir/manifest.json" ]]; then
      for m in "$out/conversation/$profile"/*/*/run.json; do [[ -f "$m" ]] && cp "$server_dir/manifest.json" "$(dirname "$m")/launch-manifest.json"; done
    fi
  fi

  if [[ ",$PARTS," == *,trace,* ]]; then
    span=$("$py" -c 'import json, sys; rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; print(int(rows[-1]["timestamp"] / 1000) + 1)' "$trace")
    tdir=$out/trace/$profile; mkdir -p "$tdir"
    for r in $(seq 1 "$TRACE_REPEATS"); do
      [[ -f "$tdir/r$r.done" ]] && continue
      rm -f "$tdir"/*-"$profile-trace-r$r"* 2>/dev/null || true  # an interrupted repeat's partial rows
      # The sweep's reset: the prefix cache starts empty (a profile with caching off answers an error: fine).
      curl -s -o /dev/null --max-time 30 -X POST "$url/reset_prefix_cache" || true
      say "trace repeat $r: ${span}s of trace"; mport=$(free_port)
      "$py" -m locust -f locustfile.py --host "$url" --headless --only-summary -u "$TRACE_USERS" -r "$TRACE_USERS" \
        -t "$((span + 60))s" --processes "$WORKERS" --master-port "$mport" --master-bind-port "$mport" --samples-dir "$tdir" --run-id "$profile-trace-r$r" \
        --workload trace --dataset-path "$trace" --model "$served" > "$tdir/locust-r$r.log" 2>&1 \
        || { tail -20 "$tdir/locust-r$r.log" >&2; exit 1; }
      touch "$tdir/r$r.done"
    done
    [[ -f "$server_dir/manifest.json" ]] && cp "$server_dir/manifest.json" "$tdir/launch-manifest.json"
  fi
  touch "$out/$profile.done"
fi
if [[ -z "${URL:-}" ]] && [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  kill -TERM -- "-$(cat "$pid_file")" 2>/dev/null || kill -TERM "$(cat "$pid_file")"
  for _ in $(seq 120); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 1; done
  for _ in $(seq 60); do healthy || break; sleep 1; done
  say "server stopped"
fi
say "done: $out/{conversation,trace}/$profile"
