"""Run an agent graph over tasks x group size, concurrently, and collect trajectories.

Each episode runs in its own asyncio task under its own ``capture()`` scope, with its own
env instance. Failures are data, not crashes: an env, tool or backend exception becomes a
trajectory with ``stop_reason=error`` and the calls made so far; a hung episode becomes
``stop_reason=timeout``. Each trajectory is written to the sink the moment it finishes.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from seed_agents.aio import DaemonThreadExecutor
from seed_agents.capture import Sink, capture
from seed_agents.envs import TextEnv
from seed_agents.types import StopReason, Task, Trajectory

RewardFn = Callable[[Task, dict[str, Any]], float]


class RunnerConfig(BaseModel):
    """How episodes are scheduled."""

    model_config = {"extra": "forbid"}

    group_size: int = Field(1, ge=1, le=1024, description="Episodes per task (the GRPO group G).")
    concurrency: int = Field(8, ge=1, le=4096, description="Episodes in flight at once.")
    episode_timeout_s: float = Field(600.0, gt=0, description="Wall-clock limit per episode.")
    recursion_limit: int = Field(1000, ge=10, description="LangGraph super-step limit per episode.")
    progress: bool = Field(True, description="Show a progress bar.")


def default_reward(task: Task, state: dict[str, Any]) -> float:
    return float(state.get("reward", 0.0))


class EpisodeRunner:
    """Plays ``graph`` on tasks. ``make_env`` is optional: tool agents need no env.

    ``make_input`` turns a task into the graph's input (default ``{"task": task}``; a
    prebuilt ReAct agent wants ``{"messages": [...]}``); ``reward_fn(task, final_state)``
    scores the episode (default: the state's ``reward``).
    """

    def __init__(
        self,
        graph: Any,
        config: RunnerConfig,
        *,
        make_env: Callable[[Task], TextEnv] | None = None,
        reward_fn: RewardFn = default_reward,
        success_fn: Callable[[Task, dict[str, Any], float], bool] | None = None,
        sink: Sink | None = None,
        labels: dict[str, Any] | None = None,
        make_input: Callable[[Task], dict[str, Any]] = lambda task: {"task": task},
    ) -> None:
        self.graph = graph
        self.config = config
        self.make_env = make_env
        self.reward_fn = reward_fn
        self.success_fn = success_fn or (lambda task, state, reward: bool(state.get("success", reward >= 1.0)))
        self.sink = sink
        self.labels = labels or {}
        self.make_input = make_input
        self._executor_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, tasks: list[Task], group_prefix: str = "g") -> list[Trajectory]:
        """All episodes, ordered by (task, sample) whatever order they finished in."""
        loop = asyncio.get_running_loop()
        # Env calls run in threads. A hung env keeps its thread: a thread per call that
        # nothing waits for (DaemonThreadExecutor) lets the episode time out and the run
        # end; a bounded pool would fill up, and asyncio.run() would wait on it at exit.
        # Once per loop: asyncio.run() shuts it down with the loop.
        if self._executor_loop is not loop:
            loop.set_default_executor(DaemonThreadExecutor())
            self._executor_loop = loop
        sem = asyncio.Semaphore(self.config.concurrency)
        specs = [(t, f"{group_prefix}-{t.task_id}", i) for t in tasks for i in range(self.config.group_size)]
        bar = _progress(len(specs), self.config.progress)

        async def one(task: Task, group_id: str, i: int) -> Trajectory:
            async with sem:
                traj = await self.run_episode(task, group_id, i)
            bar.update(traj)
            return traj

        try:
            return list(await asyncio.gather(*(one(*s) for s in specs)))
        finally:
            bar.close()

    async def run_episode(self, task: Task, group_id: str, sample_index: int) -> Trajectory:
        traj = Trajectory(task_id=task.task_id, group_id=group_id, sample_index=sample_index, split=task.split)
        t0 = time.perf_counter()
        env: TextEnv | None = None
        with capture(**self.labels, task_id=task.task_id, group_id=group_id,
                     sample_index=sample_index, trajectory_id=traj.trajectory_id) as cap:
            try:
                async with asyncio.timeout(self.config.episode_timeout_s):
                    configurable: dict[str, Any] = {}
                    if self.make_env is not None:
                        env = await asyncio.to_thread(self.make_env, task)
                        configurable["env"] = env
                    state = await self.graph.ainvoke(
                        self.make_input(task),
                        config={"configurable": configurable, "recursion_limit": self.config.recursion_limit},
                    )
                reward = float(self.reward_fn(task, state))
                traj.reward = reward
                traj.success = bool(self.success_fn(task, state, reward))
                traj.steps = int(state.get("steps", len(cap.calls)))
                traj.invalid_actions = int(state.get("invalid_actions", 0))
                traj.stop_reason = StopReason(state.get("stop_reason", StopReason.DONE))
                traj.metadata = dict(state.get("metadata", {}))
                traj.skill = state.get("skill")
            except TimeoutError:
                traj.stop_reason = StopReason.TIMEOUT
                traj.error = f"episode exceeded {self.config.episode_timeout_s:g}s"
            except Exception as e:  # noqa: BLE001 - any failure is recorded, never fatal
                traj.stop_reason = StopReason.ERROR
                traj.error = f"{type(e).__name__}: {e}\n{_short_tb(e)}"
            traj.calls = list(cap.calls)
        if env is not None:
            await _close_quietly(env)
        traj.wall_s = time.perf_counter() - t0
        if self.sink is not None:
            self.sink.write("trajectory", traj)
        return traj


async def _close_quietly(env: TextEnv, timeout_s: float = 10.0) -> None:
    try:
        await asyncio.wait_for(asyncio.to_thread(env.close), timeout_s)
    except Exception:  # noqa: BLE001 - a failing close must not lose the trajectory
        pass


def _short_tb(e: BaseException, limit: int = 6) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-limit)).strip()


class _progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        self.wins = self.done = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="episodes", unit="ep", dynamic_ncols=True)

    def update(self, traj: Trajectory) -> None:
        self.done += 1
        self.wins += traj.success
        if self.bar is not None:
            self.bar.set_postfix(success=f"{self.wins / self.done:.0%}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
