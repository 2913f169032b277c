"""Sync/async glue: run a coroutine from synchronous code, and a thread executor that a
hung env call cannot block.

``run_sync``: run a coroutine to completion from synchronous code, wherever that code is called.

The CLI entry points and the trainer's rollout step are synchronous functions that drive
async episode runners. ``asyncio.run`` refuses to start inside a running event loop
(Jupyter, an async web app, a LangGraph server calling our API), so there the coroutine
runs on a fresh loop in a worker thread instead, with the caller's context variables
(``capture()`` labels) copied in so captured traces keep their run and split.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import itertools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, or the same on a worker thread when a loop is already running
    in this thread (blocking it until done: the caller asked for a synchronous result).
    Either way the new loop's default executor is a ``DaemonThreadExecutor``, so a hung
    ``asyncio.to_thread`` call (an env step) cannot hold up the loop's shutdown."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_on_daemon_threads(coro))
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="seed-agents-run-sync") as pool:
        return pool.submit(ctx.run, asyncio.run, _on_daemon_threads(coro)).result()


async def _on_daemon_threads(coro: Coroutine[Any, Any, T]) -> T:
    asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())
    return await coro


class DaemonThreadExecutor(ThreadPoolExecutor):
    """Each call on its own daemon thread; ``shutdown`` never waits.

    The runner installs it as the loop's default executor, so env steps, tool calls and
    local generation (``asyncio.to_thread``) run here. A call that never returns (a dead
    game process, a tool blocked on a socket) is abandoned when its episode times out.
    With a ``ThreadPoolExecutor`` it would not be: ``asyncio.run`` ends by shutting the
    default executor down and waiting for every thread, so one hung env call would stall
    the end of every training iteration and evaluation, and the interpreter's exit. The
    abandoned thread keeps running until it returns or the process exits. (A subclass of
    ``ThreadPoolExecutor`` only because ``loop.set_default_executor`` requires one; none
    of its pool is used.)
    """

    def __init__(self, name: str = "seed-agents-worker") -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._name = name
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(e)
            else:
                future.set_result(result)

        threading.Thread(target=work, name=f"{self._name}-{next(self._ids)}", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; calls still running are left to finish on their own threads."""
        with self._lock:
            self._closed = True
