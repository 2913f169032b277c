"""SEED overhead: one SEED update vs one plain GRPO update on the identical batch.

One iteration's batch is collected once (the agent graph with the hindsight node, the
policy as its own analyzer). The *update* is then timed on that fixed batch, without new
rollouts: scoring (teacher + reference log-probs, ``SEEDTrainer.score_batch``) + loss +
backward + optimizer step. SEED runs with lambda = ``--opd-coef``; GRPO with lambda = 0,
which skips the teacher forward and the OPD term and is otherwise the same code on the
same rows. Before every timed update the weights and the optimizer state are put back,
so each side starts from the same point; sides are interleaved (S,G / G,S, ...) after
one untimed warm-up each, so drift on a shared machine hits both alike.

The analyzer's share of an iteration is (analyzer call time) / (collect + SEED update).
Analyzer calls overlap each other and other episodes' policy calls, so two figures are
given: the sum of their latencies ("busy", can exceed wall time under concurrency) and
the union of their in-flight intervals ("wall").

By default every row gets a teacher prompt (``--skill-coverage full``: episodes whose
skill did not parse get a fixed placeholder skill), which is SEED's worst case; an
untrained SmolLM2 writes few parsable skills, and with ``collected`` the ratio would
mostly measure the rows that happened to parse. ``successes`` is the batch SEED trains on
with ``skills.failures skip`` (the setting of the best learning run): every successful
episode gets a skill (the placeholder where its own did not parse), failures none, so the
teacher covers only the successes' rows; pass ``--skill-failures skip`` with it so the
analyzer is not asked about failures either. ``--lora-r 8`` times the update as the
learning curves run it (LoRA on every linear layer, alpha 2r); 0 (default) updates every weight.

``--injectors system,last_turn`` times SEED once per skill placement on the same batch
(interleaved with GRPO and each other): ``system`` puts the skill in the system message,
where on TextWorld a teacher prompt shares almost nothing with its row's prompt;
``last_turn`` puts it after the whole prompt, so it shares all but the turn's closing tokens. The first
placement is the headline figure; every one is in ``placements``. A placement named with
``+fused`` (``last_turn+fused``) scores the teacher on top of the prompt keys and values the
loss forward computes (``SEEDConfig.fuse_teacher``): it computes the skill and the
completion, not the prompt it shares with its row; its teacher time is then inside the loss,
not the scoring.

    .venv/bin/python bench/seed_overhead.py                        # SmolLM2, TextWorld
    .venv/bin/python bench/seed_overhead.py --env fake --repeats 2 # scripted env, quick
    .venv/bin/python bench/seed_overhead.py --model PATH --tasks 4 --group 8
    .venv/bin/python bench/seed_overhead.py --injectors system,last_turn  # where the skill sits
    .venv/bin/python bench/seed_overhead.py --injectors last_turn+fused,last_turn,system+fused,system
    .venv/bin/python bench/seed_overhead.py --env atlas --max-tokens 64 --injectors last_turn+fused,system

Prints the two update times, their ratio SEED/GRPO (goal <= 1.15) and the analyzer share,
and writes every repeat to ``docs/results/seed_overhead.json`` (``seed_overhead_atlas.json``,
``seed_overhead_fake.json`` with ``--env``; ``--results-dir``).
"""

from __future__ import annotations

import argparse
import atexit
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402

# The paper's iteration (16 tasks x 8 episodes, up to 30 turns, 512-token responses, a 3B
# model): the batch this benchmark times is far smaller, and the header says so.
PAPER = {"model": "Qwen2.5-3B-Instruct", "tasks": 16, "group": 8, "max_turns": 30, "max_tokens": 512}
LABELS = {"model": "model", "tasks": "tasks/update", "group": "group size", "max_turns": "max turns",
          "max_tokens": "max response tokens"}
GOAL = 1.15  # SEED's update at most 1.15x GRPO's on the same batch (issue 21)
FALLBACK_SKILL = "Read the numbered list, pick the command that moves toward the goal, and answer with it exactly."


