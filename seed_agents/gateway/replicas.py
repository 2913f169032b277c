"""Several vLLM replicas of one model behind one gateway, serving one version.

A deployment past one machine runs several vLLM servers with the same base model (and the
same LoRA adapters under the same names); the gateway sends each request to one of them.
What holds:

- One version at a time. The set has one current pair (upstream model, policy version), and
  a replica is in rotation only while it serves that pair's model. A request takes its
  replica and the pair in one step (no await between), and vLLM picks the adapter by the
  name sent, so the stamp on a stored call names what the replica that sampled it served.
- A new pair (a promotion, a rollback, an admin switch) is taken only after every replica
  was asked: those that serve it, or load it (``load_adapters``, when the version's adapter
  path is known), go into rotation with the switch; one that fails to load it or does not
  answer is out of rotation and reported (a log line, ``/v1/admin/replicas``, the metrics,
  the store's gateway row). When no replica serves it, nothing switches.
- A replica that fails a request before anything was answered (unreachable, connection
  broken, 503, or the model gone after a restart) is taken out at once and the request
  goes to the next one, so a dead replica costs users latency, not answers. The health
  check (``check``, every ``health_s``) puts a replica back once it answers and serves the
  current pair, loading the adapter into it first when it may. While no replica is in
  rotation, requests still try them (the alternative is a certain error; vLLM refuses a
  name it does not serve, so no stamp can lie).
- Picking: the replica with the fewest requests in flight from this gateway, ties in turn
  (``least_busy``); or strictly in turn (``round_robin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from seed_agents.backends.base import CompletionPiece
from seed_agents.gateway.upstream import Upstream, UpstreamError
from seed_agents.redact import redact
from seed_agents.types import Completion, SamplingParams

log = logging.getLogger("seed_agents.gateway")

T = TypeVar("T")
PickMode = Literal["least_busy", "round_robin"]

#: Upstream failures that say "this replica, not this request": try the next replica.
FAILOVER_CODES = frozenset({"upstream_unreachable", "upstream_transport", "upstream_unavailable", "upstream_model_missing"})
_UNREACHABLE = frozenset({"upstream_unreachable", "upstream_transport", "upstream_unavailable", "upstream_timeout"})


@dataclass(eq=False)
class Replica:
    """One vLLM server of the set, and what this gateway knows about it."""

    upstream: Upstream
    in_rotation: bool = True
    reason: str = ""  # why it is out of rotation
    in_flight: int = 0
    since: float = field(default_factory=time.time)  # when it last went in or out
    served: list[str] = field(default_factory=list)  # names it listed when last asked

    @property
    def url(self) -> str:
        return self.upstream.base_url

    def state(self) -> dict[str, Any]:
        """What ``/v1/admin/replicas`` and the store's gateway row show (credentials in a URL redacted)."""
        return {"url": redact(self.url), "in_rotation": self.in_rotation, "reason": self.reason,
                "in_flight": self.in_flight, "since": self.since}


@dataclass(frozen=True)
class Pick:
    """The replica a request goes to, and the pair it goes out with (taken together)."""

    replica: Replica
    model: str
    policy_version: int
    last_resort: bool = False  # no replica was in rotation: one was tried anyway


@dataclass(frozen=True)
class _Answer:
    """One replica's answer to "do you serve this model?": None ``why`` means yes."""

    why: str | None
    unreachable: bool = False
    served: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SwitchResult:
    """What a switch found: whether it switched, and per replica URL why it does not serve the pair."""

    switched: bool
    out: dict[str, str]
    served: dict[str, list[str]]


