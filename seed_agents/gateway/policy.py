"""Which upstream model the gateway's one public name means: the registry's promoted version.

With ``GatewayConfig.registry`` set, the gateway re-reads the promoted version from the
trace store (``VersionRegistry.resolve``) at most every ``refresh_s`` seconds, before a
request is sent upstream, so a promotion or a rollback reaches users without a restart
and at most ``refresh_s`` late. What holds while versions switch:

- A request takes (upstream model, policy version) once, after the refresh and before it
  goes upstream: a switch while it runs does not touch it, so it finishes on the version
  it started with, and its stored call is stamped with that version.
- A promoted version no upstream replica serves (its adapter not loaded yet and not
  loadable from its registry path, or lost in a vLLM restart) is not switched to: users
  keep the current version, the log says why, and the next refresh tries again. Stamps
  always name what actually answered. With several replicas every one is asked before the
  switch; those that do not serve the new version leave the rotation with it
  (``seed_agents.gateway.replicas``).
- A store that cannot be read keeps the current version serving (one warning per try).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.continual.versions import VersionRegistry
from seed_agents.gateway.replicas import ReplicaSet
from seed_agents.store import StoreError

log = logging.getLogger("seed_agents.gateway")


class PolicyResolver:
    """Keeps ``upstream.model`` / ``upstream.policy_version`` on the promoted version of ``name``."""

    def __init__(self, registry: VersionRegistry, name: str, upstream: ReplicaSet, refresh_s: float,
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
        before = self._serving()
        result = await self.upstream.switch(promoted.served_name, promoted.version, adapter_path=promoted.path or None)
        if not result.switched:
            reachable = any(not why.startswith("unreachable") for why in result.out.values())
            self.stats["policy_not_served" if reachable else "policy_refresh_errors"] += 1
            log.warning("%r v%d is promoted but no upstream replica serves %r (%s); still serving %s",
                        self.name, promoted.version, promoted.served_name,
                        "; ".join(f"{url}: {why}" for url, why in result.out.items()), self._serving())
            return
        self.stats["policy_switches"] += 1
        log.info("now serving %r v%d as %s (was %s)", self.name, promoted.version, promoted.served_name, before)

    def _serving(self) -> str:
        return f"{self.upstream.model} v{self.upstream.policy_version}"