def _union_s(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def scored_tokens(prompts: list[list[int]], completion_lens: list[int], args: Any) -> int:
    """Tokens a no-grad scoring pass computes over these rows, as the trainer chunks them
    (shared prefixes once, padding within a chunk): a figure the machine's load cannot move."""
    from seed_agents.trainers.seed_trainer import _chunk_cost, prefix_chunks

    chunks = prefix_chunks(prompts, completion_lens, args.chunk_tokens, max_rows=args.score_batch_size)
    return sum(_chunk_cost(prompts, completion_lens, rows) for rows in chunks)


def fused_tokens(tails: list[int]) -> int:
    """Positions the fused teacher computes for tails of these lengths: each group of
    ``tail_groups`` padded to its longest."""
    from seed_agents.trainers.seed_trainer import tail_groups

    return sum(len(g) * max(tails[i] for i in g) for g in tail_groups(tails))


def build(args: argparse.Namespace) -> tuple[Any, Any, list[Any]]:
    """The policy, its graph with the hindsight node, a rollout and a SEED trainer."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.graphs.env_agent import build_env_agent
    from seed_agents.graphs.hindsight import with_hindsight
    from seed_agents.models import resolve_model
    from seed_agents.runner import EpisodeRunner, RunnerConfig
    from seed_agents.skills import make_injector
    from seed_agents.trainers.rollout import GraphRollout
    from seed_agents.trainers.seed_trainer import SEEDConfig, SEEDTrainer
    from seed_agents.types import SamplingParams, Task

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if args.lora_r:  # as the learning curves and `train` with trainer.lora_r wrap it
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=args.tasks * args.group)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
    judged: dict[str, Any] = {}  # the hindsight node's success_fn, where the env does not set success itself
    if args.env == "textworld":
        from seed_agents.tools.textworld import TextWorldSuite

        suite = TextWorldSuite(cache_dir=args.cache_dir, seed=args.seed)
        tasks = suite.tasks("train", args.tasks)
        suite.prepare(tasks)
        graph, make_env = suite.build_graph(llm, max_turns=args.max_turns), suite.make_env
    elif args.env == "atlas":  # the learning curve's family: tool schemas in the system prompt, a forced first call
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ beside bench/
        from examples.atlas_tasks import answer_reward, build_agent, make_tasks

        tasks = make_tasks("train", per_level=args.tasks, levels=[0])
        graph, make_env, reward = build_agent(llm, max_turns=args.max_turns), None, answer_reward
        # the outcome is the reward function's (run after the graph): the hindsight node asks it,
        # as `train` does, or it sees no success and, under --skill-failures skip, writes nothing
        judged["success_fn"] = lambda state: answer_reward(state["task"], state) >= 1.0
    else:
        from seed_agents.testing import ScriptedEnv

        tasks = [Task(task_id=f"fake-{i}") for i in range(args.tasks)]
        graph, make_env = build_env_agent(llm, max_turns=args.max_turns), (lambda task: ScriptedEnv())
    graph = with_hindsight(graph, llm, max_tokens=args.analyzer_tokens, failures=args.skill_failures, **judged)
    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.tasks * args.group, progress=False),
                           make_env=make_env, **({"reward_fn": reward} if args.env == "atlas" else {}))
    rollout = GraphRollout(runner, llm, skills="self", injector=make_injector(args.injectors[0].removesuffix("+fused")))
    ds = datasets.Dataset.from_list([{"prompt": t.model_dump_json()} for t in tasks])
    out = tempfile.mkdtemp(prefix="seed-overhead-")  # save_strategy "no": TRL only needs the folder to exist
    atexit.register(shutil.rmtree, out, True)
    cfg = SEEDConfig(output_dir=out, per_device_train_batch_size=args.tasks * args.group,
                     num_generations=args.group, max_steps=1, learning_rate=1e-6, opd_coef=args.opd_coef,
                     score_batch_size=args.score_batch_size, use_cpu=not torch.cuda.is_available(), bf16=False,
                     report_to=[], save_strategy="no", seed=args.seed, disable_tqdm=True)
    trainer = SEEDTrainer(model=model, args=cfg, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    return trainer, rollout, tasks


def fill_skills(rollout: Any, batch: Any, successes_only: bool = False) -> Any:
    """Give every episode a valid skill (placeholder where the analyzer's did not parse);
    ``successes_only``: every successful one, and take the skill of every failure away."""
    from seed_agents.types import Skill

    for t in batch.trajectories:
        if successes_only and not t.success:
            t.skill = None
        elif t.skill is None or not t.skill.valid:
            t.skill = Skill(trajectory_id=t.trajectory_id, task_id=t.task_id, success=t.success,
                            skill=FALLBACK_SKILL, valid=True)
    return rollout.build(batch.trajectories)


class Updater:
    """One update on a fixed batch, always from the same weights and optimizer state."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we drive the step
        self.weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        self.coef = trainer.coef

    def __call__(self, batch: Any, lam: float, fuse: bool = False) -> tuple[float, float]:
        """Seconds of (scoring, whole update); ``fuse``: the teacher scored in the loss forward."""
        tr = self.trainer
        tr.args.fuse_teacher = fuse
        with torch.no_grad():
            tr.model.load_state_dict(self.weights)
        tr.optimizer.state.clear()  # Adam re-initializes its moments on the first step
        tr.optimizer.zero_grad(set_to_none=True)
        tr.coef = replace(self.coef, lam=lam)
        tr.model.train()
        t0 = time.perf_counter()
        inputs = tr.score_batch(batch)
        t_score = time.perf_counter() - t0
        loss = tr._compute_loss(tr.model, inputs)
        tr.accelerator.backward(loss)
        torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.args.max_grad_norm)
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
        return t_score, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="Alias or local folder (the trainer's and the local backend's).")
    ap.add_argument("--env", choices=["textworld", "atlas", "fake"], default="textworld",
                    help="atlas: the learning curve's tool family (level 0, first call forced; pass --max-tokens 64); "
                         "fake: the scripted two-step env.")
    ap.add_argument("--cache-dir", default=None, help="TextWorld game cache (default: the user cache).")
    ap.add_argument("--tasks", type=int, default=2, help="Tasks per iteration.")
    ap.add_argument("--group", type=int, default=4, help="Episodes per task (G).")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=16, help="Policy completion budget.")
    ap.add_argument("--analyzer-tokens", type=int, default=128, help="Hindsight skill budget.")
    ap.add_argument("--opd-coef", type=float, default=0.01, help="SEED's lambda (GRPO side: 0).")
    ap.add_argument("--score-batch-size", type=int, default=4)
    ap.add_argument("--skill-coverage", choices=["full", "collected", "successes"], default="full",
                    help="full: a skill on every episode; collected: the analyzer's valid ones; successes: one on "
                         "every success, none on failures (skills.failures skip's batch).")
    ap.add_argument("--skill-failures", choices=["write", "skip"], default="write",
                    help="skills.failures during the collect (skip: the analyzer is not asked about failures).")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank of the timed update (0: every weight).")
    ap.add_argument("--temperature", type=float, default=0.7, help="The policy's sampling temperature.")
    ap.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on",
                    help="Activation checkpointing in the timed update (on: as `train` runs it, trainer."
                         "gradient_checkpointing; off: every activation kept, as this benchmark ran before 2026-12-06).")
    ap.add_argument("--result-name", default=None,
                    help="Result file name (default seed_overhead, or seed_overhead_ENV with --env).")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--injectors", default="system",
                    help="Comma list of skill placements to time SEED with (skills.injector); the first is the headline.")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    from seed_agents.backends.prefix import common_prefix_len
    from seed_agents.skills import INJECTORS, make_injector

    if args.result_name is not None and not re.fullmatch(r"seed_overhead(_[a-z0-9_]+)?", args.result_name):
        ap.error("--result-name: seed_overhead or seed_overhead_<lowercase letters, digits, _> (its table's family)")
    args.injectors = [n.strip() for n in args.injectors.split(",") if n.strip()]
    if (not args.injectors or {n.removesuffix("+fused") for n in args.injectors} - set(INJECTORS)
            or len(set(args.injectors)) < len(args.injectors)):
        ap.error(f"--injectors: distinct names from {', '.join(INJECTORS)}, each optionally with +fused")
    started = bench_results.now()

    trainer, rollout, tasks = build(args)
    from bench.update_throughput import set_checkpointing

    set_checkpointing(trainer.model, args.gradient_checkpointing == "on")  # Trainer.train() would; we never call it

    # -- one iteration's rollouts, collected once ------------------------------------------
    t0 = time.perf_counter()
    batch = rollout.collect(tasks, args.group, iteration=0)
    t_collect = time.perf_counter() - t0
    analyzer = [c for t in batch.trajectories for c in t.calls if c.purpose == "analyzer"]
    parsed = sum(1 for t in batch.trajectories if t.skill is not None and t.skill.valid)
    batches = {}  # the same episodes and skills; only where the skill sits differs
    for name in args.injectors:
        rollout.injector = make_injector(name.removesuffix("+fused"))
        batches[name] = (rollout.build(batch.trajectories) if args.skill_coverage == "collected"
                         else fill_skills(rollout, batch, successes_only=args.skill_coverage == "successes"))
    batch = batches[args.injectors[0]]
    with_skill = sum(p is not None for p in batch.teacher_prompt_ids)

    # -- the update on that batch: SEED (per placement) vs GRPO, interleaved --------------
    update = Updater(trainer)
    for name in args.injectors:  # warm-up (allocations, thread pools), each side once
        update(batches[name], args.opd_coef, name.endswith("+fused"))
    update(batch, 0.0)
    sides = [*args.injectors, "grpo"]
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for r in range(args.repeats):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:  # the order rotates between repeats
            times[side].append(update(batches.get(side, batch), 0.0 if side == "grpo" else args.opd_coef,
                                      side.endswith("+fused")))
        print(f"repeat {r}: " + "   ".join(f"{'GRPO' if side == 'grpo' else f'SEED ({side})'} {times[side][-1][1]:.2f} s "
                                           f"(score {times[side][-1][0]:.2f})" for side in sides), flush=True)
    med = {side: (statistics.median(s for s, _ in times[side]), statistics.median(t for _, t in times[side]))
           for side in sides}
    grpo_score, grpo_s = med["grpo"]
    seed_score, seed_s = med[args.injectors[0]]
    completion_lens = [len(r.completion_ids) for r in batch.rows]
    reference_tokens = scored_tokens([r.prompt_ids for r in batch.rows], completion_lens, trainer.args)
    placements = {}
    for name in args.injectors:
        pairs = [(p, r) for p, r in zip(batches[name].teacher_prompt_ids, batches[name].rows) if p is not None]
        placements[name] = {
            "seed_score_s": med[name][0], "seed_update_s": med[name][1], "ratio": med[name][1] / grpo_s,
            "repeats": [{"seed_score_s": s, "seed_update_s": t} for s, t in times[name]],
            "teacher_prompt_tokens_per_row": statistics.fmean(len(p) for p, _ in pairs) if pairs else 0.0,
            "shared_with_row_prompt_per_row": statistics.fmean(common_prefix_len([p, r.prompt_ids]) for p, r in pairs)
            if pairs else 0.0,
            "teacher_tokens_scored": scored_tokens([p for p, _ in pairs], [len(r.completion_ids) for _, r in pairs],
                                                   trainer.args) if not name.endswith("+fused")
            # fused: each teacher computes what follows the prompt it shares with its row, padded as
            # the fused forward groups the tails (counted as if the loss forward were one chunk)
            else fused_tokens([len(p) - common_prefix_len([p, r.prompt_ids]) + len(r.completion_ids) for p, r in pairs])}
        if name.endswith("+fused"):
            placements[name]["fused_rows"] = trainer._metrics["train"]["teacher/fused_rows"][-1]

    # -- the analyzer's share of one SEED iteration (collect + update; in-process sync ~0) --
    iteration_s = t_collect + seed_s
    busy = sum(c.latency_s for c in analyzer)
    wall = _union_s([(c.started_at, c.started_at + c.latency_s) for c in analyzer])
    rows = batch.rows
    print(f"\nmodel={args.model} env={args.env} tasks={len(tasks)} group={args.group} max_turns={args.max_turns} "
          f"repeats={args.repeats}")
    print(f"batch: {len(batch.trajectories)} episodes, {len(rows)} rows, "
          f"{sum(len(r.prompt_ids) for r in rows) / len(rows):.0f} prompt / "
          f"{sum(len(r.completion_ids) for r in rows) / len(rows):.1f} completion tokens per row; "
          f"skills parsed {parsed}/{len(batch.trajectories)}, rows with a teacher prompt {with_skill}/{len(rows)} "
          f"(coverage: {args.skill_coverage})")
    print(f"GRPO update : {grpo_s:.2f} s (scoring {grpo_score:.2f} s: reference)")
    for name, x in placements.items():
        fused = "fused_rows" in x
        print(f"SEED update : {x['seed_update_s']:.2f} s (scoring {x['seed_score_s']:.2f} s: "
              f"{'reference; the teacher inside the loss' if fused else 'teacher + reference'}), "
              f"skill placement {name}: teacher prompts {x['teacher_prompt_tokens_per_row']:.0f} tokens, "
              f"{x['shared_with_row_prompt_per_row']:.0f} shared with the row's prompt; the "
              f"{'fused teacher' if fused else 'teacher pass'} computes {x['teacher_tokens_scored']} tokens"
              + (f" ({x['fused_rows']:.0%} of its rows on the loss forward's keys and values)" if fused else "")
              + f", the reference pass {reference_tokens}")
        print(f"ratio SEED/GRPO ({name}): {x['ratio']:.3f}   (goal <= {GOAL})")
    print(f"iteration: collect {t_collect:.2f} s + SEED update {seed_s:.2f} s = {iteration_s:.2f} s")
    print(f"analyzer: {len(analyzer)} calls, {sum(len(c.completion_ids) for c in analyzer)} tokens; "
          f"busy {busy:.2f} s ({busy / iteration_s:.1%} of the iteration), "
          f"wall {wall:.2f} s ({wall / iteration_s:.1%})")
    bench_results.write_result(
        args.result_name or ("seed_overhead" if args.env == "textworld" else f"seed_overhead_{args.env}"),
        {**bench_results.config_of(args), "model": Path(str(args.model)).name},
        {"repeats": [{"seed_score_s": ss, "seed_update_s": st, "grpo_score_s": gs, "grpo_update_s": gt}
                     for (ss, st), (gs, gt) in zip(times[args.injectors[0]], times["grpo"])],
         "placements": placements, "reference_tokens_scored": reference_tokens,
         "seed_update_s": seed_s, "grpo_update_s": grpo_s, "seed_score_s": seed_score, "grpo_score_s": grpo_score,
         "ratio": seed_s / grpo_s, "goal": GOAL, "collect_s": t_collect, "episodes": len(batch.trajectories),
         "rows": len(rows), "skills_parsed": parsed, "rows_with_teacher": with_skill,
         "prompt_tokens_per_row": sum(len(r.prompt_ids) for r in rows) / len(rows),
         "completion_tokens_per_row": sum(len(r.completion_ids) for r in rows) / len(rows),
         "analyzer_calls": len(analyzer), "analyzer_busy_s": busy, "analyzer_wall_s": wall, "iteration_s": iteration_s},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
