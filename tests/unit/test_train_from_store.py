"""`seed-agents train --from-store`: SEED on sessions a deployed agent recorded.

The sessions are real: a tiny model plays episodes whose calls a ``StoreSink`` records
(the in-process path of the data plane; the gateway writes the same tables). Training
then claims each session exactly once, across iterations and across runs.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("trl")

from seed_agents.app.cli import main  # noqa: E402
from seed_agents.backends.local import LocalBackend  # noqa: E402
from seed_agents.chat_model import SeedChatModel  # noqa: E402
from seed_agents.runner import EpisodeRunner, RunnerConfig  # noqa: E402
from seed_agents.store import StoreSink, TraceStore  # noqa: E402
from seed_agents.testing import build_faulty_agent, faulty_reward  # noqa: E402
from seed_agents.types import SamplingParams, Task  # noqa: E402


@pytest.fixture()
def store_url(tmp_path, tiny_model_dir) -> str:
    """4 task keys x 2 rewarded sessions, plus one flagged session that must never train."""
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = TraceStore.open(url)
    backend = LocalBackend(tiny_model_dir)
    llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer, sampling=SamplingParams(max_tokens=6))
    runner = EpisodeRunner(build_faulty_agent(llm), RunnerConfig(group_size=2, progress=False),
                           reward_fn=faulty_reward, sink=StoreSink(store))
    asyncio.run(runner.run([Task(task_id=f"key{i}") for i in range(4)]))
    flagged = store.sessions(task_key="key0")[0].session_id
    store.flag_session(flagged, "secret")
    store.close()
    return url


def config(tmp_path, tiny_model_dir, **over) -> str:
    """Full weights, TRL's schedule and a skill for every session: what these tests were written
    under, before the defaults moved to what the learning runs chose."""
    cfg = {"tasks_per_iteration": 1, "num_tasks": 1, "iterations": 1,
           "backend": {"kind": "local", "model": tiny_model_dir},
           "runner": {"group_size": 2, "progress": False},
           "skills": {"source": "self", "max_tokens": 16, "failures": "write"},
           "trainer": {"learning_rate": 1e-3, "kl_coef": 0.0, "lora_r": None, "lr_schedule": "linear", "opd_coef": 0.01},
           **over}
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_train_from_store_claims_each_session_once(tmp_path, tiny_model_dir, store_url, capsys, monkeypatch):
    import seed_agents.graphs.hindsight as hindsight

    asked, build = [], hindsight.build_analyzer_messages
    monkeypatch.setattr(hindsight, "build_analyzer_messages",
                        lambda *a, **kw: asked.append(kw.get("answer_format")) or build(*a, **kw))
    cfg = config(tmp_path, tiny_model_dir, iterations=2,
                 skills={"source": "self", "max_tokens": 16, "answer_format": "described", "failures": "write"})
    assert main(["train", "--config", cfg, "--from-store", store_url, "--out", str(tmp_path / "a")]) == 0
    store = TraceStore.open(store_url)
    consumed = [s for s in store.sessions() if s.consumed_by is not None]
    # key0 has one clean session left (the other is flagged): not a group, never trained
    assert len(consumed) == 4 and {s.task_key for s in consumed} <= {"key1", "key2", "key3"}
    assert all(s.flagged_reason is None for s in consumed)
    assert len({s.consumed_by for s in consumed}) == 2  # one update id per iteration
    metrics = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1] and all(m["rows"] >= 2 for m in metrics)
    trained = [json.loads(x) for x in (tmp_path / "a" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["metadata"]["session_id"] for t in trained) == sorted(s.session_id for s in consumed)
    # the stored calls are trained token-exactly: the rows are the served ids
    for t in trained:
        assert t["calls"] == [c.model_dump(mode="json") for c in store.calls(t["metadata"]["session_id"])]
    # the policy wrote a hindsight skill about every trained session, kept with it
    assert all(store.to_trajectory(s.session_id).skill is not None for s in consumed)
    assert len(asked) == 4 and set(asked) == {"described"}  # asked with the configured reply example

    # a second run takes what is left (one task key), and then nothing is left to take
    assert main(["train", "--config", config(tmp_path, tiny_model_dir), "--from-store", store_url,
                 "--out", str(tmp_path / "b")]) == 0
    assert sum(s.consumed_by is not None for s in store.sessions()) == 6
    capsys.readouterr()
    assert main(["train", "--config", config(tmp_path, tiny_model_dir), "--from-store", store_url,
                 "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "0 task keys" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_a_killed_store_run_resumes_on_the_sessions_it_had_claimed(tmp_path, tiny_model_dir, store_url):
    import os
    import subprocess
    import sys

    from seed_agents.faults import CRASH_ENV

    argv = [sys.executable, "-m", "seed_agents", "train", "--config", config(tmp_path, tiny_model_dir, iterations=2),
            "--from-store", store_url, "--out", str(tmp_path / "run")]
    killed = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, CRASH_ENV: "update@2"}, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = TraceStore.open(store_url)
    claimed_before = {s.session_id: s.consumed_by for s in store.sessions() if s.consumed_by}
    assert len(claimed_before) == 4  # iteration 1 had claimed its sessions when it died

    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    resumed = subprocess.run([*argv, "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = {s.session_id: s.consumed_by for s in store.sessions() if s.consumed_by}
    assert after == claimed_before  # the same sessions, by the same updates: none skipped, none twice
    trained = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["metadata"]["session_id"] for t in trained) == sorted(after)
