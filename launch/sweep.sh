#!/usr/bin/env bash
# The experiment matrix: for each profile, restart vLLM, smoke-test it, then for each concurrency
# and repeat: warm up, load it with Locust headless, scrape /metrics all along, keep everything.
#
# Usage: bash launch/sweep.sh --profiles baseline-cpu,optimized-cpu --concurrency 32,64,128 \
#          --warmup 30 --duration 120 --repeats 3 --out runs/NAME [--workers N] [-- LOCUST_ARGS...]
#        bash launch/sweep.sh --external-url http://127.0.0.1:8000 --label NAME [same options]
# Layout: OUT/<profile or label>/server-<time>/{manifest.json,server.log}
#         OUT/<profile or label>/c<concurrency>/r<repeat>/{run.json,locust_*.csv,samples-*.csv,
#           requests-*.csv,metrics.csv,metrics-before.prom,metrics-after.prom,locust.log}
# A run with run.json is done and never rerun or overwritten; rerun the same command to resume.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

profiles= concurrency=32,64,128 warmup=30 duration=120 repeats=1 out= external= label= workers=0
locust_args=()
while (( $# )); do
  case "$1" in
    --profiles) profiles=${2:?}; shift ;;
    --concurrency) concurrency=${2:?}; shift ;;
    --warmup) warmup=${2:?}; shift ;;
    --duration) duration=${2:?}; shift ;;
    --repeats) repeats=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --external-url) external=${2:?}; shift ;;
    --label) label=${2:?}; shift ;;
    --workers) workers=${2:?}; shift ;;
    --) shift; locust_args=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[[ -n "$out" ]] || die "--out DIR is required"
if [[ -n "$external" ]]; then
  [[ -n "$label" ]] || die "--external-url needs --label NAME (the name this server's runs go under)"
  [[ -z "$profiles" ]] || die "--external-url measures a running server: no --profiles"
  [[ "$label" =~ ^[A-Za-z0-9._-]+$ ]] || die "--label '$label': letters, digits, '.', '_' and '-' only"
  names=("$label")
else
  [[ -n "$profiles" ]] || die "--profiles a,b,... is required (profiles: $(list_profiles))"
  IFS=, read -r -a names <<< "$profiles"
  for p in "${names[@]}"; do build_command "$p"; done  # unknown profiles fail before anything starts
fi
IFS=, read -r -a levels <<< "$concurrency"
for c in "${levels[@]}"; do [[ "$c" =~ ^[1-9][0-9]*$ ]] || die "--concurrency '$concurrency': positive integers"; done
[[ "$repeats" =~ ^[1-9][0-9]*$ && "$workers" =~ ^[0-9]+$ ]] || die "--repeats and --workers must be whole numbers"
[[ -x "$SUITE_PY" ]] || die "no load-generator python at $SUITE_PY: run launch/setup.sh"
mkdir -p "$out"; out=$(cd "$out" && pwd)

