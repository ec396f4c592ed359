#!/usr/bin/env bash
# The browser test's browser: Debian's chromium and chromium-driver (/usr/bin/chromium,
# /usr/bin/chromedriver), driven by Selenium (requirements.txt). Only the tests need it.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
echo "setup: installing Debian's chromium and chromium-driver (the web UI's browser test)"
SUDO=""
[[ "$(id -u)" -ne 0 ]] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium chromium-driver >/dev/null \
  || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null; }
