"""`kill -9` a real `seed-agents continual` process at three moments, restart it, and check
from the store that nothing was trained twice, skipped, or served undecided.

The moments (``seed_agents.faults`` crash points, each a SIGKILL the process sends itself):
mid-replay (the 2nd shadow replay of the first cycle), mid-update (before the optimizer
step) and after the candidate is loaded but before the gate's decision. Each restart takes
the killed cycle up where the store says it is. Tiny random model, local backend, the demo
library on loopback as production (its request log proves no replay wrote to it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("trl")

from examples.library_service import DemoServer  # noqa: E402
from seed_agents.continual import VersionRegistry  # noqa: E402
from seed_agents.faults import CRASH_ENV  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from tests.unit.test_continual_loop import make_config, seed_sessions  # noqa: E402

NAME = "library-agent"


def continual(config: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash:
        env[CRASH_ENV] = crash
    return subprocess.run([sys.executable, "-m", "seed_agents", "continual", "--config", str(config), *extra],
                          capture_output=True, text=True, env=env, timeout=900)


def test_kill_9_at_three_moments_then_restart_trains_each_session_once(tmp_path, tiny_model_dir):
    with DemoServer() as prod:
        cfg = make_config(tmp_path, tiny_model_dir, prod.url)
        config = tmp_path / "continual.yaml"
        config.write_text(json.dumps(cfg.model_dump(mode="json")))
        store = TraceStore.open(cfg.store)
        sids = seed_sessions(store, 4)  # 2 cycles of 2
        registry = VersionRegistry(store)

        # 1. mid-replay: the cycle is claimed, nothing trained
        run = continual(config, "--cycles", "2", crash="rollout@2")
        assert run.returncode == -9, run.stderr[-2000:]
        (first,) = store.cycles(NAME)
        assert first.state == "claimed" and store.cycle_sessions(first.cycle_id) == sids[:2]
        assert [v.version for v in store.model_versions(NAME)] == [0]

        # 2. mid-update, on the resumed cycle: still claimed, still no candidate
        run = continual(config, "--cycles", "2", crash="update@1")
        assert run.returncode == -9, run.stderr[-2000:]
        (first,) = store.cycles(NAME)
        assert (first.state, first.attempts) == ("claimed", 2)
        assert store.cycle_sessions(first.cycle_id, "claimed") == sids[:2]
        assert [v.version for v in store.model_versions(NAME)] == [0]

        # 3. after the candidate is loaded, before the decision: it is stored but never served
        run = continual(config, "--cycles", "2", crash="continual-loaded@1")
        assert run.returncode == -9, run.stderr[-2000:]
        (first,) = store.cycles(NAME)
        assert (first.state, first.attempts, first.candidate_version) == ("loaded", 3, 1)
        assert [v.status for v in store.model_versions(NAME)] == ["promoted", "candidate"]
        assert registry.resolve(NAME).version == 0  # type: ignore[union-attr]
        assert registry.decisions(NAME)[-1].actor == "bootstrap"  # no decision on v1 yet

        # the restart finishes the killed cycle (canary, gate) and runs the next one
        run = continual(config, "--cycles", "2")
        assert run.returncode == 0, run.stderr[-2000:]
        lines = [x for x in run.stdout.splitlines() if x.startswith("cycle ")]  # TRL prints its own summary too
        assert len(lines) == 2 and lines[0].startswith(f"cycle {first.cycle_id} (resumed at loaded)")

        cycles = store.cycles(NAME)
        assert [(c.state, c.attempts, c.candidate_version) for c in cycles] == [("decided", 4, 1), ("decided", 1, 2)]
        claims = store.claim_states()
        assert sorted(claims) == sids  # none skipped, one claim each
        assert [claims[s][:2] for s in sids] == [(cycles[0].cycle_id, "trained")] * 2 + [(cycles[1].cycle_id, "trained")] * 2
        gate = [d for d in registry.decisions(NAME) if d.actor == "gate"]
        assert sorted(d.version for d in gate) == [1, 2]  # one decision per candidate, with its evidence
        assert all(d.evidence["gate"]["n_tasks"] == 2 for d in gate)
        assert [c.decision_id for c in cycles] == [d.decision_id for d in gate]
        assert registry.pending(NAME) == [] and sum(v.status == "promoted" for v in store.model_versions(NAME)) == 1
        adapters = sorted(p.name for p in (cfg.out / "adapters").iterdir())
        assert adapters == [f"cycle-{c.cycle_id}" for c in cycles]  # no half-written adapter left
        assert prod.log.mutating() == 0
        store.close()
