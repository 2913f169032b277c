"""This gateway's row in the trace store: how ``seed-agents status`` sees every gateway.

Several gateways may share one store. Each one reports itself every ``HEARTBEAT_S`` seconds
(``TraceStore.beat_gateway``): its name and address, what it serves, its replicas (in or out
of rotation, and why), its spool's depth and its call counters; and once more when it stops.
A report is a convenience for the people watching: one that fails (the store is down, and
the spool holds the calls) is logged once per outage and retried at the next beat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.recording import Recorder
from seed_agents.gateway.replicas import ReplicaSet
from seed_agents.store import StoreError, TraceStore
from seed_agents.store.gateways import HEARTBEAT_S

log = logging.getLogger("seed_agents.gateway")

_COUNTERS = ("calls_stored", "calls_spooled", "calls_flushed", "replica_failovers", "replica_out", "replica_in",
             "policy_switches")


class Heartbeat:
    """Reports one gateway (its config, replicas, recorder and counters) to ``store`` until cancelled."""

    def __init__(self, store: TraceStore, cfg: GatewayConfig, replicas: ReplicaSet, recorder: Recorder,
                 stats: Counter[str]) -> None:
        self.store, self.cfg, self.replicas, self.recorder, self.stats = store, cfg, replicas, recorder, stats
        self.started_at = time.time()
        self._failing = False

    def state(self, *, stopped: bool = False) -> dict[str, Any]:
        spool = self.recorder.spool
        return {"model": self.cfg.model, "upstream_model": self.replicas.model,
                "policy_version": self.replicas.policy_version, "replicas": self.replicas.state(),
                "spool_depth": spool.depth if spool is not None else 0, "stopped": stopped,
                "counters": {k: self.stats.get(k, 0) for k in _COUNTERS}}

    async def beat(self, *, stopped: bool = False) -> None:
        cfg = self.cfg
        try:
            await asyncio.to_thread(self.store.beat_gateway, cfg.gateway_name, url=f"http://{cfg.host}:{cfg.port}",
                                    started_at=self.started_at, state=self.state(stopped=stopped))
        except (StoreError, SQLAlchemyError) as e:
            if not self._failing:
                log.warning("cannot report this gateway to the trace store (retrying every %g s): %s", HEARTBEAT_S,
                            (str(e).splitlines() or [type(e).__name__])[0][:300])
            self._failing = True
            return
        self._failing = False

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(HEARTBEAT_S)
