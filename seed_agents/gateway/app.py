"""The capture gateway: an OpenAI-compatible server that records every call token-exactly.

Put it between any OpenAI client and a vLLM server (a base-URL change is the whole
integration). Per chat request it renders the chat template with the model's tokenizer
(``SeedChatModel``'s code: tools included), sends the prompt ids to vLLM
``/v1/completions``, answers in OpenAI format (tool calls parsed from the model's
``<tool_call>`` blocks) and stores one ``LLMCall`` (prompt ids, completion ids, logprobs,
messages, tools, policy version, latency, sampling) under the request's session.

Sessions: the id comes from the ``X-Session-Id`` header or the path prefix
``/s/{session_id}/v1/...``; without one a new id is made. Either way it is echoed in the
``X-Session-Id`` response header. ``X-Task-Key`` sets the session's task key (what it
attempts: ``train --from-store`` trains the sessions of one key as one group and the judge
compares them; the continual loop replays each session as a group of its own) when the
session has none yet.

Replaying a session (the continual loop): every stored call keeps the session's transcript
(task and tool results, ``seed_agents.transcript``) in its metadata, so a session is
replayable with nothing else. ``PUT /v1/sessions/{id}/metadata`` (feedback role) sets an
explicit ``task`` (a Task record) and/or ``recording`` (a ``tools.replay`` JSONL path on the
loop's machine), which take precedence over the transcript.

Rewards: ``POST /v1/sessions/{id}/reward``, ``POST /v1/sessions/{id}/end`` (runs the
configured verifiers), ``POST /v1/tasks/{task_key}/judge`` (the LLM judge). Which reward
trains is the store's ``RewardPolicy``: by default the first reward of the most trusted
source present, ``verifier`` > ``user`` > ``judge`` (other sources after those, in arrival
order); configurable as ``RewardPolicy(precedence=..., combine=..., ignore_unlisted=...)``
where the trainer reads the store. So a reward's ``source`` is set by the sender's key,
never by the body alone: a feedback key may send ``user`` only, a verifier key
(``security.verifier_keys_env``) ``verifier``, an admin key any source; an open gateway
(no keys) takes ``user`` only. A body asking for more gets 403 ``reward_source_forbidden``
and nothing is stored. The gateway's own verifiers record ``verifier``, its judge ``judge``.

What gets stored, and when:
- Non-streaming: after vLLM answered and before the reply is sent. A store outage (server
  down, disk read-only) spools the call to a local durable queue and the user is answered;
  it is stored, exactly once and in order, when the store is back (``store_outage``,
  ``seed_agents.gateway.spool``). With ``store_outage.on_failure: refuse``, or when the spool
  cannot take it, a store failure turns the reply into a 503 (OpenAI clients retry it), so
  a client never holds an answer whose call is neither stored nor spooled without being told.
- Streaming: once, after the last content chunk and before ``data: [DONE]``. A client
  that disconnects before that leaves NO stored call (nothing half-written, nothing
  flagged "incomplete"); a store failure that is not spooled replaces ``[DONE]`` with an
  error event.
- Errors answer OpenAI-style ``{"error": {"message", "type", "code"}}``: 400 bad JSON or
  schema, 401/403 keys, 404 unknown model, 409 ended session, 413 oversize body,
  502/503/504 upstream or store trouble. None of them stores anything.
- Under load: beyond ``max_in_flight`` requests in progress a new one gets 503 ``overloaded``
  with ``Retry-After`` (``seed_agents.gateway.admission``), never a dropped connection; idle
  connections stay open ``keep_alive_s`` (longer than clients' pool expiry). The document
  of this contract, bodies and statuses included: ``seed_agents.gateway.openapi``.
- Secrets: see ``recording`` (redacted, session flagged "secret", never trained).

Replicas and gateways: ``upstream`` may list several vLLM replicas of one model; the gateway
spreads requests over those in rotation and moves all of them to a new version together, or
takes out the ones that cannot serve it (``seed_agents.gateway.replicas``; admin role:
``GET /v1/admin/replicas``). Each stored call's scope names the replica that sampled it
(``replica``). Several gateways may share one store: a session continues on any of them, each
drains its own spool (named after the gateway), and each reports itself in the store every
few seconds for ``seed-agents status`` (``seed_agents.gateway.fleet``).

Versions: with config ``registry`` the upstream model and the stamped policy version
follow the store's promoted version (``seed_agents.gateway.policy``): a promotion or a
rollback reaches new requests within ``refresh_s``, requests in flight keep the version
they started with, and ``PUT /v1/admin/policy`` is refused (409). Without it, an admin
switches by hand with that PUT.

Watching (admin role): ``GET /metrics`` (Prometheus) and ``GET /dashboard`` (the store's
HTML report); see ``seed_agents.observe``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from fastapi import BackgroundTasks, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from seed_agents.gateway.admission import InFlightLimit
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.errors import GatewayError, bad_request, not_found
from seed_agents.gateway.feedback import RewardIn, load_verifiers, reward_source, run_verifiers
from seed_agents.gateway.fleet import Heartbeat
from seed_agents.gateway.judge import LLMJudge
from seed_agents.gateway.policy import PolicyResolver
from seed_agents.gateway.recording import Turn
from seed_agents.gateway.replicas import ReplicaSet
from seed_agents.gateway.render import ChatRequest, Renderer, Reply, forced_prefix, parse_reply, parse_request, tool_choice_of
from seed_agents.gateway.security import KeyRing, RedactingFilter, Redactor, Role, presented_key
from seed_agents.gateway.streaming import DeltaBuilder
from seed_agents.gateway.upstream import Upstream
from seed_agents.observe import routes as observe_routes
from seed_agents.observe.metrics import GatewayMetrics, MeteredRecorder
from seed_agents.store import TraceStore
from seed_agents.types import Completion, Task, new_id

log = logging.getLogger("seed_agents.gateway")

_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TASK_KEY_MAX = 256


class PolicyIn(BaseModel):
    """Body of ``PUT /v1/admin/policy``: what new requests are sent to and stamped with."""

    model_config = ConfigDict(extra="forbid")

    upstream_model: str = Field(min_length=1, description="A name the upstream serves (e.g. a LoRA adapter).")
    policy_version: int = Field(ge=0)


class Gateway:
    """Everything a request handler needs, built once per app."""

    def __init__(self, cfg: GatewayConfig, store: TraceStore, upstream: Upstream | ReplicaSet, tokenizer: Any) -> None:
        self.cfg = cfg
        self.store = store
        self.stats: Counter[str] = Counter()
        if isinstance(upstream, Upstream):  # one server: a set of one
            upstream = ReplicaSet([upstream], pick=cfg.replicas.pick, probe_timeout_s=cfg.replicas.probe_timeout_s,
                                  load_timeout_s=cfg.replicas.load_timeout_s, load_adapters=cfg.replicas.load_adapters)
        upstream.stats = self.stats
        self.upstream = upstream
        self.renderer = Renderer(tokenizer, cfg.tool_format)
        self.keys = KeyRing.from_config(cfg.security)
        self.redactor = Redactor.from_config(cfg.security, extra_literals=[*self.keys.values, *upstream.secret_values])
        self.metrics = GatewayMetrics(store, upstream, self.stats)
        self.recorder = MeteredRecorder(store, self.renderer, self.redactor, self.stats, self.metrics, cfg.store_outage,
                                        gateway=cfg.gateway_name)
        self.heartbeat = Heartbeat(store, cfg, upstream, self.recorder, self.stats)
        self.verifiers = load_verifiers(cfg.verifiers)
        self.judge = LLMJudge(cfg.judge, redact=self.redactor.text) if cfg.judge else None
        self._judge_locks: dict[str, asyncio.Lock] = {}
        self.policy: PolicyResolver | None = None
        if cfg.registry is not None:
            from seed_agents.continual.versions import VersionRegistry

            self.policy = PolicyResolver(VersionRegistry(store), cfg.registry.name or cfg.model, upstream,
                                         cfg.registry.refresh_s, self.stats)

    def judge_lock(self, task_key: str) -> asyncio.Lock:
        """One judge run per task key at a time, so a group is never scored twice."""
        return self._judge_locks.setdefault(task_key, asyncio.Lock())


def build_app(config: GatewayConfig, store: TraceStore, upstream: Upstream | ReplicaSet, *, tokenizer: Any = None,
              check_replicas: bool = False) -> FastAPI:
    """The gateway app. ``tokenizer`` defaults to ``config.tokenizer or config.model``
    (resolved with ``seed_agents.models``); the caller owns ``store`` and closes it.
    ``upstream``: one server, or several replicas (``ReplicaSet``). ``check_replicas``: ask
    every replica at start whether it answers (the CLI does), so one that does not starts
    out of rotation with one log line instead of failing the first requests sent to it."""
    if tokenizer is None:
        from seed_agents.models import load_tokenizer

        tokenizer = load_tokenizer(config.tokenizer or config.model)
    gw = Gateway(config, store, upstream, tokenizer)
    _install_log_redaction(gw.redactor)
    if gw.keys.open:
        log.warning("no API keys configured: the gateway admits every request (fine on loopback only)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.recorder.start()  # spool mode: open the spool, flush what an earlier run left
        if check_replicas:
            await gw.upstream.check()
        if gw.policy is not None:  # serve the promoted version from the first request on
            await gw.policy.refresh()
        background = [asyncio.create_task(gw.upstream.watch(config.replicas.health_s), name="seed-gateway-replicas"),
                      asyncio.create_task(gw.heartbeat.run(), name="seed-gateway-heartbeat")]
        yield
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await gw.recorder.stop()  # one last flush; the rest waits in the spool for the next start
        await gw.heartbeat.beat(stopped=True)
        await gw.upstream.aclose()

    app = FastAPI(title="seed-agents capture gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw
    _add_error_handlers(app, gw)
    _add_chat_routes(app, gw)
    _add_feedback_routes(app, gw)
    _add_session_metadata_route(app, gw)
    _add_admin_routes(app, gw)
    app.add_middleware(InFlightLimit, limit=config.max_in_flight, stats=gw.stats)  # inside the metrics middleware: 503s counted
    observe_routes.install(app, gw.metrics, store, [Depends(_require(gw, Role.ADMIN))])
    return app


def _install_log_redaction(redactor: Redactor) -> None:
    """Every gateway log line (and uvicorn's error log) passes the redactor first."""
    for name in ("seed_agents.gateway", "uvicorn.error"):
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, RedactingFilter)]:
            logger.removeFilter(f)
        logger.addFilter(RedactingFilter(redactor))


