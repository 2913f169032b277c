"""``seed-agents traces export``: write stored sessions as JSONL ``Trajectory`` records.

The flags are ``ExportConfig``'s fields; the export is ``seed_agents.store.export_trajectories``
(see ``seed_agents.store.export`` for what the file holds).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.app.flags import config_command
from seed_agents.config import load_config
from seed_agents.store.records import RewardPolicy


class ExportConfig(BaseModel):
    """`seed-agents traces export`: write stored sessions as JSONL Trajectory records
    (what ``seed_agents.capture.read_jsonl(path, Trajectory)`` reads). Exporting never marks
    a session consumed."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(description="Store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    out: Path = Field(description="Output JSONL file (replaced whole when the export finishes).")
    only_trainable: bool = Field(False, description="Only ended, rewarded sessions not yet consumed by an update and not flagged.")
    reward: RewardPolicy = Field(default_factory=RewardPolicy, description="Which reward counts when several sources scored a session.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``traces`` with ``export`` on ``sub``."""
    traces = sub.add_parser("traces", help="The trace store: export sessions as trajectories.")
    tsub = traces.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND")
    config_command(tsub, "export", ExportConfig, cmd_export, yaml=False,
                   help="Write stored sessions as JSONL Trajectory records (read_jsonl reads them).",
                   shortcuts={"reward.precedence": "precedence", "reward.combine": "combine",
                              "reward.ignore-unlisted": "ignore-unlisted"})


def cmd_export(args: argparse.Namespace) -> int:
    from seed_agents.errors import ConfigError
    from seed_agents.store import StoreError, TraceStore, export_trajectories

    cfg = load_config(ExportConfig, None, args.config_flags(args))
    try:
        with TraceStore.open(cfg.store) as store:
            n = export_trajectories(store, cfg.out, policy=cfg.reward, only_trainable=cfg.only_trainable)
    except StoreError as e:
        raise ConfigError(f"--store: {e}") from None
    which = "trainable sessions" if cfg.only_trainable else "sessions"
    print(f"exported {n} {which} to {cfg.out}")
    return 0
