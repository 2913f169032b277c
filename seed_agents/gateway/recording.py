"""One served chat call -> one ``LLMCall`` in the trace store, redacted, written once.

A call is written only after the upstream finished it and (for streams) the client got
every chunk, in one store transaction (``add_call``), so the store never holds half a
call. Redaction decides whether the session may train:

- No secret anywhere: the call is stored token-exactly (the ids vLLM saw and sampled).
- A secret in the prompt (messages or tool schemas) or in the completion: the session is
  flagged ``"secret"`` first (so it is out of training before any of its calls is
  visible) and the call is stored with redacted messages and text, with ids that no
  longer encode the secret: prompt ids are the re-rendering of the redacted messages;
  completion ids, only when the completion itself held a secret, are the tokenization of
  the redacted text with logprobs 0.0. Such a call is marked ``scope["flagged"] =
  "secret"``; its ids are not what the model saw, which is harmless because a flagged
  session is never trained on, and necessary because raw ids would be the secret again.

Each stored call also updates the session's replayable transcript (``metadata["transcript"]``,
``seed_agents.transcript``): the first user message, the system prompt, the tool names, and
every tool call with the tool message the client answered it with, read from the
client's structured messages after redaction. The continual loop replays a session from it
when no explicit ``metadata["task"]`` / ``["recording"]`` was set, sampling as the session's
calls asked (``metadata["sampling"]``: max_tokens, temperature, and the tool_choice each call
also keeps in ``scope["tool_choice"]``).

When the store cannot be written (``GatewayConfig.store_outage``): in ``spool`` mode (the
default) a call that meets an outage is committed to the local spool instead and the user is
answered; the spool's ``Flusher`` stores it later, exactly once and in order
(``seed_agents.gateway.spool``). In ``refuse`` mode the call is answered with 503 and
nothing is recorded, as is any store error that no wait cures, in either mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.gateway.config import StoreOutageConfig
from seed_agents.gateway.errors import GatewayError
from seed_agents.gateway.render import Renderer
from seed_agents.gateway.security import Redactor
from seed_agents.gateway.spool import (
    Flusher,
    FlushResult,
    Spool,
    SpoolEntry,
    SpoolError,
    adopt_unnamed,
    default_spool_path,
    is_outage,
)
from seed_agents.store import SessionRecord, StoreError, TraceStore
from seed_agents.transcript import TOOL_CHOICE_LABEL, record_transcript, transcript_of
from seed_agents.types import Completion, LLMCall, SamplingParams

log = logging.getLogger("seed_agents.gateway")

SECRET_FLAG = "secret"
T = TypeVar("T")


@dataclass
class Turn:
    """A chat request, rendered and ready to sample; what a stored call is built from."""

    session_id: str
    task_key: str | None
    call_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    rendered: list[dict[str, Any]]
    params: SamplingParams
    model: str
    policy_version: int
    stream: bool
    prefix: str = ""  # a forced call's prefill: the end of the prompt, the start of the client's reply
    tool_choice: str | None = None  # the request's, as tool_choice_of reads it (None: auto)
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    replica: str | None = None  # the upstream replica that sampled it

    def picked(self, model: str, policy_version: int, replica: str) -> None:
        """The replica the call went to, and the pair it went out with (its stamp)."""
        self.model, self.policy_version, self.replica = model, policy_version, replica


class Recorder:
    """Builds redacted ``LLMCall``s and writes them (store calls run in worker threads);
    in spool mode, owns the spool and its flusher between ``start`` and ``stop``."""

    def __init__(self, store: TraceStore, renderer: Renderer, redactor: Redactor, stats: Counter[str],
                 outage: StoreOutageConfig | None = None, *, gateway: str | None = None) -> None:
        self.store = store
        self.gateway = gateway  # this gateway's name: its default spool is its own
        self.renderer = renderer
        self.redactor = redactor
        self.stats = stats
        self.outage = outage or StoreOutageConfig()
        # Opened when the app starts (``start``), not here: an app that is built but never
        # served (a test without its lifespan) must not take a lock on a file; until then,
        # store failures are 503s as in refuse mode.
        self.spool: Spool | None = None
        self._flusher: Flusher | None = None
        self._flushing: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Spool mode: open the spool and start flushing it (an earlier run's calls first)."""
        if self.outage.on_failure != "spool":
            return
        path = Path(self.outage.spool_path) if self.outage.spool_path else default_spool_path(self.store.url, self.gateway)
        if not self.outage.spool_path and await asyncio.to_thread(adopt_unnamed, default_spool_path(self.store.url), path):
            log.warning("took over the spool %s, left by an earlier gateway, as %s", default_spool_path(self.store.url), path)
        self.spool = await asyncio.to_thread(Spool.open, path, self.store.url, int(self.outage.max_spool_mb * 2**20))
        if self.spool.depth:
            log.warning("the spool %s holds %d calls from an earlier run; flushing them to the store", path, self.spool.depth)
        self._flusher = Flusher(self.spool, self._write, self._flushed, self.outage.retry_max_s)
        self._flushing = asyncio.create_task(self._flusher.run(), name="seed-gateway-spool-flusher")

    async def stop(self) -> None:
        """Stop flushing, try one last flush, close the spool; what is left is flushed at the next start."""
        spool, flusher, task = self.spool, self._flusher, self._flushing
        if spool is None or flusher is None or task is None:
            return
        self.spool, self._flusher, self._flushing = None, None, None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        try:
            await flusher.flush()
        except (StoreError, SQLAlchemyError) as e:
            log.warning("the trace store is still unavailable at shutdown: %s", _first_line(e))
        finally:
            if spool.depth:
                log.warning("%d calls stay in the spool %s; this gateway flushes them when it starts again", spool.depth, spool.path)
            await asyncio.to_thread(spool.close)

    # -- sessions -------------------------------------------------------------------------

    async def open_session(self, session_id: str) -> SessionRecord | None:
        """The session if it exists (409 when it has ended); None when it is new (it is
        created with its first stored call, so a failed first call leaves no empty session).

        In spool mode an outage does not stop the call: this read only decides the 409 for
        an ended session, and refusing every user for a check the store cannot make now is
        what spooling exists to avoid. The price: a call to an ended session made during an
        outage is appended to it when flushed, as a call racing the session's end would be."""
        if self.spool is not None and self.spool.store_down:
            return None  # known down: a read would only fail (or wait for a timeout) for nothing
        try:
            session = await asyncio.to_thread(self.store.get_session, session_id)
        except (StoreError, SQLAlchemyError) as e:
            if self.spool is None or not is_outage(e):
                raise self._unavailable("get_session", e) from None
            self.stats["store_errors"] += 1
            return None
        if session is not None and session.ended_at is not None:
            raise GatewayError(409, f"session {session_id} has ended; start a new one (omit X-Session-Id)", type="invalid_request_error", code="session_ended")
        return session

    # -- calls ------------------------------------------------------------------------------

    def build(self, turn: Turn, comp: Completion) -> tuple[LLMCall, bool]:
        """The call as it will be stored, and whether it carried a secret."""
        text = self.renderer.decode(comp.token_ids)  # the sampled text only, as SeedChatModel records a forced call
        messages, tools = self.redactor.obj(turn.messages), self.redactor.obj(turn.tools)
        prompt_secret = messages != turn.messages or tools != turn.tools
        prompt_ids, rendered = turn.prompt_ids, turn.rendered
        if prompt_secret:
            prompt_ids, rendered = self.renderer.render(messages, tools, turn.prefix)
            rendered = self.redactor.obj(rendered)
        red_text = self.redactor.text(text)
        completion_ids, logprobs = comp.token_ids, comp.logprobs
        if red_text != text:
            completion_ids = self.renderer.encode(red_text)
            logprobs = [0.0] * len(completion_ids)
        flagged = prompt_secret or red_text != text
        # the tool_choice in the loop's words (agent.tool_choice), for the replays to send the same
        choice = {None: "auto", "any": "required"}.get(turn.tool_choice, turn.tool_choice)
        scope: dict[str, Any] = {"source": "gateway", "stream": turn.stream, TOOL_CHOICE_LABEL: choice}
        if turn.replica is not None:  # who sampled it, under which served name: what its stamp rests on
            scope["replica"], scope["upstream_model"] = turn.replica, turn.model
        if flagged:
            scope["flagged"] = SECRET_FLAG
        call = LLMCall(
            call_id=turn.call_id, messages=rendered, tools=tools, prompt_ids=prompt_ids, completion_ids=completion_ids,
            logprobs=logprobs, text=red_text, policy_version=turn.policy_version, purpose="policy",
            finish_reason=comp.finish_reason, latency_s=time.perf_counter() - turn.t0,
            started_at=turn.started_at, sampling=turn.params, scope=scope,
        )
        return call, flagged

    async def save(self, turn: Turn, call: LLMCall, flagged: bool) -> None:
        """Write the call (after flagging its session when it held a secret), or spool it
        (spool mode, at an outage); 503 when neither is possible."""
        transcript = transcript_of(self.redactor.obj(turn.messages), self.redactor.obj(turn.tools))
        entry = SpoolEntry(session_id=turn.session_id, task_key=turn.task_key, call=call, flagged=flagged, transcript=transcript)
        spool = self.spool
        if spool is not None and (spool.store_down or spool.holds(entry.session_id)):
            # The store is known down, or this session has calls waiting that must be stored first.
            await self._spool(spool, entry, mark_down=False)
            return
        try:
            await asyncio.to_thread(self._write, entry)
        except (StoreError, SQLAlchemyError) as e:
            if spool is None or not is_outage(e):
                raise self._unavailable("add_call", e) from None
            self.stats["store_errors"] += 1
            log.warning("the trace store is unavailable (%s); spooling calls to %s until it is back", _first_line(e), spool.path)
            await self._spool(spool, entry, mark_down=True)
            return
        self.stored(entry, flushed=False)

    def stored(self, entry: SpoolEntry, *, flushed: bool) -> None:
        """Count a call the store now holds (``flushed``: it came through the spool)."""
        self.stats["calls_stored"] += 1
        if flushed:
            self.stats["calls_flushed"] += 1
        if entry.flagged:
            self.stats["secret_calls"] += 1
            log.warning("session %s: a secret was redacted; the session is flagged and kept out of training", entry.session_id)

    def spooled(self, entry: SpoolEntry) -> None:
        """Count a call answered but waiting in the spool."""
        self.stats["calls_spooled"] += 1

    async def _spool(self, spool: Spool, entry: SpoolEntry, *, mark_down: bool) -> None:
        try:
            await asyncio.to_thread(spool.append, entry, mark_down=mark_down)
        except (SpoolError, sqlite3.Error, OSError) as e:
            self.stats["spool_errors"] += 1
            log.error("cannot spool a call of session %s: %s", entry.session_id, _first_line(e))
            raise GatewayError(503, "the trace store is unavailable and the local spool cannot take the call; nothing was recorded",
                               type="store_unavailable", code="spool_unavailable") from None
        self.spooled(entry)

    def _flushed(self, step: FlushResult) -> None:
        for entry in step.flushed:
            self.stored(entry, flushed=True)
        self.stats["spool_rejected"] += step.rejected

    def _write(self, entry: SpoolEntry) -> None:
        """The call's store write; idempotent (see ``spool``), so the flusher may replay it."""
        sid, task_key = entry.session_id, entry.task_key
        if entry.flagged:  # out of training before the call becomes visible
            self.store.create_session(sid, task_key=task_key)
            self.store.flag_session(sid, SECRET_FLAG)
        turn = self.store.add_call(sid, entry.call, task_key=task_key)  # creates the session when new
        record_transcript(self.store, sid, entry.transcript, call=entry.call, turn=turn)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store method off the event loop; a store failure becomes a 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (StoreError, SQLAlchemyError) as e:
            raise self._unavailable(fn.__name__, e) from None

    def _unavailable(self, what: str, e: BaseException) -> GatewayError:
        self.stats["store_errors"] += 1
        log.error("trace store request %s failed: %s", what, _first_line(e))
        return GatewayError(503, "the trace store is unavailable; nothing was recorded", type="store_unavailable", code="store_error")


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
