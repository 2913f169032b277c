"""A learning run's peak memory with and without giving freed heap memory back to the OS.

glibc keeps what a process frees in its heap; a training step frees gigabytes in blocks of
many sizes, so a learning run's training process stayed at 11-14 GB resident between
updates and peaked at 15-20 GB on a 23 GB machine (an OOM kill once), while one
``malloc_trim(0)`` called into it left 2.1 GB. ``trainer.release_memory`` (on by default,
``seed_agents/memory.py``) trims after each step's rollouts, its scoring and its update.
This asks what that is worth and what it costs on the workload that showed it: the learning
curve's GRPO training (``bench/learning_curve.py``'s settings: atlas level 0, 4 tasks x
group 8, T 0.5, LoRA r8, a constant 3e-4, fp32), a few updates, no held-out evaluation.

Each side is one ``seed-agents train`` run in its own process, the same seed and tasks, the
only difference ``trainer.release_memory``; sides alternate (on, off, off, on, ...) so drift
on a shared machine hits both. Per side: the process's peak RSS (``seed_agents.memory``), the median
update's seconds (``step_time``) and its rollout and scoring shares from metrics.jsonl. Both
sides sample the same tokens (the trim changes no value; tests/unit/test_train_cli.py), so
their batches are the same and the time is what the trim costs.

    .venv/bin/python bench/run_memory.py --note "nothing else ran"     # ~25 min on 2 cores

Writes ``docs/results/run_memory.json`` (``--results-dir``).

``--phases``: where the main job's memory goes, beside TRL's. The main job's config (the atlas
tool agent left to choose its tools, as ``main_job_config`` writes it, or ``--config``) trains
``--updates`` updates in its own process, with a held-out evaluation after the last (``--heldout``
tasks); its metrics.jsonl and eval.jsonl hold each phase's peak RSS (``mem/*``: Linux's high-water
mark, reset at each phase, ``seed_agents.memory``). Then TRL's plain ``GRPOTrainer``, in a process
of its own, takes one optimizer step on the same batch: the rows of the update that peaked highest
(prompt and completion token ids, loss masks and rewards, from trajectories.jsonl), the same model
(fp32 weights, LoRA r8 through peft, bf16 autocast where the run had it), TRL's loss, its scoring
(the reference pass) and its update measured the same way, each phase starting from a trimmed heap
as ours does (``trainer.release_memory``). TRL samples nothing here (``rollout_func`` hands it the
rows), so its rollout phase has no figure. Writes ``docs/results/run_memory_phases.json``.

    .venv/bin/python bench/run_memory.py --phases --note "nothing else ran"   # ~30 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is on the path, its package is not
from bench import learning_curve  # noqa: E402
from bench import results as bench_results  # noqa: E402
from bench.children import run_logged, stop_children_on_sigterm  # noqa: E402
# the child reports its own peak: RUSAGE_CHILDREN here would be the largest of all sides so far
from bench.update_memory import CHILD  # noqa: E402

CURVE = ["--temperature", "0.5", "--lr", "3e-4", "--lr-schedule", "constant", "--train-tasks", "200"]


def side_config(args: argparse.Namespace, work: Path, release: bool, i: int) -> tuple[dict[str, Any], Path]:
    """The learning curve's GRPO config for ``args.updates`` updates, without its held-out
    evaluation, with ``trainer.release_memory`` set; (config, its run folder)."""
    curve = learning_curve.build_parser().parse_args(
        [*CURVE, "--model", args.model, "--updates", str(args.updates), "--group", str(args.group), "--heldout", "1"])
    tasks, heldout, n_train, n_heldout = learning_curve.write_tasks(work, curve.level, curve.train_tasks, curve.heldout)
    out = work / f"{'on' if release else 'off'}-{i}"
    config = learning_curve.train_config(curve, "grpo", args.seed, tasks, heldout, n_train, n_heldout, out)
    del config["eval"]
    config["trainer"]["release_memory"] = release
    return config, out


def run_side(args: argparse.Namespace, work: Path, release: bool, i: int) -> dict[str, Any]:
    config, out = side_config(args, work, release, i)
    cfg_path = work / f"{out.name}.json"
    cfg_path.write_text(json.dumps(config, indent=1))
    log = work / f"{out.name}.log"
    rc, wall = run_logged([sys.executable, "-c", CHILD, str(cfg_path)], log)
    text = log.read_text(encoding="utf-8", errors="replace")
    peak = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("PEAK_RSS_KB=")]
    if rc != 0 or not peak:
        tail = "\n".join(text.splitlines()[-15:])
        raise SystemExit(f"error: the release_memory={str(release).lower()} run failed (exit {rc}):\n{tail}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    med = {key: statistics.median(float(r[key]) for r in rows) for key in ("step_time", "time/rollout_s", "time/score_s")}
    side = {"release_memory": release, "peak_rss_gb": int(peak[0]) / 1024**2, "wall_s": wall, "updates": len(rows),
            "step_s": med["step_time"], "rollout_s": med["time/rollout_s"], "score_s": med["time/score_s"],
            "rows": [float(r["rows"]) for r in rows], "loss": [float(r["loss/total"]) for r in rows]}
    print(f"  release_memory {'on ' if release else 'off'}: peak RSS {side['peak_rss_gb']:.2f} GB, median update "
          f"{side['step_s']:.1f} s (rollouts {side['rollout_s']:.1f} s, scoring {side['score_s']:.1f} s)", flush=True)
    return side


# -- --phases: the main job's peak per phase, beside TRL's GRPOTrainer on the same batch ----------------

PHASES = ("rollout", "score", "update")


def main_job_config(args: argparse.Namespace, work: Path, out: Path) -> dict[str, Any]:
    """The main job's training (issue 62): the atlas level-0 tool agent left free to choose its
    tools, SEED with the policy's own skills on successes, guided openings on half of each group,
    LoRA r8 at a constant 1e-3, T 0.5; ``args.updates`` updates of 4 tasks x ``args.group``, then
    ``args.heldout`` held-out tasks, greedy. ``--config`` replaces it (its out and iterations set here)."""
    if args.config is not None:
        config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
        return {**config, "out": str(out), "iterations": args.updates}
    from examples.atlas_tasks import make_tasks

    tasks, heldout = work / "atlas_train_l0.jsonl", work / "atlas_heldout_l0.jsonl"
    for path, split in ((tasks, "train"), (heldout, "heldout")):
        path.write_text("".join(t.model_dump_json() + "\n" for t in make_tasks(split, levels=[0])), encoding="utf-8")
    config: dict[str, Any] = {
        "num_tasks": 200, "tasks_per_iteration": 4, "iterations": args.updates, "seed": args.seed, "out": str(out),
        "graph": {"build": "examples.atlas_tasks:build_auto_agent", "tasks": str(tasks),
                  "reward": "examples.atlas_tasks:answer_reward"},
        "backend": {"kind": "local", "model": args.model, "max_batch_size": 32},
        "sampling": {"max_tokens": 64, "temperature": 0.5},
        "runner": {"group_size": args.group, "concurrency": 32, "progress": False},
        "skills": {"source": "self", "max_tokens": 64, "failures": "skip"},
        "trainer": {"learning_rate": 1e-3, "lr_schedule": "constant", "lora_r": 8, "lora_alpha": 16, "opd_coef": 0.1,
                    "kl_coef": 0.001, "guide_share": 0.5},
        "stage1": {"run": "off"},
    }
    if args.heldout:
        config["eval"] = {"tasks": str(heldout), "num_tasks": args.heldout, "every": args.updates, "at_start": False}
    return config


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []


def run_ours(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The main job in its own process: (its per-phase peaks, its config)."""
    out = work / "ours"
    config = main_job_config(args, work, out)
    cfg_path = work / "ours.json"
    cfg_path.write_text(json.dumps(config, indent=1))
    log = work / "ours.log"
    rc, wall = run_logged([sys.executable, "-c", CHILD, str(cfg_path)], log)
    text = log.read_text(encoding="utf-8", errors="replace")
    peak = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("PEAK_RSS_KB=")]
    if rc != 0 or not peak:
        tail = "\n".join(text.splitlines()[-15:])
        raise SystemExit(f"error: the main job's run failed (exit {rc}):\n{tail}")
    return ours_peaks(out, int(peak[0]) / 1024**2, wall), config


