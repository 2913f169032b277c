"""``seed-agents traces export``: store sessions as JSONL ``Trajectory`` records.

The output is what ``seed_agents.capture.read_jsonl(path, Trajectory)`` and the rows
pipeline already read, so stored sessions from a deployed agent can be inspected, copied
between machines or trained on with the file-based tools. Exporting never marks a session
consumed: only ``TraceStore.claim_sessions`` does that.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pydantic import ValidationError

from seed_agents.store.records import RewardPolicy, StoreError
from seed_agents.store.store import TraceStore


def export_trajectories(store: TraceStore, out_path: str | Path, *, policy: RewardPolicy | None = None,
                        only_trainable: bool = False) -> int:
    """Write every session (or only trainable ones) to ``out_path``; return how many.

    The file appears whole or not at all (written beside it, then renamed), so a killed
    export never leaves a truncated file that looks complete.
    """
    policy = policy or RewardPolicy()
    records = store.trainable_sessions(policy) if only_trainable else store.sessions()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(store.to_trajectory(record.session_id, policy).model_dump_json() + "\n")
        f.flush()
        os.fsync(f.fileno())
    partial.replace(out)
    return len(records)


def cmd_export(args: argparse.Namespace) -> int:
    # The CLI's error type, imported here: seed_agents.config pulls in the runner and
    # LangGraph, which a gateway that only needs the store should not pay for.
    from seed_agents.config import ConfigError, validation_message

    try:
        policy = RewardPolicy(precedence=_split(args.precedence), combine=args.combine,
                              ignore_unlisted=args.ignore_unlisted)
    except ValidationError as e:
        raise ConfigError(validation_message(e, "reward policy flags")) from None
    try:
        with TraceStore.open(args.store) as store:
            n = export_trajectories(store, args.out, policy=policy, only_trainable=args.only_trainable)
    except StoreError as e:
        raise ConfigError(f"--store: {e}") from None
    which = "trainable sessions" if args.only_trainable else "sessions"
    print(f"exported {n} {which} to {args.out}")
    return 0


def _split(csv: str) -> list[str]:
    return [s.strip() for s in csv.split(",") if s.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``export`` under the ``traces`` command's subparsers."""
    default = RewardPolicy()
    p = sub.add_parser("export", help="Write stored sessions as JSONL Trajectory records (read_jsonl reads them).",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="Store URL: sqlite:///path/traces.db or postgresql://user@host/db.")
    p.add_argument("--out", required=True, help="Output JSONL file (replaced whole when the export finishes).")
    p.add_argument("--only-trainable", dest="only_trainable", action="store_true",
                   help="Only ended, rewarded sessions not yet consumed by an update and not flagged.")
    p.add_argument("--precedence", default=",".join(default.precedence),
                   help="Reward sources, most trusted first (comma-separated); the first present sets the reward.")
    p.add_argument("--combine", choices=["first", "mean", "last"], default=default.combine,
                   help="How several rewards of the chosen source merge.")
    p.add_argument("--ignore-unlisted", dest="ignore_unlisted", action="store_true",
                   help="Count only the sources named in --precedence.")
    p.set_defaults(func=cmd_export)
