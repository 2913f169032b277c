"""How long does the README's first command take, on the path before and on the path now?

The default demo (``seed-agents train`` with no config: SEED on TextWorld, SmolLM2-135M,
full fine-tuning, stage 1 first) is run on up to four paths, side by side in one invocation:

- ``before``: every prompt computed whole (engine ``reuse_kv false``: no shared batch
  prefix, no per-episode turn cache, and ``prefix_groups false``), transformers' concatenating KV
  cache (engine ``kv_cache concat``) and ``generate`` (engine ``drop_finished false``), TRL's padded
  update layout (``trainer.chunk_tokens 0``, ``trainer.share_prefix false``, ``trainer.sampled_head
  false``), TRL's SFT head over every position in stage 1 (``stage1.completion_head false``), fp32
  everywhere;
- ``previous``: the README's command before a finished row left the decode's forward
  (engine ``drop_finished false``: transformers' ``generate``). The ``previous`` of other
  result files switched other levers: ``demo_speed_activations_runs``, every activation
  recomputed (``--trainer.keep-activations-gb 0``) when the default was briefly ``auto``;
  ``demo_speed_reuse*``, the LM head at every position, the concatenating cache, one prefix a
  batch. Each result file keeps its sides' settings;
- ``keep``: the README's command keeping an update's activations where they fit
  (``--trainer.keep-activations-gb auto``; off by default, docs/training.md);
- ``fp32``: every reuse on, fp32 (``--backend.precision float32``): the README's first
  command until ``auto`` became the default;
- ``default``: the README's first command as it is (precision and attention ``auto``: bf16
  where the CPU has bf16 instructions, with attention in fp32 where it has no AMX, as
  `train` prints; stage 1's rollouts and SFT included; fp32 on a CPU without bf16);
- ``auto``: ``--backend.precision auto --backend.attention same`` (bf16 attention too: the
  ``auto`` side of the tables before attention had an ``auto`` of its own);
- ``auto-attn32``: ``--backend.precision auto --backend.attention float32`` (attention in fp32
  over the bf16 products: bf16's decode was slower than fp32's for its attention, docs/benchmarks.md).

A side's ``local_engine`` settings are the local backend's engine options
(``seed_agents.backends.engine.LocalEngineOptions``: older paths, not in the user config),
given to its child processes through ``SEED_AGENTS_BENCH_LOCAL_ENGINE``; the rest is the
config ``train`` reads. What no setting can switch off (the local backend's batching,
everything else that changed since) runs on both sides, so the ratios understate the change
since the issue was filed.

Stage 1 (collect with the offline analyzer, then SFT) is built once per side into the
run's own cache folder (each side pays for it, as a first run does). The iterations then
start from one model, the first side's stage-1 model, on every side, so they play and
train the same workload; with ``--repeats`` above 1 their order reverses every repeat. An iteration's
time is ``time/step_s + time/sync_s`` from the run's metrics.jsonl (with ``--run-iterations`` above 1,
the median over the run's iterations: the README's command runs three) (rollouts, hindsight
skills, scoring, loss, backward, optimizer step, weight sync; model loading and start-up
are not in it and are printed apart). Goals (issue 21): an iteration at most 0.4x and stage 1
at most 0.5x of the path before, read for each side against ``before``. Writes ``docs/results/demo_speed.json``
(``--result-name`` another name: a run on other hardware keeps its own file); everything it trained is deleted at the
end (``--keep`` keeps it).

    .venv/bin/python bench/demo_speed.py --note "nothing else ran"
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is on the path
from bench.children import run_logged, stop_children_on_sigterm  # noqa: E402
from bench.results import add_results_args, config_of, now, write_result  # noqa: E402

ITERATION_GOAL = 0.4
STAGE1_GOAL = 0.5
#: the section of a side that holds the local backend's engine options, not config keys
ENGINE = "local_engine"
#: side -> the settings it changes from the embedded demo
SIDES: dict[str, dict[str, Any]] = {
    "before": {"backend": {"precision": "float32"},
               ENGINE: {"reuse_kv": False, "kv_cache": "concat", "prefix_groups": False, "drop_finished": False},
               "trainer": {"chunk_tokens": 0, "share_prefix": False, "sampled_head": False},
               "stage1": {"completion_head": False}},
    "previous": {ENGINE: {"drop_finished": False}},
    "keep": {"trainer": {"keep_activations_gb": "auto"}},
    "fp32": {"backend": {"precision": "float32"}},
    "default": {},
    "auto": {"backend": {"precision": "auto", "attention": "same"}},
    "auto-attn32": {"backend": {"precision": "auto", "attention": "float32"}},
}

#: what a run without --sides times: every side but the opt-in ``keep``
DEFAULT_SIDES = [side for side in SIDES if side != "keep"]


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def demo_config(over: dict[str, Any]) -> dict[str, Any]:
    """The embedded demo's config (TrainConfig's defaults, which configs/textworld_smollm2_cpu.yaml
    spells out) with ``over`` applied (its engine options left out: ``engine_env``), as JSON-ready data."""
    from seed_agents.config import TrainConfig

    over = {key: value for key, value in over.items() if key != ENGINE}
    return TrainConfig.model_validate(merged(TrainConfig().model_dump(mode="json"), over)).model_dump(mode="json")


def engine_env(side: str) -> dict[str, str]:
    """The environment that gives ``side``'s child processes its engine options (the defaults too)."""
    from seed_agents.backends.engine import LocalEngineOptions

    return LocalEngineOptions(**SIDES[side].get(ENGINE, {})).as_env()


