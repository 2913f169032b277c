#!/usr/bin/env bash
# Install everything (including the real vLLM CPU server) and run the default suite:
# unit tests plus integration tests against a real vLLM server, real TextWorld games and
# real SmolLM2 weights. Extra arguments go to pytest (e.g. -m slow, -k capture).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-vllm
export SEED_AGENTS_REQUIRE_VLLM=1
export SEED_AGENTS_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
exec .venv/bin/python -m pytest -q -rs "$@"
