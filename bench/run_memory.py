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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--updates", type=int, default=4, help="Updates per run (the peak grew over a 30-update run).")
    ap.add_argument("--repeats", type=int, default=1, help="Pairs of runs (on and off).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group", type=int, default=8, help="Episodes per task (the curve's 8; fewer for a quick check).")
    ap.add_argument("--note", default="", help="What else ran on the machine.")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if args.updates < 1 or args.repeats < 1:
        ap.error("--updates and --repeats: at least 1")
    stop_children_on_sigterm()
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
        "run_memory", config,
        {"runs": sides[True] + sides[False], "median": {"on" if r else "off": m for r, m in med.items()},
         "rss_on_over_off": rss, "step_on_over_off": step, "same_batches": same_batches},
        started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
