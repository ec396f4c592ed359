#!/usr/bin/env bash
# The knee of vLLM's CPU build found two ways, timed: launch/boundary.py (one Locust run per probe,
# the server started once) against --ramp-until-slo (one Locust run, the rate steered live), same
# profile, SLO, start, tolerance, warm-up and measured seconds. docs/results/knee-cpu.md.
# Usage: bash benchmarks/knee_cpu.sh [OUT]   (default runs/knee-cpu; needs launch/setup.sh's servers)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/knee-cpu}"
slo="${SLO:-ttft:1000,itl:100}"
start="${START:-2}" tolerance="${TOLERANCE:-0.1}" warmup="${WARMUP:-5}" window="${WINDOW:-15}"
load=(--max-tokens 32 --prompt-tokens 128)
mkdir -p "$out"
export SERVER_CPUS="${SERVER_CPUS:-0}"
client=(taskset -c "${CLIENT_CPUS:-1}")

began=$(date +%s.%N)
.venv/bin/python -m launch.boundary --profiles baseline-cpu --slo "$slo" --start "$start" --warmup "$warmup" \
  --duration "$window" --tolerance "$tolerance" --client-cpus "${CLIENT_CPUS:-1}" --out "$out/boundary" \
  -- "${load[@]}" 2>&1 | tee "$out/boundary.log"
offline=$(echo "$(date +%s.%N) - $began" | bc)

PORT="${PORT:-8011}" bash launch/serve.sh baseline-cpu --run-dir "$out/serve" > "$out/serve.log" 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:${PORT:-8011}/health" >/dev/null && break
  sleep 1
done
began=$(date +%s.%N)
"${client[@]}" .venv/bin/locust -f locustfile.py --headless --host "http://127.0.0.1:${PORT:-8011}" -u 256 -r 256 \
  --samples-dir "$out/ramp" --ramp-until-slo "$slo" --ramp-start "$start" --ramp-tolerance "$tolerance" \
  --ramp-window "$window" --steer-warmup "$warmup" "${load[@]}" 2>&1 | tee "$out/ramp.log" | grep "ramp:"
live=$(echo "$(date +%s.%N) - $began" | bc)
echo "wall time: boundary.py ${offline} s (server start included), --ramp-until-slo ${live} s (server already up)" \
  | tee "$out/wall.txt"