def prepare_games() -> None:
    """Generate the demo's TextWorld games before any timing (``tw-make`` takes ~5-10 s a game
    the first time, then they are cached): otherwise the first side pays for them alone."""
    from seed_agents.config import TrainConfig
    from seed_agents.tools.textworld import TextWorldSuite

    cfg = TrainConfig()
    suite = TextWorldSuite()
    suite.prepare(suite.tasks(cfg.split, max(cfg.num_tasks, cfg.stage1.num_tasks)))


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run ``cmd`` (output appended to ``log``, ``env`` added to its environment); its wall
    seconds. A failure stops the benchmark with one line naming the log; a stopped benchmark
    stops the child too."""
    returncode, wall = run_logged(cmd, log, env)
    if returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[1:4])} failed (exit {returncode}); see {log}")
    return wall


def build_stage1(side: str, work: Path, log: Path) -> dict[str, Any]:
    """Stage 1 of the demo on ``side``'s path, into its own cache folder: collect and SFT
    seconds (from the stage-1 summary), the whole build's, and the model folder."""
    cfg = demo_config(merged(SIDES[side], {"stage1": {"cache_dir": str(work / f"{side}-stage1")}}))
    path = work / f"{side}-stage1.json"
    path.write_text(json.dumps(cfg))
    wall = run([sys.executable, str(Path(__file__).resolve()), "--build-stage1", str(path)], log, engine_env(side))
    done = next((work / f"{side}-stage1").glob("*/DONE"))
    summary = json.loads(done.read_text())
    return {"collect_s": summary["collect"]["wall_s"], "sft_s": summary["sft"]["wall_s"],
            "stage1_s": summary["collect"]["wall_s"] + summary["sft"]["wall_s"], "process_s": wall,
            "model": str(done.parent / "sft" / "model"),
            "parse_rate_after": summary["sft"]["parse_rate"]["after"], "episodes": summary["collect"].get("episodes")}


def iterate(side: str, work: Path, model: str, repeat: int, log: Path, iterations: int = 1) -> dict[str, Any]:
    """A demo run of ``iterations`` iterations on ``side``'s path from ``model`` (stage 1 already
    done): with one, that iteration's times; with more, each iteration's time and the medians
    over the run's iterations (the first pays one-off costs: the optimizer's state is allocated
    at its first step)."""
    out = work / f"{side}-iter-{repeat}"
    cfg = demo_config(merged(SIDES[side], {"iterations": iterations, "out": str(out), "backend": {"model": model},
                                           "stage1": {"run": "off"}}))
    path = work / f"{side}-iter-{repeat}.json"
    path.write_text(json.dumps(cfg))
    wall = run([sys.executable, "-m", "seed_agents", "train", "--config", str(path)], log, engine_env(side))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()[:iterations]]
    keep = ("time/step_s", "time/sync_s", "time/rollout_s", "time/score_s", "success_rate", "skill_parse_rate", "rows")
    each = [row["time/step_s"] + row["time/sync_s"] for row in rows]
    got = {k: statistics.median(row[k] for row in rows) for k in keep if all(k in row for row in rows)}
    return {**got, "iteration_s": statistics.median(each), "process_s": wall,
            **({"each_iteration_s": each} if iterations > 1 else {})}


