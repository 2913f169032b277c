"""The durable trace store of a deployed agent: sessions, token-exact calls, rewards.

``TraceStore.open("sqlite:///runs/traces.db")`` (embedded default) or
``TraceStore.open("postgresql://user@host/db")`` (several machines) gives one interface;
``StoreSink`` plugs it into ``capture()`` and the runner; ``export_trajectories`` writes
sessions as the JSONL ``Trajectory`` records the training pipeline reads.
"""

from seed_agents.store.export import export_trajectories
from seed_agents.store.records import (
    CanaryEpisodeRecord,
    CycleRecord,
    DecisionRecord,
    GatewayRecord,
    ModelVersionRecord,
    QueueLengths,
    RewardPolicy,
    RewardRecord,
    SessionEpisode,
    SessionRecord,
    StoreError,
)
from seed_agents.store.sink import StoreSink
from seed_agents.store.store import TraceStore

__all__ = [
    "CanaryEpisodeRecord",
    "CycleRecord",
    "DecisionRecord",
    "GatewayRecord",
    "ModelVersionRecord",
    "QueueLengths",
    "RewardPolicy",
    "RewardRecord",
    "SessionEpisode",
    "SessionRecord",
    "StoreError",
    "StoreSink",
    "TraceStore",
    "export_trajectories",
]
