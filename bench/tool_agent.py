"""Does a wrapped tool agent improve? Held-out success before and after training, GRPO vs SEED.

The agent is the hand-written LangGraph tool agent (``graphs/tool_agent.py``) over three
tools of a generated atlas (``examples/knowledge_base.py``): ``lookup(place, field)``,
``add``, ``multiply``. Its questions cannot be answered from memory (invented places,
products of five- and three-digit numbers), so success needs tool calls that parse and
name the right tool with the right arguments. Training and held-out tasks ask about
disjoint places (manifests committed in ``bench/tool_agent/``).

For each seed, two ``seed-agents train`` runs from the same base model, same tasks, same
budget and learning rate; only the skill source differs:

- ``grpo``: outcome RL only (``skills.source: none``);
- ``seed``: SEED, the policy writes its own hindsight skills (``skills.source: self``)
  through the constrained analyzer (its reply is decoded under the skill JSON schema).

Each run is evaluated greedily on the same held-out tasks before the first update and
every ``--eval-every`` updates. Reported per method: held-out success at the start and
at the end, the gain, the tool-call parse rate and (SEED) the skill parse rate during
training; paired by seed: SEED minus GRPO of the final success and of the gain, with a
bootstrap 95% CI and the number of seeds a paired test would need to detect the
observed effect. Raw results go to ``docs/results/tool_agent.json``, the plot to
``docs/tool_agent.png``.

    .venv/bin/python bench/tool_agent.py                       # CPU default, 3 seeds (~35 min on 2 cores)
    .venv/bin/python bench/tool_agent.py --seeds 0 --iterations 1 --eval-tasks 4   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.results import add_results_args, now, write_result  # noqa: E402

METHODS = ("grpo", "seed")
MANIFESTS = ROOT / "bench" / "tool_agent"

# The paper's protocol (SEEDConfig's defaults, ALFWorld/WebShop budgets): every setting of
# this benchmark that differs from it is printed in the table's header.
PAPER = {"model": "Qwen2.5-3B-Instruct", "kl_coef": 0.01, "opd_coef": 0.01, "lr": 1e-6, "iterations": 150,
         "tasks_per_iteration": 16, "group": 8}


def run_config(method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    skills: dict[str, Any] = {"source": "none"}
    if method == "seed":
        skills = {"source": "self", "max_tokens": args.skill_max_tokens, "injector": "system", "failures": "write"}
    return {
        "graph": {"build": "examples.knowledge_base:build_agent", "tasks": str(MANIFESTS / "train.jsonl"),
                  "reward": "examples.knowledge_base:answer_reward"},
        "num_tasks": args.num_tasks, "tasks_per_iteration": args.tasks_per_iteration,
        "iterations": args.iterations, "seed": seed, "out": str(args.out / f"{method}-s{seed}"),
        # fp32 as its stored results were: backend.precision defaults to auto (bf16 where the CPU has it)
        "backend": {"kind": "local", "model": args.model, "max_batch_size": 16, "precision": "float32"},
        "sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature},
        "runner": {"group_size": args.group, "concurrency": 16, "progress": False},
        "skills": skills,
        "stage1": {"run": "off"},
        # full weights, TRL's schedule and skills on every episode, as its stored results were (the defaults moved)
        "trainer": {"learning_rate": args.lr, "opd_coef": args.opd_coef if method == "seed" else 0.0,
                    "kl_coef": args.kl_coef, "lora_r": None, "lr_schedule": "linear", "guide_share": 0.0},
        "eval": {"tasks": str(MANIFESTS / "heldout.jsonl"), "num_tasks": args.eval_tasks, "every": args.eval_every},
    }


def departures(args: argparse.Namespace) -> list[str]:
    """Each setting that differs from the paper's, as ``name ours (paper theirs)``."""
    ours = {"model": Path(str(args.model)).name, "kl_coef": args.kl_coef, "opd_coef": args.opd_coef, "lr": args.lr,
            "iterations": args.iterations, "tasks_per_iteration": args.tasks_per_iteration, "group": args.group}
    return [f"{k} {ours[k]} (paper {v})" for k, v in PAPER.items() if ours[k] != v]


