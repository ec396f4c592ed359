#!/usr/bin/env bash
# The test command: set up everything a fresh machine lacks (launch/setup.sh), then run pytest:
# unit (no subprocess), e2e (real Locust and the mock server; the web UI in headless Chromium,
# launch/install_browser.sh), integration (real vLLM CPU).
# Integration tests may not be skipped here.
#
#   bash tests/run.sh          # every tier: what .ci/run runs
#   bash tests/run.sh --fast   # the unit tier: no vLLM install, no browser, under 3 minutes here
#
# Other arguments go to pytest (bash tests/run.sh --fast -k workloads).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fast" ]]; then
  shift
  bash launch/setup.sh --no-server
  exec .venv/bin/python -m pytest -q -p no:cacheprovider -m unit "$@"
fi
bash launch/setup.sh
bash launch/install_browser.sh
export REQUIRE_INTEGRATION=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
