"""What reproducible rollouts cost: the local backend's lockstep (seeded) mode vs its
arrival-time batching, on the same episodes, side by side in one process.

Both modes play the same tasks x group with the same agent graph, model and sampling
settings. ``seeded`` runs the ``EpisodeRunner`` with a seed: per-request seeds derived
from each episode's identity and lockstep batches (``seed_agents.backends.local``);
``arrival`` runs it without one: requests are batched as they arrive and sampled from
the global RNG, as before reproducible rollouts existed. Repeats alternate the order
(S,A / A,S, ...) after one untimed warm-up of each, so drift on a shared machine hits both
alike. The first two seeded repeats are also compared: identical token ids, logprobs
(max abs difference) and rewards?

    .venv/bin/python bench/determinism.py                         # SmolLM2, scripted env
    .venv/bin/python bench/determinism.py --env textworld         # SmolLM2, TextWorld games
    .venv/bin/python bench/determinism.py --model PATH --repeats 2 --results-dir runs/determinism-results

Prints the wall time of each mode, the ratio seeded/arrival against the goal (<= 1.2) and
whether two seeded runs were identical; writes every repeat to
``docs/results/determinism.json`` (``--results-dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results

GOAL = 1.2


def build(args: argparse.Namespace) -> tuple[Any, Any, Any, list[Any]]:
    """(graph, make_env, backend, tasks): one policy shared by both modes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.graphs.env_agent import build_env_agent
    from seed_agents.models import resolve_model
    from seed_agents.types import SamplingParams, Task

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=args.max_batch_size)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
    if args.env == "textworld":
        from seed_agents.tools.textworld import TextWorldSuite

        suite = TextWorldSuite(cache_dir=args.cache_dir, seed=args.seed)
        tasks = suite.tasks("train", args.tasks)
        suite.prepare(tasks)
        return suite.build_graph(llm, max_turns=args.max_turns), suite.make_env, backend, tasks
    from seed_agents.testing import ScriptedEnv

    tasks = [Task(task_id=f"fake-{i}") for i in range(args.tasks)]
    return build_env_agent(llm, max_turns=args.max_turns), (lambda task: ScriptedEnv()), backend, tasks


def play(args: argparse.Namespace, graph: Any, make_env: Any, tasks: list[Any], seed: int | None) -> tuple[float, list[Any]]:
    """(wall seconds, trajectories) of one run of every episode."""
    from seed_agents.runner import EpisodeRunner, RunnerConfig

    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.concurrency, progress=False),
                           make_env=make_env, seed=seed)
    t0 = time.perf_counter()
    trajs = asyncio.run(runner.run(tasks))
    return time.perf_counter() - t0, trajs


def compare(a: list[Any], b: list[Any]) -> dict[str, Any]:
    """Are two runs the same rollouts? Token ids exactly, logprobs to their max abs gap."""
    def key(t: Any) -> tuple[str, int]:
        return t.group_id, t.sample_index

    a, b = sorted(a, key=key), sorted(b, key=key)
    ids_equal = [[(c.prompt_ids, c.completion_ids) for c in t.calls] for t in a] == \
                [[(c.prompt_ids, c.completion_ids) for c in t.calls] for t in b]
    gap = 0.0
    if ids_equal:
        gap = max((abs(x - y) for ta, tb in zip(a, b) for ca, cb in zip(ta.calls, tb.calls)
                   for x, y in zip(ca.logprobs, cb.logprobs)), default=0.0)
    return {"token_ids_equal": ids_equal, "max_logprob_gap": gap if ids_equal else None,
            "rewards_equal": [t.reward for t in a] == [t.reward for t in b],
            "identical": ids_equal and gap == 0.0 and [t.reward for t in a] == [t.reward for t in b]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="Alias or local folder.")
    ap.add_argument("--env", choices=["textworld", "fake"], default="fake", help="fake: the scripted two-step env.")
    ap.add_argument("--cache-dir", default=None, help="TextWorld game cache (default: the user cache).")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="Episodes per task.")
    ap.add_argument("--concurrency", type=int, default=8, help="Episodes in flight (fewer than tasks x group: slots are reused).")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--repeats", type=int, default=3, help="Timed runs per mode (after one warm-up each).")
    ap.add_argument("--seed", type=int, default=0)
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats must be >= 2 (two seeded runs are compared)")
    started = bench_results.now()
    torch.manual_seed(args.seed)
    graph, make_env, _, tasks = build(args)

    play(args, graph, make_env, tasks, args.seed)  # warm-ups (allocations, thread pools)
    play(args, graph, make_env, tasks, None)
    times: dict[str, list[float]] = {"seeded": [], "arrival": []}
    seeded_runs: list[list[Any]] = []
    for r in range(args.repeats):
        for mode in (("seeded", "arrival") if r % 2 == 0 else ("arrival", "seeded")):
            wall, trajs = play(args, graph, make_env, tasks, args.seed if mode == "seeded" else None)
            times[mode].append(wall)
            if mode == "seeded":
                seeded_runs.append(trajs)
        print(f"repeat {r}: seeded {times['seeded'][-1]:.2f} s   arrival {times['arrival'][-1]:.2f} s", flush=True)

    same = compare(seeded_runs[0], seeded_runs[1])
    arrival_same = compare(*[play(args, graph, make_env, tasks, None)[1] for _ in range(2)])
    seeded_s, arrival_s = statistics.median(times["seeded"]), statistics.median(times["arrival"])
    ratio = seeded_s / arrival_s
    episodes = len(tasks) * args.group
    calls = sum(len(t.calls) for t in seeded_runs[0])
    print(f"\n{episodes} episodes ({calls} LLM calls), concurrency {args.concurrency}, batches <= {args.max_batch_size}, "
          f"median of {args.repeats}:")
    print(f"  seeded (lockstep) {seeded_s:.2f} s   arrival-time {arrival_s:.2f} s   "
          f"ratio {ratio:.3f} (goal <= {GOAL}): {'met' if ratio <= GOAL else 'MISSED'}")
    print(f"  two seeded runs identical: {same['identical']} (ids equal {same['token_ids_equal']}, "
          f"max logprob gap {same['max_logprob_gap']}, rewards equal {same['rewards_equal']})")
    print(f"  two arrival-time runs identical: {arrival_same['identical']} (ids equal {arrival_same['token_ids_equal']})")
    bench_results.write_result(
        "determinism", bench_results.config_of(args),
        {"seeded_s": times["seeded"], "arrival_s": times["arrival"], "seeded_median_s": seeded_s,
         "arrival_median_s": arrival_s, "ratio": ratio, "goal": GOAL, "met": ratio <= GOAL, "episodes": episodes,
         "llm_calls": calls, "seeded_runs_compared": same, "arrival_runs_compared": arrival_same},
        started_at=started, results_dir=args.results_dir,
        machine={"torch_threads": torch.get_num_threads(), "torch": torch.__version__})


if __name__ == "__main__":
    main()
