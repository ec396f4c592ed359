#!/usr/bin/env bash
# The test command: set up everything a fresh machine lacks (launch/setup.sh), then run pytest:
# unit tests against an in-test exact-timing server, integration tests against real vLLM (CPU
# build) and real Locust. Integration tests may not be skipped here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export REQUIRE_INTEGRATION=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