# -- plumbing ---------------------------------------------------------------------------


def _require(gw: Gateway, role: Role) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        gw.keys.check(presented_key(request.headers), role)

    return check


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON: 413 beyond ``limit`` bytes (checked while reading, so a
    huge body is never held in memory), 400 when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"request body exceeds {limit} bytes", type="invalid_request_error", code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise GatewayError(413, f"request body exceeds {limit} bytes", type="invalid_request_error", code="request_too_large")
    try:
        return json.loads(body)
    except ValueError:
        raise bad_request("the request body is not valid JSON", code="invalid_json") from None


def _session_id(request: Request, path_session: str | None) -> str:
    header = request.headers.get("x-session-id")
    if path_session and header and header != path_session:
        raise bad_request("X-Session-Id and the /s/{session_id} path prefix disagree", code="session_conflict")
    sid = path_session or header
    if sid is None:
        return new_id()
    if not _SESSION_ID.fullmatch(sid):
        raise bad_request("a session id is 1-128 characters of A-Z a-z 0-9 . _ : -", code="invalid_session_id")
    return sid


def _task_key(request: Request) -> str | None:
    key = request.headers.get("x-task-key")
    if key is not None and not 0 < len(key) <= _TASK_KEY_MAX:
        raise bad_request(f"X-Task-Key must be 1-{_TASK_KEY_MAX} characters", code="invalid_task_key")
    return key


