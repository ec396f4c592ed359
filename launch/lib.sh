# Functions of serve.sh (launch/sweep.py starts servers through serve.sh). Source it; it defines, it runs nothing.
# Profiles are key=value lines, parsed here, never sourced or evaluated.

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$LAUNCH_DIR/.." && pwd)
PROFILES_DIR=${PROFILES_DIR:-$ROOT/profiles}
VLLM_PY=${VLLM_PYTHON:-$ROOT/.venv-vllm/bin/python}
SUITE_PY=${SUITE_PYTHON:-$ROOT/.venv/bin/python}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-600}
# Keys serve.sh sets itself from the environment (MODEL, SERVED_MODEL_NAME, TP, HOST, PORT).
SERVE_KEYS=" model served-model-name tensor-parallel-size host port "
# Flags that take several arguments: the profile's value is space-separated, one argument each
# (lora-modules=a=models/lora-a b=models/lora-b); a relative NAME=PATH under the repo is made absolute.
LIST_KEYS=" lora-modules "
# Where vLLM sends its request spans when a profile says otlp-traces-endpoint=suite and SPANS_ENDPOINT
# is not set: the suite's receiver (locust --server-spans 4318).
DEFAULT_SPANS_ENDPOINT=http://127.0.0.1:4318/v1/traces

die() { echo "launch: $*" >&2; exit 2; }
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

