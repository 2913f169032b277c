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
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.store import StoreError

if TYPE_CHECKING:
    from seed_agents.gateway.app import Gateway

log = logging.getLogger("seed_agents.gateway")

HEARTBEAT_S = 10.0
"""Seconds between reports; ``status`` calls a gateway silent after ``SILENT_AFTER_S``."""
SILENT_AFTER_S = 3 * HEARTBEAT_S
_COUNTERS = ("calls_stored", "calls_spooled", "calls_flushed", "replica_failovers", "replica_out", "replica_in",
             "policy_switches")


class Heartbeat:
    """Reports ``gw`` to its store until cancelled."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.started_at = time.time()
        self._failing = False

    def state(self, *, stopped: bool = False) -> dict[str, Any]:
        gw = self.gw
        spool = gw.recorder.spool
        return {"model": gw.cfg.model, "upstream_model": gw.upstream.model, "policy_version": gw.upstream.policy_version,
                "replicas": gw.upstream.state(), "spool_depth": spool.depth if spool is not None else 0,
                "stopped": stopped, "counters": {k: gw.stats.get(k, 0) for k in _COUNTERS}}

    async def beat(self, *, stopped: bool = False) -> None:
        cfg = self.gw.cfg
        try:
            await asyncio.to_thread(self.gw.store.beat_gateway, cfg.gateway_name, url=f"http://{cfg.host}:{cfg.port}",
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
