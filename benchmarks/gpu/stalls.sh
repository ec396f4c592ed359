#!/usr/bin/env bash
# Issue 41 on the lent host's CPU (no GPU used): the Rust client's overhead study reproduced with
# benchmarks/measurement_error.py. The exact-timing mock of high event rates (vllm_locust/mock/exact.py:
# 8 event-loop processes on one port, spinning on cores 0-7, each recording its own truth), TTFT 50 ms,
# ITL 10 ms, 128-token replies; every client pinned: 100 and 1,000 streams to cores 8-11 (4 cores, the
# study's), 2,000 to cores 8-15; this tree's suite ("suite"), an earlier tree's ("before", from
# .gpu-stage/before.tar.gz) and vLLM's own client ("vllm", `vllm bench serve`), TRIALS runs each.
# Staging, here, from the project root: bash ../shared/gpu/prepare.sh, then the parts
# benchmarks/gpu/install_split.sh names; git archive --format=tar.gz -o .gpu-stage/before.tar.gz <commit>.
# On the device, back to back, calls carrying v0, v1, v2, c1, then c2 d e before.tar.gz, each running
#   bash benchmarks/gpu/install_split.sh && LEVEL=100 OUT=$OUT bash benchmarks/gpu/stalls.sh
# (the earlier calls only park), and more calls with LEVEL=1000 (4 processes) or LEVEL=2000 (8).
# Writes $OUT/host.txt, $OUT/streams-$LEVEL.md (the table), .log (each row as it came) and
# lag-series-$LEVEL.jsonl (the trust rule's data: benchmarks/trust_rule.py); KEEP=1 keeps each suite
# run's raw files (gzipped) under $OUT/raw.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:?OUT dir}
export PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 VLLM_PYTHON=$(command -v python3)
[ -f /tmp/site/vllm/__init__.py ] || { echo "vllm not installed yet (parking)"; exit 0; }
[ -d /tmp/before ] || { mkdir -p /tmp/before && tar xzf .gpu-stage/before.tar.gz -C /tmp/before; }
[ -f models/tiny/config.json ] || python3 launch/make_tiny_model.py models/tiny > /dev/null
{ nproc; grep -m1 "model name" /proc/cpuinfo; python3 --version; } > "$out/host.txt"
level=${LEVEL:-100}
case $level in
  100) processes=1 cpus=8-11;;
  1000) processes=4 cpus=8-11;;
  *) processes=8 cpus=8-15;;
esac
python3 benchmarks/measurement_error.py --streams "$level" --processes "$processes" --clients "${CLIENTS:-suite,vllm}" \
  --ttft-ms 50 --itl-ms 10 --tokens 128 --duration "${DURATION:-15}" --trials "${TRIALS:-3}" \
  --server-processes 8 --server-cpus 0-7 --server-spin --client-cpus "$cpus" --before-root /tmp/before \
  --lag-series "$out/lag-series-$level.jsonl" ${SPAWN:+--spawn-rate "$SPAWN"} \
  --out "$out/streams-$level${SPAWN:+-r$SPAWN}.md" ${KEEP:+--keep "$out/raw"} 2> "$out/streams-$level${SPAWN:+-r$SPAWN}.log"
echo "exit $? after $SECONDS s" >> "$out/host.txt"
if [ -n "${KEEP:-}" ]; then  # where each kept run's long gaps are
  for d in "$out"/raw/*/; do echo "== $d"; python3 benchmarks/itl_tail.py "$d"; done > "$out/itl-tail-$level.txt" 2>&1
fi
