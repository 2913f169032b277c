"""The end of a training run on one screen, read from its run dir alone.

``seed-agents train`` ends by printing ``format_summary`` of ``run_summary(out)`` and writing
it to summary.json. Everything in it comes from files the run wrote (eval.jsonl,
eval_trajectories.jsonl, eval_tasks.jsonl, metrics.jsonl, config.json), so a run dir copied
elsewhere, or one whose process was killed, gives the same summary, and a test can build
one from a few lines of JSON. The figures:

- held-out success before and after: the first and the last periodic evaluation's row of
  eval.jsonl, as written (greedy unless ``eval.temperature`` says otherwise);
- tool use, per evaluation, over the episodes that measured the policy (no fault): where
  every held-out task names its calls (``data["calls"]``, ``seed_agents.task_calls``), the
  share that called every tool its task names, and per tool how many of the episodes
  that needed it called it; where a task names none, the share that called any tool,
  and the summary says which it is. Where no tool was ever offered, neither;
- the share of the final answers that carry chat-template markup
  (``seed_agents.tool_calls.carries_markup``), read as the model wrote them;
- training success per update, one metrics.jsonl row each.

The caller adds what only it knows: the wall time and the learning curve's path.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path
from statistics import fmean
from typing import Any

from seed_agents.task_calls import called_the_tools, episode_calls, final_answer, task_calls
from seed_agents.tool_calls import carries_markup
from seed_agents.types import Trajectory

EVAL_TASKS = "eval_tasks.jsonl"
"""The held-out tasks a run evaluates on, written at its start: their ``data["calls"]``
are what "called the right tool" is read against."""

RIGHT_TOOL, ANY_TOOL = "right_tool", "any_tool"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of ``path`` ([] when it is not there); a half-written last line (a run
    killed mid-write) is skipped, as ``--resume`` skips it."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict)]


def _share(flags: list[bool]) -> float | None:
    return fmean(flags) if flags else None


def tool_measure(trajs: list[Trajectory], calls_by_task: dict[str, list[dict[str, Any]] | None]) -> str | None:
    """``right_tool`` where every episode's task names its calls, ``any_tool`` where one
    does not, None where no policy call was offered a tool (nothing to measure)."""
    if not any(c.tools for t in trajs for c in t.policy_calls):
        return None
    return RIGHT_TOOL if trajs and all(calls_by_task.get(t.task_id) for t in trajs) else ANY_TOOL


def evaluation(row: dict[str, Any], trajs: list[Trajectory], calls_by_task: dict[str, list[dict[str, Any]] | None],
               measure: str | None) -> dict[str, Any]:
    """One periodic evaluation: its eval.jsonl row's success and the episodes' tool use and
    answers (faulted episodes left out, as success leaves them out)."""
    measured = [t for t in trajs if t.fault is None]
    made = {t.trajectory_id: episode_calls(t)[0] for t in measured}
    answers = [a for t in measured if (a := final_answer(t)) is not None]
    out: dict[str, Any] = {"updates": row["updates"], "success_rate": row["success_rate"],
                           "episodes": row.get("episodes_measured", row.get("episodes")),
                           "tool_share": None, "markup_share": _share([carries_markup(a) for a in answers]),
                           "answers": len(answers)}
    if measure == ANY_TOOL:
        out["tool_share"] = _share([bool(made[t.trajectory_id]) for t in measured])
    elif measure == RIGHT_TOOL:
        out["tool_share"] = _share([called_the_tools(calls_by_task[t.task_id] or [], made[t.trajectory_id])
                                    for t in measured])
        needed: Counter[str] = Counter()
        called: Counter[str] = Counter()
        for t in measured:
            names = {c["name"] for c in calls_by_task[t.task_id] or []}
            used = {c.get("name") for c in made[t.trajectory_id]}
            needed.update(names)
            called.update(names & used)
        out["per_tool"] = {name: {"needed": needed[name], "called": called[name]} for name in sorted(needed)}
    return out


def run_summary(out: Path) -> dict[str, Any]:
    """The summary of the run in ``out`` (see the module's docstring); ``heldout`` is None
    where the run had no ``eval`` section."""
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").exists() else {}
    metrics = sorted((r for r in read_jsonl(out / "metrics.jsonl") if "success_rate" in r), key=lambda r: r["iteration"])
    summary: dict[str, Any] = {"run_dir": str(out), "updates": len(metrics),
                               "training_success": [r["success_rate"] for r in metrics], "heldout": None}
    rows = sorted(read_jsonl(out / "eval.jsonl"), key=lambda r: r["updates"])
    if not rows:
        return summary
    trajs: dict[int, list[Trajectory]] = {}
    for record in read_jsonl(out / "eval_trajectories.jsonl"):
        traj = Trajectory.model_validate(record)
        trajs.setdefault(int(traj.metadata.get("iteration", -1)) + 1, []).append(traj)
    calls_by_task = {t["task_id"]: task_calls(t.get("data") or {}) for t in read_jsonl(out / EVAL_TASKS)}
    measure = tool_measure([t for ts in trajs.values() for t in ts if t.fault is None], calls_by_task)
    evaluations = [evaluation(r, trajs.get(r["updates"], []), calls_by_task, measure) for r in rows]
    before, after = evaluations[0], evaluations[-1]
    summary["heldout"] = {
        "temperature": (config.get("eval") or {}).get("temperature"),
        "tool_measure": measure,
        "before": before,
        "after": after,
        "gain": after["success_rate"] - before["success_rate"] if len(evaluations) > 1 else None,
        "evaluations": evaluations,
    }
    return summary


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _span(before: dict[str, Any], after: dict[str, Any], key: str, one: bool) -> str:
    return _num(after[key]) if one else f"{_num(before[key])} -> {_num(after[key])}"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the lines ``seed-agents train`` ends with."""
    lines = [f"summary of {summary['run_dir']} ({summary['updates']} updates)"]
    held = summary["heldout"]
    if held is None:
        lines.append("  held-out success: not measured (add an `eval` section to the config to measure it)")
    else:
        before, after = held["before"], held["after"]
        one = len(held["evaluations"]) == 1
        t = held["temperature"]
        how = "greedy" if not t else f"at T {t:g}"
        if one:
            lines.append(f"  held-out success ({how}, {after['episodes']} episodes): {after['success_rate']:.2f} after "
                         f"{after['updates']} updates (one evaluation: set eval.at_start to measure the start)")
        else:
            lines.append(f"  held-out success ({how}, {after['episodes']} episodes): {before['success_rate']:.2f} after "
                         f"{before['updates']} updates -> {after['success_rate']:.2f} after {after['updates']} "
                         f"({held['gain']:+.2f})")
        if held["tool_measure"] == RIGHT_TOOL:
            per_tool = ", ".join(f"{name} {c['called']}/{c['needed']}" for name, c in after["per_tool"].items())
            lines.append(f"  called every tool its task names: {_span(before, after, 'tool_share', one)}"
                         f" (at the end, per tool: {per_tool})")
        elif held["tool_measure"] == ANY_TOOL:
            lines.append(f"  called any tool: {_span(before, after, 'tool_share', one)}"
                         ' (the held-out tasks do not all name their calls in data["calls"])')
        else:
            lines.append("  tool use: not measured (no tool was offered to the model)")
        lines.append(f"  answers with chat-template markup: {_span(before, after, 'markup_share', one)}"
                     f" (of {after['answers']} final answers at the end)")
    success = " ".join(f"{s:.2f}" for s in summary["training_success"]) or "-"
    lines += textwrap.wrap(success, 100, initial_indent="  training success per update: ", subsequent_indent=" " * 31)
    if "wall_s" in summary:
        minutes, seconds = divmod(round(summary["wall_s"]), 60)
        lines.append(f"  wall time: {minutes} min {seconds} s")
    if summary.get("peak_rss_gb") is not None:
        lines.append(f"  peak memory (RSS): {summary['peak_rss_gb']:.1f} GiB")
    if "learning_curve" in summary:
        lines.append(f"  learning curve: {summary['learning_curve'] or 'not written (no metrics rows)'}")
    return "\n".join(lines)