def _add_error_handlers(app: FastAPI, gw: Gateway) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        gw.stats[f"http_{exc.status}"] += 1
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        return bad_request(f"invalid request: {loc}: {first.get('msg')}").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return GatewayError(exc.status_code, str(exc.detail), type="invalid_request_error", code=code).response()

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        """A gateway bug: still an OpenAI-shaped answer, and one redacted log line."""
        gw.stats["http_500"] += 1
        log.error("unexpected %s on %s: %s", type(exc).__name__, request.url.path, exc)
        return GatewayError(500, "internal gateway error; see the gateway log", type="internal_error", code="internal_error").response()


# -- chat -----------------------------------------------------------------------------------


def _add_chat_routes(app: FastAPI, gw: Gateway) -> None:
    client = [Depends(_require(gw, Role.CLIENT))]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models", dependencies=client)
    @app.get("/s/{session_id}/v1/models", dependencies=client)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": gw.cfg.model, "object": "model", "created": 0, "owned_by": "seed-agents"}]}

    @app.post("/v1/chat/completions", dependencies=client)
    async def chat(request: Request) -> Response:
        return await _chat(gw, request, None)

    @app.post("/s/{session_id}/v1/chat/completions", dependencies=client)
    async def chat_in_session(request: Request, session_id: str) -> Response:
        return await _chat(gw, request, session_id)


