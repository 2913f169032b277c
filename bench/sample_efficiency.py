"""Sample efficiency: held-out success against training episodes consumed, SEED vs GRPO.

The same tasks, seeds, learning rate and budget for every method; only the skill source
differs. Each (method, seed) is one ``seed-agents train`` run (a subprocess, so runs are
isolated and can share the CPU) with held-out evaluation (``eval`` section: greedy, the
same ``eval_seen`` games, before the first update and every ``--eval-every`` updates).

Methods:
- ``grpo``: outcome RL only (``skills.source: none``), from the base model;
- ``seed``: SEED from the stage-1 model (the base model after skill SFT on examples that
  ``skills collect`` got from the offline rule-based TextWorld analyzer), lambda = --opd-coef;
- ``grpo_stage1``: GRPO from the stage-1 model. Always run: skill SFT also changes how the
  policy acts (the analyzer's skills quote commands), and this separates that effect from
  the distillation term's;
- ablations, by flag: ``seed_no_stage1`` (SEED from the base model), ``seed_frozen``
  (skills from a frozen copy of the stage-1 model), ``seed_external`` (skills from another
  served model, ``--external-url``/``--external-model``), ``seed_rule`` (SEED from the
  stage-1 model with every skill written by the offline rule-based analyzer: skills with
  content that the policy did not have to write; against ``grpo_stage1`` it measures the
  distillation term alone).

Stage 1 runs once per benchmark (not per seed) and is cached in the output folder.
Every method is also compared seed by seed with GRPO from the same start (``grpo_stage1``
for the stage-1 starts, ``grpo`` for ``seed_no_stage1``): the mean paired difference in
held-out success, its 95% bootstrap interval and the seeds a paired t-test would need to
detect it (``bench/stats.py``). The raw results (every evaluation point of every seed and
method, the config, code version and machine) go to ``docs/results/sample_efficiency.json``
(``--results-dir``), from which ``scripts/readme_tables.py`` renders the README's table.
Reported: success vs episodes per method (mean and spread over seeds), the episodes each
method needs to reach ``--threshold`` held-out success (per seed; a seed that never
reaches it counts as not reached, never as the budget), the ratio SEED/GRPO of the mean
episodes-to-threshold when both reach it, and the mean held-out success over the whole
curve (area under it). Nothing is tuned per seed or per method.

    .venv/bin/python bench/sample_efficiency.py                     # CPU default (< 1 h on 2 cores)
    .venv/bin/python bench/sample_efficiency.py --seeds 0 --iterations 2 --eval-tasks 4  # smoke
    .venv/bin/python bench/sample_efficiency.py --ablations seed_no_stage1 seed_frozen
    .venv/bin/python bench/sample_efficiency.py --full --model Qwen/Qwen2.5-3B-Instruct  # GPU, the paper's protocol

``--full`` uses the paper's budget (16 tasks x 8 episodes per update, lr 1e-6, 150
updates, 30 turns) with the local backend on the GPU; for vLLM rollouts use
``seed-agents train --config configs/paper_textworld_qwen2.5-3b.yaml`` per method.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is on the path, its package is not

from bench import results as bench_results  # noqa: E402
from bench import stats  # noqa: E402

MAIN_METHODS = ("grpo", "seed", "grpo_stage1")
ALL_METHODS = (*MAIN_METHODS, "seed_no_stage1", "seed_frozen", "seed_external", "seed_rule")
STAGE1_START = ("seed", "seed_frozen", "seed_rule", "grpo_stage1")  # methods that start from the stage-1 model
# each SEED variant against GRPO from the same start model
SAME_START_BASE = {"seed": "grpo_stage1", "seed_rule": "grpo_stage1", "seed_frozen": "grpo_stage1",
                   "seed_external": "grpo_stage1", "seed_no_stage1": "grpo"}


# The paper's protocol (configs/paper_textworld_qwen2.5-3b.yaml, SEEDConfig's defaults):
# every setting of a run that differs from it is printed in the table's header.
PAPER = {"model": "Qwen2.5-3B-Instruct", "kl_coef": 0.01, "opd_coef": 0.01, "lr": 1e-6, "iterations": 150,
         "tasks_per_iteration": 16, "group": 8, "max_turns": 30}
PAPER_LABELS = {"model": "model", "kl_coef": "KL coef", "opd_coef": "OPD lambda", "lr": "lr", "iterations": "updates",
                "tasks_per_iteration": "tasks/update", "group": "group size", "max_turns": "max turns"}


# -- configs ------------------------------------------------------------------------

def budget(args: argparse.Namespace) -> dict[str, Any]:
    """The settings every method shares."""
    if args.full:
        return {"iterations": 150, "tasks_per_iteration": 16, "group": 8, "num_tasks": 256, "lr": 1e-6,
                "max_turns": 30, "max_tokens": 64, "eval_tasks": 64, "eval_every": 10, "history": "window"}
    return {"iterations": args.iterations, "tasks_per_iteration": args.tasks_per_iteration, "group": args.group,
            "num_tasks": args.num_tasks, "lr": args.lr, "max_turns": args.max_turns, "max_tokens": args.max_tokens,
            "eval_tasks": args.eval_tasks, "eval_every": args.eval_every, "history": "chat"}


def train_config(method: str, seed: int, args: argparse.Namespace, stage1_model: str | None) -> dict[str, Any]:
    b = budget(args)
    skills: dict[str, Any] = {"source": "none"}
    model = args.model
    if method in ("grpo_stage1", "seed_rule"):
        model = stage1_model
    if method not in ("grpo", "grpo_stage1"):
        skills = {"source": "self", "max_tokens": args.skill_max_tokens, "injector": "system", "failures": "write"}
        if method == "seed_frozen":  # skills from a frozen copy of the initial (stage-1) policy
            model = stage1_model
            skills["source"] = "frozen"
        if method == "seed_rule":
            skills["source"] = "rule_based"
        if method == "seed_external":
            skills["source"] = "external"
            skills["analyzer"] = {"kind": "vllm", "base_url": args.external_url, "model": args.external_model,
                                  "tokenizer": args.external_tokenizer}
    return {
        "env": "textworld", "split": "train", "num_tasks": b["num_tasks"],
        "tasks_per_iteration": b["tasks_per_iteration"], "iterations": b["iterations"], "seed": seed,
        "out": str(args.out / f"{method}-s{seed}"),
        # fp32 as its stored results were: backend.precision defaults to auto (bf16 where the CPU has it)
        "backend": {"kind": "local", "model": model, "max_batch_size": 16, "precision": "float32"},
        "sampling": {"max_tokens": b["max_tokens"], "temperature": args.temperature},
        "runner": {"group_size": b["group"], "concurrency": 16, "progress": False},
        "agent": {"max_turns": b["max_turns"], "history": b["history"]},
        "skills": skills,
        # SEED finds the stage-1 model built by stage() in this cache; other methods skip stage 1
        "stage1": {"run": "auto" if method == "seed" else "off", "cache_dir": str(args.out / "stage1"),
                   "num_tasks": args.stage1_tasks, "group_size": args.stage1_group, "epochs": args.stage1_epochs},
        # full weights, TRL's schedule and skills on every episode, as its stored results were (the defaults moved)
        "trainer": {"learning_rate": b["lr"], "opd_coef": 0.0 if method.startswith("grpo") else args.opd_coef,
                    "kl_coef": args.kl_coef, "lora_r": None, "lr_schedule": "linear", "guide_share": 0.0},
        "eval": {"split": "eval_seen", "num_tasks": b["eval_tasks"], "every": b["eval_every"]},
    }


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's settings as stored with its results: the flags, the budget actually
    used (``--full`` replaces it) and the model by name; holds every key of ``PAPER``."""
    return {**bench_results.config_of(args), **budget(args), "model": Path(str(args.model)).name}


