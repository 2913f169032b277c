"""``run_sync``: the synchronous entry points work inside a running event loop too
(Jupyter, async apps), where a bare ``asyncio.run`` raises."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from pathlib import Path

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


def test_daemon_executor_runs_calls_and_shutdown_does_not_wait_for_a_stuck_one():
    from seed_agents.aio import DaemonThreadExecutor

    release = threading.Event()
    pool = DaemonThreadExecutor()
    stuck = pool.submit(release.wait, 30)
    assert pool.submit(sum, [1, 2, 3]).result(timeout=5) == 6
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    pool.shutdown(wait=True)  # returns at once
    assert not stuck.done()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(sum, [1])
    release.set()
    assert stuck.result(timeout=5) is True


def test_the_interpreter_exits_with_an_env_call_stuck_forever(tmp_path):
    """What `seed-agents eval` does at its end, with one episode's env process dead."""
    import subprocess
    import sys
    import time

    script = tmp_path / "stuck.py"
    script.write_text(
        "import asyncio, threading\n"
        "from seed_agents.aio import DaemonThreadExecutor\n"
        "async def main():\n"
        "    asyncio.get_running_loop().set_default_executor(DaemonThreadExecutor())\n"
        "    try:\n"
        "        await asyncio.wait_for(asyncio.to_thread(threading.Event().wait), 0.2)\n"
        "    except TimeoutError:\n"
        "        print('episode timed out')\n"
        "asyncio.run(main())\n"
    )
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "episode timed out" and time.perf_counter() - t0 < 30


