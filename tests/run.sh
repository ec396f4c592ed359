#!/usr/bin/env bash
# The test command: set up everything a fresh machine lacks (launch/setup.sh), then run pytest:
# unit (no subprocess), e2e (real Locust and the mock server; the web UI in headless Chromium,
# launch/install_browser.sh), integration (real vLLM CPU).
# Integration tests may not be skipped here.
#
#   bash tests/run.sh          # every tier: what .ci/run runs, in two phases (tests/parallel.py)
#   bash tests/run.sh --fast   # the unit tier: no vLLM install, no browser, under 3 minutes here
#   bash tests/run.sh --latest # the contract tests against the newest releases of the packages whose
#                              # internals the suite touches, in a throwaway venv (not in .ci/run:
#                              # it needs the network, and says what a new release broke)
#
# Other arguments go to pytest (bash tests/run.sh --fast -k workloads); with arguments and no
# --fast, every tier's selection runs in one pytest process.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fast" ]]; then
  shift
  bash launch/setup.sh --no-server
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m unit "$@"
fi
if [[ "${1:-}" == "--latest" ]]; then
  shift
  touched=(locust gevent geventhttpclient openai httpx2)  # tests/unit/test_dependency_bounds.py's list
  venv=$(mktemp -d)/venv
  trap 'rm -rf "$(dirname "$venv")"' EXIT
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r requirements.txt
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade "${touched[@]}"
  "$venv/bin/pip" list --disable-pip-version-check 2>/dev/null | grep -iE "^($(IFS='|'; echo "${touched[*]}")) " \
    | sed 's/^/latest: /'
  PYTHONPATH=. exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m unit \
    tests/unit/test_locust_compat.py tests/unit/test_channel.py tests/unit/test_audit_and_buckets.py \
    tests/unit/test_stream_clients.py tests/unit/test_wire.py tests/unit/test_wave_sends.py \
    tests/unit/test_user.py tests/unit/test_csv_writer_shutdown.py tests/unit/test_wings.py "$@"
fi
bash launch/setup.sh
bash launch/install_browser.sh
bash launch/install_prometheus.sh
export REQUIRE_INTEGRATION=1
# The whole run: three pytest processes side by side, then the timing files alone
# (tests/parallel.py; about 35 minutes on a clean clone here, setup included: docs/benchmark.md). TEST_SHARDS=N: N side by side; TEST_SHARDS=1: one pytest process, in file order.
shards=${TEST_SHARDS:-3}
if [[ $# -eq 0 && "$shards" != 1 ]]; then
  exec .venv/bin/python tests/parallel.py --shards "$shards"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
