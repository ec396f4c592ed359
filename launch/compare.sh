#!/usr/bin/env bash
# The main job: baseline vs optimized vLLM on the embedded CPU default (tiny dummy model, vLLM's
# CPU build), then the analysis and its report. Sets up whatever is missing first.
# Usage: bash launch/compare.sh [OUT_DIR] [-- LOCUST_ARGS...]
# Environment: PROFILES (baseline-cpu,optimized-cpu), CONCURRENCY (4,16), WARMUP (10), DURATION (30),
#              REPEATS (3), BASELINE (baseline-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/compare-$(date +%Y%m%d-%H%M%S)
if (( $# )) && [[ "$1" != -- ]]; then out=$1; shift; fi
bash launch/setup.sh
bash launch/sweep.sh --profiles "${PROFILES:-baseline-cpu,optimized-cpu}" --concurrency "${CONCURRENCY:-4,16}" \
  --warmup "${WARMUP:-10}" --duration "${DURATION:-30}" --repeats "${REPEATS:-3}" --out "$out" "$@"
.venv/bin/python -m analysis "$out" --baseline "${BASELINE:-baseline-cpu}"
echo "report: $out/report.html (and report.md, summary.csv, comparison.csv, verdict.csv)"
