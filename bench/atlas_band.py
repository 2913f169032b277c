"""Where does SmolLM2 sit on the atlas difficulty knob? Success per level at the training temperature.

RL moves a small model only where its success is neither rare nor certain (roughly
20-60%: docs/architecture.md, "band" in the glossary); a GRPO group whose episodes all get
the same reward teaches nothing. This script plays the policy on training tasks of each
level of ``examples/atlas_tasks.py`` (one lookup; a lookup then ``add``; two lookups then
``add``), ``--group`` episodes per task at each of ``--temperatures``, in two modes:

- ``forced``: the first turn must call a tool (``tool_choice="any"``, the tools' grammar);
- ``auto``: every turn chooses between answering and calling;
- asked for by name, for level 1 (a lookup, then ``add``), where a forced first call is
  followed by an answer in every episode: ``forced-two``, the first two turns must call a
  tool; ``lookup-add``, the first must call ``lookup`` and the second ``add`` (the tool
  sequence scripted, the arguments and the answer the model's).

Per level and mode it prints the success rate (the binary ``answer_reward``), the three
levels of ``score_levels`` (a call parsed / the right calls / the right answer), and the
fraction of groups with zero reward variance, and marks the cells inside the band.
Raw per-task counts go to ``docs/results/atlas_band.json``.

The temperature is the other knob: the band is about *training* success, and greedy
held-out success can sit far above what T 0.7 samples (level 0 forced: 0.41 greedy against
0.13 sampled in docs/results/learning_curve.json). Several ``--temperatures`` play the same
tasks and seeds side by side in one run; ``--result-name`` keeps such a sweep beside the
level probe instead of replacing it:

    .venv/bin/python bench/atlas_band.py --note "nothing else ran"
    .venv/bin/python bench/atlas_band.py --levels 0 --modes forced --temperatures 0.2 0.35 0.5 0.7 \
        --tasks 16 --group 8 --result-name atlas_band_temperature   # where level 0 meets the band
    .venv/bin/python bench/atlas_band.py --tasks 2 --group 2 --levels 0 --results-dir runs/smoke   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ and examples/ are on the path
from bench.results import add_results_args, config_of, now, write_result  # noqa: E402

MODES = ("forced", "auto", "forced-two", "lookup-add")  # examples.atlas_tasks.BUILDERS's keys
DEFAULT_MODES = ("forced", "auto")
BAND = (0.2, 0.6)
SCORES = ("parsed", "right_calls", "right_answer")


def play(mode: str, tasks: list[Any], llm: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One record per episode: temperature, task, level, reward, fault and the three levels."""
    import examples.atlas_tasks as atlas
    from examples.atlas_tasks import answer_reward, score_levels
    from seed_agents.capture import capture
    from seed_agents.config.core import RunnerConfig
    from seed_agents.runner import EpisodeRunner

    graph = getattr(atlas, atlas.BUILDERS[mode])(llm, max_turns=args.max_turns)
    runner = EpisodeRunner(graph, RunnerConfig(group_size=args.group, concurrency=args.concurrency, progress=False),
                           reward_fn=answer_reward, seed=args.seed)
    with capture():
        trajs = asyncio.run(runner.run(tasks, group_prefix=mode))
    by_id = {t.task_id: t for t in tasks}
    return [{"temperature": llm.sampling.temperature, "mode": mode, "task_id": tr.task_id,
             "level": by_id[tr.task_id].data["level"], "reward": tr.reward,
             "fault": tr.fault.value if tr.fault else None, "steps": tr.steps, "stop_reason": tr.stop_reason.value,
             "tokens": sum(len(c.completion_ids) for c in tr.policy_calls),
             **score_levels(by_id[tr.task_id], tr)} for tr in trajs]


# -- analysis (pure) ----------------------------------------------------------------------