list_profiles() {
  local f names=()
  for f in "$PROFILES_DIR"/*.conf; do names+=("$(basename "$f" .conf)"); done
  (IFS=,; echo "${names[*]}")
}

# read_profile NAME: fills P_KEYS (flag keys in first-seen order), P_VALUES (key -> value, later
# lines win), P_ENV (env.NAME=value) and P_SWEEP (sweep.setting=value, for launch/sweep.py only).
# include=OTHER reads OTHER first, in place.
read_profile() {
  P_KEYS=(); declare -gA P_VALUES=() P_ENV=() P_SWEEP=()
  _read_profile_file "$1" 0
}

_read_profile_file() {
  local name=$1 depth=$2 file="$PROFILES_DIR/$1.conf" line key value n=0
  [[ "$name" =~ ^[A-Za-z0-9._-]+$ && -f "$file" ]] || die "unknown profile '$name'; profiles: $(list_profiles)"
  (( depth < 8 )) || die "profile '$name': include nested too deep"
  while IFS= read -r line || [[ -n "$line" ]]; do
    n=$((n + 1))
    line="${line#"${line%%[![:space:]]*}"}"; line="${line%"${line##*[![:space:]]}"}"
    [[ -z "$line" || "$line" == \#* ]] && continue
    [[ "$line" == *=* ]] || die "$file:$n: expected key=value, got '$line'"
    key=${line%%=*}; value=${line#*=}
    if [[ "$key" == include ]]; then
      _read_profile_file "$value" $((depth + 1))
    elif [[ "$key" =~ ^env\.[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      P_ENV[${key#env.}]=$value
    elif [[ "$key" =~ ^sweep\.[a-z-]+$ ]]; then
      P_SWEEP[${key#sweep.}]=$value
    elif [[ "$key" =~ ^[a-z0-9][a-z0-9-]*$ ]]; then
      [[ -v "P_VALUES[$key]" ]] || P_KEYS+=("$key")
      P_VALUES[$key]=$value
    else
      die "$file:$n: '$key' is not a vLLM flag name (lower-case-with-dashes) or env.NAME"
    fi
  done < "$file"
}

# build_command PROFILE: SERVER_CMD (array) and SERVER_ENV (NAME=value array), SERVED_MODEL, SERVER_URL.
build_command() {
  read_profile "$1"
  PROFILE=$1
  local model=${MODEL:-${P_VALUES[model]:-}}
  if [[ -z "$model" && -n "${DRY_RUN_PLACEHOLDER:-}" ]]; then
    model='<MODEL>'  # a dry run shows where the model goes; a real start needs MODEL
  fi
  [[ -n "$model" ]] || die "profile '$1' names no model: set MODEL=/path/to/model"
  SERVED_MODEL=${SERVED_MODEL_NAME:-${P_VALUES[served-model-name]:-$(basename "$model")}}
  SERVER_HOST=${HOST:-${P_VALUES[host]:-127.0.0.1}}
  SERVER_PORT=${PORT:-${P_VALUES[port]:-8000}}
  SERVER_URL="http://$SERVER_HOST:$SERVER_PORT"
  case "$SERVER_HOST" in
    127.0.0.1|localhost|::1) ;;
    *) echo "launch: warning: vLLM will listen on $SERVER_HOST, reachable from other machines (without" \
         "an api-key in the profile or VLLM_API_KEY, anyone there can use it); HOST=127.0.0.1 keeps it local" >&2 ;;
  esac
  [[ "$model" == /* || ! -e "$ROOT/$model" ]] || model="$ROOT/$model"
  SERVER_CMD=("$VLLM_PY" -m vllm.entrypoints.openai.api_server
    --model "$model" --served-model-name "$SERVED_MODEL"
    --tensor-parallel-size "${TP:-${P_VALUES[tensor-parallel-size]:-1}}"
    --host "$SERVER_HOST" --port "$SERVER_PORT")
  # Spans (locust --server-spans): SPANS_ENDPOINT, or a profile's otlp-traces-endpoint (the value
  # "suite": SPANS_ENDPOINT or the suite's default receiver), makes vLLM export one span per request
  # over OTLP/HTTP protobuf, in batches every OTEL_BSP_SCHEDULE_DELAY ms: 500 here, as the SDK's
  # default of 5000 holds the last requests' spans back 5 s after the load stops.
  TRACES_ENDPOINT=${P_VALUES[otlp-traces-endpoint]:-}
  [[ "$TRACES_ENDPOINT" == suite ]] && TRACES_ENDPOINT=${SPANS_ENDPOINT:-$DEFAULT_SPANS_ENDPOINT}
  [[ -z "$TRACES_ENDPOINT" && -n "${SPANS_ENDPOINT:-}" ]] && TRACES_ENDPOINT=$SPANS_ENDPOINT
  if [[ -n "$TRACES_ENDPOINT" ]]; then
    [[ -v "P_ENV[OTEL_EXPORTER_OTLP_TRACES_PROTOCOL]" ]] || P_ENV[OTEL_EXPORTER_OTLP_TRACES_PROTOCOL]=http/protobuf
    [[ -v "P_ENV[OTEL_BSP_SCHEDULE_DELAY]" ]] || P_ENV[OTEL_BSP_SCHEDULE_DELAY]=500
  fi
  local key value
  for key in "${P_KEYS[@]}"; do
    [[ "$SERVE_KEYS" == *" $key "* || "$key" == otlp-traces-endpoint ]] && continue
    value=${P_VALUES[$key]}
    if [[ "$LIST_KEYS" == *" $key "* ]]; then
      local item items=() parts
      read -ra parts <<< "$value"  # split on spaces, never glob
      for item in "${parts[@]}"; do
        [[ "$item" != *=* || "${item#*=}" == /* || ! -e "$ROOT/${item#*=}" ]] || item="${item%%=*}=$ROOT/${item#*=}"
        items+=("$item")
      done
      SERVER_CMD+=("--$key" "${items[@]}")
      continue
    fi
    case "$value" in
      true) SERVER_CMD+=("--$key") ;;
      false) SERVER_CMD+=("--no-$key") ;;
      *) SERVER_CMD+=("--$key" "$value") ;;
    esac
  done
  [[ -n "$TRACES_ENDPOINT" ]] && SERVER_CMD+=(--otlp-traces-endpoint "$TRACES_ENDPOINT")
  # /reset_prefix_cache exists only in dev mode; the sweep resets the cache between runs.
  SERVER_ENV=(VLLM_SERVER_DEV_MODE=1)
  while IFS= read -r key; do
    if [[ -n "$key" ]]; then SERVER_ENV+=("$key=${P_ENV[$key]}"); fi
  done < <(printf "%s\n" "${!P_ENV[@]}" | sort)
}

# check_tracing: a vLLM asked to export spans whose Python lacks OpenTelemetry refuses to start
# ("OpenTelemetry is not available"): say so in one line and start it without spans instead.
check_tracing() {
  [[ -n "${TRACES_ENDPOINT:-}" ]] || return 0
  if ! "$VLLM_PY" -c 'import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter' 2>/dev/null; then
    echo "launch: spans are off: $VLLM_PY lacks the OpenTelemetry packages (pip install opentelemetry-sdk" \
         "opentelemetry-exporter-otlp); vLLM starts without --otlp-traces-endpoint, the join has no server side" >&2
    local kept=() i
    for (( i = 0; i < ${#SERVER_CMD[@]}; i++ )); do
      if [[ "${SERVER_CMD[i]}" == --otlp-traces-endpoint ]]; then i=$((i + 1)); continue; fi
      kept+=("${SERVER_CMD[i]}")
    done
    SERVER_CMD=("${kept[@]}")
    TRACES_ENDPOINT=
  fi
}

print_command() {
  printf '%q ' env "${SERVER_ENV[@]}" "${SERVER_CMD[@]}"; echo
}


need_vllm_python() {
  [[ -x "$VLLM_PY" ]] || die "no vLLM python at $VLLM_PY: run launch/setup.sh or set VLLM_PYTHON"
}

# check_flags [--cache]: the profile's command line against the installed vLLM's parser. With
# --cache (a server start), a command line this vLLM accepted before is not checked again (it costs
# a vLLM import, about 10 s on a small machine); FLAG_CHECK_CACHE names the folder.
check_flags() {
  need_vllm_python
  local cache=()
  [[ "${1:-}" == --cache ]] && cache=(--cache "${FLAG_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-locust/flag-checks}")
  "$VLLM_PY" "$LAUNCH_DIR/check_flags.py" "${cache[@]}" --profile "$PROFILE" -- "${SERVER_CMD[@]:3}" \
    || die "profile '$PROFILE' has flags the installed vLLM refuses (above)"
}

# check_flags_of PROFILE...: every profile's command line through one check_flags.py (one vLLM
# import, about 10 s on a small machine, for all of them).
check_flags_of() {
  need_vllm_python
  local name lines=()
  for name in "$@"; do
    build_command "$name"
    lines+=("::profile=$name" "${SERVER_CMD[@]:3}")
  done
  "$VLLM_PY" "$LAUNCH_DIR/check_flags.py" "${lines[@]}" || die "profiles with flags the installed vLLM refuses (above)"
}

# require_free_port: refuse a port something already listens on. Seen: a busy port answered
# /health for another server, which was then reported, measured and written down as ours.
require_free_port() {
  local probe=$SERVER_HOST
  [[ "$probe" == "0.0.0.0" || "$probe" == "::" ]] && probe=127.0.0.1
  if (exec 3<>"/dev/tcp/$probe/$SERVER_PORT") 2>/dev/null; then
    die "port $SERVER_PORT on $probe is in use by another process: stop it, or set PORT to a free port"
  fi
}

# start_server RUN_DIR: vLLM in its own session (process group), log in RUN_DIR/server.log.
start_server() {
  local dir=$1
  mkdir -p "$dir"
  SERVER_LOG="$dir/server.log"
  SERVER_STARTED_AT=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  SERVER_T0=$(date +%s.%N)
  # SERVER_CPUS (a taskset list, e.g. 0 or 0-5): keep vLLM off the load generator's cores. On a
  # small machine vLLM's CPU build starves every other process (a client's event loop woke up to
  # 500 ms late, so its chunks arrived "together"); pinned apart, both measure what they should.
  local pin=()
  [[ -n "${SERVER_CPUS:-}" ]] && pin=(taskset -c "$SERVER_CPUS")
  env "${SERVER_ENV[@]}" setsid "${pin[@]}" "${SERVER_CMD[@]}" >"$SERVER_LOG" 2>&1 < /dev/null &
  SERVER_PID=$!
  log "started vLLM ($PROFILE) pid $SERVER_PID on $SERVER_URL${SERVER_CPUS:+ (CPUs $SERVER_CPUS)}; log $SERVER_LOG"
}

# wait_healthy URL: poll /health; fail at once, with the log's tail, if the server died.
wait_healthy() {
  local url=$1 deadline=$(( $(date +%s) + HEALTH_TIMEOUT ))
  while (( $(date +%s) < deadline )); do
    if [[ -n "${SERVER_PID:-}" ]] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "launch: vLLM exited before it was healthy; last lines of $SERVER_LOG:" >&2
      tail -n 25 "$SERVER_LOG" >&2
      SERVER_PID=
      return 1
    fi
    curl -sf -o /dev/null --max-time 2 "$url/health" && {
      if [[ -n "${SERVER_PID:-}" ]] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
        continue  # not ours that answered: the next turn reports our server's exit
      fi
      SECONDS_TO_HEALTHY=$(awk -v a="${SERVER_T0:-0}" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
      return 0; }
    sleep 1
  done
  echo "launch: $url not healthy after ${HEALTH_TIMEOUT}s" >&2
  return 1
}

# smoke_test URL MODEL: one short chat completion must come back with a choice.
smoke_test() {
  local out
  # The key goes in through a file descriptor (printf is a builtin): never on curl's command line.
  out=$(curl -s --max-time 120 "$1/v1/chat/completions" -H 'Content-Type: application/json' \
    -H @<([[ -z "${OPENAI_API_KEY:-}" ]] || printf 'Authorization: Bearer %s\n' "$OPENAI_API_KEY") \
    -d "{\"model\": \"$2\", \"messages\": [{\"role\": \"user\", \"content\": \"hello\"}], \"max_tokens\": 4}") || true
  [[ "$out" == *'"choices"'* ]] || { echo "launch: smoke test failed at $1 (model $2): ${out:0:300}" >&2; return 1; }
}

# stop_server: TERM to the server's process group, then KILL after 30 s. Safe to call twice.
stop_server() {
  local pid=${SERVER_PID:-} i
  [[ -n "$pid" ]] || return 0
  SERVER_PID=
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for i in $(seq 1 30); do kill -0 -- "-$pid" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
}

# write_manifest RUN_DIR: what ran, with which versions; never the API key.
write_manifest() {
  "$VLLM_PY" "$LAUNCH_DIR/manifest.py" --out "$1/manifest.json" --profile "$PROFILE" \
    --url "$SERVER_URL" --model "$SERVED_MODEL" --started-at "$SERVER_STARTED_AT" \
    --seconds-to-healthy "${SECONDS_TO_HEALTHY:-}" --pid "${SERVER_PID:-}" --server-env "${SERVER_ENV[@]}" -- "${SERVER_CMD[@]}"
}
