"""Capture overhead: the LangGraph env agent under ``capture()`` vs a plain loop.

Both sides play the same TextWorld games with the same backend, the same prompts and
greedy decoding, so they do identical model work; the difference is the framework
(LangGraph state machine, SeedChatModel, capture scopes, trajectory records). Runs are
interleaved (A, B, A, B, ...) so drift on a shared machine hits both sides alike.

    .venv/bin/python bench/capture_overhead.py                 # SmolLM2, local backend
    .venv/bin/python bench/capture_overhead.py --backend fake  # framework cost alone
    .venv/bin/python bench/capture_overhead.py --backend vllm --base-url URL

Prints episodes/s for each side, the ratio graph/plain (goal >= 0.9) and the framework's
cost per agent step, ``(graph wall - plain wall) / steps`` (goal <= 5 ms; wall time of the
whole run, episodes concurrent, medians of the interleaved repeats), and writes every
repeat to ``docs/results/capture_overhead_<backend>.json`` (``--results-dir``).

Beside them, in the same repeats, LangGraph's own floor: a bare graph of the agent's shape
(a model node, a branch, an env node, nothing in them) run for as many episodes, steps and
the same concurrency. No agent written as a LangGraph graph can cost less per step, so
``plain / (plain + floor)`` is the highest ratio this workload allows a LangGraph agent; with
the fake backend a plain step costs a few milliseconds, and that ceiling says how much of
the 0.9 goal is ours to reach.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.env_agent import SYSTEM_PROMPT, build_env_agent, parse_action, render_turn
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.tools.textworld import TextWorldSuite
from seed_agents.types import SamplingParams, Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402

# the paper's agent runs a 3B model for up to 30 turns; the framework's share shrinks with both
PAPER = {"model": "Qwen2.5-3B-Instruct", "max_turns": 30}
LABELS = {"model": "model", "max_turns": "max turns"}


async def plain_episode(backend, tokenizer, env, params: SamplingParams, max_turns: int) -> int:
    """The same agent written as a bare loop: render, generate, parse, step."""
    obs = await asyncio.to_thread(env.reset)  # as the graph does: never block the loop
    history: list[tuple[str, str]] = []
    steps = 0
    while not obs.done and steps < max_turns:
        turn = render_turn(obs.text, obs.admissible_actions)
        past = "".join(f"Observation: {o.strip()}\nYour command: {a}\n\n" for o, a in history[-5:])
        body = (f"Recent history:\n{past}" if past else "") + f"Current observation:\n{turn}"
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": body}],
            add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        comp = await backend.agenerate(ids, params)
        action = parse_action(tokenizer.decode(comp.token_ids, skip_special_tokens=True), obs.admissible_actions)
        history.append((obs.text, action))
        obs = await asyncio.to_thread(env.step, action)
        steps += 1
    return steps


async def run_plain(suite, tasks, backend, tokenizer, params, max_turns, concurrency) -> tuple[float, int]:
    sem = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> int:
        async with sem:
            env = await asyncio.to_thread(suite.make_env, task)
            try:
                return await plain_episode(backend, tokenizer, env, params, max_turns)
            finally:
                env.close()

    t0 = time.perf_counter()
    steps = await asyncio.gather(*(one(t) for t in tasks))
    return time.perf_counter() - t0, sum(steps)


async def run_graph(suite, tasks, llm, max_turns, concurrency) -> tuple[float, int]:
    graph = build_env_agent(llm, max_turns=max_turns)
    runner = EpisodeRunner(graph, RunnerConfig(concurrency=concurrency, progress=False), make_env=suite.make_env)
    t0 = time.perf_counter()
    with capture():
        trajs = await runner.run(tasks)
    errors = [t.error for t in trajs if t.error]
    if errors:
        raise RuntimeError(f"graph episodes failed: {errors[0]}")
    return time.perf_counter() - t0, sum(t.steps for t in trajs)


async def run_bare_graph(steps_per_episode: list[int], concurrency: int) -> tuple[float, int]:
    """LangGraph alone: the env agent's shape (model node -> branch -> env node -> model
    node ...) with nodes that only count, one invocation per episode taking that episode's
    number of steps, at the benchmark's concurrency. Returns (wall time, steps taken)."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        steps: int
        limit: int

    async def act(state: State) -> dict[str, int]:
        return {"steps": state["steps"] + 1}

    async def env(state: State) -> dict[str, int]:
        return {}

    graph = StateGraph(State)
    graph.add_node("act", act)
    graph.add_node("env", env)
    graph.add_edge(START, "act")
    graph.add_conditional_edges("act", lambda s: END if s["steps"] >= s["limit"] else "env", ["env", END])
    graph.add_edge("env", "act")
    app = graph.compile()
    sem = asyncio.Semaphore(concurrency)

    async def one(limit: int) -> int:
        async with sem:
            return (await app.ainvoke({"steps": 0, "limit": limit}))["steps"]

    t0 = time.perf_counter()
    steps = await asyncio.gather(*(one(n) for n in steps_per_episode))
    return time.perf_counter() - t0, sum(steps)