async def _chat(gw: Gateway, request: Request, path_session: str | None) -> Response:
    sid = _session_id(request, path_session)
    headers = {"X-Session-Id": sid}
    try:
        data = await read_json(request, gw.cfg.security.max_request_bytes)
        req = parse_request(data)
        if req.model != gw.cfg.model:
            raise not_found(f"model {req.model!r} does not exist here; this gateway serves {gw.cfg.model!r}", code="model_not_found")
        choice = tool_choice_of(req)
        tools = None if choice == "none" else req.tools  # "none": nothing offered, nothing parsed (as SeedChatModel)
        prefix = forced_prefix(choice, tools)
        params = gw.renderer.sampling(req, gw.cfg.default_max_tokens, gw.cfg.max_tokens_limit, tools=tools, prefix=prefix)
        prompt_ids, rendered = gw.renderer.render(req.messages, tools, prefix)
        task_key = _task_key(request)
        await gw.recorder.open_session(sid)
        if gw.policy is not None:
            await gw.policy.refresh()
        # the pair is the replica's, taken when it is picked: set on the turn below
        turn = Turn(session_id=sid, task_key=task_key, call_id=new_id(), messages=req.messages, tools=tools,
                    prompt_ids=prompt_ids, rendered=rendered, params=params, model=gw.upstream.model,
                    policy_version=gw.upstream.policy_version, stream=req.stream, prefix=prefix, tool_choice=choice)
        if req.stream:
            return await _open_stream(gw, request, req, turn, headers)
        comp, pick = await gw.upstream.complete(prompt_ids, params)
        turn.picked(pick.model, pick.policy_version, pick.replica.state()["url"])
        call, flagged = gw.recorder.build(turn, comp)
        if await request.is_disconnected():  # nobody will act on this answer: keep it out of the session
            gw.stats["dropped_disconnected"] += 1
            return Response(status_code=499)
        await gw.recorder.save(turn, call, flagged)
    except GatewayError as e:
        gw.stats[f"http_{e.status}"] += 1
        if e.status >= 500:
            log.warning("chat call in session %s failed: HTTP %d %s", sid, e.status, e.message)
        return e.response(headers)
    reply = parse_reply(prefix + gw.renderer.decode(comp.token_ids), bool(tools))  # the client sees the unredacted text
    body = _completion_json(gw, turn.call_id, reply, comp, len(prompt_ids))
    return JSONResponse(body, headers={**headers, "X-Call-Id": turn.call_id})


def _completion_json(gw: Gateway, call_id: str, reply: Reply, comp: Completion, n_prompt: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": gw.cfg.model,
        "system_fingerprint": f"policy-v{comp.policy_version}",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_override or comp.finish_reason}],
        "usage": _usage(n_prompt, len(comp.token_ids)),
    }


def _usage(n_prompt: int, n_completion: int) -> dict[str, int]:
    return {"prompt_tokens": n_prompt, "completion_tokens": n_completion, "total_tokens": n_prompt + n_completion}


async def _open_stream(gw: Gateway, request: Request, req: ChatRequest, turn: Turn, headers: dict[str, str]) -> Response:
    """Start the upstream stream first, so its errors are still proper HTTP errors."""
    stack = AsyncExitStack()
    try:
        pieces, pick = await gw.upstream.open_stream(turn.prompt_ids, turn.params, stack)
    except BaseException:
        await stack.aclose()
        raise
    turn.picked(pick.model, pick.policy_version, pick.replica.state()["url"])
    events = _stream_events(gw, request, req, turn, pieces, stack)
    return StreamingResponse(events, media_type="text/event-stream", headers={**headers, "X-Call-Id": turn.call_id})


