"""A small "deployed" library service: the stand-in for a production tool API.

Tests and the continual-learning demo need an HTTP API with an OpenAPI spec, state that
writes change (borrowing a book makes it unavailable), read and write operations, and a
way to prove what reached it. ``create_app()`` builds that service (FastAPI, so the spec
at ``/openapi.json`` is generated from the same code that serves it) and every request it
receives is counted in ``app.state.log`` (also ``GET /admin/requests``, left out of the
spec so no agent tool is generated for it), by method and by origin: a test reads the log
of the *production* instance to show that training replays sent it 0 mutating requests.
The origin is the ``X-Demo-Origin`` request header (``OriginTransport`` sets it under any
httpx client); the demo's traffic generator marks its requests, and whatever else reaches
production arrives unmarked, so the loop's replays need no demo-specific code to be counted.

``DemoServer`` runs an app under uvicorn on a loopback port in a background thread;
``python -m examples.library_service --port 8000`` serves it in the foreground.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import httpx
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from seed_agents.serve import free_port
from seed_agents.types import Task

Genre = Literal["fiction", "science", "history", "fantasy"]
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ORIGIN_HEADER = "x-demo-origin"
UNMARKED = "unmarked"


class Book(BaseModel):
    id: int = Field(description="The book's id.")
    title: str
    author: str
    genre: Genre
    year: int
    available: bool = Field(description="False while the book is on loan.")


class BorrowRequest(BaseModel):
    book_id: int = Field(description="Id of the book to borrow (see search_books).")
    member_id: str = Field(min_length=1, max_length=64, description="The library member who borrows it.")
    days: int = Field(14, ge=1, le=60, description="Loan length in days.")


class Loan(BaseModel):
    id: int = Field(description="The loan's id (use it to return the book).")
    book_id: int
    member_id: str
    days: int
    returned: bool = False


CATALOG: tuple[Book, ...] = (
    Book(id=1, title="Dune", author="Frank Herbert", genre="fiction", year=1965, available=True),
    Book(id=2, title="The Hobbit", author="J. R. R. Tolkien", genre="fantasy", year=1937, available=True),
    Book(id=3, title="A Brief History of Time", author="Stephen Hawking", genre="science", year=1988, available=True),
    Book(id=4, title="The Guns of August", author="Barbara Tuchman", genre="history", year=1962, available=True),
    Book(id=5, title="Foundation", author="Isaac Asimov", genre="fiction", year=1951, available=True),
    Book(id=6, title="The Selfish Gene", author="Richard Dawkins", genre="science", year=1976, available=True),
    Book(id=7, title="A Wizard of Earthsea", author="Ursula K. Le Guin", genre="fantasy", year=1968, available=True),
    Book(id=8, title="SPQR", author="Mary Beard", genre="history", year=2015, available=True),
)


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the service saw it."""

    method: str
    path: str
    origin: str  # the X-Demo-Origin header, else UNMARKED
    at: float  # unix time of arrival


class RequestLog:
    """Every request the service received, in arrival order."""

    def __init__(self) -> None:
        self._entries: list[LoggedRequest] = []
        self._lock = threading.Lock()

    def record(self, method: str, path: str, origin: str = UNMARKED) -> None:
        with self._lock:
            self._entries.append(LoggedRequest(method.upper(), path, origin or UNMARKED, time.time()))

    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._entries)

    def entries(self) -> list[tuple[str, str]]:
        """``(method, path)`` per request."""
        return [(r.method, r.path) for r in self.requests()]

    def counts(self) -> Counter[str]:
        """``{"GET /books": 3, "POST /loans": 1, ...}``."""
        return Counter(f"{m} {p}" for m, p in self.entries())

    def by_origin(self) -> dict[str, dict[str, int]]:
        """``{"traffic": {"GET": 5, "POST": 2}, "unmarked": {"GET": 3}}``."""
        out: dict[str, Counter[str]] = {}
        for r in self.requests():
            out.setdefault(r.origin, Counter())[r.method] += 1
        return {origin: dict(sorted(c.items())) for origin, c in sorted(out.items())}

    def mutating(self, *, origin: str | None = None, exclude: tuple[str, ...] = ()) -> int:
        """Requests with a method other than GET/HEAD/OPTIONS (of one origin, or of every
        origin but those in ``exclude``)."""
        return sum(r.method not in READ_METHODS for r in self.requests()
                   if (origin is None or r.origin == origin) and r.origin not in exclude)


class OriginTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that stamps ``X-Demo-Origin: <origin>`` on every request it passes
    to ``inner`` (default: the network), so the service's log can say who sent what."""

    def __init__(self, origin: str, inner: httpx.AsyncBaseTransport | httpx.BaseTransport | None = None) -> None:
        self.origin = origin
        self._async = inner if isinstance(inner, httpx.AsyncBaseTransport) else (None if inner else httpx.AsyncHTTPTransport())
        self._sync = inner if isinstance(inner, httpx.BaseTransport) else (None if inner else httpx.HTTPTransport())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert self._sync is not None, "OriginTransport: the inner transport is async only"
        request.headers[ORIGIN_HEADER] = self.origin
        return self._sync.handle_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self._async is not None, "OriginTransport: the inner transport is sync only"
        request.headers[ORIGIN_HEADER] = self.origin
        return await self._async.handle_async_request(request)

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()


class Library:
    """The service's state; one lock makes borrow/return atomic under concurrent requests."""

    def __init__(self, books: tuple[Book, ...] = CATALOG) -> None:
        self.books = {b.id: b.model_copy() for b in books}
        self.loans: dict[int, Loan] = {}
        self.lock = threading.Lock()

    def borrow(self, req: BorrowRequest) -> Loan:
        with self.lock:
            book = self.book(req.book_id)
            if not book.available:
                raise HTTPException(409, f"book {book.id} is already on loan")
            loan = Loan(id=len(self.loans) + 1, book_id=book.id, member_id=req.member_id, days=req.days)
            self.loans[loan.id] = loan
            book.available = False
            return loan

    def give_back(self, loan_id: int) -> Loan:
        with self.lock:
            loan = self.loans.get(loan_id)
            if loan is None:
                raise HTTPException(404, f"no loan with id {loan_id}")
            if loan.returned:
                raise HTTPException(409, f"loan {loan_id} was already returned")
            loan.returned = True
            self.book(loan.book_id).available = True
            return loan

    def book(self, book_id: int) -> Book:
        book = self.books.get(book_id)
        if book is None:
            raise HTTPException(404, f"no book with id {book_id}")
        return book


