"""Which upstream model the gateway's one public name means: the registry's promoted version.

With ``GatewayConfig.registry`` set, the gateway re-reads the promoted version from the
trace store (``VersionRegistry.resolve``) at most every ``refresh_s`` seconds, before a
request is sent upstream, so a promotion or a rollback reaches users without a restart
and at most ``refresh_s`` late. What holds while versions switch:

- A request takes (upstream model, policy version) once, after the refresh and before it
  goes upstream: a switch while it runs does not touch it, so it finishes on the version
  it started with, and its stored call is stamped with that version.
- A promoted version the upstream does not serve (its adapter not loaded yet, or lost in
  a vLLM restart) is not switched to: users keep the current version, the log says why,
  and the next refresh tries again. Stamps always name what actually answered.
- A store that cannot be read keeps the current version serving (one warning per try).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.continual.versions import ServedVersion, VersionRegistry
from seed_agents.gateway.errors import GatewayError
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import StoreError

log = logging.getLogger("seed_agents.gateway")


class PolicyResolver:
    """Keeps ``upstream.model`` / ``upstream.policy_version`` on the promoted version of ``name``."""

    def __init__(self, registry: VersionRegistry, name: str, upstream: Upstream, refresh_s: float,
                 stats: Counter[str], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.name = name
        self.upstream = upstream
        self.refresh_s = refresh_s
        self.stats = stats
        self._clock = clock
        self._next = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Re-read the promoted version if the last read is older than ``refresh_s``.

        One reader at a time; requests arriving during a read wait for it, so a request
        that comes after the interval has passed never goes out on an older version.
        """
        if self._clock() < self._next:
            return
        async with self._lock:
            if self._clock() < self._next:
                return
            self._next = self._clock() + self.refresh_s
            await self._follow()

    async def _follow(self) -> None:
        try:
            promoted = await asyncio.to_thread(self.registry.resolve, self.name)
        except (StoreError, SQLAlchemyError) as e:
            self.stats["policy_refresh_errors"] += 1
            log.warning("cannot read the promoted version of %r (still serving %s): %s",
                        self.name, self._serving(), str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
            return
        if promoted is None or (promoted.served_name, promoted.version) == (self.upstream.model, self.upstream.policy_version):
            return
        if not await self._upstream_serves(promoted):
            return
        before = self._serving()
        # no await between these two: a request sees the old pair or the new one, never a mix
        self.upstream.model, self.upstream.policy_version = promoted.served_name, promoted.version
        self.stats["policy_switches"] += 1
        log.info("now serving %r v%d as %s (was %s)", self.name, promoted.version, promoted.served_name, before)

    async def _upstream_serves(self, promoted: ServedVersion) -> bool:
        try:
            served = await self.upstream.models()
        except GatewayError as e:
            self.stats["policy_refresh_errors"] += 1
            log.warning("cannot list the upstream's models to switch to %r v%d (still serving %s): %s",
                        self.name, promoted.version, self._serving(), e.message)
            return False
        if promoted.served_name not in served:
            self.stats["policy_not_served"] += 1
            log.warning("%r v%d is promoted but the upstream does not serve %r (it serves %s); still serving %s",
                        self.name, promoted.version, promoted.served_name, served, self._serving())
            return False
        return True

    def _serving(self) -> str:
        return f"{self.upstream.model} v{self.upstream.policy_version}"