async def chat_model_cost_ms(llm, backend, tokenizer, env, params: SamplingParams, calls: int = 200) -> tuple[float, float]:
    """(ms per ``SeedChatModel.ainvoke``, ms per the same call bare: render, backend,
    decode), on the first turn's prompt of one game, calls one after another: what
    LangChain's chat-model machinery and our capture add to a call."""
    from langchain_core.messages import HumanMessage, SystemMessage

    from seed_agents.chat_model import render_chat

    obs = env.reset()
    messages = [SystemMessage(SYSTEM_PROMPT),
                HumanMessage(f"Current observation:\n{render_turn(obs.text, obs.admissible_actions)}")]

    async def bare() -> None:
        ids, _ = render_chat(tokenizer, messages)
        comp = await backend.agenerate(ids, params)
        tokenizer.decode(comp.token_ids, skip_special_tokens=True)

    async def chat() -> None:
        await llm.ainvoke(messages)

    out = []
    for call in (chat, bare):
        for _ in range(20):  # warm
            await call()
        t0 = time.perf_counter()
        for _ in range(calls):
            await call()
        out.append(1000 * (time.perf_counter() - t0) / calls)
    return out[0], out[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["local", "vllm", "fake"], default="local")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    started = bench_results.now()

    from transformers import AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.models import resolve_model

    suite = TextWorldSuite()
    tasks = suite.tasks("eval_seen", args.episodes)
    suite.prepare(tasks)
    if args.backend == "local":
        backend = LocalBackend(args.model, max_batch_size=args.concurrency)
        tokenizer = backend.tokenizer
    else:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
        if args.backend == "vllm":
            from seed_agents.backends.vllm import VLLMBackend

            backend = VLLMBackend(args.base_url, args.model)
        else:
            from seed_agents.testing import FakeBackend

            backend = FakeBackend(tokenizer, lambda ids: "look")
    params = SamplingParams(max_tokens=16, temperature=0.0)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=params)

    # one untimed round of each: first game loads, tokenizer caches, thread pools
    asyncio.run(run_plain(suite, tasks, backend, tokenizer, params, args.max_turns, args.concurrency))
    asyncio.run(run_graph(suite, tasks, llm, args.max_turns, args.concurrency))
    plain_eps, graph_eps, repeats = [], [], []
    asyncio.run(run_bare_graph([args.max_turns] * len(tasks), args.concurrency))  # untimed, as the others
    for r in range(args.repeats):
        wall_p, steps_p = asyncio.run(run_plain(suite, tasks, backend, tokenizer, params, args.max_turns, args.concurrency))
        wall_g, steps_g = asyncio.run(run_graph(suite, tasks, llm, args.max_turns, args.concurrency))
        # as many steps as the graph side took, spread over the same number of episodes
        per_episode = [steps_g // len(tasks) + (i < steps_g % len(tasks)) for i in range(len(tasks))]
        wall_b, steps_b = asyncio.run(run_bare_graph(per_episode, args.concurrency))
        if steps_b != steps_g:  # the floor must be timed on as many steps as the graph took
            raise RuntimeError(f"the bare graph took {steps_b} steps, the agent {steps_g}")
        if steps_p != steps_g:
            print(f"warning: repeat {r}: plain took {steps_p} steps, graph {steps_g} (batching changed greedy ties?)")
        plain_eps.append(len(tasks) / wall_p)
        graph_eps.append(len(tasks) / wall_g)
        repeats.append({"plain_s": wall_p, "plain_steps": steps_p, "graph_s": wall_g, "graph_steps": steps_g,
                        "plain_eps": plain_eps[-1], "graph_eps": graph_eps[-1], "bare_graph_s": wall_b})
        print(f"repeat {r}: plain {plain_eps[-1]:.3f} ep/s ({steps_p} steps)  graph+capture {graph_eps[-1]:.3f} ep/s "
              f"({steps_g} steps)  bare LangGraph {1000 * wall_b / max(steps_g, 1):.2f} ms/step")
    chat_ms, bare_call_ms = None, None
    if args.backend == "fake":  # with a real model the call's own time would drown what is measured
        env = suite.make_env(tasks[0])
        try:
            with capture():
                chat_ms, bare_call_ms = asyncio.run(chat_model_cost_ms(llm, backend, tokenizer, env, params))
        finally:
            env.close()
    p, g = statistics.median(plain_eps), statistics.median(graph_eps)
    steps = statistics.median(r["graph_steps"] for r in repeats)
    plain_s = statistics.median(r["plain_s"] for r in repeats)
    per_step_ms = 1000 * (statistics.median(r["graph_s"] for r in repeats) - plain_s) / steps
    floor_ms = 1000 * statistics.median(r["bare_graph_s"] for r in repeats) / steps
    ceiling = plain_s / (plain_s + floor_ms * steps / 1000)
    print(f"\nbackend={args.backend} episodes={len(tasks)} max_turns={args.max_turns} concurrency={args.concurrency}")
    print(f"plain loop      : {p:.3f} episodes/s (median of {args.repeats})")
    print(f"graph + capture : {g:.3f} episodes/s")
    print(f"ratio graph/plain: {g / p:.3f}   (goal >= 0.9)")
    print(f"framework cost per agent step: {per_step_ms:.2f} ms   (goal <= 5)")
    print(f"LangGraph alone (a bare graph of the agent's shape): {floor_ms:.2f} ms per step, so no LangGraph agent "
          f"exceeds a ratio of {ceiling:.3f} on this workload; ours beyond it: {per_step_ms - floor_ms:.2f} ms per step")
    if chat_ms is not None and bare_call_ms is not None:
        print(f"a chat model call: {chat_ms:.2f} ms through SeedChatModel under capture, {bare_call_ms:.2f} ms bare "
              f"(render + backend + decode): {chat_ms - bare_call_ms:.2f} ms of the step is the chat model's")
    model = "none (scripted fake backend)" if args.backend == "fake" else Path(str(args.model)).name
    bench_results.write_result(
        f"capture_overhead_{args.backend}", {**bench_results.config_of(args), "model": model, "episodes": len(tasks)},
        {"repeats": repeats, "plain_eps_median": p, "graph_eps_median": g, "ratio": g / p, "goal": 0.9,
         "framework_ms_per_step": per_step_ms, "goal_ms_per_step": 5.0, "langgraph_floor_ms_per_step": floor_ms,
         "langgraph_ratio_ceiling": ceiling, "chat_model_ms_per_call": chat_ms, "bare_call_ms": bare_call_ms,
         "load_avg_1m_end": os.getloadavg()[0]},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
