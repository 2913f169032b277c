"""The continual demo's smoke run (``bench/continual_demo.py --smoke``) end to end, and the
invariants of its figures.

One real run: the demo library on loopback as production, the real CPU vLLM server with
runtime LoRA behind the capture gateway (a tiny random model taught the tasks), traffic
between cycles, three loop cycles of which the second is a forced regression (random LoRA
weights registered as the cycle's candidate). What must hold whatever the sampling did:

- production's own request log shows 0 mutating requests from anything but the users'
  traffic (the loop's replays and canaries never wrote to it), and the users' traffic did
  write (the count is live, not vacuous);
- the forced regression was rejected by the gate, with its evidence;
- every gate decision carries its evidence (verdict, paired canary statistics, reasons),
  and each promotion's lower bound is within the margin;
- every session a promoted version learned from has a reward -> promotion time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_vllm

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_smoke_demo_keeps_production_clean_and_rejects_the_forced_regression(tmp_path: Path) -> None:
    require_vllm()
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "continual_demo.py"), "--smoke",
                          "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False,
                         env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "FALLBACK" not in run.stdout  # the smoke serves through vLLM + the gateway
    doc = json.loads((tmp_path / "continual_demo.json").read_text())
    r = doc["results"]
    assert r["serving"] == "vllm+gateway"

    # production: nothing but the users wrote to it, and the users did
    requests = r["production_requests"]
    assert requests["mutating_from_training"] == 0
    assert requests["mutating_from_traffic"] > 0
    assert set(requests["by_origin"]) <= {"traffic", "members", "bench", "unmarked"}
    assert all(method in ("GET", "HEAD") for method in requests["by_origin"].get("unmarked", {}))

    # the gate: one decision per cycle, each with its evidence
    cycles, decisions = r["cycles"], r["decisions"]
    assert len(cycles) == 3 and all(c["state"] == "decided" for c in cycles)
    assert sorted(d["version"] for d in decisions) == sorted(c["candidate_version"] for c in cycles)
    for d in decisions:
        assert d["verdict"] in ("promote", "reject", "inconclusive") and d["reasons"] and d["summary"]
        assert d["n_tasks"] >= r["loop_config"]["gate"]["min_tasks"] and d["per_task"]
        assert d["candidate_mean"] is not None and d["promoted_mean"] is not None
        if d["action"] == "promote":
            assert d["ci_low"] >= -r["loop_config"]["gate"]["margin"] - 1e-9

    # the forced regression: rejected, against a baseline that does succeed
    forced = r["forced_regression"]
    assert forced is not None and forced["action"] == "reject" and forced["verdict"] == "reject"
    assert forced["promoted_mean"] > forced["candidate_mean"]
    assert forced["version"] in r["rejected"] and forced["version"] != r["final_promoted"]
    assert [c["forced_regression"] for c in cycles] == [False, True, False]

    # traffic was served by the versions the gate promoted, and promotions have a latency
    served = {int(v[1:]) for v in r["traffic_by_version"] if v != "mixed"}
    assert served <= {0, *r["promoted"]}
    latency = r["reward_to_promotion_s"]
    if r["promoted"]:
        assert latency["sessions"] and all(x["seconds"] > 0 for x in latency["sessions"])
        assert {x["version"] for x in latency["sessions"]} <= set(r["promoted"])


def test_atlas_smoke_runs_the_loop_on_the_atlas_service(tmp_path: Path) -> None:
    """``--family atlas --smoke --serving local``: an untaught tiny model on the atlas (it
    solves nothing, so every verdict is inconclusive: a canary nobody solves tells no version
    from another); what must hold is the plumbing: traffic from the atlas's training tasks
    reached the atlas service, each cycle decided with evidence, nothing wrote."""
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "continual_demo.py"), "--family", "atlas", "--smoke",
                          "--serving", "local", "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=1800, check=False, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    r = json.loads((tmp_path / "continual_demo_atlas.json").read_text())["results"]
    assert r["family"] == "atlas" and r["service_writes"] is False and r["loop_config"]["canary_tasks"] == 8
    assert [c["state"] for c in r["cycles"]] == ["decided"] * 3
    assert all(d["n_tasks"] == 8 and d["reasons"] for d in r["decisions"])
    requests = r["production_requests"]
    assert requests["by_origin"]["traffic"]["GET"] > 0 and requests["mutating_from_training"] == 0
    assert sum(x["played"] for x in r["traffic_rounds"]) == 6
    assert "forced regression: v2 rejected" in run.stdout and "goal (>= +0.10" in run.stdout