def ours_peaks(out: Path, process_gb: float, wall_s: float) -> dict[str, Any]:
    """Each update's phase peaks (metrics.jsonl), each held-out evaluation's (eval.jsonl), the
    process's peak, and the update whose update phase peaked highest (the batch TRL gets)."""
    rows = read_jsonl(out / "metrics.jsonl")
    if not rows or any(f"mem/{phase}_peak_gb" not in r for r in rows for phase in PHASES):
        raise SystemExit(f"error: {out / 'metrics.jsonl'} holds no per-phase peaks (needs Linux's /proc/self/clear_refs)")
    updates = [{"iteration": r["iteration"], "rows": r["rows"], **{p: r[f"mem/{p}_peak_gb"] for p in PHASES},
                "step_s": r["time/step_s"]} for r in rows]
    evals = [{"updates": r["updates"], "episodes": r["episodes"], "eval": r["mem/eval_peak_gb"]}
             for r in read_jsonl(out / "eval.jsonl") if "mem/eval_peak_gb" in r]
    worst = max(updates, key=lambda u: u["update"])
    peak = {p: max(u[p] for u in updates) for p in PHASES}
    if evals:
        peak["eval"] = max(e["eval"] for e in evals)
    return {"process_peak_gb": process_gb, "wall_s": wall_s, "phase_peak_gb": peak, "updates": updates, "evals": evals,
            "trl_batch_iteration": worst["iteration"]}