def departures(args: argparse.Namespace) -> list[str]:
    """Each setting that differs from the paper's, as ``name ours (paper theirs)``."""
    return bench_results.departures(run_config(args), PAPER, PAPER_LABELS)


def header(args: argparse.Namespace) -> str:
    """The table's header: what was run, then every departure from the paper's settings."""
    b = budget(args)
    diff = departures(args)
    return (f"TextWorld eval_seen ({b['eval_tasks']} games, greedy), {args.model}, {b['iterations']} updates of "
            f"{b['tasks_per_iteration']} tasks x {b['group']} episodes, lr {b['lr']}, KL coef {args.kl_coef}, "
            f"seeds {args.seeds}\n"
            + (f"differs from the paper: {'; '.join(diff)}" if diff else "every compared setting is the paper's"))


# -- stage 1 ------------------------------------------------------------------------

def stage1(args: argparse.Namespace) -> str:
    """The stage-1 model the SEED runs start from: the same recipe and cache as
    ``seed-agents train`` (``seed_agents.stage1.auto``), here cached under ``--out``."""
    from seed_agents.config import TrainConfig
    from seed_agents.stage1.auto import stage1_model

    t0 = time.perf_counter()
    cfg = TrainConfig.model_validate(train_config("seed", 0, args, None))
    path = stage1_model(cfg)
    if path is None:
        raise SystemExit("stage 1 does not apply to the SEED config; see seed_agents/stage1/auto.py")
    print(f"stage 1 ready in {time.perf_counter() - t0:.0f}s: {path}", flush=True)
    return str(path)


