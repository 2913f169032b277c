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
    for r in range(args.repeats):
        wall_p, steps_p = asyncio.run(run_plain(suite, tasks, backend, tokenizer, params, args.max_turns, args.concurrency))
        wall_g, steps_g = asyncio.run(run_graph(suite, tasks, llm, args.max_turns, args.concurrency))
        if steps_p != steps_g:
            print(f"warning: repeat {r}: plain took {steps_p} steps, graph {steps_g} (batching changed greedy ties?)")
        plain_eps.append(len(tasks) / wall_p)
        graph_eps.append(len(tasks) / wall_g)
        repeats.append({"plain_s": wall_p, "plain_steps": steps_p, "graph_s": wall_g, "graph_steps": steps_g,
                        "plain_eps": plain_eps[-1], "graph_eps": graph_eps[-1]})
        print(f"repeat {r}: plain {plain_eps[-1]:.3f} ep/s ({steps_p} steps)  graph+capture {graph_eps[-1]:.3f} ep/s ({steps_g} steps)")
    p, g = statistics.median(plain_eps), statistics.median(graph_eps)
    per_step_ms = 1000 * (statistics.median(r["graph_s"] for r in repeats)
                          - statistics.median(r["plain_s"] for r in repeats)) / statistics.median(r["graph_steps"] for r in repeats)
    print(f"\nbackend={args.backend} episodes={len(tasks)} max_turns={args.max_turns} concurrency={args.concurrency}")
    print(f"plain loop      : {p:.3f} episodes/s (median of {args.repeats})")
    print(f"graph + capture : {g:.3f} episodes/s")
    print(f"ratio graph/plain: {g / p:.3f}   (goal >= 0.9)")
    print(f"framework cost per agent step: {per_step_ms:.2f} ms   (goal <= 5)")
    model = "none (scripted fake backend)" if args.backend == "fake" else Path(str(args.model)).name
    bench_results.write_result(
        f"capture_overhead_{args.backend}", {**bench_results.config_of(args), "model": model, "episodes": len(tasks)},
        {"repeats": repeats, "plain_eps_median": p, "graph_eps_median": g, "ratio": g / p, "goal": 0.9,
         "framework_ms_per_step": per_step_ms, "goal_ms_per_step": 5.0, "load_avg_1m_end": os.getloadavg()[0]},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
