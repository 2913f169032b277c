"""A small "deployed" library service: the stand-in for a production tool API.

Tests and the continual-learning demo need an HTTP API with an OpenAPI spec, state that
writes change (borrowing a book makes it unavailable), read and write operations, and a
way to prove what reached it. ``create_app()`` builds that service (FastAPI, so the spec
at ``/openapi.json`` is generated from the same code that serves it) and every request it
receives is counted in ``app.state.log`` (also ``GET /admin/requests``, left out of the
spec so no agent tool is generated for it): a test reads the log of the *production*
instance to show that training replays sent it 0 mutating requests.

``DemoServer`` runs an app under uvicorn on a loopback port in a background thread;
``python -m tools.demo_service --port 8000`` serves it in the foreground.
"""

from __future__ import annotations

import argparse
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, Self

from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from seed_agents.serve import free_port

Genre = Literal["fiction", "science", "history", "fantasy"]
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


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


class RequestLog:
    """Every request the service received, as ``(method, path)``, in arrival order."""

    def __init__(self) -> None:
        self._entries: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def record(self, method: str, path: str) -> None:
        with self._lock:
            self._entries.append((method.upper(), path))

    def entries(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._entries)

    def counts(self) -> Counter[str]:
        """``{"GET /books": 3, "POST /loans": 1, ...}``."""
        return Counter(f"{m} {p}" for m, p in self.entries())

    def mutating(self) -> int:
        """Requests with a method other than GET/HEAD/OPTIONS."""
        return sum(m not in READ_METHODS for m, _ in self.entries())


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


def create_app(*, api_key: str | None = None, title: str = "Library") -> FastAPI:
    """The library service. With ``api_key`` every API request must send it as ``X-Api-Key``
    (401 otherwise): the tests' stand-in for a credentialed production API."""
    app = FastAPI(title=title, version="1.0.0",
                  description="A small library: search books, borrow and return them.")
    app.state.log = RequestLog()
    app.state.library = Library()

    @app.middleware("http")
    async def log_and_authorize(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        app.state.log.record(request.method, request.url.path)
        public = request.url.path in ("/openapi.json", "/admin/requests")
        if api_key and not public and not secrets.compare_digest(request.headers.get("x-api-key", ""), api_key):
            return JSONResponse({"detail": "missing or wrong X-Api-Key"}, status_code=401)
        return await call_next(request)

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
        return {"entries": [list(e) for e in log.entries()], "mutating": log.mutating()}

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


async def play_traffic(store: Any, llm: Any, base_url: str, recordings: Any, *, sessions: int, max_turns: int = 4,
                       system_prompt: str | None = None, start: int = 0) -> list[str]:
    """Users of the deployed agent: ``sessions`` library tasks (cycling ``LIBRARY_TASKS``)
    played against the live service at ``base_url``. Each session's calls go into the
    store (``StoreSink``), its HTTP exchanges into ``recordings/<session>.jsonl`` (record
    mode), its verifier reward (``library_reward``, source ``verifier``) and, in its
    metadata, the task and the recording: what the continual loop's shadow replays need."""
    from pathlib import Path

    from graphs.tool_agent import build_tool_agent
    from seed_agents.runner import EpisodeRunner, RunnerConfig
    from seed_agents.store import StoreSink
    from seed_agents.types import Task
    from tools.openapi import load_spec, openapi_tools
    from tools.replay import Recording, ReplayConfig, ReplayTransport

    spec = load_spec(f"{base_url}/openapi.json", allow_hosts=["127.0.0.1"])
    sink, out = StoreSink(store), Path(recordings)
    sids = []
    for i in range(start, start + sessions):
        task = Task.model_validate(LIBRARY_TASKS[i % len(LIBRARY_TASKS)])
        path = out / f"traffic-{i:05d}.jsonl"
        transport = ReplayTransport(ReplayConfig(mode="record"), Recording(path=path))
        tools = openapi_tools(spec, base_url=base_url, allow_hosts=["127.0.0.1"], transport=transport)
        graph = build_tool_agent(llm, tools, system_prompt=system_prompt, max_turns=max_turns)
        runner = EpisodeRunner(graph, RunnerConfig(progress=False), reward_fn=library_reward, sink=sink)
        traj = await runner.run_episode(task, f"traffic-{task.task_id}", 0)
        await transport.aclose()
        sid = traj.trajectory_id
        if store.get_session(sid) is None:  # an episode that made no call left no session
            continue
        store.add_reward(sid, traj.reward, source="verifier")
        store.merge_session_metadata(sid, {"task": task.model_dump(mode="json"), "recording": str(path.resolve())})
        sids.append(sid)
    return sids


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
        import asyncio

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