total=$(( ${#names[@]} * ${#levels[@]} * repeats )); k=0; t_start=$(date +%s)
SCRAPER_PID= ; LOCUST_PIDS=()
cleanup() {
  [[ -n "${SCRAPER_PID:-}" ]] && kill -TERM "$SCRAPER_PID" 2>/dev/null || true
  local pid
  for pid in "${LOCUST_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  stop_server
}
trap cleanup EXIT
trap 'exit 130' INT TERM

progress() {
  local elapsed=$(( $(date +%s) - t_start )) left=$(( total - k + 1 )) done=$(( k - 1 ))
  local per=$(( done > 0 ? elapsed / done : warmup + duration + 15 ))
  log "run $k of $total ($1): elapsed ${elapsed}s, about $(( left * per ))s left"
}

run_done() { [[ -f "$1/run.json" ]]; }

# run_locust DIR URL CONCURRENCY RUN_ID: Locust headless, one step, warm-up discarded.
run_locust() {
  local dir=$1 url=$2 c=$3 run_id=$4 rc=0 pid
  local common=(-f "$ROOT/locustfile.py" --host "$url" --headless --only-summary
    --steps "$c" --step-warmup "$warmup" --step-duration "$duration"
    --csv "$dir/locust" --samples-dir "$dir" --run-id "$run_id" "${locust_args[@]}")
  if (( workers > 0 )); then
    LOCUST_PIDS=()
    for _ in $(seq 1 "$workers"); do
      "$SUITE_PY" -m locust -f "$ROOT/locustfile.py" --worker --master-host 127.0.0.1 >>"$dir/locust-workers.log" 2>&1 &
      LOCUST_PIDS+=($!)
    done
    "$SUITE_PY" -m locust "${common[@]}" --master --master-bind-host 127.0.0.1 --expect-workers "$workers" \
      >"$dir/locust.log" 2>&1 || rc=$?
    for pid in "${LOCUST_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    LOCUST_PIDS=()
  else
    "$SUITE_PY" -m locust "${common[@]}" >"$dir/locust.log" 2>&1 || rc=$?
  fi
  return "$rc"
}

for name in "${names[@]}"; do
  todo=0
  for c in "${levels[@]}"; do for r in $(seq 1 "$repeats"); do
    run_done "$out/$name/c$c/r$r" || todo=$((todo + 1)); done; done
  if (( todo == 0 )); then k=$(( k + ${#levels[@]} * repeats )); log "$name: all runs done, skipped"; continue; fi

  reset_cache=true
  if [[ -n "$external" ]]; then
    url=${external%/}
    curl -sf -o /dev/null --max-time 10 "$url/v1/models" || die "cannot reach $url/v1/models (--external-url)"
    mkdir -p "$out/$name"
    server_dir="$out/$name/external-$(date +%Y%m%d-%H%M%S)"; mkdir -p "$server_dir"
    "$SUITE_PY" -c 'import json,sys,requests; u=sys.argv[1]
def get(p):
    try: r=requests.get(u+p,timeout=5); return r.json() if r.ok else None
    except Exception: return None
json.dump({"label": sys.argv[2], "url": u, "external": True, "models": get("/v1/models"), "version": get("/version")},
          open(sys.argv[3], "w"), indent=2)' "$url" "$name" "$server_dir/manifest.json"
  else
    PORT=${PORT:-$(free_port)} build_command "$name"
    check_flags
    url=$SERVER_URL
    server_dir="$out/$name/server-$(date +%Y%m%d-%H%M%S)"
    start_server "$server_dir"
    wait_healthy "$url" || die "$name: server did not come up (log: $SERVER_LOG)"
    smoke_test "$url" "$SERVED_MODEL" || die "$name: smoke test failed"
    write_manifest "$server_dir"
    log "$name: healthy after ${SECONDS_TO_HEALTHY}s"
    [[ "$(sweep_setting reset-prefix-cache true)" == true ]] || reset_cache=false
  fi

  "$SUITE_PY" -m vllm_locust.prepare --host "$url" "${locust_args[@]}" || die "$name: cannot build the workload"
  for c in "${levels[@]}"; do
    for r in $(seq 1 "$repeats"); do
      k=$((k + 1))
      dir="$out/$name/c$c/r$r"
      if run_done "$dir"; then log "run $k of $total ($name c=$c r=$r): done before, skipped"; continue; fi
      [[ -e "$dir" ]] && mv "$dir" "$dir.incomplete-$(date +%Y%m%d-%H%M%S)"
      mkdir -p "$dir"
      progress "$name c=$c r=$r"
      if [[ "$reset_cache" == true ]]; then
        curl -s -o /dev/null -X POST --max-time 30 "$url/reset_prefix_cache" \
          || log "warning: $url/reset_prefix_cache failed; prefix cache not reset"
      fi
      "$SUITE_PY" -m vllm_locust.scraper "$url" --snapshot "$dir/metrics-before.prom" || true
      "$SUITE_PY" -m vllm_locust.scraper "$url" --out "$dir/metrics.csv" --interval 1 2>>"$dir/scraper.log" &
      SCRAPER_PID=$!
      started_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
      rc=0; run_locust "$dir" "$url" "$c" "$name-c$c-r$r" || rc=$?
      kill -TERM "$SCRAPER_PID" 2>/dev/null || true; wait "$SCRAPER_PID" 2>/dev/null || true; SCRAPER_PID=
      "$SUITE_PY" -m vllm_locust.scraper "$url" --snapshot "$dir/metrics-after.prom" || true
      if [[ -z "$external" ]] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "launch: vLLM ($name) died during run c=$c r=$r; what was measured is kept in $dir; last log lines:" >&2
        tail -n 20 "$SERVER_LOG" >&2
        SERVER_PID=
        exit 1
      fi
      (( rc <= 1 )) || die "locust failed (exit $rc) in $dir; see $dir/locust.log"
      "$SUITE_PY" "$LAUNCH_DIR/run_record.py" --out "$dir/run.json" --profile "$name" --concurrency "$c" \
        --repeat "$r" --warmup "$warmup" --duration "$duration" --url "$url" --server-dir "$server_dir" \
        --started-at "$started_at" --locust-exit "$rc" --workers "$workers" --external "${external:+1}" \
        --reset-prefix-cache "$reset_cache" -- "${locust_args[@]}"
    done
  done
  stop_server
done
log "sweep done: $total runs in $out ($(( $(date +%s) - t_start ))s)"
