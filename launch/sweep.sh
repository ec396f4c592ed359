#!/usr/bin/env bash
# The experiment matrix (launch/sweep.py does the work; this is its shell entry point).
# Usage: bash launch/sweep.sh --profiles baseline-cpu,optimized-cpu --concurrency 32,64,128 \
#          --warmup 30 --duration 120 --repeats 3 --out runs/NAME [--workers N] [--continue-on-error] [-- LOCUST_ARGS...]
#        bash launch/sweep.sh --external-url http://127.0.0.1:8000 --label NAME [same options]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SUITE_PY=${SUITE_PYTHON:-$ROOT/.venv/bin/python}
[[ -x "$SUITE_PY" ]] || { echo "sweep: no load-generator python at $SUITE_PY: run launch/setup.sh" >&2; exit 2; }
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$SUITE_PY" -m launch.sweep "$@"
