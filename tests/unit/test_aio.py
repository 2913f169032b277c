"""``run_sync``: the synchronous entry points work inside a running event loop too
(Jupyter, async apps), where a bare ``asyncio.run`` raises."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from seed_agents.aio import run_sync

LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("LABEL", default="unset")


async def probe() -> tuple[str, str]:
    await asyncio.sleep(0)
    return LABEL.get(), threading.current_thread().name


def test_without_a_running_loop_it_is_asyncio_run():
    token = LABEL.set("outer")
    try:
        label, thread = run_sync(probe())
    finally:
        LABEL.reset(token)
    assert (label, thread) == ("outer", threading.current_thread().name)


async def test_inside_a_running_loop_it_runs_on_a_worker_thread_with_the_callers_context():
    bare = probe()
    with pytest.raises(RuntimeError, match="running event loop"):
        asyncio.run(bare)  # what every entry point did before
    bare.close()
    token = LABEL.set("inside")
    try:
        label, thread = run_sync(probe())
    finally:
        LABEL.reset(token)
    assert label == "inside" and thread.startswith("seed-agents-run-sync")


async def test_errors_reach_the_caller():
    async def boom() -> None:
        raise ValueError("env exploded")

    with pytest.raises(ValueError, match="env exploded"):
        run_sync(boom())