def verdict(ratio: float, goal: float) -> str:
    return "met" if ratio <= goal else f"missed by {ratio - goal:.2f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                   help=f"Comma list of {', '.join(SIDES)}; ratios read against the first.")
    p.add_argument("--repeats", type=int, default=1, help="Runs per side (order alternating).")
    p.add_argument("--run-iterations", type=int, default=1,
                   help="Iterations in each run (the README's command runs 3); a run's iteration time is the median of "
                        "its iterations. 1: the first iteration of a fresh process, one-off costs included.")
    p.add_argument("--no-stage1", action="store_true",
                   help="Skip the stage-1 comparison; iterations start from --model instead.")
    p.add_argument("--model", default=None, help="With --no-stage1: the stage-1 model folder the iterations start from.")
    p.add_argument("--work", type=Path, default=None,
                   help="Working folder (default: a temporary one, removed); a side's stage 1 already built there is "
                        "reused, with the times recorded when it was built.")
    p.add_argument("--keep", action="store_true", help="Keep the working folder (checkpoints: ~1.5 GB per iteration).")
    p.add_argument("--note", default="", help="What else ran on the machine (it shapes the times).")
    p.add_argument("--result-name", default="demo_speed",
                   help="Name of the result file (default demo_speed; e.g. demo_speed_avx2 for a run on other hardware).")
    p.add_argument("--build-stage1", metavar="CONFIG", help=argparse.SUPPRESS)  # the child that builds one side
    add_results_args(p)
    args = p.parse_args(argv)
    if args.build_stage1:
        from seed_agents.config import TrainConfig
        from seed_agents.stage1.auto import stage1_model

        stage1_model(TrainConfig.model_validate(json.loads(Path(args.build_stage1).read_text())))
        return
    sides = [x for x in args.sides.split(",") if x]
    if unknown := sorted(set(sides) - set(SIDES)):
        p.error(f"unknown side {unknown[0]!r}; sides: {', '.join(SIDES)}")
    if len(sides) < 2 or len(set(sides)) < len(sides):
        p.error("--sides needs at least two different sides")
    if args.repeats < 1 or args.run_iterations < 1:
        p.error("--repeats and --run-iterations must be at least 1")
    if not args.result_name.replace("_", "").replace("-", "").isalnum():
        p.error("--result-name: letters, digits, '-' and '_' only")
    if args.no_stage1 and not args.model:
        p.error("--no-stage1 needs --model (a stage-1 model folder)")
    started = now()
    work = args.work or Path(tempfile.mkdtemp(prefix="demo-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "demo_speed.log"
    print(f"logs: {log}", flush=True)
    prepare_games()
    try:
        stage1: dict[str, Any] = {}
        model = args.model
        if not args.no_stage1:
            for side in sides:
                stage1[side] = build_stage1(side, work, log)
                print(f"stage 1 {side}: {stage1[side]['stage1_s']:.0f} s (collect {stage1[side]['collect_s']:.0f} s, "
                      f"SFT {stage1[side]['sft_s']:.0f} s)", flush=True)
            model = stage1[sides[0]]["model"]
        iterations: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for r in range(args.repeats):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                it = iterate(side, work, model, r, log, args.run_iterations)
                iterations[side].append(it)
                print(f"iteration {side} (repeat {r}): {it['iteration_s']:.0f} s (rollouts {it['time/rollout_s']:.0f} s, "
                      f"scoring {it['time/score_s']:.0f} s; process {it['process_s']:.0f} s)", flush=True)
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    base = sides[0]
    med = {side: statistics.median(i["iteration_s"] for i in its) for side, its in iterations.items()}
    ratios = {side: med[side] / med[base] for side in sides[1:]}
    results: dict[str, Any] = {"iterations": iterations, "iteration_s": med, "iteration_ratio": ratios,
                               "iteration_goal": ITERATION_GOAL,
                               "iteration_verdict": {side: verdict(x, ITERATION_GOAL) for side, x in ratios.items()}}
    print(f"\none demo iteration (median of {args.repeats} run(s) of {args.run_iterations} iteration(s)), against {base}:")
    for side in sides:
        extra = "" if side == base else (f", ratio {ratios[side]:.2f} (goal <= {ITERATION_GOAL}: "
                                         f"{results['iteration_verdict'][side]})")
        print(f"  {side:<8} {med[side]:>6.0f} s{extra}")
    if stage1:
        for side in stage1:
            stage1[side].pop("model")
        s_ratios = {side: stage1[side]["stage1_s"] / stage1[base]["stage1_s"] for side in sides[1:]}
        results.update({"stage1": stage1, "stage1_ratio": s_ratios, "stage1_goal": STAGE1_GOAL,
                        "stage1_verdict": {side: verdict(x, STAGE1_GOAL) for side, x in s_ratios.items()}})
        print(f"stage 1 (collect + SFT), against {base}:")
        for side in sides:
            extra = "" if side == base else (f", ratio {s_ratios[side]:.2f} (goal <= {STAGE1_GOAL}: "
                                             f"{results['stage1_verdict'][side]})")
            print(f"  {side:<8} {stage1[side]['stage1_s']:>6.0f} s{extra}")
    config = {k: v for k, v in config_of(args).items()
              if k not in ("work", "keep", "build_stage1", "model", "result_name")}
    write_result(args.result_name, {**config, "side_settings": {side: SIDES[side] for side in sides}}, results,
                 started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    stop_children_on_sigterm()
    main()
