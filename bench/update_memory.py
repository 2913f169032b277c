"""Peak memory of a training iteration with and without gradient checkpointing.

Each side is one ``seed-agents train`` iteration (rollout + update) in its own process,
with the settings of ``bench/sample_efficiency.py`` (SmolLM2, TextWorld, 2 tasks x 4
episodes, 3 turns, full fine-tuning, fp32) and the same seed; the only difference is
``trainer.gradient_checkpointing``. Sides alternate (off, on, off, on, ...) so drift on a
shared machine hits both. Reported per side: the process's peak RSS (``seed_agents.memory``), the
update time (``step_time - time/rollout_s`` from metrics.jsonl) and the batch's rows.
Rollouts are sampled, so the two sides' batches are alike but not identical; the
update time is what checkpointing costs, the peak RSS is what it saves.

    .venv/bin/python bench/update_memory.py              # ~5 min on 2 cores
    .venv/bin/python bench/update_memory.py --repeats 2

``--demo MODEL_DIR`` runs the embedded demo's iteration instead (``seed-agents train`` with no
config: bf16 where the CPU has it, 2 tasks x 4 episodes, SEED) from the stage-1 model in
``MODEL_DIR`` (stage 1 not run), written as ``update_memory_demo``: what the demo's update
pays for recomputing, and what keeping its activations costs in memory.

The "on" side recomputes at every update (``trainer.keep_activations_gb 0``, the default): a
budget above 0 would let the trainer keep activations that fit.

Every run goes to ``docs/results/update_memory.json`` (``--results-dir``; ``--result-name``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402

# the paper's iteration: 16 tasks x 8 episodes of up to 30 turns with a 3B model (on GPUs)
PAPER = {"model": "Qwen2.5-3B-Instruct", "tasks_per_iteration": 16, "group_size": 8, "max_turns": 30}
LABELS = {"model": "model", "tasks_per_iteration": "tasks/update", "group_size": "group size", "max_turns": "max turns"}
# the process's peak across the trainer's per-phase resets (ru_maxrss reads the peak since the last one)
CHILD = (
    "import resource, sys\n"
    "from seed_agents.app.cli import main\n"
    "from seed_agents.memory import PEAK_RSS\n"
    "rc = main(['train', '--config', sys.argv[1]])\n"
    "peak = PEAK_RSS.process_gb()\n"
    "kb = round(peak * 2**20) if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "print('PEAK_RSS_KB=' + str(kb))\n"
    "sys.exit(rc)\n"
)


def config(out: Path, checkpointing: bool, args: argparse.Namespace) -> dict:
    # "on" recomputes at every update, whatever trainer.keep_activations_gb's default becomes
    trainer = {"gradient_checkpointing": checkpointing, "keep_activations_gb": 0}
    if args.demo:
        from seed_agents.config import TrainConfig

        demo = TrainConfig().model_dump(mode="json")
        demo["backend"]["model"] = args.demo
        demo["trainer"].update(trainer)
        return {**demo, "iterations": 1, "seed": args.seed, "out": str(out), "stage1": {**demo["stage1"], "run": "off"}}
    return {
        "env": "textworld", "split": "train", "num_tasks": 16, "tasks_per_iteration": 2, "iterations": 1,
        "seed": args.seed, "out": str(out),
        # fp32 as its stored results were: backend.precision defaults to auto (bf16 where the CPU has it)
        "backend": {"kind": "local", "model": args.model, "max_batch_size": 16, "precision": "float32"},
        "sampling": {"max_tokens": 12, "temperature": 0.7},
        "runner": {"group_size": 4, "concurrency": 16, "progress": False},
        "agent": {"max_turns": 3, "history": "chat"},
        "skills": {"source": "self", "max_tokens": 128, "injector": "system", "failures": "write"},
        "stage1": {"run": "off"},
        # full weights and TRL's schedule, as its stored results were (the defaults moved)
        "trainer": {"learning_rate": 2e-5, "opd_coef": 0.01, "kl_coef": 0.0, "lora_r": None, "lr_schedule": "linear",
                    **trainer},
    }


def run_side(checkpointing: bool, i: int, tmp: Path, args: argparse.Namespace) -> dict:
    out = tmp / f"{'on' if checkpointing else 'off'}-{i}"
    cfg_path = tmp / f"{out.name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(out, checkpointing, args)))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(cfg_path)], capture_output=True, text=True, env=env, cwd=ROOT)
    peak = [ln.split("=", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("PEAK_RSS_KB=")]
    if proc.returncode != 0 or not peak:
        raise SystemExit(f"train failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    update_s = float(row["step_time"]) - float(row["time/rollout_s"])
    side = {"checkpointing": checkpointing, "peak_rss_gb": int(peak[0]) / 1024**2, "update_s": update_s,
            "rows": float(row["rows"])}
    print(f"  gradient checkpointing {'on ' if checkpointing else 'off'}: peak RSS {side['peak_rss_gb']:.2f} GB, "
          f"update {update_s:.1f} s, {side['rows']:.0f} rows", flush=True)
    return side


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=1, help="Pairs of runs (off, on).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="Torch threads per run.")
    ap.add_argument("--demo", default=None, metavar="MODEL_DIR",
                    help="Run the embedded demo's iteration from this stage-1 model folder (stage 1 not run).")
    ap.add_argument("--note", default="", help="What else ran on the machine (it shapes the times).")
    ap.add_argument("--result-name", default=None,
                    help="Result file name (default: update_memory, with --demo update_memory_demo).")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if args.demo is not None and not Path(args.demo).is_dir():
        ap.error(f"--demo {args.demo}: no such model folder")
    name = args.result_name or ("update_memory_demo" if args.demo else "update_memory")
    if not name.startswith("update_memory") or not name.replace("_", "").isalnum():
        ap.error("--result-name: update_memory or update_memory_<letters, digits, _>")
    started = bench_results.now()
    sides: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.repeats):
            order = (False, True) if i % 2 == 0 else (True, False)
            for gc in order:
                sides[gc].append(run_side(gc, i, Path(d), args))
    med = {gc: {k: statistics.median(s[k] for s in runs) for k in ("peak_rss_gb", "update_s")} for gc, runs in sides.items()}
    print(f"\nmedian of {args.repeats}: peak RSS off {med[False]['peak_rss_gb']:.2f} GB, on {med[True]['peak_rss_gb']:.2f} GB "
          f"(on/off {med[True]['peak_rss_gb'] / med[False]['peak_rss_gb']:.2f}); update off {med[False]['update_s']:.1f} s, "
          f"on {med[True]['update_s']:.1f} s (on/off {med[True]['update_s'] / med[False]['update_s']:.2f})")
    shared = config(Path("out"), False, args)  # the settings both sides share, flattened for the header
    train_config = {k: v for k, v in shared.items() if k != "out"}
    if args.demo:  # the folder is this machine's: the file names what it holds
        train_config["backend"] = {**train_config["backend"], "model": "<stage-1 model of smollm2-135m>"}
    bench_results.write_result(
        name, {**bench_results.config_of(args), "demo": args.demo is not None,
               "model": "smollm2-135m (stage 1)" if args.demo else Path(str(args.model)).name,
               "tasks_per_iteration": shared["tasks_per_iteration"],
               "group_size": shared["runner"]["group_size"], "max_turns": shared["agent"]["max_turns"],
               "train_config": train_config},
        {"runs": [s for gc in (False, True) for s in sides[gc]],
         "median": {"off" if not gc else "on": m for gc, m in med.items()},
         "rss_on_over_off": med[True]["peak_rss_gb"] / med[False]["peak_rss_gb"],
         "update_on_over_off": med[True]["update_s"] / med[False]["update_s"]},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
