"""Which gateways write to this store, and what each last said about itself.

Several gateways may share one PostgreSQL store (one per machine, or several behind a load
balancer); ``seed-agents status`` reads them all from the ``gateways`` table. Each gateway
reports itself every few seconds (``beat_gateway``: one upsert); nothing here decides
anything, so a report that fails costs nothing but freshness.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from seed_agents.store._base import StoreBase, _check_id, _insert_ignore
from seed_agents.store.records import GatewayRecord
from seed_agents.store.schema import gateways

HEARTBEAT_S = 10.0
"""Seconds between a running gateway's reports."""
SILENT_AFTER_S = 3 * HEARTBEAT_S
"""A gateway not heard from for this long is shown as silent: stopped without saying so, or cut off."""


class GatewayStore(StoreBase):
    """The gateways' own rows."""

    def beat_gateway(self, name: str, *, url: str, started_at: float, state: dict[str, Any]) -> None:
        """Record that gateway ``name`` runs now, in ``state`` (insert or update, one transaction)."""
        _check_id(name, "gateway name")
        now = time.time()

        def tx(conn: Connection) -> None:
            values = {"url": url, "started_at": started_at, "seen_at": now, "state": state}
            if not _insert_ignore(conn, gateways, ["name"], {"name": name, **values}):
                conn.execute(sa.update(gateways).where(gateways.c.name == name).values(**values))

        self._write(tx)

    def gateways(self) -> list[GatewayRecord]:
        """Every gateway that ever reported, most recently seen first."""
        rows = self._read(lambda conn: conn.execute(
            sa.select(gateways).order_by(gateways.c.seen_at.desc(), gateways.c.name)).mappings().all())
        return [GatewayRecord(name=r["name"], url=r["url"], started_at=r["started_at"], seen_at=r["seen_at"],
                              state=dict(r["state"] or {})) for r in rows]