def batch_rows(out: Path, iteration: int, merge: bool) -> list[dict[str, Any]]:
    """The training rows of ``iteration`` as the trainer built them (``GraphRollout.build``: the
    trainable episodes' policy calls, merged where their tokens continue), with their rewards."""
    from seed_agents.rows import trajectory_to_rows
    from seed_agents.trainers.rollout import trainable_episodes
    from seed_agents.types import Trajectory

    trajs = [Trajectory.model_validate(t) for t in read_jsonl(out / "trajectories.jsonl")
             if t["metadata"].get("iteration") == iteration]
    return [{"prompt_ids": row.prompt_ids, "completion_ids": row.completion_ids, "loss_mask": row.loss_mask,
             "old_logprobs": row.old_logprobs, "reward": t.reward}
            for t in trainable_episodes(trajs) for row in trajectory_to_rows(t, merge=merge)]


def run_trl(args: argparse.Namespace, work: Path, rows: list[dict[str, Any]], bf16: bool) -> dict[str, Any]:
    """TRL's side in its own process (``trl_side``); its peaks."""
    rows_path, result = work / "trl_rows.json", work / "trl.json"
    rows_path.write_text(json.dumps(rows))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-rows", str(rows_path), "--trl-out", str(result),
           "--model", args.model, "--seed", str(args.seed), *(["--trl-bf16"] if bf16 else [])]
    log = work / "trl.log"
    rc, wall = run_logged(cmd, log)
    if rc != 0 or not result.exists():
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise SystemExit(f"error: TRL's GRPOTrainer run failed (exit {rc}):\n{tail}")
    return {**json.loads(result.read_text()), "wall_s": wall}


