#!/usr/bin/env bash
# The test command: set up everything a fresh machine lacks (launch/setup.sh), then run pytest:
# unit (no subprocess), e2e (real Locust and the mock server; the web UI in headless Chromium,
# launch/install_browser.sh), integration (real vLLM CPU).
# Integration tests may not be skipped here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
bash launch/install_browser.sh
export REQUIRE_INTEGRATION=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