# -- running ------------------------------------------------------------------------

def run_one(method: str, seed: int, args: argparse.Namespace, stage1_model: str | None) -> dict[str, Any]:
    cfg = train_config(method, seed, args, stage1_model)
    out = Path(cfg["out"])
    cfg_path = out.parent / f"{method}-s{seed}.yaml"
    if (out / "summary.json").exists():  # finished before: a re-run of the benchmark reuses it
        # any other setting (a new stage-1 model included) is another experiment
        if not cfg_path.exists() or yaml.safe_load(cfg_path.read_text()) != cfg:
            raise SystemExit(f"{out} holds a finished run with other settings; use another --out")
        wall = json.loads((out / "summary.json").read_text()).get("wall_s")  # of its last (resumed) part
        return {"method": method, "seed": seed, "out": str(out), "rc": 0, "wall_s": wall, "reused": True}
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    resume = ["--resume"] if (out / "checkpoints").exists() and any((out / "checkpoints").iterdir()) else []
    if (out / "metrics.jsonl").exists() and not resume:
        import shutil
        shutil.rmtree(out)  # a run killed before its first checkpoint: start it again
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    with open(out.parent / f"{method}-s{seed}.log", "w") as log:
        rc = subprocess.call([sys.executable, "-m", "seed_agents", "train", "--config", str(cfg_path), *resume],
                             stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    print(f"  {method:<16} seed {seed}: {'ok' if rc == 0 else f'FAILED rc={rc}, see {log.name}'} ({wall:.0f}s)", flush=True)
    if rc == 0 and (out / "summary.json").exists() and not args.keep_checkpoints:
        drop_checkpoints(out)
    return {"method": method, "seed": seed, "out": str(out), "rc": rc, "wall_s": wall}


def drop_checkpoints(out: Path) -> None:
    """A finished run's checkpoints (weights plus optimizer state, ~1.5 GB each for SmolLM2)
    are only needed to resume it; the curve lives in eval.jsonl. Nine runs would otherwise
    leave ~28 GB behind."""
    import shutil
    ckpt = out / "checkpoints"
    if ckpt.exists():
        shutil.rmtree(ckpt)


def read_curve(out: str) -> list[dict[str, Any]]:
    path = Path(out) / "eval.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- analysis (pure) ----------------------------------------------------------------

def episodes_to_threshold(curve: list[dict[str, Any]], threshold: float) -> int | None:
    """Training episodes consumed at the first evaluation reaching ``threshold``; None if never."""
    for row in sorted(curve, key=lambda r: r["episodes_consumed"]):
        if row["success_rate"] >= threshold:
            return int(row["episodes_consumed"])
    return None


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0) if xs else (float("nan"), 0.0)


def summarize_method(curves: dict[int, list[dict[str, Any]]], threshold: float) -> dict[str, Any]:
    """Per-method figures over seeds: the mean curve, episodes to threshold, area."""
    points = sorted({r["episodes_consumed"] for c in curves.values() for r in c})
    curve = []
    for p in points:
        vals = [r["success_rate"] for c in curves.values() for r in c if r["episodes_consumed"] == p]
        m, sd = mean_sd(vals)
        curve.append({"episodes": p, "mean": m, "sd": sd, "n": len(vals)})
    reach = {s: episodes_to_threshold(c, threshold) for s, c in curves.items()}
    reached = [v for v in reach.values() if v is not None]
    area = {s: statistics.fmean(r["success_rate"] for r in c) for s, c in curves.items() if c}
    final = {s: max(c, key=lambda r: r["episodes_consumed"])["success_rate"] for s, c in curves.items() if c}
    start = {s: min(c, key=lambda r: r["episodes_consumed"])["success_rate"] for s, c in curves.items() if c}
    first = [min(c, key=lambda r: r["episodes_consumed"]).get("invalid_action_rate") for c in curves.values() if c]
    last = [max(c, key=lambda r: r["episodes_consumed"]).get("invalid_action_rate") for c in curves.values() if c]
    return {"curve": curve, "to_threshold": reach, "reached": f"{len(reached)}/{len(reach)}",
            "mean_to_threshold": statistics.fmean(reached) if len(reached) == len(reach) and reached else None,
            "area": mean_sd(list(area.values())), "area_per_seed": area, "final": mean_sd(list(final.values())),
            "start": mean_sd(list(start.values())), "gain": mean_sd([final[s] - start[s] for s in final]),
            "invalid_start": mean_sd([x for x in first if x is not None]),
            "invalid_final": mean_sd([x for x in last if x is not None])}