def log_requests(app: FastAPI) -> FastAPI:
    """Count every request ``app`` receives in ``app.state.log`` (method, path, origin), so
    any service can be the demo's production and prove what reached it; returns ``app``."""
    app.state.log = RequestLog()

    @app.middleware("http")
    async def log(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        app.state.log.record(request.method, request.url.path, request.headers.get(ORIGIN_HEADER, UNMARKED))
        return await call_next(request)

    return app


def create_app(*, api_key: str | None = None, title: str = "Library") -> FastAPI:
    """The library service. With ``api_key`` every API request must send it as ``X-Api-Key``
    (401 otherwise): the tests' stand-in for a credentialed production API."""
    app = FastAPI(title=title, version="1.0.0",
                  description="A small library: search books, borrow and return them.")
    app.state.library = Library()

    @app.middleware("http")
    async def authorize(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        public = request.url.path in ("/openapi.json", "/admin/requests")
        if api_key and not public and not secrets.compare_digest(request.headers.get("x-api-key", ""), api_key):
            return JSONResponse({"detail": "missing or wrong X-Api-Key"}, status_code=401)
        return await call_next(request)

    log_requests(app)  # added last, so it runs first: a request refused for its key is logged too
    lib: Library = app.state.library

    @app.get("/books", operation_id="search_books", summary="Search the catalog",
             description="Books whose title or author contains the query, optionally filtered.")
    def search_books(q: Annotated[str | None, Query(description="Text to find in the title or author.")] = None,
                     genre: Annotated[Genre | None, Query(description="Only books of this genre.")] = None,
                     available_only: Annotated[bool, Query(description="Only books that can be borrowed now.")] = False,
                     limit: Annotated[int, Query(ge=1, le=50, description="At most this many results.")] = 10) -> list[Book]:
        text = (q or "").lower()
        hits = [b for b in lib.books.values()
                if text in f"{b.title} {b.author}".lower()
                and (genre is None or b.genre == genre) and (b.available or not available_only)]
        return hits[:limit]

    @app.get("/books/{book_id}", operation_id="get_book", summary="Get one book by id")
    def get_book(book_id: int) -> Book:
        return lib.book(book_id)

    @app.get("/loans", operation_id="list_loans", summary="List loans",
             description="Loans, newest last; optionally those of one member.")
    def list_loans(member_id: Annotated[str | None, Query(description="Only this member's loans.")] = None) -> list[Loan]:
        return [loan for loan in lib.loans.values() if member_id is None or loan.member_id == member_id]

    @app.post("/loans", operation_id="borrow_book", status_code=201, summary="Borrow a book",
              description="Lend an available book to a member; 409 when it is already on loan.")
    def borrow_book(req: BorrowRequest) -> Loan:
        return lib.borrow(req)

    @app.post("/loans/{loan_id}/return", operation_id="return_book", summary="Return a borrowed book")
    def return_book(loan_id: int) -> Loan:
        return lib.give_back(loan_id)

    @app.get("/admin/requests", include_in_schema=False)
    def requests_received() -> dict[str, Any]:
        log: RequestLog = app.state.log
        return {"entries": [list(e) for e in log.entries()], "mutating": log.mutating(), "by_origin": log.by_origin()}

    return app


# ------------------------------------------------------------ tasks with verifiable outcomes

LIBRARY_TASKS: tuple[dict[str, Any], ...] = (
    {"task_id": "borrow-dune", "data": {"question": "Please borrow the book 'Dune' for member ann.",
                                         "expect": {"operation": "borrow_book", "args": {"book_id": 1, "member_id": "ann"}}}},
    {"task_id": "borrow-hobbit", "data": {"question": "Borrow 'The Hobbit' for member bob for 7 days.",
                                           "expect": {"operation": "borrow_book", "args": {"book_id": 2, "member_id": "bob"}}}},
    {"task_id": "year-foundation", "data": {"question": "In which year was 'Foundation' by Isaac Asimov published?",
                                             "expect": {"answer_contains": "1951"}}},
    {"task_id": "author-spqr", "data": {"question": "Who wrote the book 'SPQR'?", "expect": {"answer_contains": "Beard"}}},
    {"task_id": "borrow-earthsea", "data": {"question": "Member cy wants to borrow 'A Wizard of Earthsea'.",
                                             "expect": {"operation": "borrow_book", "args": {"book_id": 7, "member_id": "cy"}}}},
    {"task_id": "year-selfish-gene", "data": {"question": "When was 'The Selfish Gene' published?",
                                               "expect": {"answer_contains": "1976"}}},
)
"""Library tasks whose outcome a verifier can check (``library_reward``): a borrow with the
right book and member that the service accepted, or an answer that holds a fact."""


def library_reward(task: Any, state: dict[str, Any]) -> float:
    """1.0 when the episode did what ``task.data["expect"]`` says, else 0.0. Verifiable from
    the agent's own messages: a tool call of the expected operation with (at least) the
    expected arguments whose tool result was not an error, or a final answer containing
    the expected text. Works the same against production, a sandbox or a recording."""
    from langchain_core.messages import AIMessage, ToolMessage

    expect = task.data.get("expect", {})
    messages = state.get("messages", [])
    if "answer_contains" in expect:
        return float(str(expect["answer_contains"]).lower() in str(state.get("answer", "")).lower())
    wanted, args = expect.get("operation"), expect.get("args", {})
    accepted = {m.tool_call_id for m in messages if isinstance(m, ToolMessage) and m.status != "error"}
    for m in messages:
        for call in m.tool_calls if isinstance(m, AIMessage) else ():
            if call["name"] == wanted and call.get("id") in accepted and \
                    all(call["args"].get(k) == v for k, v in args.items()):
                return 1.0
    return 0.0


class DemoServer:
    """An app (default: a fresh library) under uvicorn on a loopback port, in a daemon thread.

    A context manager: ``with DemoServer() as s: s.url, s.log``. ``stop`` waits for the
    thread, so a test never leaves a server behind.
    """

    def __init__(self, app: FastAPI | None = None, *, host: str = "127.0.0.1", port: int | None = None) -> None:
        import uvicorn

        self.app = app or create_app()
        self.host, self.port = host, port or free_port(host)
        self.url = f"http://{self.host}:{self.port}"
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"demo-service-{self.port}", daemon=True)

    @property
    def log(self) -> RequestLog:
        return self.app.state.log

    def start(self, timeout_s: float = 15.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"the demo service did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class ViaGateway:
    """Users reach the agent's model through a capture gateway (``seed-agents gateway``):
    each session gets its own ``ChatOpenAI`` with ``X-Session-Id`` and ``X-Task-Key``
    headers, so the gateway stores its calls token-exactly under that session, and the
    verifier's reward and the session's end are posted to the gateway's feedback routes.

    A reward's source is what the key's role allows (``seed_agents.gateway.feedback``): the
    verifier's reward goes with a ``verifier`` key, the session's end with a ``feedback`` key,
    the chat with a ``client`` key (keys the gateway was started with; None on an open
    gateway, which takes ``user`` rewards only)."""

    url: str  # the gateway's base URL, without /v1
    model: str  # the public model name the gateway serves (it resolves the promoted version)
    temperature: float = 0.7
    max_tokens: int = 96
    client_key: str | None = None
    verifier_key: str | None = None
    feedback_key: str | None = None

    @staticmethod
    def _auth(key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def chat_model(self, session_id: str, task_key: str, client: httpx.AsyncClient) -> Any:
        """``client``: an HTTP client of the running event loop. ChatOpenAI's default one is
        cached process-wide, and its pooled connections die with the loop that opened them
        (each ``asyncio.run`` of the caller is a new loop)."""
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model=self.model, base_url=f"{self.url}/v1", api_key=self.client_key or "unused",
                          temperature=self.temperature,
                          max_tokens=self.max_tokens, max_retries=2, timeout=600, http_async_client=client,
                          default_headers={"X-Session-Id": session_id, "X-Task-Key": task_key})

    def reward_and_end(self, session_id: str, reward: float, comment: str = "examples.library_service:library_reward") -> None:
        """Post the verifier's ``reward`` (``comment``: which verifier) and end the session."""
        with httpx.Client(base_url=self.url, timeout=60, headers=self._auth(self.verifier_key)) as client:
            client.post(f"/v1/sessions/{session_id}/reward",
                        json={"value": reward, "source": "verifier", "comment": comment}).raise_for_status()
        self.end(session_id)

    def end(self, session_id: str) -> None:
        with httpx.Client(base_url=self.url, timeout=60, headers=self._auth(self.feedback_key)) as client:
            client.post(f"/v1/sessions/{session_id}/end").raise_for_status()


async def play_traffic(store: Any, llm: Any, base_url: str, recordings: Any, *, sessions: int, max_turns: int = 4,
                       system_prompt: str | None = None, start: int = 0, return_loans: bool = True,
                       tasks: Sequence[Any] | None = None, reward: Callable[[Any, dict[str, Any]], float] | None = None,
                       tool_choices: Mapping[str, str | None] | None = None, concurrency: int = 1) -> list[str]:
    """Users of the deployed agent: ``sessions`` tasks (cycling ``tasks``, default
    ``LIBRARY_TASKS``; session ``i`` plays ``tasks[i % len(tasks)]``) played against the live
    service at ``base_url``, their requests marked with origin ``traffic``. ``llm`` is a chat
    model (its calls go into the store in process, through ``StoreSink``) or a
    ``ViaGateway`` (the gateway stores them). Each session leaves in the store: its calls,
    its HTTP exchanges in ``recordings/traffic-<i>.jsonl`` (record mode), its verifier
    reward (``reward``, default ``library_reward``; source ``verifier``) and, in its
    metadata, the task and the recording: what the continual loop's shadow replays need.
    ``tool_choices``: ``build_tool_agent``'s ``first_tool_choice`` / ``tool_choice``, what the
    deployed agent sends (the loop's ``agent.tool_choices()``), so traffic is forced where
    replays are.

    With ``return_loans`` the member brings every book a session borrowed back right after
    it (origin ``members``), so production's state is the same for every session and
    success rates of different versions compare; such sessions run one at a time.
    ``concurrency`` > 1 plays that many sessions at once: for a service whose traffic
    changes nothing (the atlas), where the order of sessions cannot matter. Session ids
    come back in session order."""
    from pathlib import Path

    from seed_agents.store import StoreSink
    from seed_agents.tools.openapi import load_spec

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if concurrency > 1 and return_loans:
        raise ValueError("return_loans needs one session at a time (concurrent sessions would borrow the same books)")
    pool = list(tasks) if tasks is not None else list(LIBRARY_TASKS)
    if not pool:
        raise ValueError("no tasks to play")
    spec = load_spec(f"{base_url}/openapi.json", allow_hosts=["127.0.0.1"], transport=OriginTransport("traffic"))
    out = Path(recordings)
    gateway = llm if isinstance(llm, ViaGateway) else None
    sink = None if gateway else StoreSink(store)
    http = httpx.AsyncClient(timeout=600) if gateway else None
    sem = asyncio.Semaphore(concurrency)
    session = _Session(store=store, llm=llm, gateway=gateway, http=http, sink=sink, spec=spec, base_url=base_url, out=out,
                       max_turns=max_turns, system_prompt=system_prompt, return_loans=return_loans,
                       reward=reward or library_reward, tool_choices=dict(tool_choices or {}))

    async def one(i: int) -> str | None:
        async with sem:
            return await session.play(i, Task.model_validate(pool[i % len(pool)]))

    try:
        sids = await asyncio.gather(*(one(i) for i in range(start, start + sessions)))
    finally:
        if http is not None:
            await http.aclose()
    return [sid for sid in sids if sid is not None]


@dataclass(frozen=True)
class _Session:
    """What every traffic session of one ``play_traffic`` call shares."""

    store: Any
    llm: Any
    gateway: ViaGateway | None
    http: httpx.AsyncClient | None
    sink: Any
    spec: dict[str, Any]
    base_url: str
    out: Any
    max_turns: int
    system_prompt: str | None
    return_loans: bool
    reward: Callable[[Any, dict[str, Any]], float]
    tool_choices: dict[str, str | None]

    async def play(self, i: int, task: Task) -> str | None:
        """Traffic session ``i``; its session id once rewarded, None when it faulted or made no call."""
        from seed_agents.graphs.tool_agent import build_tool_agent
        from seed_agents.runner import EpisodeRunner, RunnerConfig
        from seed_agents.tools.openapi import openapi_tools
        from seed_agents.tools.replay import Recording, ReplayConfig, ReplayTransport
        from seed_agents.types import new_id

        store, gateway = self.store, self.gateway
        path = self.out / f"traffic-{i:05d}.jsonl"
        live = OriginTransport("traffic")
        transport = ReplayTransport(ReplayConfig(mode="record"), Recording(path=path), live=live)
        tools = openapi_tools(self.spec, base_url=self.base_url, allow_hosts=["127.0.0.1"], transport=transport)
        sid = f"traffic-{i:05d}-{new_id()[:8]}"
        model = gateway.chat_model(sid, task.task_id, self.http) if gateway is not None and self.http is not None else self.llm
        graph = build_tool_agent(model, tools, system_prompt=self.system_prompt, max_turns=self.max_turns,
                                 **self.tool_choices)
        runner = EpisodeRunner(graph, RunnerConfig(progress=False), reward_fn=self.reward, sink=self.sink)
        traj = await runner.run_episode(task, f"traffic-{task.task_id}", 0)
        await live.aclose()
        if self.return_loans:
            await _return_loans(self.base_url, path)
        if gateway is None:
            sid = traj.trajectory_id
        if traj.fault is not None:  # an infrastructure fault says nothing about the policy: never rewarded
            print(f"traffic session {sid} ({task.task_id}): {traj.fault.value} fault, not rewarded: "
                  f"{' '.join(str(traj.error).split())[:300]}", flush=True)
            if gateway is not None and store.get_session(sid) is not None:
                await asyncio.to_thread(gateway.end, sid)
            return None
        if store.get_session(sid) is None:  # an episode that made no call left no session
            return None
        if gateway is not None:
            await asyncio.to_thread(gateway.reward_and_end, sid, traj.reward,
                                    f"{self.reward.__module__}:{self.reward.__qualname__}")
        else:
            store.add_reward(sid, traj.reward, source="verifier")
        store.merge_session_metadata(sid, {"task": task.model_dump(mode="json"), "recording": str(path.resolve())})
        return sid


async def _return_loans(base_url: str, recording: Any) -> None:
    """Return the loans a session's recording shows it made (the members' own requests)."""
    import json

    from seed_agents.tools.replay import Recording

    loans = [json.loads(e.response)["id"] for e in Recording.load(recording, append=False).exchanges
             if e.method == "POST" and e.url.endswith("/loans") and e.status == 201]
    async with httpx.AsyncClient(base_url=base_url, transport=OriginTransport("members"), timeout=30) as client:
        for loan_id in loans:
            await client.post(f"/loans/{loan_id}/return")


def main(argv: list[str] | None = None) -> None:
    """Serve the library in the foreground (the demo's "production" or "sandbox" service);
    with ``--traffic-store URL``, instead play user traffic against a running one."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key-env", help="require X-Api-Key equal to this environment variable's value")
    parser.add_argument("--traffic-store", help="play traffic against http://HOST:PORT into this store URL, then exit")
    parser.add_argument("--traffic-sessions", type=int, default=12, help="sessions of traffic to play")
    parser.add_argument("--traffic-model", default="smollm2-135m", help="the model serving the traffic (local backend)")
    parser.add_argument("--traffic-recordings", default="runs/continual-demo/recordings", help="where HTTP recordings go")
    args = parser.parse_args(argv)
    if args.traffic_store:
        from seed_agents.backends.local import LocalBackend
        from seed_agents.chat_model import SeedChatModel
        from seed_agents.store import TraceStore
        from seed_agents.types import SamplingParams

        backend = LocalBackend(args.traffic_model)
        llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer, model_name="library-agent",
                            sampling=SamplingParams(max_tokens=96, temperature=0.7))
        with TraceStore.open(args.traffic_store) as store:
            start = len(store.sessions())
            sids = asyncio.run(play_traffic(store, llm, f"http://{args.host}:{args.port}", args.traffic_recordings,
                                            sessions=args.traffic_sessions, start=start))
            rewards = [store.session_reward(s) or 0.0 for s in sids]
        print(f"{len(sids)} sessions recorded, mean verifier reward {sum(rewards) / max(1, len(rewards)):.2f}")
        return
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        parser.error(f"--api-key-env names {args.api_key_env}, which is not set")
    uvicorn.run(create_app(api_key=key), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
