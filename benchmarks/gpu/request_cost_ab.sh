#!/usr/bin/env bash
# Issue 25 on the lent H200 machine's CPU (no GPU used): request_cost.py alternated between an
# earlier commit (BEFORE, unpacked from .gpu-stage/before.tar.gz) and this tree, in one device call.
# Staging, here, from the project root (the suite's wheels for the device's Python 3.12, about 20 MB):
#   P="--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none"
#   for p in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do P="$P --platform ${p}_x86_64"; done
#   .venv/bin/pip download -q $P --platform any -d .gpu-stage/w locust==2.47.0 gevent==26.9.0 \
#     geventhttpclient==2.6.1 openai==3.57.0 orjson==3.13.0 httpx2==2.16.2 requests==2.34.2 prometheus-client==0.26.0 py-spy
#   git archive --format=tar.gz -o .gpu-stage/before.tar.gz <commit>   (and start.tar.gz for "start" runs)
# On the device (carry .gpu-stage): LIMIT=470 OUT=$OUT bash benchmarks/gpu/request_cost_ab.sh
# Writes $OUT/host.txt: the machine, then one line per run ("before: ..." / "src: ..."); runs start
# until LIMIT seconds have passed; PROFILE=1 adds one py-spy profiled run of this tree. RUNS names the
# runs of a round (default "before src"; "floor": this tree's request_floor.py, bare gevent sockets;
# a ":pin" suffix, e.g. "before:pin src:pin": request_cost.py --pin, client and mock on other cores;
# "start": a second earlier tree from .gpu-stage/start.tar.gz, e.g. the commit before issue 25, 3b25770).
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
out=${OUT:?OUT dir}
if [ ! -f /tmp/site/locust/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu-stage/w/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site
[ -d /tmp/before ] || { mkdir -p /tmp/before && tar xzf .gpu-stage/before.tar.gz -C /tmp/before; }
if [ -f .gpu-stage/start.tar.gz ] && [ ! -d /tmp/start ]; then  # optional: a second earlier tree ("start" runs)
  mkdir -p /tmp/start && tar xzf .gpu-stage/start.tar.gz -C /tmp/start
fi
{ nproc; grep -m1 "model name" /proc/cpuinfo; python3 --version; uptime; } > "$out/host.txt"
while :; do
  for t in ${RUNS:-before src}; do
    [ $(( $(date +%s) - T0 )) -gt "${LIMIT:-470}" ] && break 2
    # this tree's request_cost.py measures every run; "before" runs the earlier tree's suite (--root)
    args="--users 16 --repeat 1"
    case $t in before*) args="$args --root /tmp/before";; start*) args="$args --root /tmp/start";;
      floor*) args="$args --client floor";; esac
    case $t in *:pin) args="$args --pin";; esac
    line=$(python3 benchmarks/request_cost.py $args 2>&1 | tail -1)
    line=${line#floor: }; echo "$t: ${line#pinned: }" | tee -a "$out/host.txt"  # labels the line once
  done
done
if [ -n "${PROFILE:-}" ]; then
  python3 benchmarks/request_cost.py --users 16 --repeat 1 --profile "$out/profile.txt" >> "$out/host.txt" 2>&1
fi
echo "done in $(( $(date +%s) - T0 )) s" >> "$out/host.txt"