def training_stats(outs: list[str]) -> dict[str, float | None]:
    """Means over every update of every run: the skill parse rate and the distillation
    gate (None where the method writes no skills), from each run's metrics.jsonl."""
    rows = [json.loads(x) for out in outs if (Path(out) / "metrics.jsonl").exists()
            for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    gates = [r["opd/gate"] for r in rows if r.get("opd/tokens")]
    parse = [r["skill_parse_rate"] for r in rows if "skill_parse_rate" in r]
    return {"skill_parse_rate": statistics.fmean(parse) if parse and gates else None,
            "gate": statistics.fmean(gates) if gates else None}


def report(results: dict[str, dict[str, Any]], threshold: float) -> str:
    def ms(x: tuple[float, float]) -> str:
        return f"{x[0]:.3f} ± {x[1]:.3f}"

    lines = [f"{'method':<16} {'seeds reaching':>14} {'episodes to ' + format(threshold, '.2f'):>18} "
             f"{'start':>15} {'mean (area)':>15} {'final':>15} {'final - start':>15}",
             "-" * 115]
    for m, r in results.items():
        tt = r["mean_to_threshold"]
        per_seed = ",".join("-" if v is None else str(v) for v in r["to_threshold"].values())
        lines.append(f"{m:<16} {r['reached']:>14} {(f'{tt:.0f}' if tt is not None else 'n/a') + ' [' + per_seed + ']':>18} "
                     f"{ms(r['start']):>15} {ms(r['area']):>15} {ms(r['final']):>15} {ms(r['gain']):>15}")
    lines += ["", f"{'method':<16} {'held-out invalid actions, start -> final':>42} {'training skill parse rate':>26} {'mean gate':>10}"]
    for m, r in results.items():
        t = r.get("train", {})
        fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        lines.append(f"{m:<16} {ms(r['invalid_start']) + ' -> ' + ms(r['invalid_final']):>42} "
                     f"{fmt(t.get('skill_parse_rate')):>26} {fmt(t.get('gate')):>10}")
    lines.append("")
    g, s, g1 = results.get("grpo"), results.get("seed"), results.get("grpo_stage1")
    if g and s:
        if g["mean_to_threshold"] is None or s["mean_to_threshold"] is None:
            lines.append("episodes to threshold, SEED/GRPO: n/a (a method did not reach the threshold on every seed)")
        elif g["mean_to_threshold"] == 0:
            lines.append("episodes to threshold, SEED/GRPO: n/a (GRPO was above the threshold before training)")
        else:  # SEED at 0 episodes (above it from the start, the stage-1 head start) is a real 0.00
            lines.append(f"episodes to threshold, SEED/GRPO: {s['mean_to_threshold'] / g['mean_to_threshold']:.2f}")
        if g["area"][0] > 0:
            lines.append(f"mean held-out success, SEED/GRPO: {s['area'][0] / g['area'][0]:.2f} "
                         "(SEED starts from the stage-1 model: its head start counts here)")
    if g1 and s and g1["area"][0] > 0:
        lines.append(f"mean held-out success, SEED/GRPO from the stage-1 model: {s['area'][0] / g1['area'][0]:.2f} "
                     "(same start: what the distillation term adds)")
    r = results.get("seed_rule")
    if g1 and r and g1["area"][0] > 0:
        lines.append(f"mean held-out success, SEED with rule-based skills/GRPO from the stage-1 model: "
                     f"{r['area'][0] / g1['area'][0]:.2f} (same start, skills the policy did not write)")
    for m, base in SAME_START_BASE.items():
        if m in results and base in results:
            lines.append(paired_line(m, results[m], base, results[base]))
    return "\n".join(lines)


def paired(results: dict[str, dict[str, Any]]) -> dict[str, stats.Paired]:
    """Each SEED variant minus GRPO from the same start, seed by seed, on mean held-out
    success over the curve (a seed's methods share its held-out games and training tasks)."""
    return {f"{m} - {base}": stats.compare(results[m]["area_per_seed"], results[base]["area_per_seed"])
            for m, base in SAME_START_BASE.items() if m in results and base in results}


def paired_line(name: str, a: dict[str, Any], base_name: str, base: dict[str, Any]) -> str:
    """The paired difference in mean held-out success: its mean ± sd, how many seeds each
    side won (means of k/12: float noise is a tie), its 95% bootstrap interval and the
    seeds a paired t-test would need to detect it (``bench/stats.py``)."""
    p = stats.compare(a["area_per_seed"], base["area_per_seed"])
    if not p.n:
        return f"paired by seed, {name} - {base_name}: no common seeds"
    ci = "n/a (one seed)" if p.ci is None else f"[{p.ci[0]:+.3f}, {p.ci[1]:+.3f}]"
    need = "no effect to detect" if p.seeds_needed is None else f"{p.seeds_needed} seeds"
    return (f"paired by seed, mean held-out success {name} - {base_name}: {p.mean:+.3f} ± {p.sd:.3f} over {p.n} seeds "
            f"({p.higher} higher, {p.lower} lower, {p.equal} equal); 95% bootstrap CI {ci}; "
            f"to detect it (paired t, alpha 0.05, power 0.8): {need}")


def plot(results: dict[str, dict[str, Any]], path: Path, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--"), ("X", "-.")]
    for i, (m, r) in enumerate(results.items()):
        xs = [p["episodes"] for p in r["curve"]]
        ys = [p["mean"] for p in r["curve"]]
        sd = [p["sd"] for p in r["curve"]]
        marker, line = styles[i % len(styles)]  # identical curves stay visible
        ax.plot(xs, ys, marker=marker, linestyle=line, label=m)
        ax.fill_between(xs, [y - d for y, d in zip(ys, sd)], [y + d for y, d in zip(ys, sd)], alpha=0.15)
    ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("training episodes consumed")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend()
    ax.set_title("TextWorld, SmolLM2-135M: mean ± sd over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=list(MAIN_METHODS), choices=MAIN_METHODS,
                   help="The main methods to run (default all three); e.g. only the same-start pair "
                        "`seed grpo_stage1` when the time is short.")
    p.add_argument("--ablations", nargs="*", default=[],
                   choices=[m for m in ALL_METHODS if m not in MAIN_METHODS])
    p.add_argument("--model", default="smollm2-135m", help="Base model (alias or folder).")
    p.add_argument("--iterations", type=int, default=4, help="Updates per run.")
    p.add_argument("--tasks-per-iteration", dest="tasks_per_iteration", type=int, default=2)
    p.add_argument("--group", type=int, default=4, help="Episodes per task per update (G).")
    p.add_argument("--num-tasks", dest="num_tasks", type=int, default=16, help="Distinct training games, cycled.")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--opd-coef", dest="opd_coef", type=float, default=0.01)
    p.add_argument("--kl-coef", dest="kl_coef", type=float, default=0.0, help="0 here: saves the reference forward on 2 cores.")
    p.add_argument("--temperature", type=float, default=0.7, help="Rollout temperature, every method.")
    p.add_argument("--max-turns", dest="max_turns", type=int, default=3)
    p.add_argument("--max-tokens", dest="max_tokens", type=int, default=12)
    p.add_argument("--skill-max-tokens", dest="skill_max_tokens", type=int, default=128)
    p.add_argument("--eval-tasks", dest="eval_tasks", type=int, default=12, help="Held-out eval_seen games.")
    p.add_argument("--eval-every", dest="eval_every", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.5, help="Held-out success to reach.")
    p.add_argument("--stage1-tasks", dest="stage1_tasks", type=int, default=8)
    p.add_argument("--stage1-group", dest="stage1_group", type=int, default=2)
    p.add_argument("--stage1-epochs", dest="stage1_epochs", type=float, default=3.0)
    p.add_argument("--external-url", dest="external_url", default="http://127.0.0.1:8000")
    p.add_argument("--external-model", dest="external_model", default="analyzer")
    p.add_argument("--external-tokenizer", dest="external_tokenizer", default=None)
    p.add_argument("--parallel", type=int, default=2, help="Runs at once.")
    p.add_argument("--threads", type=int, default=1, help="Torch threads per run.")
    p.add_argument("--full", action="store_true", help="The paper's budget (GPU).")
    p.add_argument("--keep-checkpoints", dest="keep_checkpoints", action="store_true",
                   help="Keep each finished run's checkpoints (by default they are deleted: ~3 GB a run).")
    p.add_argument("--out", type=Path, default=Path("runs/bench/sample_efficiency"))
    p.add_argument("--stage1-only", dest="stage1_only", action="store_true", help=argparse.SUPPRESS)
    bench_results.add_results_args(p)
    return p


def raw_results(methods: list[str], runs: list[dict[str, Any]], results: dict[str, dict[str, Any]],
                wall_s: float) -> dict[str, Any]:
    """What docs/results/sample_efficiency.json keeps: every evaluation point of every
    (method, seed) as eval.jsonl wrote it, each run's exit and wall time, the summary the
    table prints and the paired comparisons."""
    curves = {m: {str(r["seed"]): read_curve(r["out"]) for r in runs if r["method"] == m and r["rc"] == 0} for m in methods}
    return {"curves": curves,
            "runs": [{k: r.get(k) for k in ("method", "seed", "rc", "wall_s", "reused")} for r in runs],
            "summary": results, "paired": {k: asdict(v) for k, v in paired(results).items()}, "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = bench_results.now()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)

    if args.stage1_only:
        print(f"STAGE1_MODEL={stage1(args)}")
        return 0
    methods = [*dict.fromkeys([*args.methods, *args.ablations])]
    t0 = time.perf_counter()
    stage1_model = None
    if any(m in STAGE1_START for m in methods):
        # in a subprocess: this process only waits on runs and must not keep a model (or its threads)
        proc = subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--stage1-only"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
        found = [ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("STAGE1_MODEL=")]
        if proc.returncode != 0 or not found:
            print(proc.stdout[-3000:])
            raise SystemExit(f"stage 1 failed (exit {proc.returncode})")
        stage1_model = found[0]
        print(f"stage 1 model: {stage1_model} ({time.perf_counter() - t0:.0f}s; "
              f"{'reused from the cache' if 'using the cached' in proc.stdout else 'built now'})", flush=True)
    jobs = [(m, s) for s in args.seeds for m in methods]
    print(f"{len(jobs)} runs ({', '.join(methods)} x seeds {args.seeds}), {args.parallel} at a time", flush=True)
    with ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda job: run_one(*job, args, stage1_model), jobs))
    # A run killed by the kernel (two runs' update steps peaking together can exhaust memory)
    # resumes from its last checkpoint, alone.
    for i, r in enumerate(runs):
        if r["rc"] < 0:
            print(f"  {r['method']} seed {r['seed']} was killed (signal {-r['rc']}); resuming it alone", flush=True)
            runs[i] = run_one(r["method"], r["seed"], args, stage1_model)

    results = {}
    for m in methods:
        curves = {r["seed"]: read_curve(r["out"]) for r in runs if r["method"] == m and r["rc"] == 0}
        if curves:
            results[m] = summarize_method(curves, args.threshold)
            results[m]["train"] = training_stats([r["out"] for r in runs if r["method"] == m and r["rc"] == 0])
    text = report(results, args.threshold)
    wall = time.perf_counter() - t0
    b = budget(args)
    print("\n" + header(args))
    print(text)
    reused = sum(bool(r.get("reused")) for r in runs)
    print(f"total wall time {wall / 60:.1f} min" + (f" ({reused} of {len(runs)} runs finished in an earlier invocation "
                                                    "and were reused)" if reused else ""))
    (args.out / "results.json").write_text(json.dumps({"budget": b, "seeds": args.seeds, "threshold": args.threshold,
                                                        "results": results, "runs": runs, "wall_s": wall}, indent=2))
    plot(results, args.out / "sample_efficiency.png", args.threshold)
    bench_results.write_result("sample_efficiency", {**run_config(args), "methods": methods},
                               raw_results(methods, runs, results, wall), paper=PAPER, labels=PAPER_LABELS,
                               started_at=started, results_dir=args.results_dir)
    print(f"wrote {args.out / 'results.json'} and {args.out / 'sample_efficiency.png'}")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
