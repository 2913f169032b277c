"""Same seed, same training run: two `seed-agents train` runs of one config (local
backend, concurrency 4 > 1) write the same metrics.jsonl (to float tolerance, timings
aside) and bit-identical final weights.

The agent makes two LLM calls per episode, each after a random pause drawn from the
process's own entropy, so the two runs' requests reach the backend in different orders;
only the seeded, lockstep rollouts (``seed_agents.runner``, ``LocalBackend``) make the
runs agree. 3 tasks, 2 per iteration, 4 episodes each at concurrency 4 (so episodes also
wait for free slots), batches of at most 3, 2 updates of a tiny random model.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("trl")
from safetensors.torch import load_file

from seed_agents.testing import faulty_train_config

ITERATIONS = 2
ROOT = Path(__file__).resolve().parents[2]
METRIC_RTOL = 1e-6


def build_jittery_agent(chat_model: Any) -> Any:
    """Two calls per episode after random pauses (from OS entropy: they differ per run);
    reward 1.0 when the replies' total length is even (groups get a spread)."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    jitter = random.Random()

    class State(TypedDict, total=False):
        task: Any
        reward: float
        steps: int

    async def act(state: State) -> State:
        total = 0
        for turn in range(2):
            await asyncio.sleep(jitter.uniform(0.0, 0.05))
            reply = await chat_model.ainvoke([("user", f"Task {state['task'].task_id}, turn {turn}: one word.")])
            total += len(str(reply.content))
        return {"reward": float(total % 2 == 0), "steps": 2}

    graph = StateGraph(State)
    graph.add_node("act", act)
    graph.add_edge(START, "act")
    graph.add_edge("act", END)
    return graph.compile()


def train(config: Path, out: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "seed_agents", "train", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)  # the agent is imported from tests/
    assert proc.returncode == 0, proc.stderr[-3000:]


def metrics(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without wall-clock timings and memory peaks (they differ in every run)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not (k.startswith(("time/", "mem/")) or k == "step_time")} for r in rows]


def calls(out: Path) -> list[tuple]:
    rows = []
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        rows.append((t["metadata"]["iteration"], t["group_id"], t["sample_index"], t["reward"],
                     [(c["prompt_ids"], c["completion_ids"]) for c in t["calls"]]))
    return sorted(rows, key=lambda r: r[:3])


@pytest.fixture(scope="module")
def config(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("train-reproducible")
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "data": {}}) + "\n" for i in range(3)))
    cfg = faulty_train_config(str(tasks), tiny_model_dir, iterations=ITERATIONS, tasks_per_iteration=2, seed=5,
                              runner={"group_size": 4, "progress": False, "concurrency": 4})
    cfg["graph"]["build"] = "tests.integration.test_train_reproducible:build_jittery_agent"
    cfg["backend"]["max_batch_size"] = 3
    path = root / "train.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_two_train_runs_with_one_seed_end_identical(config):
    a, b = config.parent / "a", config.parent / "b"
    train(config, a)
    train(config, b)
    assert calls(a) == calls(b), "the two runs sampled different rollouts"
    ma, mb = metrics(a), metrics(b)
    assert [r["iteration"] for r in ma] == list(range(ITERATIONS))
    assert [sorted(r) for r in ma] == [sorted(r) for r in mb]
    for ra, rb in zip(ma, mb):
        for k, va in ra.items():
            vb = rb[k]
            if isinstance(va, float) and isinstance(vb, float):
                assert math.isclose(va, vb, rel_tol=METRIC_RTOL, abs_tol=1e-9), f"iteration {ra['iteration']} {k}: {va} vs {vb}"
            else:
                assert va == vb, f"iteration {ra['iteration']} {k}: {va} vs {vb}"
    wa = load_file(str(a / "checkpoints" / f"checkpoint-{ITERATIONS}" / "model.safetensors"))
    wb = load_file(str(b / "checkpoints" / f"checkpoint-{ITERATIONS}" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert all(bool((wa[k] == wb[k]).all()) for k in wa), "final weights differ"
