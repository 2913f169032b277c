"""Sampler vs trainer: the logprobs a rollout recorded against the trainer's own
recomputation of the same tokens, before any update, per precision mode.

PPO's ratio at the first step is ``exp(trainer logp - recorded logp)``; in exact arithmetic
it is 1. It is not, because the two passes compute differently: the sampler decodes token
by token in a left-padded generation batch with a KV cache; the trainer runs each merged
row (observation tokens and all) in one forward, padded with other rows. bf16 makes both
passes round more. This script plays the same seeded TextWorld episodes in each mode
(``--modes``), turns them into the rows the trainer trains on (``seed_agents.rows``,
``rows_to_tensors``), recomputes every sampled token's logprob the way TRL's
``GRPOTrainer._get_per_token_logps_and_entropies`` does (``model(input_ids, attention_mask,
logits_to_keep)``, same padding, same batch chunking), in the same mode, and prints:
mean and max |gap| per token, and the share of tokens whose first-step ratio already falls
outside PPO's clip [1 - eps, 1 + eps].

    .venv/bin/python bench/logprob_gap.py                       # SmolLM2, float32 and bfloat16
    .venv/bin/python bench/logprob_gap.py --modes float32 --tasks 2 --group 2

bf16 on a CPU without bf16 instructions is emulated and slow (see bench/roofline.py): the
gap is the same number either way, only the wall time differs. Writes
``docs/results/logprob_gap.json``.
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
from bench import results as bench_results  # noqa: E402


def play(backend: Any, tokenizer: Any, args: argparse.Namespace) -> list[Any]:
    """The seeded rollouts, as the trainer would get them."""
    from seed_agents.capture import capture
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.envs import load_env_suite
    from seed_agents.runner import EpisodeRunner, RunnerConfig
    from seed_agents.types import SamplingParams

    suite = load_env_suite("textworld", seed=args.seed)
    tasks = suite.tasks("train", args.tasks)
    suite.prepare(tasks)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
    graph = suite.build_graph(llm, max_turns=args.max_turns, history="chat")
    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.group, progress=False),
                           make_env=suite.make_env, seed=args.seed)
    with capture():
        trajs = asyncio.run(runner.run(tasks))
    return [t for t in trajs if t.fault is None]


@torch.no_grad()
def recompute(model: Any, rows: list[Any], pad_id: int, dtype: torch.dtype, batch_size: int) -> list[list[float]]:
    """Every row's completion logprobs as TRL's scoring computes them (temperature 1)."""
    from seed_agents.precision import compute_in
    from seed_agents.trainers.seed_trainer import rows_to_tensors

    out: list[list[float]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        t = rows_to_tensors(chunk, torch.zeros(len(chunk)), pad_id)
        ids = torch.cat([t["prompt_ids"], t["completion_ids"]], dim=1)
        mask = torch.cat([t["prompt_mask"], t["completion_mask"]], dim=1)
        width = t["completion_ids"].size(1)
        with compute_in(dtype):
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=width + 1).logits
        logps = logits[:, :-1].float().log_softmax(-1).gather(-1, t["completion_ids"].unsqueeze(-1)).squeeze(-1)
        out += [logps[i, : len(r.completion_ids)].tolist() for i, r in enumerate(chunk)]
    return out


def measure(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.models import resolve_model
    from seed_agents.precision import resolve_precision
    from seed_agents.rows import trajectory_to_rows

    dtype, why = resolve_precision(mode)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # fp32 master weights, as the trainer holds
    model.eval()
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=args.group, compute_dtype=dtype)
    t0 = time.perf_counter()
    trajs = play(backend, tokenizer, args)
    rollout_s = time.perf_counter() - t0
    rows = [r for t in trajs for r in trajectory_to_rows(t)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    t1 = time.perf_counter()
    trainer_logps = recompute(model, rows, pad, dtype, args.score_batch_size)
    score_s = time.perf_counter() - t1
    gaps = [abs(new - old) for r, new_row in zip(rows, trainer_logps, strict=True)
            for new, old, m in zip(new_row, r.old_logprobs, r.loss_mask, strict=True) if m]
    diffs = [new - old for r, new_row in zip(rows, trainer_logps, strict=True)
             for new, old, m in zip(new_row, r.old_logprobs, r.loss_mask, strict=True) if m]
    ratios = [float(torch.tensor(d).exp()) for d in diffs]
    outside = sum(1 for q in ratios if q < 1 - args.clip_eps or q > 1 + args.clip_eps)
    result = {"mode": mode, "dtype": str(dtype).removeprefix("torch."), "why": why, "episodes": len(trajs),
              "rows": len(rows), "tokens": len(gaps), "mean_abs_gap": statistics.fmean(gaps) if gaps else None,
              "max_abs_gap": max(gaps) if gaps else None,
              "median_abs_gap": statistics.median(gaps) if gaps else None,
              "ratio_outside_clip": outside / len(ratios) if ratios else None,
              "max_abs_ratio_minus_1": max(abs(q - 1) for q in ratios) if ratios else None,
              "rollout_s": rollout_s, "score_s": score_s}
    print(f"{mode}: {why}; {len(trajs)} episodes, {len(rows)} rows, {len(gaps)} sampled tokens; |gap| mean "
          f"{result['mean_abs_gap']:.2e} max {result['max_abs_gap']:.2e}; first-step ratio outside "
          f"[{1 - args.clip_eps:.1f}, {1 + args.clip_eps:.1f}]: {outside}/{len(ratios)}; rollout {rollout_s:.0f}s, "
          f"score {score_s:.0f}s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--modes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--score-batch-size", type=int, default=8, help="Rows per scoring forward (TRL's chunking).")
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="What else ran on the machine.")
    bench_results.add_results_args(parser)
    args = parser.parse_args(argv)
    started = bench_results.now()
    modes = [measure(mode, args) for mode in args.modes]
    bench_results.write_result("logprob_gap", bench_results.config_of(args), {"modes": modes, "note": args.note},
                               started_at=started, results_dir=args.results_dir)
    print("\n| mode | tokens | mean abs gap | max abs gap | first-step ratio outside clip |")
    print("|---|---|---|---|---|")
    for m in modes:
        print(f"| {m['mode']} ({m['dtype']}) | {m['tokens']} | {m['mean_abs_gap']:.2e} | {m['max_abs_gap']:.2e} | "
              f"{m['ratio_outside_clip']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
