"""Learning from a deployed agent, the control plane: which version serves, and why.

``gate.decide`` compares a candidate with the promoted version on paired canary results
(a one-sided paired bootstrap over tasks) and returns a ``GateDecision``
(``gate.gate_power``: what a canary of a given size can tell apart);
``VersionRegistry`` applies it to the trace store atomically (promote, reject, rollback,
resolve), and ``seed-agents versions`` (``seed_agents.app.commands.continual``) is the
operators' view of it. The continual loop (``seed_agents.app.continual``) composes these;
the gateway follows ``VersionRegistry.resolve``. ``canary.CanaryEpisode`` is what is kept of
each canary episode behind a decision (its tool calls, results, answer).
"""

from seed_agents.continual.canary import CanaryEpisode, EpisodeTrace
from seed_agents.continual.gate import (CanaryResult, GateConfig, GateDecision, GatePower, UpdateSignal, decide,
                                        gate_power)
from seed_agents.continual.versions import DecisionRecord, ServedVersion, VersionRegistry, VersionStatus

__all__ = [
    "CanaryEpisode",
    "CanaryResult",
    "DecisionRecord",
    "EpisodeTrace",
    "GateConfig",
    "GateDecision",
    "GatePower",
    "ServedVersion",
    "UpdateSignal",
    "VersionRegistry",
    "VersionStatus",
    "decide",
    "gate_power",
]
