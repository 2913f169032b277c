"""Same seed, same rollouts: two runs of one config on the local backend sample the same
token ids, logprobs and rewards although their requests arrive in different orders.

The agent below makes two LLM calls per episode with a random pause before each, drawn
from a generator that differs between the runs, so the two runs' requests reach the
backend in different orders; at concurrency 4 with 6 episodes and batches of at most 3,
arrival-time batching would give different batch compositions (and, on this CPU, logits
that differ by ~1e-5: see ``seed_agents.backends.local``). The runs write trajectory
files; their token ids must be byte-identical, their logprobs equal to float tolerance.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from seed_agents.aio import run_sync
from seed_agents.backends.local import LocalBackend
from seed_agents.capture import Cohort, JsonlSink, capture, derive_seed
from seed_agents.chat_model import SeedChatModel
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.types import SamplingParams, Task

# Lockstep batches give the same bits; arrival-time batching (with the same per-request
# seeds) gave the same ids here but logprobs 1.9e-6 apart, so anything looser hides it.
LOGPROB_ATOL = 0.0


def build_jittery_agent(llm: SeedChatModel, jitter: random.Random) -> Any:
    """Two calls per episode, each after a random pause; reward: replies' total length parity."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        task: Any
        reward: float

    async def act(state: State) -> State:
        total = 0
        for turn in range(2):
            await asyncio.sleep(jitter.uniform(0.0, 0.03))
            reply = await llm.ainvoke([("user", f"Task {state['task'].task_id}, turn {turn}: say a word.")])
            total += len(str(reply.content))
        return {"reward": float(total % 2 == 0)}

    graph = StateGraph(State)
    graph.add_node("act", act)
    graph.add_edge(START, "act")
    graph.add_edge("act", END)
    return graph.compile()


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir: str) -> tuple[Any, Any]:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def play(model_and_tokenizer: tuple[Any, Any], out: Path, *, seed: int | None, jitter_seed: int) -> dict[str, Any]:
    """One run of the config into ``out``; returns the arrival order and batch sizes seen."""
    model, tok = model_and_tokenizer
    backend = LocalBackend(model, tokenizer=tok, max_batch_size=3)
    arrivals: list[str] = []
    batches: list[int] = []
    agenerate, generate_batch = backend.agenerate, backend._generate_batch

    async def spy_agenerate(prompt_ids: list[int], params: SamplingParams) -> Any:
        arrivals.append(tok.decode(prompt_ids[-20:]))
        return await agenerate(prompt_ids, params)

    def spy_batch(prompts: list[list[int]], *rest: Any) -> Any:
        batches.append(len(prompts))
        return generate_batch(prompts, *rest)

    backend.agenerate, backend._generate_batch = spy_agenerate, spy_batch  # type: ignore[method-assign]
    llm = SeedChatModel(backend=backend, tokenizer=tok, sampling=SamplingParams(max_tokens=6, temperature=1.0))
    runner = EpisodeRunner(build_jittery_agent(llm, random.Random(jitter_seed)),
                           RunnerConfig(group_size=3, concurrency=4, progress=False), seed=seed)
    tasks = [Task(task_id=f"t{i}") for i in range(2)]
    with JsonlSink(out) as sink, capture(run="determinism"):
        for t in run_sync(runner.run(tasks)):
            sink.write("trajectory", t)
    return {"arrivals": arrivals, "batches": batches}


def read_episodes(path: Path) -> tuple[bytes, list[list[float]], list[float]]:
    """(the token ids of every call, as bytes; their logprobs; the rewards), by episode."""
    trajs = sorted((json.loads(line) for line in path.read_text().splitlines()),
                   key=lambda t: (t["group_id"], t["sample_index"]))
    ids = "".join(json.dumps([t["group_id"], t["sample_index"], [[c["prompt_ids"], c["completion_ids"]]
                                                                for c in t["calls"]]]) + "\n" for t in trajs)
    return ids.encode(), [lp for t in trajs for c in t["calls"] for lp in [c["logprobs"]]], [t["reward"] for t in trajs]


def test_two_runs_with_one_seed_sample_the_same_whatever_the_arrival_order(model_and_tokenizer, tmp_path):
    a = play(model_and_tokenizer, tmp_path / "a.jsonl", seed=7, jitter_seed=1)
    b = play(model_and_tokenizer, tmp_path / "b.jsonl", seed=7, jitter_seed=2)
    # the runs really differed in timing, and requests really were batched
    assert a["arrivals"] != b["arrivals"]
    assert max(a["batches"]) > 1 and max(b["batches"]) > 1
    ids_a, logps_a, rewards_a = read_episodes(tmp_path / "a.jsonl")
    ids_b, logps_b, rewards_b = read_episodes(tmp_path / "b.jsonl")
    assert ids_a == ids_b, "token ids differ between two runs of one seed"
    assert len(logps_a) == len(logps_b) == 12
    worst = max(abs(x - y) for la, lb in zip(logps_a, logps_b) for x, y in zip(la, lb, strict=True))
    assert worst <= LOGPROB_ATOL, f"logprobs differ by {worst:.2e}"
    assert rewards_a == rewards_b
    # and the seed matters: another seed samples other tokens
    play(model_and_tokenizer, tmp_path / "c.jsonl", seed=8, jitter_seed=1)
    assert read_episodes(tmp_path / "c.jsonl")[0] != ids_a


def test_request_seeds_depend_on_the_episode_and_call_not_on_timing():
    """The pure part: an episode's n-th call gets derive_seed(episode seed, n, version);
    a nested scope (the hindsight node's) continues its episode's count."""
    with capture(seed=derive_seed(7, "g-t0", "t0", 0)) as episode:
        first = episode.request_seed(0)
        with capture(purpose="analyzer") as inner:
            second = inner.request_seed(0)
    assert first == derive_seed(derive_seed(7, "g-t0", "t0", 0), 0, 0)
    assert second == derive_seed(derive_seed(7, "g-t0", "t0", 0), 1, 0)
    assert len({first, second, derive_seed(7, "g-t0", "t0", 1), derive_seed(8, "g-t0", "t0", 0)}) == 4
    with capture() as unseeded:
        assert unseeded.request_seed(0) is None


def test_a_cohort_releases_a_wave_when_every_live_episode_waits():
    cohort = Cohort(total=3, concurrency=2)
    a = cohort.join()
    assert a.wave is None  # the other live episode has not asked yet
    b = cohort.join()
    assert a.wave == b.wave == 0
    cohort.done(a)
    cohort.done(b)
    c = cohort.join()
    cohort.finish("ep-a")  # one finished, the third starts: still two live
    assert c.wave is None
    cohort.finish("ep-b")  # now only one can still ask: its request runs alone
    assert c.wave == 1 and cohort.live == 1
