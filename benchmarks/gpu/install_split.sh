#!/usr/bin/env bash
# vLLM on the lent host from .gpu-stage in parts of under 64 MiB a call (the carry limit, with the
# working tree): v0 v1 v2 (the vLLM tar.xz of ../shared/gpu/prepare.sh, re-split: cat a/* b/* |
# split -n 3 -d -a 2 - part, one part a folder), c1 c2 (c/deps halved), d (its deps), e (the suite's
# wheels, a copy of w). Run it in every call; each parks what it carries in /root/stage and the call
# that completes the set installs into /tmp/site (a machine idle 30 s is given back with its stage).
set -u
S=/root/stage; mkdir -p $S; cp -a .gpu-stage/. $S/ 2>/dev/null
if [ -f /tmp/site/vllm/__init__.py ]; then echo "vllm already in /tmp/site"; exit 0; fi
for p in v0/part00 v1/part01 v2/part02 c1 c2 d/deps e; do
  [ -e $S/$p ] || { echo "parked: $(ls $S | tr '\n' ' '); still to carry: ${p%%/*}"; exit 0; }
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $S/c1/*.whl $S/c2/*.whl $S/d/deps/*.whl || exit 1
cat $S/v0/part00 $S/v1/part01 $S/v2/part02 | tar xJf - -C /tmp/site || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $S/e/*.whl || exit 1
PYTHONPATH=/tmp/site python3 -c "import vllm, locust; print('vllm', vllm.__version__, 'locust', locust.__version__)"
