#!/usr/bin/env bash
# The Prometheus test's server: Debian's prometheus package (/usr/bin/prometheus). Only the tests
# need it: tests/e2e/test_prometheus.py starts it on loopback with a generated config.
set -euo pipefail
if command -v prometheus >/dev/null; then
  exit 0
fi
echo "setup: installing Debian's prometheus (the --prometheus-port test)"
SUDO=""
[[ "$(id -u)" -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null \
  || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
