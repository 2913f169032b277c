"""Fakes for fast, deterministic tests of graphs built on seed-agents.

``FakeBackend`` answers with scripted text, tokenized with a real tokenizer so every id
and mask downstream is real; it satisfies the ``Backend`` protocol. Use it in unit tests
of your own graphs; use a real server in integration tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from seed_agents.types import Completion, SamplingParams

Reply = str | Callable[[list[int]], str]


class FakeBackend:
    """Replies from a script: a list (cycled) of strings or ``f(prompt_ids) -> str``.

    Each reply is tokenized and followed by the tokenizer's EOS token; logprobs are a
    fixed ``logprob`` per token. ``delay_s`` simulates latency; ``fail_on`` makes the
    n-th call (0-based) raise, to test failure handling.
    """

    def __init__(self, tokenizer: Any, replies: Sequence[Reply] | Reply, *, logprob: float = -0.5,
                 delay_s: float = 0.0, fail_on: set[int] | None = None, policy_version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.replies = [replies] if callable(replies) or isinstance(replies, str) else list(replies)
        self.logprob = logprob
        self.delay_s = delay_s
        self.fail_on = fail_on or set()
        self.policy_version = policy_version
        self.prompts: list[list[int]] = []

    def _complete(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        n = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        if n in self.fail_on:
            raise RuntimeError(f"FakeBackend: scripted failure on call {n}")
        reply = self.replies[n % len(self.replies)]
        text = reply(prompt_ids) if callable(reply) else reply
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        finish = "stop"
        if len(ids) >= params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        else:
            ids = ids + [self.tokenizer.eos_token_id]
        return Completion(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish,
                          policy_version=self.policy_version)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return self._complete(prompt_ids, params)

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self._complete(prompt_ids, params)

    async def ascore(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        return [self.logprob] * len(completion_ids)

    def close(self) -> None:
        pass


class ScriptedEnv:
    """A tiny deterministic text env: reach ``goal`` by issuing ``solution`` in order.

    Used to test the env agent graph and the runner without TextWorld. ``raise_on_step``
    and ``hang_s`` simulate a broken or hung environment.
    """

    def __init__(self, solution: Sequence[str] = ("open door", "go north"), *, distractors: Sequence[str] = ("look", "wait"),
                 raise_on_step: int | None = None, hang_s: float = 0.0) -> None:
        self.solution = list(solution)
        self.distractors = list(distractors)
        self.raise_on_step = raise_on_step
        self.hang_s = hang_s
        self.progress = 0
        self.steps = 0
        self.closed = False

    def _obs(self, text: str, reward: float = 0.0, invalid: bool = False) -> Any:
        from seed_agents.envs import EnvObservation

        done = self.progress == len(self.solution)
        actions = [] if done else sorted({self.solution[self.progress], *self.distractors})
        return EnvObservation(text=text, admissible_actions=actions, reward=reward, done=done, won=done,
                              invalid=invalid, info={"progress": self.progress})

    def reset(self) -> Any:
        self.progress = self.steps = 0
        return self._obs("You are in a room. Your task is to leave it.")

    def step(self, action: str) -> Any:
        import time

        self.steps += 1
        if self.hang_s:
            time.sleep(self.hang_s)
        if self.raise_on_step is not None and self.steps >= self.raise_on_step:
            raise RuntimeError("ScriptedEnv: scripted env failure")
        admissible = self._obs("").admissible_actions
        if action not in admissible:
            return self._obs("That is not a valid action.", invalid=True)
        if action == self.solution[self.progress]:
            self.progress += 1
            return self._obs(f"You {action}.", reward=1.0 if self.progress == len(self.solution) else 0.0)
        return self._obs(f"You {action}. Nothing happens.")

    def close(self) -> None:
        self.closed = True


class ParityEnv:
    """One step; any action is accepted; reward 1 when the reply has an even length.

    The smallest env with reward variance for a random policy: trainer tests use it to
    get non-zero group advantages without TextWorld.
    """

    def reset(self) -> Any:
        from seed_agents.envs import EnvObservation

        return EnvObservation(text="Say something.", admissible_actions=["yes", "no"])

    def step(self, action: str) -> Any:
        from seed_agents.envs import EnvObservation

        won = len(action) % 2 == 0
        return EnvObservation(text="ok", reward=float(won), done=True, won=won)

    def close(self) -> None:
        pass


#: An analyzer reply that parses: the JSON a competent analyzer would write.
SKILL_JSON = '{"episode_summary": "The agent answered.", "episode_skill": "Answer with a short word of even length."}'


def random_play(make_env: Callable[[], Any], seed: int, n_steps: int, barrier: Any = None) -> list[dict[str, Any]]:
    """Play one episode with a seeded random policy (one reply in five is invalid) and
    return every observation as a dict: the reference trace for env determinism tests
    (same seed -> same trace, alone or with other episodes running). ``barrier``, when
    given, is waited on after the env is made, so concurrent players reset together."""
    import random

    env = make_env()
    if barrier is not None:
        barrier.wait()
    rng = random.Random(seed)
    obs = env.reset()
    trace = [obs.model_dump()]
    for _ in range(n_steps):
        if obs.done:
            break
        obs = env.step("xyzzy" if rng.random() < 0.2 else rng.choice(sorted(obs.admissible_actions)))
        trace.append(obs.model_dump())
    env.close()
    return trace


def build_faulty_agent(chat_model: Any) -> Any:
    """A one-turn agent graph that fails the way infrastructure does, per task.

    ``task.data["fault"]`` picks what happens after the one LLM call: ``"env"`` raises
    out of the graph (a crashing tool), ``"hang"`` never returns (a hung tool; the
    runner's timeout ends it), anything else finishes with reward 1.0 when the reply has
    an even number of characters, else 0.0 (so groups have a spread). Use it with
    ``faulty_reward``, which raises for ``"reward"``, to test that faults never train.
    """
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        task: Any  # a seed_agents.types.Task
        reward: float
        steps: int

    async def act(state: State) -> State:
        task = state["task"]
        reply = await chat_model.ainvoke([("user", f"Describe task {task.task_id} in one word.")])
        fault = task.data.get("fault")
        if fault == "env":
            raise RuntimeError(f"tool crashed on {task.task_id}")
        if fault == "hang":
            await asyncio.sleep(3600)
        return {"reward": 1.0 if len(str(reply.content)) % 2 == 0 else 0.0, "steps": 1}

    graph = StateGraph(State)
    graph.add_node("act", act)
    graph.add_edge(START, "act")
    graph.add_edge("act", END)
    return graph.compile()


def faulty_reward(task: Any, state: dict[str, Any]) -> float:
    """The reward of ``build_faulty_agent``; raises for tasks whose fault is ``"reward"``."""
    if task.data.get("fault") == "reward":
        raise ConnectionError("reward service unreachable")
    return float(state.get("reward", 0.0))


def faulty_train_config(tasks_path: str, model_dir: str, **overrides: Any) -> dict[str, Any]:
    """A tiny ``TrainConfig`` (as a dict) that trains ``build_faulty_agent`` on the tasks in
    ``tasks_path`` with the local backend: seconds per iteration, no skills, no stage 1, the
    full weights (checkpoints hold the model, which tests compare bit for bit)."""
    return {
        "num_tasks": 3, "tasks_per_iteration": 1, "iterations": 1,
        "graph": {"build": "seed_agents.testing:build_faulty_agent", "tasks": str(tasks_path),
                  "reward": "seed_agents.testing:faulty_reward"},
        "backend": {"kind": "local", "model": model_dir},
        "sampling": {"max_tokens": 6, "temperature": 1.0},
        "runner": {"group_size": 2, "progress": False},
        "skills": {"source": "none"}, "stage1": {"run": "off"},
        "trainer": {"learning_rate": 1e-3, "kl_coef": 0.0, "lora_r": None},
        **overrides,
    }


Answer = tuple[int, str, bytes] | tuple[int, str, bytes, dict[str, str]]  # (HTTP status, content type, body[, headers])


class ScriptedServer:
    """A loopback HTTP server that answers each POST from a script, for tests of HTTP
    clients (the vLLM backend's retries and streams, a server that dies mid-run).

    ``answer(n, request)`` gets the 1-based number of the POST and its JSON body and
    returns ``(status, content_type, body)``, or None to die: the connection is dropped and
    the port closed, so later requests are refused as after a crash. ``GET`` (``/health``)
    answers 200 while alive. ``requests`` holds every POST body received.
    """

    def __init__(self, answer: Callable[[int, dict[str, Any]], Answer | None]) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        owner = self
        self.requests: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                owner.requests.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"))
                reply = answer(len(owner.requests), owner.requests[-1])
                if reply is None:
                    threading.Thread(target=owner.die, daemon=True).start()
                    self.connection.close()
                    return
                status, content_type, body, *extra = reply
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for name, value in (extra[0] if extra else {}).items():  # e.g. Retry-After
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @classmethod
    def replaying(cls, answers: Sequence[Answer]) -> ScriptedServer:
        """Answers in order; the last one repeats."""
        return cls(lambda n, request: answers[min(n, len(answers)) - 1])

    def die(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    close = die
