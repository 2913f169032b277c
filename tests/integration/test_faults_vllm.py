"""A real vLLM server killed (SIGKILL) in the middle of a run.

The episode that first meets the dead server is a backend fault naming the URL; the
circuit breaker opens, so every later episode is recorded as skipped instead of retrying
the dead server; the fault budget then stops the run. The server is this module's own
(the session's shared one must stay up), on the tiny random model.

Slow tier: its own vLLM server costs ~70 s of the default suite's 20 minutes. The default
suite holds the same behaviour against a real HTTP server that dies mid-run
(``tests/unit/test_faults.py``: a dead server is one fault naming the URL, later episodes
are skipped, the run stops).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from seed_agents.backends.vllm import VLLMBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.runner import EpisodeRunner, FaultBudgetExceeded, RunnerConfig, check_fault_budget
from seed_agents.serve import VLLMServer
from seed_agents.types import FaultKind, SamplingParams, Task
from tests.conftest import _serve

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def doomed_server(tiny_model_dir, tmp_path_factory) -> Iterator[VLLMServer]:
    yield from _serve(tiny_model_dir, "doomed", tmp_path_factory.mktemp("vllm-doomed"))


def killing_agent(llm, server: VLLMServer):
    """One LLM call per episode; the episode of a task with ``data["kill"]`` then SIGKILLs
    the server, as an OOM kill or a crashed node would."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        task: object
        reward: float

    async def act(state):
        await llm.ainvoke([("user", "Say one word.")])
        if state["task"].data.get("kill"):
            server.process.kill()
            server.process.wait(timeout=30)
        return {"reward": 1.0}

    graph = StateGraph(State)
    graph.add_node("act", act)
    graph.add_edge(START, "act")
    graph.add_edge("act", END)
    return graph.compile()


def test_a_killed_vllm_server_is_a_fault_and_stops_the_run(doomed_server):
    backend = VLLMBackend(doomed_server.url, doomed_server.served_model_name, max_retries=2, backoff_s=0.2)
    llm = SeedChatModel(backend=backend, tokenizer=_tokenizer(doomed_server), sampling=SamplingParams(max_tokens=4))
    tasks = [Task(task_id=f"t{i}", data={"kill": i == 1}) for i in range(8)]
    runner = EpisodeRunner(killing_agent(llm, doomed_server), RunnerConfig(group_size=1, concurrency=1, progress=False))
    t0 = time.perf_counter()
    trajs = asyncio.run(runner.run(tasks))
    wall = time.perf_counter() - t0

    assert [t.fault for t in trajs[:2]] == [None, None]  # both answered; the second then killed the server
    assert trajs[2].fault == FaultKind.BACKEND and doomed_server.url in trajs[2].error
    assert [t.fault for t in trajs[3:]] == [FaultKind.SKIPPED] * 5
    assert wall < 60, f"the dead server was retried episode after episode ({wall:.0f} s)"
    with pytest.raises(FaultBudgetExceeded, match=doomed_server.url):
        check_fault_budget(trajs, 0.5)
    backend.close()


def _tokenizer(server: VLLMServer):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model)
