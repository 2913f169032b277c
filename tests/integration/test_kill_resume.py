"""`kill -9` at each moment of a training iteration, then `--resume`: the run ends exactly
where an uninterrupted run ends (weights bit-identical on CPU, the same trajectories).

The moments are ``seed_agents.faults.CRASH_POINTS``: mid-rollout (after the first episode
of the second iteration), mid-update (before the optimizer step), mid-checkpoint (after
TRL wrote the folder, before it is marked complete) and mid-sync (before the new weights
are pushed). Each run is a real `seed-agents train` process on a tiny random model, with
the local backend at concurrency 1 (the local backend's batches otherwise depend on
timing; see the README's reproducibility note). 3 tasks, 1 per iteration, 4 iterations:
the resumed runs also cross an epoch boundary. A kill before the first checkpoint leaves a
run that ``--resume`` restarts from step 0.
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
from safetensors.torch import load_file  # noqa: E402

from seed_agents.faults import CRASH_ENV  # noqa: E402
from seed_agents.testing import faulty_train_config  # noqa: E402

# (crash point, the n-th time it is reached): in iteration 1 or later, and once in the
# first rollout, before any checkpoint exists (--resume then restarts at step 0)
KILLS = {"rollout": "rollout@3", "update": "update@2", "checkpoint": "checkpoint@2", "sync": "sync@2",
         "first-rollout": "rollout@1"}


def train(config: Path, out: Path, *extra: str, crash: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, CRASH_ENV: crash} if crash else {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    return subprocess.run([sys.executable, "-m", "seed_agents", "train", "--config", str(config),
                           "--out", str(out), *extra], capture_output=True, text=True, env=env, timeout=600)


def final_weights(out: Path) -> dict:
    (ckpt,) = [p for p in (out / "checkpoints").glob("checkpoint-4")]
    return load_file(str(ckpt / "model.safetensors"))


def episodes(out: Path) -> list[tuple]:
    """What was played and sampled, without the per-run ids and timings."""
    rows = []
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        t = json.loads(line)
        rows.append((t["metadata"]["iteration"], t["task_id"], t["sample_index"], t["reward"],
                     [(c["prompt_ids"], c["completion_ids"], c["logprobs"]) for c in t["calls"]]))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2]))


@pytest.fixture(scope="module")
def config(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("kill-resume")
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "data": {}}) + "\n" for i in range(3)))
    cfg = faulty_train_config(str(tasks), tiny_model_dir, iterations=4,
                              runner={"group_size": 2, "progress": False, "concurrency": 1})
    path = root / "train.yaml"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def uninterrupted(config) -> Path:
    out = config.parent / "uninterrupted"
    proc = train(config, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


# The default suite kills mid-update and mid-checkpoint (where a crash can corrupt what is on
# disk); the other three moments run in the slow tier (-m slow): ~25 s each.
DEFAULT_TIER = ("update", "checkpoint")


@pytest.mark.parametrize("moment", [m if m in DEFAULT_TIER else pytest.param(m, marks=pytest.mark.slow) for m in KILLS])
def test_kill_then_resume_equals_the_uninterrupted_run(config, uninterrupted, moment):
    out = config.parent / f"killed-{moment}"
    killed = train(config, out, crash=KILLS[moment])
    assert killed.returncode == -9, f"the crash point was not reached: {killed.stderr[-2000:]}"
    if moment == "checkpoint":  # the half-saved checkpoint is there, and is not what resume takes
        assert (out / "checkpoints" / "checkpoint-2").is_dir()
    # a plain re-run refuses to touch a run that exists; --resume continues it
    again = train(config, out)
    assert again.returncode != 0 and "--resume" in again.stderr and "Traceback" not in again.stderr
    resumed = train(config, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    want, got = final_weights(uninterrupted), final_weights(out)
    assert want.keys() == got.keys()
    assert all(bool((want[k] == got[k]).all()) for k in want), "weights differ from the uninterrupted run"
    assert episodes(out) == episodes(uninterrupted)
    metrics = [json.loads(x)["iteration"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [0, 1, 2, 3]
