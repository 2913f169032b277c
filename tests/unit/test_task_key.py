"""What a session's task key (``X-Task-Key``) does, and that the pages which mention it say so.

``train --from-store`` trains the sessions of one key as one GRPO group (``store-<key>``);
the continual loop replays each session ``group_size`` times as a group of its own, so two
sessions with one key make two groups, and there the key is the replayed task's ``task_id``
unless the session was given a ``task`` (the judge's use of the key, scoring the sessions of
one key against each other, is tested in test_gateway_feedback.py). Should the loop ever pool
the sessions of one key, the loop's test here fails and the pages must change with it.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("trl")

from seed_agents.app.continual import ContinualLoop  # noqa: E402
from seed_agents.app.continual_config import ContinualConfig  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from seed_agents.testing import FakeBackend  # noqa: E402
from seed_agents.transcript import Transcript  # noqa: E402
from seed_agents.types import LLMCall  # noqa: E402
from tests.clinic_service import create_app  # noqa: E402
from tests.unit.test_sandbox_reset import FakeServing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Which slots are free on 2025-03-04?"


def call(i: int) -> LLMCall:
    return LLMCall(call_id=f"call-{i}", messages=[{"role": "user", "content": QUESTION}], prompt_ids=[1, 2],
                   completion_ids=[3], logprobs=[-0.5])


def test_train_from_store_trains_the_sessions_of_one_key_as_one_group(tmp_path):
    store = TraceStore.open(f"sqlite:///{tmp_path / 'traces.db'}")
    for i, key in enumerate(["slots", "slots", None]):
        store.add_call(f"s{i}", call(i), task_key=key)
    groups = {sid: store.to_trajectory(sid).group_id for sid in ("s0", "s1", "s2")}
    assert groups == {"s0": "store-slots", "s1": "store-slots", "s2": "store-s2"}  # no key: a group of one
    store.close()


def test_the_loop_replays_each_session_as_a_group_of_its_own(tmp_path, tiny_model_dir, tokenizer):
    (tmp_path / "spec.json").write_text(json.dumps(create_app().openapi()))
    (tmp_path / "canary.jsonl").write_text(json.dumps({"task_id": "c", "data": {"question": QUESTION}}) + "\n")
    cfg = ContinualConfig.model_validate({
        "name": "clinic-agent", "store": f"sqlite:///{tmp_path / 'traces.db'}", "out": str(tmp_path / "run"),
        "backend": {"kind": "local", "model": tiny_model_dir}, "skills": {"source": "none"}, "trainer": {"lora_r": 4},
        "runner": {"concurrency": 4, "progress": False},
        "agent": {"tools": {"base_url": "http://127.0.0.1:9", "allow_hosts": ["127.0.0.1"]},
                  "spec": str(tmp_path / "spec.json"), "max_turns": 1, "reward": "tests.clinic_service:clinic_reward"},
        "group_size": 2, "canary": {"tasks": str(tmp_path / "canary.jsonl")},
    })
    loop = ContinualLoop(cfg, store=TraceStore.open(cfg.store), serving=FakeServing(FakeBackend(tokenizer, "11:00.")),
                         log=lambda _: None)
    transcript = {"transcript": Transcript(question=QUESTION).model_dump()}
    loop.store.create_session("s0", task_key="slots", metadata=transcript)
    loop.store.create_session("s1", task_key="slots", metadata=transcript)
    loop.store.create_session("s2", task_key="slots", metadata={
        **transcript, "task": {"task_id": "slots-0304", "data": {"question": QUESTION}}})
    try:
        trajs, unusable = asyncio.run(loop._replays(1, ["s0", "s1", "s2"], loop.store.promoted_version("clinic-agent")))
    finally:
        loop.close()
    assert not unusable and len(trajs) == 6
    groups = {(t.metadata["session_id"], t.group_id, t.task_id) for t in trajs}
    assert groups == {("s0", "c1-s0", "slots"), ("s1", "c1-s1", "slots"), ("s2", "c1-s2", "slots-0304")}
    assert sorted(t.group_id for t in trajs) == ["c1-s0", "c1-s0", "c1-s1", "c1-s1", "c1-s2", "c1-s2"]


STALE = re.compile(r"sessions with (one|the same) (task )?key (form|share)", re.IGNORECASE)


@pytest.mark.parametrize("page", ["README.md", "docs/deploy.md", "docs/own_api.md"])
def test_the_pages_say_what_the_loop_does_with_a_task_key(page):
    text = (ROOT / page).read_text()
    assert not STALE.search(text), f"{page} still says the sessions of one key form a group, with no word on the loop"
    assert "a group of its own" in " ".join(text.split()), f"{page} does not say the loop replays each session as its group"


def test_the_code_says_it_too():
    """The field and header descriptions users read in --help, the OpenAPI document and the API docs."""
    sources = ["seed_agents/types.py", "seed_agents/gateway/app.py", "seed_agents/gateway/openapi.py"]
    for source in sources:
        text = " ".join((ROOT / source).read_text().split())
        assert not STALE.search(text) and "group of its own" in text, source