def _sse(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def _stream_events(gw: Gateway, request: Request, req: ChatRequest, turn: Turn, pieces: AsyncIterator[Any], stack: AsyncExitStack) -> AsyncIterator[str]:
    """Forward upstream pieces as ``chat.completion.chunk`` deltas; store once at the end."""
    base = {"id": f"chatcmpl-{turn.call_id}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": gw.cfg.model, "system_fingerprint": f"policy-v{turn.policy_version}"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    builder = DeltaBuilder(lambda ids: turn.prefix + gw.renderer.decode(ids), has_tools=bool(turn.tools))
    logprobs: list[float] = []
    finish = None
    done = False
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for piece in pieces:
            logprobs += piece.logprobs
            finish = piece.finish_reason or finish
            if delta := builder.feed(piece.token_ids):
                yield chunk({"content": delta})
        last, reply = builder.finish()
        if last:
            yield chunk({"content": last})
        if reply.tool_calls:
            yield chunk({"tool_calls": [{"index": i, **tc} for i, tc in enumerate(reply.tool_calls)]})
        comp = Completion(token_ids=builder.token_ids, logprobs=logprobs, finish_reason=finish or "error", policy_version=turn.policy_version)
        yield chunk({}, reply.finish_override or comp.finish_reason)
        if req.include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(len(turn.prompt_ids), len(comp.token_ids))})
        call, flagged = gw.recorder.build(turn, comp)
        if await request.is_disconnected():
            gw.stats["dropped_disconnected"] += 1
            return
        await gw.recorder.save(turn, call, flagged)
        done = True
        yield _sse("[DONE]")
    except GatewayError as e:
        gw.stats[f"http_{e.status}"] += 1
        log.warning("stream in session %s failed: %s", turn.session_id, e.message)
        yield _sse(e.body())
    finally:
        if not done:
            gw.stats["streams_not_stored"] += 1
        with anyio.CancelScope(shield=True):  # close upstream even when cancelled: vLLM stops generating
            await stack.aclose()


# -- feedback ---------------------------------------------------------------------------------


def _add_feedback_routes(app: FastAPI, gw: Gateway) -> None:
    feedback = [Depends(_require(gw, Role.FEEDBACK))]

    @app.post("/v1/sessions/{session_id}/reward")
    async def reward(request: Request, session_id: str) -> dict[str, Any]:
        roles = gw.keys.admit(presented_key(request.headers), Role.FEEDBACK, Role.VERIFIER)
        try:
            body = RewardIn.model_validate(await read_json(request, gw.cfg.security.max_request_bytes))
        except ValidationError as e:
            raise bad_request(f"invalid reward: {_first_error(e)}") from None
        source = reward_source(body.source, roles)  # the key's authority, not the body's say
        await _existing_session(gw, session_id)
        comment = None if body.comment is None else gw.redactor.text(body.comment)
        reward_id = await gw.recorder.run(
            lambda: gw.store.add_reward(session_id, body.value, source=source, turn=body.turn, comment=comment))
        gw.stats["rewards_stored"] += 1
        return {"session_id": session_id, "reward_id": reward_id, "source": source}

    @app.post("/v1/sessions/{session_id}/end", dependencies=feedback)
    async def end(session_id: str, background: BackgroundTasks) -> dict[str, Any]:
        session = await _existing_session(gw, session_id)
        if session.ended_at is not None:
            return {"session_id": session_id, "ended": True, "already_ended": True, "verifiers": []}
        await gw.recorder.run(gw.store.end_session, session_id)
        outcomes = await gw.recorder.run(run_verifiers, gw.store, session_id, gw.verifiers)
        gw.stats["sessions_ended"] += 1
        gw.stats["verifier_errors"] += sum(o.error is not None for o in outcomes)
        gw.stats["verifier_rewards"] += sum(o.reward_id is not None for o in outcomes)
        if gw.judge is not None and gw.judge.cfg.auto_group_size and session.task_key:
            background.add_task(_auto_judge, gw, session.task_key)
        return {"session_id": session_id, "ended": True, "already_ended": False, "verifiers": [o.as_json() for o in outcomes]}

    @app.post("/v1/tasks/{task_key}/judge", dependencies=feedback)
    async def judge(task_key: str) -> dict[str, Any]:
        if gw.judge is None:
            raise not_found("no judge is configured on this gateway (config: judge)", code="no_judge")
        return await _run_judge(gw, task_key)


async def _existing_session(gw: Gateway, session_id: str) -> Any:
    session = await gw.recorder.run(gw.store.get_session, session_id)
    if session is None:
        raise not_found(f"no session {session_id!r}", code="session_not_found")
    return session


async def _run_judge(gw: Gateway, task_key: str) -> dict[str, Any]:
    assert gw.judge is not None
    async with gw.judge_lock(task_key):
        result = await gw.recorder.run(gw.judge.judge, gw.store, task_key)
    gw.stats["judge_runs"] += 1
    if result.error:
        gw.stats["judge_failures"] += 1
    return {"task_key": task_key, "sessions": result.session_ids, "scores": result.scores,
            "stored": bool(result.reward_ids), "error": result.error}


