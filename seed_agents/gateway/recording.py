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
when no explicit ``metadata["task"]`` / ``["recording"]`` was set.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from seed_agents.gateway.errors import GatewayError
from seed_agents.gateway.render import Renderer
from seed_agents.gateway.security import Redactor
from seed_agents.store import SessionRecord, StoreError, TraceStore
from seed_agents.transcript import Transcript, record_transcript, transcript_of
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
    started_at: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)


class Recorder:
    """Builds redacted ``LLMCall``s and writes them (store calls run in worker threads)."""

    def __init__(self, store: TraceStore, renderer: Renderer, redactor: Redactor, stats: Counter[str]) -> None:
        self.store = store
        self.renderer = renderer
        self.redactor = redactor
        self.stats = stats

    # -- sessions -------------------------------------------------------------------------

    async def open_session(self, session_id: str) -> SessionRecord | None:
        """The session if it exists (409 when it has ended); None when it is new (it is
        created with its first stored call, so a failed first call leaves no empty session)."""
        session = await self.run(self.store.get_session, session_id)
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
        scope: dict[str, Any] = {"source": "gateway", "stream": turn.stream}
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
        """Write the call (after flagging its session when it held a secret); 503 on a store failure."""
        transcript = transcript_of(self.redactor.obj(turn.messages), self.redactor.obj(turn.tools))
        await self.run(self._write, turn.session_id, turn.task_key, call, flagged, transcript)
        self.stats["calls_stored"] += 1
        if flagged:
            self.stats["secret_calls"] += 1
            log.warning("session %s: a secret was redacted; the session is flagged and kept out of training", turn.session_id)

    def _write(self, session_id: str, task_key: str | None, call: LLMCall, flagged: bool, transcript: Transcript) -> None:
        if flagged:  # out of training before the call becomes visible
            self.store.create_session(session_id, task_key=task_key)
            self.store.flag_session(session_id, SECRET_FLAG)
        self.store.add_call(session_id, call, task_key=task_key)  # creates the session when new
        record_transcript(self.store, session_id, transcript)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking store method off the event loop; a store failure becomes a 503."""
        try:
            return await asyncio.to_thread(fn, *args)
        except (StoreError, SQLAlchemyError) as e:
            self.stats["store_errors"] += 1
            log.error("trace store request %s failed: %s", fn.__name__, _first_line(e))
            raise GatewayError(503, "the trace store is unavailable; nothing was recorded", type="store_unavailable", code="store_error") from None


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:300]