class ReplicaSet:
    """The gateway's replicas; ``model``/``policy_version`` are what new requests are sent
    to and stamped with (change them only with ``switch``)."""

    def __init__(self, upstreams: Sequence[Upstream], *, model: str | None = None, policy_version: int | None = None,
                 pick: PickMode = "least_busy", probe_timeout_s: float = 5.0, load_timeout_s: float = 120.0,
                 load_adapters: bool = True, stats: Counter[str] | None = None) -> None:
        if not upstreams:
            raise ValueError("a replica set needs at least one upstream")
        self.replicas = [Replica(u) for u in upstreams]
        self.model = model if model is not None else upstreams[0].model
        self.policy_version = policy_version if policy_version is not None else upstreams[0].policy_version
        self.adapter_path: str | None = None  # the current pair's adapter, for replicas that lack it
        self.pick_mode = pick
        self.probe_timeout_s = probe_timeout_s
        self.load_timeout_s = load_timeout_s
        self.load_adapters = load_adapters
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self._turn = 0
        self._lock = asyncio.Lock()  # one switch or health check at a time

    @property
    def base_url(self) -> str:
        """The first replica's URL (a label)."""
        return self.replicas[0].url

    @property
    def secret_values(self) -> list[str]:
        """Every replica's key, for the redactor only."""
        return sorted({v for r in self.replicas for v in r.upstream.secret_values})

    def state(self) -> list[dict[str, Any]]:
        return [r.state() for r in self.replicas]

    def __repr__(self) -> str:
        return f"ReplicaSet({[r.url for r in self.replicas]!r}, model={self.model!r}, policy_version={self.policy_version})"

    async def aclose(self) -> None:
        for r in self.replicas:
            await r.upstream.aclose()

    # -- requests -------------------------------------------------------------------------

    def pick(self, exclude: Sequence[Replica] = ()) -> Pick:
        """The next replica for a request, with the current pair; 503 ``no_replica`` when none is left."""
        live = [r for r in self.replicas if r.in_rotation and r not in exclude]
        last_resort = not live and not any(r.in_rotation for r in self.replicas)
        if last_resort:
            live = [r for r in self.replicas if r not in exclude]  # none in rotation: a try beats a certain error
        if not live:
            raise UpstreamError(503, "no model server replica is in rotation (see /v1/admin/replicas)",
                                type="upstream_unavailable", code="no_replica")
        self._turn += 1
        if self.pick_mode == "least_busy":
            least = min(r.in_flight for r in live)
            live = [r for r in live if r.in_flight == least]
        return Pick(live[self._turn % len(live)], self.model, self.policy_version, last_resort)

    async def complete(self, prompt_ids: list[int], params: SamplingParams) -> tuple[Completion, Pick]:
        """Sample one completion on some replica (the next one when a replica fails)."""
        return await self._failover(
            lambda p: p.replica.upstream.complete(p.model, prompt_ids, params, p.policy_version), None)

    async def open_stream(self, prompt_ids: list[int], params: SamplingParams,
                          stack: AsyncExitStack) -> tuple[AsyncIterator[CompletionPiece], Pick]:
        """Start a stream on some replica; it counts as in flight there until ``stack`` closes.
        Only errors before the first byte move it to another replica."""
        return await self._failover(lambda p: p.replica.upstream.open_stream(p.model, prompt_ids, params, stack), stack)

    async def _failover(self, do: Callable[[Pick], Awaitable[T]], hold: AsyncExitStack | None) -> tuple[T, Pick]:
        tried: list[Replica] = []
        last: UpstreamError | None = None
        while True:
            try:
                pick = self.pick(exclude=tried)
            except UpstreamError:
                if last is not None:
                    raise last from None
                raise
            replica = pick.replica
            tried.append(replica)
            replica.in_flight += 1
            try:
                result = await do(pick)
            except UpstreamError as e:
                replica.in_flight -= 1
                if e.code not in FAILOVER_CODES:
                    raise
                self._take_out(replica, _Answer(e.message, unreachable=e.code in _UNREACHABLE), pick.model)
                self.stats["replica_failovers"] += 1
                last = e
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            if hold is None:
                replica.in_flight -= 1
            else:
                hold.callback(_done, replica)
            if pick.last_resort and not replica.in_rotation and pick.model == self.model:
                self._put_in(replica, "it answered a request")  # the current pair, while no other could: back in
            return result, pick

    # -- rotation ------------------------------------------------------------------------

    async def switch(self, model: str, policy_version: int, *, adapter_path: str | None = None) -> SwitchResult:
        """Make (``model``, ``policy_version``) what new requests get, if any replica serves it
        (or loads it from ``adapter_path``); every replica is asked first, and those that do
        not serve it leave the rotation in the same step as the switch."""
        async with self._lock:
            answers = await asyncio.gather(*(self._ask(r, model, adapter_path) for r in self.replicas))
            out = {redact(r.url): a.why for r, a in zip(self.replicas, answers, strict=True) if a.why is not None}
            served = {redact(r.url): a.served for r, a in zip(self.replicas, answers, strict=True) if a.served}
            if len(out) == len(self.replicas):
                return SwitchResult(False, out, served)
            # no await from here on: a request sees the old pair and rotation, or the new ones
            self.model, self.policy_version, self.adapter_path = model, policy_version, adapter_path
            for replica, answer in zip(self.replicas, answers, strict=True):
                self._apply(replica, answer, model)
            return SwitchResult(True, out, served)

    async def check(self) -> None:
        """Ask every replica whether it serves the current pair (loading the adapter where it
        may); take out those that do not answer or serve it, put back those that do."""
        async with self._lock:
            model, path = self.model, self.adapter_path
            answers = await asyncio.gather(*(self._ask(r, model, path) for r in self.replicas))
            for replica, answer in zip(self.replicas, answers, strict=True):
                self._apply(replica, answer, model)

    async def watch(self, every_s: float) -> None:
        """``check`` every ``every_s`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.check()
            except Exception as e:  # noqa: BLE001 - a dead watcher would leave replicas out for good
                log.error("checking the replicas failed: %s", e)

    async def _ask(self, replica: Replica, model: str, adapter_path: str | None) -> _Answer:
        try:
            served = await replica.upstream.probe(self.probe_timeout_s)
        except UpstreamError as e:
            return _Answer(f"unreachable: {e.message}", unreachable=True)
        replica.served = served
        if model in served:
            return _Answer(None, served=served)
        if not (self.load_adapters and adapter_path):
            return _Answer(f"does not serve {model!r} (it serves {', '.join(served)})", served=served)
        try:
            await replica.upstream.load_adapter(model, adapter_path, self.load_timeout_s)
        except UpstreamError as e:
            self.stats["replica_load_failures"] += 1
            return _Answer(f"cannot load {model!r}: {e.message}", unreachable=e.code in _UNREACHABLE, served=served)
        self.stats["replica_loads"] += 1
        log.info("loaded %s into replica %s", model, redact(replica.url))
        return _Answer(None, served=[*served, model])

    def _apply(self, replica: Replica, answer: _Answer, model: str) -> None:
        if answer.why is None:
            if not replica.in_rotation:
                self._put_in(replica, f"it serves {model!r}")
        else:
            self._take_out(replica, answer, model)

    def _take_out(self, replica: Replica, answer: _Answer, model: str) -> None:
        why = answer.why or "failed"
        if replica.in_rotation or replica.reason != why:
            log.warning("replica %s is out of rotation (serving %r v%d): %s", redact(replica.url), model,
                        self.policy_version, why)
        if replica.in_rotation:
            self.stats["replica_out"] += 1
        replica.in_rotation, replica.reason, replica.since = False, why, time.time()

    def _put_in(self, replica: Replica, why: str) -> None:
        replica.in_rotation, replica.reason, replica.since = True, "", time.time()
        self.stats["replica_in"] += 1
        log.info("replica %s is back in rotation (%s)", redact(replica.url), why)


def _done(replica: Replica) -> None:
    replica.in_flight -= 1