async def _auto_judge(gw: Gateway, task_key: str) -> None:
    """After a session ends: judge its task key once enough sessions wait for it."""
    assert gw.judge is not None and gw.judge.cfg.auto_group_size is not None
    waiting = await gw.recorder.run(gw.judge.candidates, gw.store, task_key)
    if len(waiting) >= gw.judge.cfg.auto_group_size:
        try:
            await _run_judge(gw, task_key)
        except GatewayError as e:
            log.warning("automatic judge run for task %s failed: %s", task_key, e.message)


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    return f"{'.'.join(str(x) for x in first['loc']) or '(body)'}: {first['msg']}"


# -- session metadata ---------------------------------------------------------------------------


class SessionMetadataIn(BaseModel):
    """Body of ``PUT /v1/sessions/{id}/metadata``: what the continual loop replays the session from."""

    model_config = ConfigDict(extra="forbid")

    task: Task | None = Field(None, description="The task to replay (default: derived from the session's transcript).")
    recording: str | None = Field(None, min_length=1, description="A tools.replay JSONL path on the loop's machine "
                                                                  "(default: the transcript's tool results).")


def _add_session_metadata_route(app: FastAPI, gw: Gateway) -> None:
    @app.put("/v1/sessions/{session_id}/metadata", dependencies=[Depends(_require(gw, Role.FEEDBACK))])
    async def session_metadata(request: Request, session_id: str) -> dict[str, Any]:
        try:
            body = SessionMetadataIn.model_validate(await read_json(request, gw.cfg.security.max_request_bytes))
        except ValidationError as e:
            raise bad_request(f"invalid session metadata: {_first_error(e)}") from None
        extra = gw.redactor.obj(body.model_dump(mode="json", exclude_none=True))
        if not extra:
            raise bad_request("invalid session metadata: set task and/or recording")
        await _existing_session(gw, session_id)
        await gw.recorder.run(gw.store.merge_session_metadata, session_id, extra)
        return {"session_id": session_id, "set": sorted(extra)}


# -- admin ------------------------------------------------------------------------------------


def _add_admin_routes(app: FastAPI, gw: Gateway) -> None:
    admin = [Depends(_require(gw, Role.ADMIN))]

    @app.get("/v1/admin/sessions/{session_id}", dependencies=admin)
    async def export_session(session_id: str) -> dict[str, Any]:
        """One session as stored (already redacted): record, calls, rewards."""
        session = await _existing_session(gw, session_id)
        calls = await gw.recorder.run(gw.store.calls, session_id)
        rewards = await gw.recorder.run(gw.store.rewards, session_id)
        return {"session": session.model_dump(), "calls": [c.model_dump() for c in calls], "rewards": [r.model_dump() for r in rewards]}

    @app.get("/v1/admin/policy", dependencies=admin)
    async def get_policy() -> dict[str, Any]:
        return {"upstream_model": gw.upstream.model, "policy_version": gw.upstream.policy_version}

    @app.put("/v1/admin/policy", dependencies=admin)
    async def put_policy(request: Request) -> dict[str, Any]:
        """Switch what new requests are served by (in-flight ones keep their pair); the
        model must be served upstream already, so a typo cannot take the gateway down.
        Refused while the gateway follows the version registry (config ``registry``)."""
        if gw.policy is not None:
            raise GatewayError(409, f"this gateway serves the promoted version of {gw.policy.name!r} from the store; "
                               f"switch with `seed-agents versions promote N` or `rollback`",
                               type="invalid_request_error", code="policy_follows_registry")
        try:
            body = PolicyIn.model_validate(await read_json(request, gw.cfg.security.max_request_bytes))
        except ValidationError as e:
            raise bad_request(f"invalid policy: {_first_error(e)}") from None
        result = await gw.upstream.switch(body.upstream_model, body.policy_version)
        if not result.switched:
            why = "; ".join(f"{url}: {reason}" for url, reason in result.out.items())
            raise GatewayError(409, f"no upstream replica serves {body.upstream_model!r} ({why})",
                               type="invalid_request_error", code="model_not_served")
        log.info("policy switched to %s (version %d)", body.upstream_model, body.policy_version)
        return {"upstream_model": gw.upstream.model, "policy_version": gw.upstream.policy_version}

    @app.get("/v1/admin/replicas", dependencies=admin)
    async def replicas() -> dict[str, Any]:
        """The upstream replicas: in rotation or not (and why), requests in flight."""
        return {"upstream_model": gw.upstream.model, "policy_version": gw.upstream.policy_version,
                "replicas": gw.upstream.state()}

    @app.get("/v1/admin/stats", dependencies=admin)
    async def stats() -> dict[str, int]:
        return dict(gw.stats)
