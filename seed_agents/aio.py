"""Run a coroutine to completion from synchronous code, wherever that code is called.

The CLI entry points and the trainer's rollout step are synchronous functions that drive
async episode runners. ``asyncio.run`` refuses to start inside a running event loop
(Jupyter, an async web app, a LangGraph server calling our API), so there the coroutine
runs on a fresh loop in a worker thread instead, with the caller's context variables
(``capture()`` labels) copied in so captured traces keep their run and split.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, or the same on a worker thread when a loop is already running
    in this thread (blocking it until done: the caller asked for a synchronous result)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="seed-agents-run-sync") as pool:
        return pool.submit(ctx.run, asyncio.run, coro).result()