def run_one(method: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    cfg = run_config(method, seed, args)
    out = Path(cfg["out"])
    cfg_path = args.out / f"{method}-s{seed}.yaml"
    if (out / "summary.json").exists():  # finished before: reuse it only with the same settings
        if not cfg_path.exists() or yaml.safe_load(cfg_path.read_text()) != cfg:
            raise SystemExit(f"{out} holds a finished run with other settings; use another --out")
        return {"method": method, "seed": seed, "out": str(out), "rc": 0, "reused": True}
    if out.exists():  # unfinished: this benchmark does not resume, it starts the run again
        shutil.rmtree(out)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with open(args.out / f"{method}-s{seed}.log", "w") as log:
        rc = subprocess.call([sys.executable, "-m", "seed_agents", "train", "--config", str(cfg_path)],
                             stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    print(f"  {method:<5} seed {seed}: {'ok' if rc == 0 else f'FAILED rc={rc}, see {log.name}'} ({wall:.0f}s)", flush=True)
    if (out / "checkpoints").exists():  # ~1.5 GB each; the figures live in eval.jsonl / metrics.jsonl
        shutil.rmtree(out / "checkpoints")
    return {"method": method, "seed": seed, "out": str(out), "rc": rc, "wall_s": wall}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


# -- analysis (pure) --------------------------------------------------------------------

def run_figures(curve: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's figures: held-out success at the first and last evaluation, and the
    training-time parse rates (means over updates; None where not logged)."""
    curve = sorted(curve, key=lambda r: r["episodes_consumed"])

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in metrics if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    return {"start": curve[0]["success_rate"], "final": curve[-1]["success_rate"],
            "gain": curve[-1]["success_rate"] - curve[0]["success_rate"],
            "curve": [{"episodes": r["episodes_consumed"], "success": r["success_rate"],
                       "invalid_action_rate": r.get("invalid_action_rate")} for r in curve],
            "skill_parse_rate": mean_of("skill_parse_rate"),
            "train_invalid_action_rate": mean_of("invalid_action_rate"),
            "train_success": mean_of("success_rate")}


def paired(per_seed: dict[str, dict[int, dict[str, Any]]], key: str) -> dict[str, Any]:
    """SEED minus GRPO of ``key`` per seed (same start, tasks and held-out set), with a
    bootstrap CI of the mean and the seeds a paired test would need."""
    from bench.stats import bootstrap_ci, seeds_needed

    seeds = sorted(set(per_seed.get("seed", {})) & set(per_seed.get("grpo", {})))
    diffs = [per_seed["seed"][s][key] - per_seed["grpo"][s][key] for s in seeds]
    if not diffs:
        return {"seeds": [], "diffs": []}
    low, high = bootstrap_ci(diffs, seed=0) if len(diffs) > 1 else (float("nan"), float("nan"))
    return {"seeds": seeds, "diffs": diffs, "mean": statistics.fmean(diffs), "ci95": [low, high],
            "seeds_needed": seeds_needed(diffs) if len(diffs) > 1 else None}


def report(per_seed: dict[str, dict[int, dict[str, Any]]], header: list[str]) -> str:
    def ms(xs: list[float]) -> str:
        if not xs:
            return "-"
        return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"

    lines = ["settings that differ from the paper: " + "; ".join(header), "",
             f"{'method':<6} {'seeds':>5} {'held-out start':>16} {'held-out final':>16} {'gain':>16} "
             f"{'train invalid calls':>20} {'skill parse':>12}", "-" * 98]
    for method, runs in per_seed.items():
        vals = list(runs.values())
        col = lambda k: [v[k] for v in vals if v.get(k) is not None]  # noqa: E731
        lines.append(f"{method:<6} {len(vals):>5} {ms(col('start')):>16} {ms(col('final')):>16} {ms(col('gain')):>16} "
                     f"{ms(col('train_invalid_action_rate')):>20} {ms(col('skill_parse_rate')):>12}")
    lines.append("")
    for key in ("final", "gain"):
        p = paired(per_seed, key)
        if not p["diffs"]:
            lines.append(f"paired by seed, SEED - GRPO ({key}): no seed has both runs")
            continue
        wins, losses = sum(d > 1e-9 for d in p["diffs"]), sum(d < -1e-9 for d in p["diffs"])
        ci = "n/a (one seed)" if len(p["diffs"]) < 2 else f"[{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
        need = p.get("seeds_needed")
        lines.append(f"paired by seed, SEED - GRPO held-out {key}: {p['mean']:+.3f}, 95% bootstrap CI {ci}, "
                     f"{wins} higher / {losses} lower / {len(p['diffs']) - wins - losses} equal; seeds needed "
                     f"to detect it (paired, alpha 0.05, power 0.8): {'n/a' if need is None else need}")
    return "\n".join(lines)


def plot(per_seed: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (method, runs), (marker, line) in zip(per_seed.items(), [("o", "-"), ("s", "--")]):
        points = sorted({p["episodes"] for r in runs.values() for p in r["curve"]})
        means = [statistics.fmean(p["success"] for r in runs.values() for p in r["curve"] if p["episodes"] == x)
                 for x in points]
        ax.plot(points, means, marker=marker, linestyle=line, label=f"{method} (mean of {len(runs)} seeds)")
        for r in runs.values():  # every seed, faint: the spread is the point
            ax.plot([p["episodes"] for p in r["curve"]], [p["success"] for p in r["curve"]], linestyle=line,
                    alpha=0.2, color=ax.lines[-1].get_color())
    ax.set_xlabel("training episodes consumed")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.set_title("Atlas tool agent, SmolLM2-135M: held-out success")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--iterations", type=int, default=2, help="SEED/GRPO updates per run.")
    p.add_argument("--tasks-per-iteration", type=int, default=2)
    p.add_argument("--group", type=int, default=4, help="Episodes per task (GRPO group).")
    p.add_argument("--num-tasks", type=int, default=32, help="Training tasks cycled through.")
    p.add_argument("--eval-tasks", type=int, default=16, help="Held-out tasks (the same at every evaluation).")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--kl-coef", type=float, default=0.01)
    p.add_argument("--opd-coef", type=float, default=0.01)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skill-max-tokens", type=int, default=128)
    p.add_argument("--parallel", type=int, default=2, help="Runs at a time.")
    p.add_argument("--threads", type=int, default=1, help="Torch threads per run.")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_tool_agent")
    p.add_argument("--keep-runs", action="store_true", help="Keep the run folders (trajectories) after the report.")
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "tool_agent.png")
    add_results_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    header = departures(args)
    jobs = [(m, s) for s in args.seeds for m in METHODS]
    print(f"{len(jobs)} runs, {args.parallel} at a time; settings that differ from the paper: {'; '.join(header)}",
          flush=True)
    started, started_at = time.time(), now()
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: run_one(*job, args), jobs))
    wall = time.time() - started
    failed = [r for r in runs if r["rc"] != 0]
    per_seed: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in METHODS}
    for r in runs:
        curve = read_jsonl(Path(r["out"]) / "eval.jsonl")
        if r["rc"] == 0 and curve:
            per_seed[r["method"]][r["seed"]] = run_figures(curve, read_jsonl(Path(r["out"]) / "metrics.jsonl"))
    text = report(per_seed, header)
    print(text)
    print(f"\nwall time {wall / 60:.1f} min for {len(jobs)} runs ({args.parallel} at a time)"
          + (f"; {len(failed)} FAILED: {[(r['method'], r['seed']) for r in failed]}" if failed else ""))
    config = {**vars(args), "methods": list(METHODS), "run_config": {**run_config("seed", args.seeds[0], args), "out": None}}
    write_result("tool_agent", config,
                 {"per_seed": {m: {str(s): v for s, v in r.items()} for m, r in per_seed.items()},
                  "paired": {k: paired(per_seed, k) for k in ("final", "gain")},
                  "wall_s": wall, "failed": [[r["method"], r["seed"]] for r in failed]},
                 paper=PAPER, started_at=started_at, results_dir=args.results_dir)
    plot(per_seed, args.plot)
    if not args.keep_runs:
        shutil.rmtree(args.out, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
