"""Summaries of a batch of trajectories (pure functions; the CLI and trainer print them)."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import fmean
from typing import Any

from seed_agents.rows import trajectory_to_rows
from seed_agents.types import Trajectory


def summarize(trajs: list[Trajectory], wall_s: float) -> dict[str, Any]:
    """Success, reward, steps, throughput and failure counts over ``trajs``.

    Outcome figures (success, reward, steps, invalid actions, success by type) are over
    the episodes that measured the policy: an infrastructure fault (env crash, timeout,
    dead server, raising reward) says nothing about it and is counted apart, by kind, in
    ``faults``. ``errors`` counts every episode that recorded an error.
    """
    from seed_agents.runner import fault_counts

    all_trajs, trajs = trajs, [t for t in trajs if t.fault is None]
    n = len(trajs)
    calls = [c for t in trajs for c in t.policy_calls]
    completion_tokens = sum(len(c.completion_ids) for c in calls)
    steps = sum(t.steps for t in trajs)
    rows = sum(len(trajectory_to_rows(t)) for t in trajs)
    by_type: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_type[str(t.metadata.get("game_type", t.split))].append(t.success)
    return {
        "episodes": len(all_trajs),
        "episodes_measured": n,
        "faults": sum(t.fault is not None for t in all_trajs),
        "faults_by_kind": {k: v for k, v in fault_counts(all_trajs).items() if v},
        "success_rate": fmean(t.success for t in trajs) if n else 0.0,
        "mean_reward": fmean(t.reward for t in trajs) if n else 0.0,
        "mean_steps": fmean(t.steps for t in trajs) if n else 0.0,
        "invalid_action_rate": (sum(t.invalid_actions for t in trajs) / steps) if steps else 0.0,
        "stop_reasons": dict(Counter(t.stop_reason.value for t in all_trajs)),
        "errors": sum(t.error is not None for t in all_trajs),
        "llm_calls": len(calls),
        "rows": rows,
        "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
        "completion_tokens": completion_tokens,
        "tokens_per_s": completion_tokens / wall_s if wall_s > 0 else 0.0,
        "episodes_per_s": len(all_trajs) / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        "success_by_type": {k: fmean(v) for k, v in sorted(by_type.items())},
    }


def format_table(summary: dict[str, Any]) -> str:
    keys = ["episodes", "episodes_measured", "faults", "success_rate", "mean_reward", "mean_steps",
            "invalid_action_rate", "errors", "llm_calls", "rows", "completion_tokens", "tokens_per_s", "wall_s"]
    lines = [f"{'metric':<22} value", f"{'-' * 22} {'-' * 12}"]
    keys += [k for k in ("score",) if k in summary]
    for k in keys:
        v = summary[k]
        lines.append(f"{k:<22} {v:.3f}" if isinstance(v, float) else f"{k:<22} {v}")
    for k, v in summary["success_by_type"].items():
        lines.append(f"{'success[' + k + ']':<22} {v:.3f}")
    lines.append(f"{'stop_reasons':<22} {summary['stop_reasons']}")
    if summary.get("faults_by_kind"):
        lines.append(f"{'faults_by_kind':<22} {summary['faults_by_kind']}")
    return "\n".join(lines)
