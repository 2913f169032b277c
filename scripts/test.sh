#!/usr/bin/env bash
# Install everything (including the real vLLM CPU server) and run the default suite:
# unit tests plus integration tests against a real vLLM server, a real PostgreSQL server,
# real TextWorld games and real SmolLM2 weights. Extra arguments go to pytest (e.g. -m slow, -k capture).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-vllm
# The trace store's suite also runs on a real PostgreSQL server (the test fixture starts
# one as the postgres user). Debian's package where it is missing and apt can install it.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
    || echo "WARNING: could not install postgresql; the PostgreSQL store tests will fail" >&2
fi
# The report page (seed-agents report, the gateway's /dashboard) is tested in a real
# headless browser: Debian's chromium.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
    || echo "WARNING: could not install chromium; the browser tests will fail" >&2
fi
export SEED_AGENTS_REQUIRE_VLLM=1 SEED_AGENTS_REQUIRE_POSTGRES=1 SEED_AGENTS_REQUIRE_BROWSER=1
export SEED_AGENTS_VLLM_PYTHON="$PWD/.venv-vllm/bin/python"
# --durations: every run (CI's included) ends with its 25 slowest tests, so the suite's
# 20-minute budget is watched from the logs rather than rediscovered when it is over.
exec .venv/bin/python -m pytest -q -rs --durations=25 "$@"
