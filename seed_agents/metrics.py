"""Summaries of a batch of trajectories (pure functions; the CLI and trainer print them)."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import fmean
from typing import Any

from seed_agents.rows import trajectory_to_rows
from seed_agents.types import Trajectory


def summarize(trajs: list[Trajectory], wall_s: float) -> dict[str, Any]:
    """Success, reward, steps, throughput and failure counts over ``trajs``.

    Errored or timed-out episodes count as failures in ``success_rate`` (they are real
    outcomes of the run) and are also reported separately.
    """
    n = len(trajs)
    calls = [c for t in trajs for c in t.policy_calls]
    completion_tokens = sum(len(c.completion_ids) for c in calls)
    steps = sum(t.steps for t in trajs)
    rows = sum(len(trajectory_to_rows(t)) for t in trajs)
    by_type: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_type[str(t.metadata.get("game_type", t.split))].append(t.success)
    return {
        "episodes": n,
        "success_rate": fmean(t.success for t in trajs) if n else 0.0,
        "mean_reward": fmean(t.reward for t in trajs) if n else 0.0,
        "mean_steps": fmean(t.steps for t in trajs) if n else 0.0,
        "invalid_action_rate": (sum(t.invalid_actions for t in trajs) / steps) if steps else 0.0,
        "stop_reasons": dict(Counter(t.stop_reason.value for t in trajs)),
        "errors": sum(t.error is not None for t in trajs),
        "llm_calls": len(calls),
        "rows": rows,
        "prompt_tokens": sum(len(c.prompt_ids) for c in calls),
        "completion_tokens": completion_tokens,
        "tokens_per_s": completion_tokens / wall_s if wall_s > 0 else 0.0,
        "episodes_per_s": n / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        "success_by_type": {k: fmean(v) for k, v in sorted(by_type.items())},
    }


def format_table(summary: dict[str, Any]) -> str:
    keys = ["episodes", "success_rate", "mean_reward", "mean_steps", "invalid_action_rate",
            "errors", "llm_calls", "rows", "completion_tokens", "tokens_per_s", "wall_s"]
    lines = [f"{'metric':<22} value", f"{'-' * 22} {'-' * 12}"]
    keys += [k for k in ("score",) if k in summary]
    for k in keys:
        v = summary[k]
        lines.append(f"{k:<22} {v:.3f}" if isinstance(v, float) else f"{k:<22} {v}")
    for k, v in summary["success_by_type"].items():
        lines.append(f"{'success[' + k + ']':<22} {v:.3f}")
    lines.append(f"{'stop_reasons':<22} {summary['stop_reasons']}")
    return "\n".join(lines)
