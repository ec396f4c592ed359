#!/usr/bin/env bash
# Start vLLM with a profile, wait until healthy, smoke-test it, keep it up until Ctrl-C.
# Usage: bash launch/serve.sh PROFILE [--dry-run] [--check] [--sweep-settings] [--run-dir DIR]
#   --dry-run         print the exact command line and exit 0
#   --check           check every flag against the installed vLLM's parser and exit (several
#                     profiles at once: serve.sh --check A B C, one vLLM import for all)
#   --sweep-settings  print the profile's sweep.NAME=value lines (for launch/sweep.py) and exit
# Environment: MODEL, SERVED_MODEL_NAME, TP, HOST (default 127.0.0.1), PORT (default 8000), VLLM_PYTHON,
#   SPANS_ENDPOINT (vLLM's request spans to the suite's receiver: locust --server-spans PORT).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage() {
  cat <<EOF
Usage: bash launch/serve.sh PROFILE [--dry-run | --check | --sweep-settings] [--run-dir DIR]

Start vLLM with a profile, wait until it is healthy, smoke-test it, and keep it up until Ctrl-C.

  --dry-run         print the exact command line and exit
  --check           check every flag against the installed vLLM's parser and exit; several
                    profiles may follow (--check A B C checks them all with one vLLM import)
  --sweep-settings  print the profile's sweep.NAME=value lines (for launch/sweep.py) and exit
  --run-dir DIR     where server.log and manifest.json go (default runs/serve-PROFILE-TIME)
  -h, --help        this text

Profiles (profiles/NAME.conf):
$(list_profiles | sed 's/,/, /g' | fold -s -w 94 | sed 's/^/  /; s/ *$//')

Environment: MODEL (the model path or name), SERVED_MODEL_NAME, TP (tensor parallel size),
HOST (default 127.0.0.1), PORT (default 8000), SERVER_CPUS (a taskset CPU list for vLLM),
SPANS_ENDPOINT (vLLM exports its request spans there, OTLP/HTTP: locust --server-spans PORT),
HEALTH_TIMEOUT (seconds, default 600), VLLM_PYTHON (the vLLM interpreter), OPENAI_API_KEY.
EOF
}

profile= dry_run= check_only= run_dir= sweep_settings= more_profiles=()
while (( $# )); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --check) check_only=1 ;;
    --sweep-settings) sweep_settings=1 ;;
    --run-dir) run_dir=${2:?--run-dir needs a directory}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) if [[ -z "$profile" ]]; then profile=$1; else more_profiles+=("$1"); fi ;;
  esac
  shift
done
[[ -n "$profile" ]] || die "usage: serve.sh PROFILE [--dry-run] [--check] (--help for more); profiles: $(list_profiles)"
(( ${#more_profiles[@]} == 0 )) || [[ -n "$check_only" && -z "$dry_run$sweep_settings$run_dir" ]] \
  || die "one profile at a time (several only with --check)"
if [[ -n "$check_only" ]] && (( ${#more_profiles[@]} )); then
  check_flags_of "$profile" "${more_profiles[@]}"
  echo "launch: profiles $profile ${more_profiles[*]}: every flag accepted by the installed vLLM"; exit 0
fi

if [[ -n "$sweep_settings" ]]; then
  read_profile "$profile"
  for key in "${!P_SWEEP[@]}"; do printf '%s=%s\n' "$key" "${P_SWEEP[$key]}"; done
  exit 0
fi
[[ -n "$dry_run" ]] && DRY_RUN_PLACEHOLDER=1
build_command "$profile"
if [[ -n "$dry_run" ]]; then
  [[ "${SERVER_CMD[*]}" == *"<MODEL>"* ]] && echo "launch: no MODEL set: <MODEL> shows where it goes" >&2
  print_command; exit 0
fi
if [[ -n "$check_only" ]]; then
  check_flags
  echo "launch: profile '$profile': every flag accepted by the installed vLLM"; exit 0
fi
require_free_port
check_flags --cache
check_tracing

run_dir=${run_dir:-$ROOT/runs/serve-$profile-$(date +%Y%m%d-%H%M%S)}
trap stop_server EXIT
trap 'exit 130' INT TERM
start_server "$run_dir"
wait_healthy "$SERVER_URL" || exit 1
smoke_test "$SERVER_URL" "$SERVED_MODEL" || exit 1
write_manifest "$run_dir"
log "healthy after ${SECONDS_TO_HEALTHY}s; model $SERVED_MODEL at $SERVER_URL; manifest $run_dir/manifest.json; Ctrl-C stops it"
wait "$SERVER_PID" || true
