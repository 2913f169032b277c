"""Store sessions as JSONL ``Trajectory`` records (``seed-agents traces export``, whose
command line is ``seed_agents.app.commands.traces``).

The output is what ``seed_agents.capture.read_jsonl(path, Trajectory)`` and the rows
pipeline already read, so stored sessions from a deployed agent can be inspected, copied
between machines or trained on with the file-based tools. Exporting never marks a session
consumed: only ``TraceStore.claim_sessions`` does that.
"""

from __future__ import annotations

import os
from pathlib import Path

from seed_agents.store.records import RewardPolicy
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