def test_the_interpreter_exits_cleanly_while_a_worker_still_frees_tensors(tmp_path):
    """A daemon worker freeing tensors as the interpreter finalizes used to abort the
    process (exit 134, "terminate called without an active exception") after the work was
    done: each freed tensor releases the GIL, and a thread that cannot take it back during
    finalization is ended by a forced unwind through C++. The exit now waits for it."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    script = tmp_path / "freeing.py"
    script.write_text(
        "import asyncio, time\n"
        "import torch\n"
        "from seed_agents.aio import run_sync\n"
        "def work():\n"
        "    held = [(torch.zeros(4), torch.zeros(4)) for _ in range(100_000)]\n"
        "    time.sleep(0.3)  # the main thread is exiting by now\n"
        "    del held\n"
        "async def main():\n"
        "    asyncio.get_running_loop().run_in_executor(None, work)  # left running\n"
        "    await asyncio.sleep(0.05)\n"
        "run_sync(main())\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "done" and "terminate called" not in out.stderr


def test_at_exit_the_stoppers_run_before_the_wait(monkeypatch):
    """The local backend's stop must come first (it ends a running generation at the next
    token); a wait first would let it run on for the whole bound."""
    from seed_agents import aio
    from seed_agents.backends import local

    assert local._IN_FLIGHT.stop_all in aio._exit_stoppers  # registered with aio, not atexit
    order = []
    monkeypatch.setattr(aio, "_exit_stoppers", [lambda: order.append("stop")])
    monkeypatch.setattr(aio, "wait_for_workers", lambda timeout_s: order.append("wait") or True)
    monkeypatch.setattr(aio, "_workers", set())  # this process's executors stay open
    monkeypatch.setattr(aio.gc, "collect", lambda: order.append("collect") or 0)
    aio._quiet_exit()
    assert order == ["stop", "wait", "collect"]


def test_the_exit_wait_counts_running_and_queued_calls_until_their_references_are_dropped():
    """Counted from the submit (a call queued for an idle worker counts) until the worker
    has dropped the call; compared with the count before, as other tests' hung calls may
    still be counted in this process."""
    from seed_agents import aio

    def settles(target: int) -> bool:
        deadline = time.monotonic() + 5
        while aio._busy != target and time.monotonic() < deadline:
            time.sleep(0.01)
        return aio._busy == target

    base = aio._busy
    release = threading.Event()
    pool = aio.DaemonThreadExecutor()
    first = pool.submit(release.wait, 30)
    assert aio._busy == base + 1 and not aio.wait_for_workers(0.1)  # running: the exit would wait
    release.set()
    assert first.result(timeout=5) and settles(base)
    second = pool.submit(release.wait, 30)  # goes to the now idle worker through the queue
    assert aio._busy == base + 1
    assert second.result(timeout=5) and settles(base)
    pool.shutdown()


def test_a_call_whose_thread_cannot_start_is_not_counted(monkeypatch):
    from seed_agents import aio

    base = aio._busy
    pool = aio.DaemonThreadExecutor()

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError, match="new thread"):
        pool.submit(sum, [1])
    assert aio._busy == base  # else every exit would wait out the bound for it
    pool.shutdown()


def test_run_sync_loops_never_wait_for_a_stuck_thread():
    """Code that plays episodes without ``EpisodeRunner.run`` (stage-1 collect and the
    usefulness re-runs) gets the daemon executor from ``run_sync`` itself."""
    import time

    release = threading.Event()

    async def episode() -> str:
        try:
            await asyncio.wait_for(asyncio.to_thread(release.wait, 20), 0.2)
        except TimeoutError:
            return "timed out"
        return "returned"

    t0 = time.perf_counter()
    assert run_sync(episode()) == "timed out"
    assert time.perf_counter() - t0 < 5
    release.set()


def test_daemon_executor_reuses_idle_workers_and_never_queues_behind_a_stuck_call():
    """A thread per call cost ~9 ms of every env step: idle workers take the next call. A
    call stuck forever keeps its own thread; later calls still start at once."""
    from seed_agents.aio import DaemonThreadExecutor

    pool = DaemonThreadExecutor(idle_s=5.0)
    names = set()
    for _ in range(20):  # one after another: one worker does them all
        names.add(pool.submit(lambda: threading.current_thread().name).result(timeout=5))
    assert len(names) == 1
    release = threading.Event()
    stuck = [pool.submit(release.wait, 30) for _ in range(3)]  # the idle worker and two new ones
    assert pool.submit(sum, [1, 2]).result(timeout=5) == 3  # a fourth thread, not a wait
    release.set()
    assert all(s.result(timeout=5) for s in stuck)
    pool.shutdown()


def test_daemon_executor_idle_workers_leave_after_idle_s():
    from seed_agents.aio import DaemonThreadExecutor

    pool = DaemonThreadExecutor(name="idle-probe", idle_s=0.05)
    assert pool.submit(sum, [1]).result(timeout=5) == 1
    deadline = time.monotonic() + 10
    while any(t.name.startswith("idle-probe") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "an idle worker never left"
        time.sleep(0.02)
    assert pool.submit(sum, [2]).result(timeout=5) == 2  # a new worker after the old one left
    pool.shutdown()


def test_a_worker_holds_no_reference_to_a_finished_call():
    """``threading.Thread`` keeps its arguments until the thread ends: a worker started with
    its first call as an argument kept that call (and, through ``asyncio.to_thread``'s
    context copy, the episode and its weak-keyed tensors) alive for as long as it idled,
    and freed it on its way out, at the interpreter's exit."""
    import gc
    import weakref

    from seed_agents.aio import DaemonThreadExecutor

    class Episode:
        pass

    episode = Episode()
    gone = threading.Event()
    weakref.finalize(episode, gone.set)
    pool = DaemonThreadExecutor(idle_s=30.0)
    assert pool.submit(lambda e: e is not None, episode).result(timeout=5)
    del episode
    deadline = time.monotonic() + 5
    while not gone.is_set() and time.monotonic() < deadline:  # the worker drops it after the result
        gc.collect()
        time.sleep(0.01)
    assert gone.is_set(), "the idle worker still holds its first call"
    assert pool.threads()  # the worker itself is still there, idle
    pool.shutdown()


def test_at_exit_idle_workers_are_ended_and_joined(tmp_path):
    """An idle worker must not be left to end while the interpreter finalizes: the exit
    shuts the executors down and joins their threads (bounded)."""
    import subprocess
    import sys

    script = tmp_path / "idle.py"
    script.write_text(
        "import threading, time\n"
        "from seed_agents import aio\n"
        "pool = aio.DaemonThreadExecutor(name='idle-at-exit', idle_s=60.0)\n"
        "assert pool.submit(sum, [1]).result(timeout=5) == 1\n"
        "t0 = time.monotonic()\n"
        "aio._quiet_exit()\n"
        "left = [t.name for t in threading.enumerate() if t.name.startswith('idle-at-exit')]\n"
        "print(left, time.monotonic() - t0 < 3)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] True"
