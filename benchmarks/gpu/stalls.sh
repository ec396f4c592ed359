#!/usr/bin/env bash
# Issue 41 on the lent host's CPU (no GPU used): the Rust client's overhead study reproduced with
# benchmarks/measurement_error.py. Exact-timing mock of 8 --reuse-port processes on cores 0-7 (each
# records its own truth), TTFT 50 ms, ITL 10 ms, 128-token replies; every client pinned to cores
# 8-11; the suite of this tree ("suite"), of an earlier tree ("before", from
# .gpu-stage/before.tar.gz) and vLLM's own client ("vllm", `vllm bench serve`), TRIALS runs each.
# Staging, here, from the project root:
#   bash ../shared/gpu/prepare.sh                 # vLLM 0.26 in .gpu-stage/a b c d
#   cp -r .gpu-stage/w .gpu-stage/e               # the suite's wheels (request_cost_ab.sh says how)
#   git archive --format=tar.gz -o .gpu-stage/before.tar.gz <earlier commit>
# On the device, back to back: three calls carrying .gpu-stage/a, then b, then c, each running
#   bash "$(ls .gpu-stage/*/install.sh | head -1)"
# then one carrying .gpu-stage/d, .gpu-stage/e and .gpu-stage/before.tar.gz:
#   bash .gpu-stage/d/install.sh && LEVEL=100 OUT=$OUT bash benchmarks/gpu/stalls.sh
# and more calls with LEVEL=1000 (4 processes) or LEVEL=2000 (8 processes, cores 8-15).
# Writes $OUT/host.txt and $OUT/streams-$LEVEL.md (the table), .log (each row as it came); KEEP=1
# keeps each suite run's raw files (gzipped) under $OUT/raw.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?OUT dir}
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_PYTHON=$(command -v python3)
[ -d /tmp/before ] || { mkdir -p /tmp/before && tar xzf .gpu-stage/before.tar.gz -C /tmp/before; }
[ -f models/tiny/config.json ] || python3 launch/make_tiny_model.py models/tiny > /dev/null
{ nproc; grep -m1 "model name" /proc/cpuinfo; python3 --version; } > "$out/host.txt"
level=${LEVEL:-100}
case $level in
  100) processes=1 cpus=8-11;;
  1000) processes=4 cpus=8-11;;
  *) processes=8 cpus=8-15;;
esac
python3 benchmarks/measurement_error.py --streams "$level" --processes "$processes" --clients "${CLIENTS:-before,suite,vllm}" \
  --ttft-ms 50 --itl-ms 10 --tokens 128 --duration "${DURATION:-15}" --trials "${TRIALS:-2}" \
  --server-processes 8 --server-cpus 0-7 --client-cpus "$cpus" --before-root /tmp/before \
  --out "$out/streams-$level.md" ${KEEP:+--keep "$out/raw"} 2> "$out/streams-$level.log"
echo "exit $? after $SECONDS s" >> "$out/host.txt"
if [ -n "${KEEP:-}" ]; then  # where each kept run's long gaps are
  for d in "$out"/raw/*/; do echo "== $d"; python3 benchmarks/itl_tail.py "$d"; done > "$out/itl-tail-$level.txt" 2>&1
fi