def cell_figures(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """One (level, mode) cell: rates over the episodes that did not fault, and the share
    of groups (a task's episodes) whose rewards are all equal."""
    ok = [e for e in episodes if e["fault"] is None]
    groups: dict[str, list[float]] = {}
    for e in ok:
        groups.setdefault(e["task_id"], []).append(e["reward"])

    def rate(values: list[float | bool]) -> float | None:
        return statistics.fmean(float(v) for v in values) if values else None

    return {"episodes": len(episodes), "faults": len(episodes) - len(ok), "groups": len(groups),
            "success": rate([e["reward"] >= 1.0 for e in ok]),
            **{k: rate([e[k] for e in ok]) for k in SCORES},
            "zero_variance_groups": rate([len(set(r)) == 1 for r in groups.values()]),
            "answer_disagrees_with_reward": sum((e["reward"] >= 1.0) != e["right_answer"] for e in ok),
            "mean_tokens": rate([e["tokens"] for e in ok]), "mean_steps": rate([e["steps"] for e in ok])}


def figures(episodes: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{mode: {level: cell}}`` over every (mode, level) present."""
    cells: dict[str, dict[str, dict[str, Any]]] = {}
    for mode in dict.fromkeys(e["mode"] for e in episodes):
        for level in sorted({e["level"] for e in episodes if e["mode"] == mode}):
            cells.setdefault(mode, {})[str(level)] = cell_figures(
                [e for e in episodes if e["mode"] == mode and e["level"] == level])
    return cells


def in_band(success: float | None) -> bool:
    return success is not None and BAND[0] <= success <= BAND[1]


def figures_by_temperature(episodes: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """``{temperature: {mode: {level: cell}}}``, temperatures as ``%g`` strings (JSON keys)."""
    temps = dict.fromkeys(e["temperature"] for e in episodes)
    return {f"{t:g}": figures([e for e in episodes if e["temperature"] == t]) for t in temps}


def report(cells: dict[str, dict[str, dict[str, Any]]], temperature: float) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    lines = [f"T {temperature:g}; band {pct(BAND[0])}-{pct(BAND[1])} success marked *", "",
             f"{'mode':<7} {'level':>5} {'episodes':>8} {'success':>8} {'call parses':>11} {'right calls':>11} "
             f"{'right answer':>12} {'zero-var groups':>15}", "-" * 86]
    for mode, by_level in cells.items():
        for level, c in by_level.items():
            mark = "*" if in_band(c["success"]) else " "
            lines.append(f"{mode:<7} {level:>5} {c['episodes']:>8} {pct(c['success']):>7}{mark} {pct(c['parsed']):>11} "
                         f"{pct(c['right_calls']):>11} {pct(c['right_answer']):>12} "
                         f"{pct(c['zero_variance_groups']):>15}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="Local backend model (alias, folder or hub id).")
    p.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2], help="Difficulty levels to play.")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES),
                   help="First turn forced, auto (both by default); the first two turns forced to any tool "
                        "(forced-two) or to lookup then add (lookup-add).")
    p.add_argument("--tasks", type=int, default=8, help="Training tasks per level (the manifest's first ones).")
    p.add_argument("--group", type=int, default=4, help="Episodes per task (the GRPO group).")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.7],
                   help="Sampling temperatures (training's), each played on the same tasks and seed.")
    p.add_argument("--max-tokens", type=int, default=48, help="Completion tokens per turn.")
    p.add_argument("--max-turns", type=int, default=4, help="Agent turns per episode.")
    p.add_argument("--concurrency", type=int, default=32, help="Episodes in flight.")
    p.add_argument("--batch-size", type=int, default=16, help="Local backend: requests per generate call.")
    p.add_argument("--threads", type=int, default=2, help="Torch threads.")
    p.add_argument("--seed", type=int, default=0, help="Runner seed (reproducible sampling).")
    p.add_argument("--note", default="", help="What else ran on the machine (it shapes the wall time, not the rates).")
    p.add_argument("--result-name", default="atlas_band",
                   help="Result file stem under --results-dir (a sweep keeps the level probe).")
    add_results_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.result_name.replace("_", "").replace("-", "").isalnum():
        p.error("--result-name: letters, digits, '-' and '_' only")
    if any(not 0.0 < t <= 10.0 for t in args.temperatures) or len(set(args.temperatures)) != len(args.temperatures):
        p.error("--temperatures: distinct values in (0, 10] (0 would be greedy: one episode a group)")
    import torch

    from examples.atlas_tasks import make_tasks
    from seed_agents.app.builders import open_chat_model
    from seed_agents.config.core import BackendConfig
    from seed_agents.types import SamplingParams

    torch.set_num_threads(args.threads)
    started_at, t0 = now(), time.perf_counter()
    tasks = make_tasks("train", per_level=args.tasks, levels=args.levels)
    # fp32 as its stored results were: backend.precision defaults to auto (bf16 where the CPU has it)
    llm = open_chat_model(BackendConfig(kind="local", model=args.model, max_batch_size=args.batch_size,
                                        precision="float32"),
                          SamplingParams(max_tokens=args.max_tokens, temperature=args.temperatures[0]))
    episodes: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    try:
        for temperature in args.temperatures:  # one backend (one copy of the weights), a chat model per T
            at_t = llm.model_copy(update={"sampling": llm.sampling.model_copy(update={"temperature": temperature})})
            for mode in args.modes:
                t = time.perf_counter()
                episodes += play(mode, tasks, at_t, args)
                walls[f"{temperature:g}/{mode}"] = time.perf_counter() - t
                print(f"T {temperature:g} {mode}: {len(tasks) * args.group} episodes in "
                      f"{walls[f'{temperature:g}/{mode}']:.0f}s", flush=True)
    finally:
        close = getattr(llm.backend, "close", None)
        if close is not None:
            close()
    by_t = figures_by_temperature(episodes)
    band = []
    for temperature, cells in by_t.items():
        print(report(cells, float(temperature)), end="\n\n")
        band += [f"T {temperature} {mode} level {level}" for mode, by in cells.items() for level, c in by.items()
                 if in_band(c["success"])]
    print("in the band: " + (", ".join(band) if band else "none"))
    write_result(args.result_name, config_of(args),
                 {"cells_by_temperature": by_t, "in_band": band, "band": list(BAND), "wall_s": walls,
                  "total_wall_s": time.perf_counter() - t0,
                  "per_task": _per_task(episodes)},
                 started_at=started_at, results_dir=args.results_dir)
    return 0


def _per_task(episodes: list[dict[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """``{"T/mode": {task_id: [successes, episodes]}}``: enough to recompute every rate."""
    out: dict[str, dict[str, list[int]]] = {}
    for e in episodes:
        if e["fault"] is None:
            cell = out.setdefault(f"{e['temperature']:g}/{e['mode']}", {}).setdefault(e["task_id"], [0, 0])
            cell[0] += int(e["reward"] >= 1.0)
            cell[1] += 1
    return out


if __name__ == "__main__":
    raise SystemExit(main())
