"""Rollouts side by side: the same seeded workload on each rollout path, in one run.

Workloads (fixed tasks, group 8, sampled at T 0.7):
- ``textworld``: the env agent on TextWorld training games (chat history, 3 turns, 16 tokens a turn);
- ``atlas``: the hand-written tool agent over the atlas tools (``examples/knowledge_base.py``;
  first turn a forced call under the tools' grammar, 4 turns, 48 tokens a turn).

Paths:
- ``local``: ``LocalBackend`` in float32, a batch's common prompt prefix computed once and an
  episode's next turn reading its last prompt's keys and values (the default);
- ``local-noturn``: the same without the turn cache (``turn_cache_bytes=0``: the path before it);
- ``local-noshare``: neither (``share_prefix=False``, no turn cache): every prompt run whole
  (the path before the shared prefix), for the side-by-side comparison;
- ``local-auto``: ``LocalBackend`` in the precision ``auto`` picks on this CPU
  (``seed_agents.precision``); skipped when that is float32 too (it would be the same path);
- ``vllm``: the vLLM CPU server (``seed_agents.serve.VLLMServer``, float32), started here.

Per path and workload: episodes/s, generated tokens/s and prompt tokens/s (wall time of the
whole workload, episodes concurrent), and generated tokens/s as a fraction of the decode
ceiling at batch 8 from ``docs/results/roofline.json`` (run ``bench/roofline.py`` first).
Paths run interleaved (A, B, C, A, B, C ...) after one untimed warm-up each, so drift on a
shared machine hits all alike.

    .venv/bin/python bench/rollout_throughput.py
    .venv/bin/python bench/rollout_throughput.py --paths local vllm --workloads atlas --repeats 1

Writes ``docs/results/rollout_throughput.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402

WORKLOADS = {
    "textworld": {"max_turns": 3, "max_tokens": 16},
    "atlas": {"max_turns": 4, "max_tokens": 48},
}


def make_workload(name: str, llm: Any, args: argparse.Namespace) -> tuple[Any, list[Any], Any, Any]:
    """(graph, tasks, make_env, make_input) of one workload."""
    from seed_agents.envs import load_env_suite

    if name == "textworld":
        suite = load_env_suite("textworld", seed=args.seed)
        tasks = suite.tasks("train", args.tasks)
        suite.prepare(tasks)
        graph = suite.build_graph(llm, max_turns=WORKLOADS[name]["max_turns"], history="chat")
        return graph, tasks, suite.make_env, lambda task: {"task": task}
    from examples.knowledge_base import build_agent, make_tasks

    return build_agent(llm), make_tasks("train", args.tasks), None, lambda task: {"task": task}


async def play(graph: Any, tasks: list[Any], make_env: Any, make_input: Any, args: argparse.Namespace,
               seed: int | None) -> tuple[float, list[Any]]:
    from seed_agents.capture import capture
    from seed_agents.runner import EpisodeRunner, RunnerConfig

    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.group * args.tasks, progress=False),
                           make_env=make_env, make_input=make_input, seed=seed)
    t0 = time.perf_counter()
    with capture():
        trajs = await runner.run(tasks)
    return time.perf_counter() - t0, trajs


LOCAL_PATHS = ("local", "local-noturn", "local-noshare", "local-auto")


def open_path(path: str, args: argparse.Namespace, server: Any) -> tuple[Any, Any, str]:
    """(backend, tokenizer, what) for a rollout path."""
    from transformers import AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.models import resolve_model
    from seed_agents.precision import resolve_precision

    model = resolve_model(args.model)
    if path in LOCAL_PATHS:
        dtype, why = resolve_precision("auto" if path == "local-auto" else "float32")
        backend = LocalBackend(model, max_batch_size=args.group * args.tasks, compute_dtype=dtype,
                               share_prefix=path != "local-noshare",
                               turn_cache_bytes=0 if path in ("local-noturn", "local-noshare") else 1 << 30)
        return backend, backend.tokenizer, why + {"local-noshare": ", every prompt whole",
                                                  "local-noturn": ", no turn cache"}.get(path, "")
    from seed_agents.backends.vllm import VLLMBackend

    return (VLLMBackend(server.url, server.served_model_name, max_concurrency=64),
            AutoTokenizer.from_pretrained(model), "vLLM CPU server, float32")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--paths", nargs="+", default=[*LOCAL_PATHS, "vllm"], choices=[*LOCAL_PATHS, "vllm"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--tasks", type=int, default=2, help="Distinct tasks per workload.")
    parser.add_argument("--group", type=int, default=8, help="Episodes per task.")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="What else ran on the machine.")
    parser.add_argument("--roofline", default=None,
                        help="The ceilings' file (default: the docs/results/roofline*.json measured on a CPU like this one).")
    bench_results.add_results_args(parser)
    args = parser.parse_args(argv)
    started = bench_results.now()

    from seed_agents.chat_model import SeedChatModel
    from seed_agents.models import resolve_model
    from seed_agents.precision import resolve_precision
    from seed_agents.serve import VLLMServer
    from seed_agents.types import SamplingParams

    paths = [p for p in args.paths if not (p == "local-auto" and resolve_precision("auto")[0] == resolve_precision("float32")[0])]
    skipped = sorted(set(args.paths) - set(paths))
    if skipped:
        print(f"skipped {skipped}: {resolve_precision('auto')[1]} (the same path as local)", flush=True)
    try:  # a ceiling from another CPU would misstate every fraction
        ceiling = bench_results.load_roofline(args.roofline).results["ceilings"]["fp32"]["decode_tokens_per_s"]["8"]
    except bench_results.RooflineMismatch as e:
        parser.error(str(e))
    server = None
    if "vllm" in paths:
        server = VLLMServer(resolve_model(args.model), served_model_name="policy").start()
        print(f"starting vLLM (log {server.log_path}) ...", flush=True)
        server.wait_ready(600)
    runs: list[dict[str, Any]] = []
    try:
        opened = {p: open_path(p, args, server) for p in paths}
        setups = {}
        for p, (backend, tokenizer, _) in opened.items():
            for w in args.workloads:
                llm = SeedChatModel(backend=backend, tokenizer=tokenizer, model_name=p, sampling=SamplingParams(
                    max_tokens=WORKLOADS[w]["max_tokens"], temperature=args.temperature))
                setups[p, w] = make_workload(w, llm, args)
        for rep in range(-1, args.repeats):  # -1: the untimed warm-up round
            for w in args.workloads:
                for p in paths:
                    seed = args.seed if p != "vllm" else None  # vLLM 0.32 CPU crashes on concurrent seeded requests
                    wall, trajs = asyncio.run(play(*setups[p, w], args, seed))
                    calls = [c for t in trajs for c in t.calls]
                    gen = sum(len(c.completion_ids) for c in calls)
                    prompt = sum(len(c.prompt_ids) for c in calls)
                    run = {"path": p, "workload": w, "repeat": rep, "wall_s": wall, "episodes": len(trajs),
                           "faults": sum(t.fault is not None for t in trajs), "calls": len(calls),
                           "generated_tokens": gen, "prompt_tokens": prompt, "episodes_per_s": len(trajs) / wall,
                           "generated_tokens_per_s": gen / wall, "prompt_tokens_per_s": prompt / wall,
                           "success": statistics.fmean(t.success for t in trajs) if trajs else None}
                    print(f"{'warm-up' if rep < 0 else f'repeat {rep}'}: {w:9s} {p:10s} {wall:6.1f}s "
                          f"{run['episodes_per_s']:.3f} ep/s {run['generated_tokens_per_s']:.1f} gen tok/s "
                          f"{run['prompt_tokens_per_s']:.0f} prompt tok/s ({run['faults']} faults)", flush=True)
                    if rep >= 0:
                        runs.append(run)
        for backend, _, _ in opened.values():
            backend.close()
    finally:
        if server is not None:
            server.stop()

    summary = {}
    for w in args.workloads:
        for p in paths:
            mine = [r for r in runs if r["path"] == p and r["workload"] == w]
            gen = statistics.median(r["generated_tokens_per_s"] for r in mine)
            summary[f"{w}/{p}"] = {"episodes_per_s": statistics.median(r["episodes_per_s"] for r in mine),
                                   "generated_tokens_per_s": gen,
                                   "prompt_tokens_per_s": statistics.median(r["prompt_tokens_per_s"] for r in mine),
                                   "fraction_of_decode_ceiling": gen / ceiling if ceiling else None}
    why = {p: opened_why for p, (_, _, opened_why) in opened.items()}
    bench_results.write_result("rollout_throughput", bench_results.config_of(args),
                               {"runs": runs, "summary": summary, "paths": why, "decode_ceiling_batch8": ceiling,
                                "note": args.note}, started_at=started, results_dir=args.results_dir)
    print("\n| workload | path | episodes/s | generated tok/s | prompt tok/s | of decode ceiling (batch 8) |")
    print("|---|---|---|---|---|---|")
    for key, s in summary.items():
        w, p = key.split("/")
        frac = f"{s['fraction_of_decode_ceiling']:.2f}" if s["fraction_of_decode_ceiling"] is not None else "-"
        print(f"| {w} | {p} | {s['episodes_per_s']:.3f} | {s['generated_tokens_per_s']:.1f} | "
              f"{s['prompt_tokens_per_s']:.0f} | {frac} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
