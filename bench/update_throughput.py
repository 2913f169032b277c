"""How fast is one SEED update on the learning benchmark's batch, and how far from this CPU's limit?

The learning curve (issue 22) needs tens of updates; the continual atlas cycle spent 950 s
of 1407 s in its one update (docs/results/continual_atlas.json). This script collects one
batch the way that cycle does (SmolLM2 on atlas level-0 tasks, the first turn forced to a
tool call, the policy writing its own hindsight skills; every episode without a parsed
skill gets a placeholder so every row has a teacher prompt, SEED's worst case) and then
times the same SEED update (teacher scoring + loss + backward + optimizer step, from the
same weights and optimizer state each time) under each layout, interleaved, side by side:

- ``trl``: TRL's layout, every row padded to the batch's widest prompt plus its widest
  completion, one forward (the path before ``SEEDConfig.chunk_tokens``);
- ``chunked``: rows grouped by length, each group's padding trimmed (``chunk_tokens``);
- ``shared``: chunked, and the prompt tokens a chunk's rows share (system prompt, tool
  schemas) computed once (``share_prefix``, the default now; ``trainers/shared_prefix.py``);
- ``shared-nogc``: the same without gradient checkpointing (no recompute, far more memory:
  at 64 rows of ~470 tokens it went past this machine's 23 GB and was killed, so it is
  not in the default ``--layouts``);
- ``shared-bf16``: ``shared`` with the whole update under bf16 autocast over the fp32 weights
  (``seed_agents.precision.compute_in``; `train` gets the same from ``backend.precision``
  through accelerate's autocast), read against the bf16 matmul ceiling.

Per layout it prints the update time, the tokens it computed (real and padded) and the
useful matmul work as a fraction of the matmul ceiling of the layout's number format
from ``bench/roofline.py`` (goal >= 40%, read on the fastest layout). Work counts weight
matmuls: the body's 2 x params per token forward, the tied LM head only at the trained
positions (``trainer.sampled_head``; TRL's layout runs it at every completion column, counted so), backward 2x forward for full fine-tuning and 1x for LoRA (activation gradients; the adapters' own are negligible);
attention scores are left out (about +10% at these lengths). "of ceiling" is the work of
the positions a layout computes (its padding included, checkpointing's recompute not) per
second: how well the kernels run. "effective" is the work of every real token of every row
per second: above 100% where a layout skips repeated work (a shared prefix computed once).
Writes ``docs/results/update_throughput.json``.

    .venv/bin/python bench/update_throughput.py --note "nothing else ran"
    .venv/bin/python bench/update_throughput.py --tasks 2 --group 2 --repeats 1 --results-dir runs/smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ and examples/ are on the path
from bench import results as bench_results  # noqa: E402
from bench.seed_overhead import Updater, fill_skills  # noqa: E402
from seed_agents.precision import compute_in  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# name: (chunk_tokens, share_prefix, gradient checkpointing, number format)
LAYOUTS = {"trl": (0, False, True, "fp32"), "chunked": (8192, False, True, "fp32"), "shared": (8192, True, True, "fp32"),
           "shared-nogc": (8192, True, False, "fp32"), "shared-bf16": (8192, True, True, "bf16")}
GOAL = 0.40  # update at >= 40% of the matmul ceiling (issue 21)
PAPER = {"model": "Qwen2.5-3B-Instruct", "tasks": 16, "group": 8, "max_turns": 30, "max_tokens": 512}
LABELS = {"model": "model", "tasks": "tasks/update", "group": "group size", "max_turns": "max turns",
          "max_tokens": "max response tokens"}


def update_flops(train_tokens: int, teacher_tokens: int, train_scored: int, teacher_scored: int,
                 body_params: int, head_params: int, lora: bool) -> float:
    """Weight-matmul FLOPs of one update over the given token positions (see the module
    docstring): the teacher forward, then the training forward and its backward (2x the
    forward for full fine-tuning, 1x for LoRA); the LM head only at scored positions."""
    teacher = 2 * body_params * teacher_tokens + 2 * head_params * teacher_scored
    train = 2 * body_params * train_tokens + 2 * head_params * train_scored
    return teacher + train * (2.0 if lora else 3.0)


def tokens_computed(prompts: list[list[int]], completions: list[int], budget: int, max_rows: int | None,
                    share: bool) -> int:
    """Token positions one forward pass over these rows computes under a layout, chunked and
    prefix-shared exactly as ``SEEDTrainer`` does it."""
    from seed_agents.trainers.seed_trainer import length_chunks
    from seed_agents.backends.prefix import worth_sharing

    lens = [len(p) for p in prompts]
    if budget <= 0:  # TRL: the whole batch padded to its widest prompt and completion
        return len(lens) * (max(lens) + max(completions))
    total = 0
    for rows in length_chunks(lens, completions, budget, max_rows=max_rows):
        shared = worth_sharing([prompts[i] for i in rows]) if share else 0
        total += shared + len(rows) * (max(lens[i] for i in rows) - shared + max(completions[i] for i in rows))
    return total


def build(args: argparse.Namespace) -> tuple[Any, Any, list[Any]]:
    """SmolLM2 (LoRA unless ``--lora-r 0``), the forced atlas agent with the hindsight node,
    a rollout and a SEED trainer; the policy samples from the trainer's own weights."""
    import datasets
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.atlas_tasks import answer_reward, build_agent, make_tasks
    from seed_agents.backends.local import LocalBackend
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.graphs.hindsight import with_hindsight
    from seed_agents.models import resolve_model
    from seed_agents.runner import EpisodeRunner, RunnerConfig
    from seed_agents.trainers.rollout import GraphRollout
    from seed_agents.trainers.seed_trainer import SEEDConfig, SEEDTrainer
    from seed_agents.types import SamplingParams

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if args.lora_r:
        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=args.tasks * args.group)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=0.7))
    tasks = make_tasks("train", per_level=args.tasks, levels=[0])
    graph = with_hindsight(build_agent(llm, max_turns=args.max_turns), llm, max_tokens=args.skill_tokens)
    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.tasks * args.group, progress=False),
                           reward_fn=answer_reward, seed=args.seed)
    rollout = GraphRollout(runner, llm, skills="self")
    ds = datasets.Dataset.from_list([{"prompt": t.model_dump_json()} for t in tasks])
    out = Path(args.work_dir)
    cfg = SEEDConfig(output_dir=str(out), per_device_train_batch_size=args.tasks * args.group,
                     num_generations=args.group, max_steps=1, learning_rate=1e-4, opd_coef=args.opd_coef, beta=0.0,
                     use_cpu=not torch.cuda.is_available(), bf16=False, report_to=[], save_strategy="no",
                     seed=args.seed, disable_tqdm=True)
    trainer = SEEDTrainer(model=model, args=cfg, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    return trainer, rollout, tasks


def set_layout(trainer: Any, layout: str) -> None:
    chunk, share, checkpointing, _ = LAYOUTS[layout]
    trainer.args.chunk_tokens, trainer.args.share_prefix = chunk, share
    set_checkpointing(trainer.model, checkpointing)


def set_checkpointing(model: Any, on: bool) -> None:
    """Turn activation (gradient) checkpointing on or off. ``Trainer.train()`` turns it on
    when its arguments ask (``train``'s default); a benchmark that drives the update itself
    never calls ``train()``, so without this it would time, and hold in memory, an update
    that keeps every activation."""
    new = hasattr(model, "activation_checkpointing_enable")  # transformers 5's name
    if on and new:
        model.activation_checkpointing_enable({"use_reentrant": False})
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        (model.activation_checkpointing_disable if new else model.gradient_checkpointing_disable)()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="Alias or local folder.")
    ap.add_argument("--tasks", type=int, default=8, help="Atlas level-0 training tasks in the batch.")
    ap.add_argument("--group", type=int, default=4, help="Episodes per task (G).")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64, help="Policy completion budget.")
    ap.add_argument("--skill-tokens", type=int, default=64, help="Hindsight skill budget.")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank (alpha = 2r, all linear layers); 0: full fine-tuning.")
    ap.add_argument("--opd-coef", type=float, default=0.01)
    ap.add_argument("--layouts", default="trl,shared", help=f"Comma list of {', '.join(LAYOUTS)}.")
    ap.add_argument("--repeats", type=int, default=1, help="Timed updates per layout (after one untimed warm-up each).")
    ap.add_argument("--roofline", default=None,
                    help="The ceilings' file (default: the docs/results/roofline*.json measured on a CPU like this one).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work-dir", default=None, help="TRL's output folder (default: a temporary one, removed).")
    ap.add_argument("--note", default="", help="What else ran on the machine (it shapes the times).")
    ap.add_argument("--result-name", default="update_throughput",
                    help="Name of the result file, so a run of other layouts does not replace the main table.")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if not args.result_name.replace("_", "").replace("-", "").isalnum():
        ap.error("--result-name: letters, digits, '-' and '_' only")
    layouts = [x for x in args.layouts.split(",") if x]
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown:
        ap.error(f"unknown layout {unknown[0]!r}; layouts: {', '.join(LAYOUTS)}")
    try:
        roofline = bench_results.load_roofline(args.roofline)
    except bench_results.RooflineMismatch as e:
        ap.error(str(e))
    ceilings = {fmt: roofline.results["matmul_gflops"][fmt]["mlp_prefill_2048"]["best"] * 1e9 for fmt in ("fp32", "bf16")}
    ceiling = ceilings["fp32"]
    started = bench_results.now()

    import shutil
    import tempfile

    owned = args.work_dir is None
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="update-throughput-")
    try:
        trainer, rollout, tasks = build(args)
        t0 = time.perf_counter()
        batch = fill_skills(rollout, rollout.collect(tasks, args.group, iteration=0))
        t_collect = time.perf_counter() - t0
        rows = batch.rows
        config = trainer.accelerator.unwrap_model(trainer.model).config
        head = config.vocab_size * config.hidden_size
        body = sum(p.numel() for p in trainer.model.parameters()) - head - sum(
            p.numel() for n, p in trainer.model.named_parameters() if "lora_" in n)
        real = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        taught = [i for i, p in enumerate(batch.teacher_prompt_ids) if p is not None]
        completions = [len(r.completion_ids) for r in rows]
        # the head's useful work is at the trained positions (a merged row's completion also holds
        # the environment's answers); TRL's layout (chunk_tokens 0) runs it at every completion column
        trained = [sum(r.loss_mask) for r in rows]
        scored = (sum(trained), sum(trained[i] for i in taught))
        every_column = (sum(completions), sum(completions[i] for i in taught))
        real_teacher = sum(len(batch.teacher_prompt_ids[i]) + completions[i] for i in taught)
        flops = update_flops(real, real_teacher, *scored, body, head, lora=bool(args.lora_r))
        print(f"batch: {len(batch.trajectories)} episodes, {len(rows)} rows, {real} real tokens "
              f"(prompt {min(len(r.prompt_ids) for r in rows)}-{max(len(r.prompt_ids) for r in rows)}, completion "
              f"{min(len(r.completion_ids) for r in rows)}-{max(len(r.completion_ids) for r in rows)}); "
              f"collected in {t_collect:.0f} s; the work of every real token {flops / 1e12:.2f} TFLOP", flush=True)

        update = Updater(trainer)
        for layout in layouts:  # warm-up, one untimed update per layout: allocations, thread pools, and the
            set_layout(trainer, layout)  # kernels of its number format (a bf16 warm-up leaves fp32's cold)
            with compute_in(DTYPES[LAYOUTS[layout][3]]):
                update(batch, args.opd_coef)
        times: dict[str, list[float]] = {layout: [] for layout in layouts}
        for r in range(args.repeats):
            for layout in (layouts if r % 2 == 0 else layouts[::-1]):
                set_layout(trainer, layout)
                with compute_in(DTYPES[LAYOUTS[layout][3]]):
                    times[layout].append(update(batch, args.opd_coef)[1])
                print(f"repeat {r}: {layout} {times[layout][-1]:.1f} s", flush=True)
    finally:
        if owned:
            shutil.rmtree(args.work_dir, ignore_errors=True)

    per_layout: dict[str, Any] = {}
    base = statistics.median(times[layouts[0]])
    print(f"\nmodel={args.model} lora_r={args.lora_r} tasks={args.tasks} group={args.group} rows={len(rows)} "
          f"real tokens={real}; matmul ceilings fp32 {ceiling / 1e9:.0f}, bf16 {ceilings['bf16'] / 1e9:.0f} GFLOP/s "
          f"(bench/roofline.py)")
    print(f"{'layout':<14}{'update s':>10}{'vs ' + layouts[0]:>10}{'train tok':>11}{'teacher tok':>13}"
          f"{'of ceiling':>12}{'effective':>11}")
    for layout in layouts:
        s = statistics.median(times[layout])
        chunk, share, _, fmt = LAYOUTS[layout]
        train_tok = tokens_computed([r.prompt_ids for r in rows], completions, chunk, None, share)
        teacher_tok = tokens_computed([batch.teacher_prompt_ids[i] for i in taught], [completions[i] for i in taught],
                                      chunk, trainer.args.score_batch_size, share) if taught else 0
        # the work this layout computes (padding included, recompute not) per second, against the
        # ceiling of the number format it computes in
        rate = update_flops(train_tok, teacher_tok, *(every_column if chunk <= 0 else scored), body, head,
                            lora=bool(args.lora_r)) / s
        frac = rate / ceilings[fmt]
        effective = flops / s / ceilings[fmt]  # the work of every real token, shared or not: > 1 where sharing saves
        per_layout[layout] = {"update_s": times[layout], "median_s": s, "vs_first": s / base,
                              "train_tokens_computed": train_tok, "teacher_tokens_computed": teacher_tok,
                              "fraction_of_ceiling": frac, "effective_fraction": effective, "chunk_tokens": chunk,
                              "share_prefix": share, "gradient_checkpointing": LAYOUTS[layout][2], "precision": fmt,
                              "gflops": rate / 1e9, "layout_ceiling_gflops": ceilings[fmt] / 1e9}
        print(f"{layout:<14}{s:>10.1f}{s / base:>10.2f}{train_tok:>11}{teacher_tok:>13}{frac:>12.1%}{effective:>11.1%}")
    best = min(per_layout, key=lambda k: per_layout[k]["median_s"])
    frac = per_layout[best]["fraction_of_ceiling"]  # the goal is about kernels, not about skipped work
    verdict = "met" if frac >= GOAL else f"missed by {GOAL - frac:.2f}"
    print(f"fastest: {best}, {frac:.1%} of the {per_layout[best]['precision']} matmul ceiling "
          f"(goal >= {GOAL:.0%}: {verdict})")
    bench_results.write_result(
        args.result_name, {**{k: v for k, v in bench_results.config_of(args).items() if k != "work_dir"},
                              "model": Path(str(args.model)).name},
        {"layouts": per_layout, "fastest": best, "goal": GOAL, "verdict": verdict, "collect_s": t_collect,
         "episodes": len(batch.trajectories), "rows": len(rows), "real_tokens": real, "real_token_tflop": flops / 1e12,
         "ceiling_gflops": ceiling / 1e9, "rows_with_teacher": sum(p is not None for p in batch.teacher_prompt_ids),
         "mean_reward": statistics.mean(t.reward for t in batch.trajectories)},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
