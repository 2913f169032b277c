"""The README's main job as a new user runs it: `seed-agents train` with no config.

Targets (issue: the product learns out of the box), all from the default command on the
2-core machine: held-out success up by at least 25 points, the whole command within 15
minutes (stage 1 included, if any), peak RSS at most 4 GB. Beside it, GRPO from the same
start (`--skills.source none`), the same seed and tasks, so the summary's SEED gain reads
against the outcome-only baseline (one seed each: a pilot, not a test between them).

Each side is one `seed-agents train` process started from an empty folder (its run goes to
the default `runs/train` there); its wall time is the whole command's, its peak RSS the
process's own (``os.wait4``). The summary is the one the command printed and wrote
(``summary.json``): held-out success before and after, the share of held-out episodes that
called the right tool, the share of answers carrying chat-template markup.

    .venv/bin/python -m bench.main_job --note "nothing else ran"          # ~30 min on 2 cores

Writes ``docs/results/main_job.json`` (``--results-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import results as bench_results
from bench.children import stop_children_on_sigterm

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"gain_at_least": 0.25, "wall_s_at_most": 900.0, "peak_rss_gb_at_most": 4.0}
SIDES = {"default": [], "grpo": ["--skills.source", "none"]}
"""Each side's flags after `seed-agents train`: the default command, and GRPO from the same start."""
SPLIT_FLAGS = {"heldout": [],
               "validation": ["--eval.tasks", "seed_agents.tools.atlas:validation_tasks", "--eval.num-tasks", "150"],
               "test": ["--eval.tasks", "seed_agents.tools.atlas:final_test_tasks", "--eval.num-tasks", "300"]}
"""The flags that point both sides' evaluations at a split (seed_agents.tools.atlas): none for
``heldout``, the command's own held-out set, on which past figures were tuned and reported."""


def run_side(name: str, flags: list[str], work: Path) -> dict[str, Any]:
    """One `seed-agents train` process from an empty folder: its exit, wall time, peak RSS
    and the summary it wrote."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "train.log"
    cmd = [sys.executable, "-m", "seed_agents", "train", *flags]
    print(f"{name}: seed-agents train {' '.join(flags)} (log {log})", flush=True)
    code = bench_results.code_version()  # each side's own: the checkout may move while the other runs
    t0 = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    summary_path = folder / "runs" / "train" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    # the child resets its high-water mark per phase (which resets ru_maxrss too) and carries the
    # process's peak itself: the larger of the two is the process's peak
    peak = max(usage.ru_maxrss / 1024**2, summary.get("peak_rss_gb") or 0.0)
    side = {"exit": proc.returncode, "wall_s": wall, "peak_rss_gb": peak, "summary": summary, "code": code,
            "log_tail": log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]}
    print(f"{name}: exit {proc.returncode}, {wall:.0f} s, peak RSS {side['peak_rss_gb']:.2f} GB", flush=True)
    return side


def verdicts(side: dict[str, Any]) -> dict[str, Any]:
    """Each target met or missed, from the default side's own figures."""
    heldout = side["summary"].get("heldout") or {}
    gain = heldout.get("gain")
    return {
        "gain": gain, "gain_met": gain is not None and gain >= TARGETS["gain_at_least"],
        "wall_met": side["wall_s"] <= TARGETS["wall_s_at_most"],
        "rss_met": side["peak_rss_gb"] <= TARGETS["peak_rss_gb_at_most"],
        "exit_ok": side["exit"] == 0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", default=",".join(SIDES), help=f"Comma list of {', '.join(SIDES)}.")
    p.add_argument("--work", type=Path, default=None, help="Folder for the runs (default: a temporary one, deleted).")
    p.add_argument("--note", default="", help="What else ran on the machine (it shapes the wall time).")
    p.add_argument("--result-name", default="main_job", help="The result file's name (a variant: main_job_NAME).")
    p.add_argument("--split", choices=list(SPLIT_FLAGS), default="heldout",
                   help="Which tasks the evaluations play: heldout (the command's own), validation (for choosing "
                        "settings) or test (read once).")
    bench_results.add_results_args(p)
    args = p.parse_args(argv)
    stop_children_on_sigterm()
    started, code = bench_results.now(), bench_results.code_version()
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        p.error(f"unknown side(s) {', '.join(unknown)}; sides: {', '.join(SIDES)}")
    with tempfile.TemporaryDirectory(prefix="main-job-") as tmp:
        work = args.work or Path(tmp)
        runs = {name: run_side(name, [*SIDES[name], *SPLIT_FLAGS[args.split]], work) for name in sides}
    results: dict[str, Any] = {"sides": runs, "targets": TARGETS}
    if "default" in runs:
        results["verdicts"] = verdicts(runs["default"])
    if {"default", "grpo"} <= runs.keys():
        gains = [(runs[s]["summary"].get("heldout") or {}).get("gain") for s in ("default", "grpo")]
        results["default_minus_grpo"] = None if None in gains else gains[0] - gains[1]
    config = {"sides": {s: [*SIDES[s], *SPLIT_FLAGS[args.split]] for s in sides}, "split": args.split, "note": args.note}
    bench_results.write_result(args.result_name, config, results, started_at=started, results_dir=args.results_dir,
                               code=code)
    for key, value in results.get("verdicts", {}).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
