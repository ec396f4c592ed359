#!/usr/bin/env bash
# The main job: baseline vs optimized vLLM on the embedded CPU default (tiny dummy model, vLLM's
# CPU build), then the analysis and its report. Sets up whatever is missing first.
# Usage: bash launch/compare.sh [OUT_DIR] [-- LOCUST_ARGS...]
# Environment: PROFILES (baseline-cpu,optimized-cpu), CONCURRENCY (4,16), WARMUP (10), DURATION (30),
#              REPEATS (3), BASELINE (baseline-cpu), SERVER_CPUS / CLIENT_CPUS (taskset lists; default:
#              the last core for Locust, the others for vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/compare-$(date +%Y%m%d-%H%M%S)
if (( $# )) && [[ "$1" != -- ]]; then out=$1; shift; fi
bash launch/setup.sh
# On a small machine give vLLM's CPU build all cores but the last, and Locust the last: sharing
# them, the server starved the client (its event loop woke up to 500 ms late) and every chunk
# seemed to arrive at once. Set SERVER_CPUS/CLIENT_CPUS yourself, or to "" to share.
cores=$(nproc)
if (( cores >= 2 )) && [[ -z "${SERVER_CPUS+x}" && -z "${CLIENT_CPUS+x}" ]]; then
  export SERVER_CPUS="0-$(( cores - 2 ))" CLIENT_CPUS="$(( cores - 1 ))"
fi
bash launch/sweep.sh --profiles "${PROFILES:-baseline-cpu,optimized-cpu}" --concurrency "${CONCURRENCY:-4,16}" \
  --warmup "${WARMUP:-10}" --duration "${DURATION:-30}" --repeats "${REPEATS:-3}" --out "$out" "$@"
.venv/bin/python -m analysis "$out" --baseline "${BASELINE:-baseline-cpu}"
echo "report: $out/report.html (and report.md, summary.csv, comparison.csv, verdict.csv)"
