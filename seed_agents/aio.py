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
import atexit
import concurrent.futures
import contextvars
import gc
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: Calls submitted to any ``DaemonThreadExecutor`` whose worker has not yet dropped their
#: references. Counted for the exit below.
_busy = 0
_busy_changed = threading.Condition()
EXIT_WAIT_S = 5.0


def _count_busy(delta: int) -> None:
    global _busy
    with _busy_changed:
        _busy += delta
        _busy_changed.notify_all()


def wait_for_workers(timeout_s: float) -> bool:
    """Wait until no ``DaemonThreadExecutor`` call is running or queued (its references
    dropped); False when ``timeout_s`` ran out first (a hung call)."""
    with _busy_changed:
        return _busy_changed.wait_for(lambda: _busy == 0, timeout=timeout_s)


_exit_stoppers: list[Callable[[], None]] = []
#: Every live ``DaemonThreadExecutor``, for the exit to end and join their idle workers.
_workers: weakref.WeakSet[DaemonThreadExecutor] = weakref.WeakSet()


def stop_at_exit(stop: Callable[[], None]) -> None:
    """Call ``stop`` at interpreter exit before waiting for the workers: it tells the calls
    it owns to end (the local backend stops its generations at the next token), so the wait
    is short. Registered here, not with ``atexit``, to keep that order whatever the import
    order (``atexit`` runs the last registered first)."""
    _exit_stoppers.append(stop)


def _quiet_exit() -> None:
    """At interpreter exit, let daemon workers finish and free what they held, end the idle
    ones and wait until their threads are gone, then collect cyclic garbage here, on the
    main thread.

    Why: a daemon thread that is still freeing tensors when the interpreter finalizes
    aborts the process. Freeing a torch tensor releases the GIL (``THPVariable_clear``);
    once finalization has begun, the thread cannot take it back, so CPython ends it with
    ``pthread_exit``, whose forced unwind reaches a C++ frame that may not throw:
    ``std::terminate``, "terminate called without an active exception", exit status 134,
    after the command's work was done and written (seen under gdb at the end of `skills
    collect`, 128 episodes: a worker freeing a list of tuples of tensors while the main
    thread ran the finalizing garbage collection). Bounded: a call that never returns (a
    hung env step) must not hold the exit up, as ``DaemonThreadExecutor`` promises.

    Then every executor is shut down and its idle workers are joined: a thread that ends
    runs Python on its way out (``threading.Thread`` drops its target and arguments, which
    may free the last reference to an episode and, through a weak-keyed cache, its
    tensors), so a worker still leaving while the interpreter finalizes aborts it the same
    way (seen under gdb at the end of `eval --concurrency 4`).
    """
    for stop in _exit_stoppers:
        stop()
    wait_for_workers(EXIT_WAIT_S)
    deadline = time.monotonic() + EXIT_WAIT_S
    executors = list(_workers)
    for executor in executors:
        executor.shutdown(wait=False)
    for thread in [t for executor in executors for t in executor.threads()]:
        thread.join(max(0.0, deadline - time.monotonic()))
    gc.collect()


atexit.register(_quiet_exit)


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
    """Daemon worker threads, reused while they are idle, never waited for.

    The runner installs it as the loop's default executor, so env steps, tool calls and
    local generation (``asyncio.to_thread``) run here. A call that never returns (a dead
    game process, a tool blocked on a socket) is abandoned when its episode times out.
    With a ``ThreadPoolExecutor`` it would not be: ``asyncio.run`` ends by shutting the
    default executor down and waiting for every thread, so one hung env call would stall
    the end of every training iteration and evaluation, and the interpreter's exit. Here
    a call goes to an idle worker if there is one, else to a new daemon thread (no upper
    bound: a hung call never keeps another from starting); a worker idle for ``idle_s``
    exits, and ``shutdown`` refuses new calls, releases the idle workers and leaves running
    calls to finish on their own threads.

    Reuse is what keeps an agent step cheap: starting a thread per call (a thread start
    waits for the new thread to run) was the largest part of the framework's cost per env
    step and tool call (docs/benchmarks.md, "Figures behind code comments"). (A
    subclass of ``ThreadPoolExecutor`` only because ``loop.set_default_executor`` requires
    one; none of its pool is used.)
    """

    def __init__(self, name: str = "seed-agents-worker", *, idle_s: float = 30.0) -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self._name = name
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = 0  # workers waiting for work and not yet claimed by a submit
        self._idle_s = idle_s
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        _workers.add(self)

    def threads(self) -> list[threading.Thread]:
        """This executor's worker threads still alive."""
        with self._lock:
            return [t for t in self._threads if t.is_alive()]

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
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

        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            _count_busy(+1)  # until the worker has run it and dropped its references
            if self._idle > 0:  # an idle worker takes it from the queue
                self._idle -= 1
                self._work.put(work)
                return future
        # The call travels in a box the worker empties: a Thread keeps its args until it
        # ends, and an idle worker lives on for idle_s holding its first call's references.
        thread = threading.Thread(target=self._worker, args=([work],), name=f"{self._name}-{next(self._ids)}",
                                  daemon=True)
        try:
            thread.start()
        except BaseException:  # no thread (out of threads): the call never counts, or the exit would wait for it
            _count_busy(-1)
            raise
        with self._lock:
            self._threads.add(thread)
        return future

    def _worker(self, box: list[Callable[[], None]]) -> None:
        item: Callable[[], None] | None = box.pop()
        while item is not None:
            try:
                item()
            finally:
                item = None  # drop the finished call's references before waiting
                _count_busy(-1)
            with self._lock:
                if self._closed:
                    return
                self._idle += 1
            item = self._next()

    def _next(self) -> Callable[[], None] | None:
        """The next call for this (idle, counted) worker; None when it should exit."""
        while True:
            try:
                return self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    # A submit puts its call under the lock: an empty queue here means no call
                    # counts on this worker, so it may leave.
                    if self._work.empty():
                        self._idle -= 1
                        return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls and release the idle workers; calls still running are left to
        finish on their own threads."""
        with self._lock:  # a worker between its call and going idle sees _closed and leaves
            self._closed = True
            for _ in range(self._idle):
                self._work.put(None)
            self._idle = 0