def trl_side(rows_path: Path, out: Path, model_name: str, seed: int, bf16: bool) -> None:
    """One ``GRPOTrainer`` step on the rows in ``rows_path`` (one group: the batch's grouping moves
    no memory), the phases' peaks written to ``out``. The model is ours: fp32 weights, LoRA r8
    (alpha 16, every linear layer) through peft; KL 0.001 (a reference pass with the adapter off),
    a constant 1e-3, TRL's defaults for the rest (its loss, gradient checkpointing)."""
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from seed_agents.memory import PEAK_RSS, release_free_memory
    from seed_agents.models import resolve_model

    rows = json.loads(rows_path.read_text())
    path = resolve_model(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peaks: dict[str, float | None] = {}

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        return {"prompt_ids": [r["prompt_ids"] for r in rows], "completion_ids": [r["completion_ids"] for r in rows],
                "logprobs": [r["old_logprobs"] for r in rows], "env_mask": [r["loss_mask"] for r in rows],
                "recorded_reward": [r["reward"] for r in rows]}

    def recorded_reward(prompts: list[Any], completions: list[Any], recorded_reward: list[float], **kw: Any) -> list[float]:
        return recorded_reward

    class UpdatePeak(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            peaks["update"] = PEAK_RSS.phase_gb()

    config = GRPOConfig(output_dir=str(out.parent / "trl-run"), per_device_train_batch_size=len(rows),
                        num_generations=len(rows), max_steps=1, learning_rate=1e-3, lr_scheduler_type="constant",
                        beta=0.001, bf16=bf16, use_cpu=not torch.cuda.is_available(), logging_steps=1,
                        save_strategy="no", report_to=[], disable_tqdm=True, seed=seed)
    trainer = GRPOTrainer(model=model, reward_funcs=[recorded_reward], args=config, processing_class=tokenizer,
                          train_dataset=datasets.Dataset.from_list([{"prompt": "rows"}]), rollout_func=rollout_func,
                          peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
                          callbacks=[UpdatePeak()])
    score = trainer._generate_and_score_completions

    def scored(inputs: Any) -> Any:  # its scoring, then the update's start: as ours, from a trimmed heap
        release_free_memory()
        PEAK_RSS.reset()
        batch = score(inputs)
        peaks["score"] = PEAK_RSS.phase_gb()
        release_free_memory()
        PEAK_RSS.reset()
        return batch

    trainer._generate_and_score_completions = scored
    peaks["load"] = PEAK_RSS.process_gb()
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    # num_tokens: the prompt and completion tokens TRL trained on, the rows' own
    out.write_text(json.dumps({"phase_peak_gb": peaks, "process_peak_gb": PEAK_RSS.process_gb(), "rows": len(rows),
                               "loss": logged["loss"], "num_tokens": logged.get("num_tokens")}))


def run_phases(args: argparse.Namespace) -> int:
    started = bench_results.now()
    with (contextlib.nullcontext(str(args.work)) if args.work else tempfile.TemporaryDirectory(prefix="run_memory-phases-")) as d:
        work = Path(d)
        work.mkdir(parents=True, exist_ok=True)
        ours, config = run_ours(args, work)
        out = Path(config["out"])
        fmt = json.loads((out / "format.json").read_text()) if (out / "format.json").exists() else {}
        merge = config.get("trainer", {}).get("merge_rows", True)
        rows = batch_rows(out, ours["trl_batch_iteration"], merge)
        trl = run_trl(args, work, rows, bf16=fmt.get("update") == "bfloat16")
    both = [p for p in ("score", "update") if trl["phase_peak_gb"].get(p) is not None]
    ratio = {p: ours["updates"][[u["iteration"] for u in ours["updates"]].index(ours["trl_batch_iteration"])][p]
             / trl["phase_peak_gb"][p] for p in both}
    same = max(ours["updates"], key=lambda u: u["update"])
    ours_over = max(same[p] for p in both) / max(trl["phase_peak_gb"][p] for p in both)
    print(f"\nours (peak per phase, max over {args.updates} updates): "
          + ", ".join(f"{p} {v:.2f} GB" for p, v in ours["phase_peak_gb"].items())
          + f"; process {ours['process_peak_gb']:.2f} GB")
    print(f"TRL GRPOTrainer on the batch of iteration {ours['trl_batch_iteration']} ({len(rows)} rows): "
          + ", ".join(f"{p} {trl['phase_peak_gb'][p]:.2f} GB" for p in both)
          + f"; process {trl['process_peak_gb']:.2f} GB (no rollouts)")
    print("ours/TRL on that batch: " + ", ".join(f"{p} {r:.2f}" for p, r in ratio.items())
          + f"; the larger of score and update {ours_over:.2f}")
    bench_results.write_result(
        args.result_name or "run_memory_phases", {**bench_results.config_of(args), "main_job": config},
        {"ours": ours, "trl": trl, "ours_over_trl": {**ratio, "score_or_update": ours_over},
         "batch_tokens": sum(len(r["prompt_ids"]) + sum(r["loss_mask"]) for r in rows),
         "formats": fmt, "target_gb": 4.0, "process_peak_within_target": ours["process_peak_gb"] <= 4.0},
        started_at=started, results_dir=args.results_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--updates", type=int, default=None,
                    help="Updates per run (default 4; with --phases 2). The peak grew over a 30-update run.")
    ap.add_argument("--repeats", type=int, default=1, help="Pairs of runs (on and off).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group", type=int, default=8, help="Episodes per task (the curve's 8; fewer for a quick check).")
    ap.add_argument("--note", default="", help="What else ran on the machine.")
    ap.add_argument("--phases", action="store_true",
                    help="Peak RSS per phase of the main job's config, beside TRL's GRPOTrainer on the same batch.")
    ap.add_argument("--config", type=Path, default=None, help="With --phases: a train config YAML instead of the main job's.")
    ap.add_argument("--heldout", type=int, default=32, help="With --phases: held-out tasks evaluated after the last update.")
    ap.add_argument("--work", type=Path, default=None,
                    help="With --phases: keep the runs here (configs, logs, run folders) instead of a temporary folder.")
    ap.add_argument("--result-name", default=None, help="The result file's name (default run_memory, run_memory_phases).")
    ap.add_argument("--trl-rows", type=Path, help=argparse.SUPPRESS)  # the TRL side's own process
    ap.add_argument("--trl-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--trl-bf16", action="store_true", help=argparse.SUPPRESS)
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if args.trl_rows is not None:
        trl_side(args.trl_rows, args.trl_out, args.model, args.seed, args.trl_bf16)
        return 0
    if args.updates is None:
        args.updates = 2 if args.phases else 4
    if args.updates < 1 or args.repeats < 1:
        ap.error("--updates and --repeats: at least 1")
    stop_children_on_sigterm()
    if args.phases:
        return run_phases(args)
    started = bench_results.now()
    sides: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="run_memory-") as d:
        for i in range(args.repeats):
            for release in ((True, False) if i % 2 == 0 else (False, True)):
                sides[release].append(run_side(args, Path(d), release, i))
    med = {release: {key: statistics.median(s[key] for s in runs) for key in ("peak_rss_gb", "step_s")}
           for release, runs in sides.items()}
    # the trim changes no value: each pair's runs must log the same rows and losses, update for update
    same_batches = all((a["rows"], a["loss"]) == (b["rows"], b["loss"]) for a, b in zip(sides[True], sides[False], strict=True))
    rss, step = (med[True][k] / med[False][k] for k in ("peak_rss_gb", "step_s"))
    print(f"\nmedian of {args.repeats} pair(s), {args.updates} updates each: peak RSS on {med[True]['peak_rss_gb']:.2f} GB, "
          f"off {med[False]['peak_rss_gb']:.2f} GB (on/off {rss:.2f}); update on {med[True]['step_s']:.1f} s, "
          f"off {med[False]['step_s']:.1f} s (on/off {step:.2f}); the same rows and losses on both sides: {same_batches}")
    config = {**bench_results.config_of(args), "model": Path(str(args.model)).name, "workload": CURVE}
    bench_results.write_result(
        args.result_name or "run_memory", config,
        {"runs": sides[True] + sides[False], "median": {"on" if r else "off": m for r, m in med.items()},
         "rss_on_over_off": rss, "step_on_over_off": step, "same_batches": same_batches},
        started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
