"""Run an agent graph over tasks x group size, concurrently, and collect trajectories.

Each episode runs in its own asyncio task under its own ``capture()`` scope, with its own
env instance. Failures are data, not crashes: an env, tool or backend exception becomes a
trajectory with ``stop_reason=error`` and the calls made so far; a hung episode becomes
``stop_reason=timeout``. Each is typed as an infrastructure fault (``Trajectory.fault``)
so trainers never learn from it; ``check_fault_budget`` stops a run whose faults exceed
its budget. Once the backend is unreachable the runner stops starting episodes (a circuit
breaker): the rest are recorded as skipped instead of each retrying a dead server.
Each trajectory is written to the sink the moment it finishes.

With a ``seed``, a run is reproducible whatever the timing: every episode's capture scope
gets a seed derived from the run's seed and the episode's identity (group, task, sample),
from which each of its LLM calls derives its own (see ``seed_agents.capture``), and the
episodes form a ``Cohort`` that an in-process backend batches in lockstep (see
``LocalBackend``). Without one, sampling and batching are as the backend pleases.

With a ``guide_share``, that share of each group's episodes (spread evenly over the
sample indices, the same ones in every group) is guided: its first free tool choice is
steered into a call (``capture(guide=True)``; docs/training.md, "Guided openings"). With
``"auto"``, ``AUTO_GUIDE_SHARE`` of them are, and only at the episode's first policy call
where that call is free (``capture(guide="first_call")``): whether tools are bound and the
first turn is free is known only when the graph makes that call.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable, Collection
from fractions import Fraction
from typing import Any, Literal

from langgraph.errors import GraphRecursionError

from seed_agents.aio import DaemonThreadExecutor
from seed_agents.backends.base import BackendError, BackendUnavailable
from seed_agents.capture import Cohort, Sink, capture, derive_seed
from seed_agents.config.core import AUTO_GUIDE_SHARE, RunnerConfig
from seed_agents.envs import TextEnv
from seed_agents.errors import FaultBudgetExceeded
from seed_agents.faults import EpisodeFault, crash_point
from seed_agents.types import FaultKind, StopReason, Task, Trajectory

RewardFn = Callable[[Task, dict[str, Any]], float]


def fault_counts(trajs: list[Trajectory]) -> dict[str, int]:
    """Faulted episodes by kind (every kind present, zeros included)."""
    counts = {kind.value: 0 for kind in FaultKind}
    for t in trajs:
        if t.fault is not None:
            counts[t.fault.value] += 1
    return counts


def check_fault_budget(trajs: list[Trajectory], max_fraction: float, what: str = "episodes") -> None:
    """Raise ``FaultBudgetExceeded`` when more than ``max_fraction`` of ``trajs`` faulted;
    the message names the kinds and the first error (a dead server's URL is in it)."""
    faulted = [t for t in trajs if t.fault is not None]
    if not trajs or len(faulted) <= max_fraction * len(trajs):
        return
    kinds = ", ".join(f"{k} {n}" for k, n in fault_counts(trajs).items() if n)
    first = next((t.error for t in faulted if t.error and t.fault != FaultKind.SKIPPED), faulted[0].error or "")
    raise FaultBudgetExceeded(
        f"{len(faulted)} of {len(trajs)} {what} ended in infrastructure faults ({kinds}), over the budget "
        f"of {max_fraction:.0%} (runner.max_fault_fraction); first: {first.splitlines()[0] if first else '?'}")


def default_reward(task: Task, state: dict[str, Any]) -> float:
    return float(state.get("reward", 0.0))


def guided_episode(sample_index: int, share: float) -> bool:
    """Whether a group's ``sample_index``-th episode is guided when ``share`` of them are:
    the share is spread evenly (0.5: samples 1, 3, 5, ...; 0.25: 3, 7, ...), so each group
    of G has ``floor(G * share)`` guided episodes beside free ones to compare with."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"guide share {share} is not in [0, 1]")
    q = Fraction(share).limit_denominator(10_000)  # 0.1 means one in ten, not its binary float
    return (sample_index + 1) * q // 1 > sample_index * q // 1


class EpisodeRunner:
    """Plays ``graph`` on tasks. ``make_env`` is optional: tool agents need no env.

    ``make_input`` turns a task into the graph's input (default ``{"task": task}``; a
    prebuilt ReAct agent wants ``{"messages": [...]}``); ``reward_fn(task, final_state)``
    scores the episode (default: the state's ``reward``). ``seed``: make the run
    reproducible (module docstring); None samples as the backend pleases.
    ``guide_share``: the share of each group's episodes that are guided, or ``"auto"``
    (module docstring).
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
        seed: int | None = None,
        guide_share: float | Literal["auto"] = 0.0,
    ) -> None:
        self.guide_share = AUTO_GUIDE_SHARE if guide_share == "auto" else guide_share
        guided_episode(0, self.guide_share)  # an out-of-range share fails here, not mid-run
        self.guide: Literal["first_call"] | bool = "first_call" if guide_share == "auto" else True
        self.seed = seed
        self.graph = graph
        self.config = config
        self.make_env = make_env
        self.reward_fn = reward_fn
        self.success_fn = success_fn or (lambda task, state, reward: bool(state.get("success", reward >= 1.0)))
        self.sink = sink
        self.labels = labels or {}
        self.make_input = make_input
        self._executor_loop: asyncio.AbstractEventLoop | None = None
        self._backend_down: str | None = None  # set by the first unreachable-backend fault

    async def run(self, tasks: list[Task], group_prefix: str = "g",
                  only: Collection[tuple[str, int]] | None = None) -> list[Trajectory]:
        """All episodes, ordered by (task, sample) whatever order they finished in;
        ``only``: just these (task id, sample index) slots (a resumed run plays the missing ones)."""
        loop = asyncio.get_running_loop()
        # Env calls run in threads. A hung env keeps its thread: a thread per call that
        # nothing waits for (DaemonThreadExecutor) lets the episode time out and the run
        # end; a bounded pool would fill up, and asyncio.run() would wait on it at exit.
        # Once per loop: asyncio.run() shuts it down with the loop.
        if self._executor_loop is not loop:
            loop.set_default_executor(DaemonThreadExecutor())
            self._executor_loop = loop
        sem = asyncio.Semaphore(self.config.concurrency)
        self._backend_down: str | None = None
        specs = [(t, f"{group_prefix}-{t.task_id}", i) for t in tasks for i in range(self.config.group_size)
                 if only is None or (t.task_id, i) in only]
        bar = _progress(len(specs), self.config.progress)
        cohort = Cohort(len(specs), self.config.concurrency) if self.seed is not None else None

        async def one(task: Task, group_id: str, i: int) -> Trajectory:
            async with sem:
                traj = await self.run_episode(task, group_id, i, cohort=cohort)
            bar.update(traj)
            return traj

        try:
            return list(await asyncio.gather(*(one(*s) for s in specs)))
        finally:
            bar.close()

    async def run_episode(self, task: Task, group_id: str, sample_index: int, *,
                          cohort: Cohort | None = None) -> Trajectory:
        """One episode; ``cohort.finish()`` is called once it makes no more LLM calls."""
        try:
            return await self._run_episode(task, group_id, sample_index, cohort)
        finally:
            if cohort is not None:
                cohort.finish((group_id, sample_index))

    async def _run_episode(self, task: Task, group_id: str, sample_index: int, cohort: Cohort | None) -> Trajectory:
        traj = Trajectory(task_id=task.task_id, group_id=group_id, sample_index=sample_index, split=task.split)
        t0 = time.perf_counter()
        env: TextEnv | None = None
        if self._backend_down is not None:  # the breaker is open: do not start
            traj.stop_reason, traj.fault = StopReason.ERROR, FaultKind.SKIPPED
            traj.error = f"not started: {self._backend_down}"
            return self._finish(traj, t0)
        seed = derive_seed(self.seed, group_id, task.task_id, sample_index) if self.seed is not None else None
        with capture(**self.labels, task_id=task.task_id, group_id=group_id, sample_index=sample_index,
                     trajectory_id=traj.trajectory_id, seed=seed, cohort=cohort,
                     guide=guided_episode(sample_index, self.guide_share) and self.guide) as cap:
            state: dict[str, Any] | None = None
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
            except TimeoutError:
                traj.stop_reason, traj.fault = StopReason.TIMEOUT, FaultKind.TIMEOUT
                traj.error = f"episode exceeded {self.config.episode_timeout_s:g}s"
            except GraphRecursionError as e:  # the agent looped: an outcome of the policy
                traj.stop_reason = StopReason.MAX_TURNS
                traj.error = f"{type(e).__name__}: {e}"
            except Exception as e:  # noqa: BLE001 - any failure is recorded, never fatal
                traj.stop_reason = StopReason.ERROR
                traj.fault = _fault_kind(e)
                traj.error = f"{type(e).__name__}: {e}\n{_short_tb(e)}"
                if _is_unreachable(e):
                    self._backend_down = f"backend unavailable ({e})"
            if state is not None:
                self._score(task, state, traj, steps_default=len(cap.calls))
            traj.calls = list(cap.calls)
        if cohort is not None:  # no more LLM calls: the cohort's batches need not wait for the close
            cohort.finish((group_id, sample_index))
        if env is not None:
            await _close_quietly(env)
        return self._finish(traj, t0)

    def _score(self, task: Task, state: dict[str, Any], traj: Trajectory, steps_default: int) -> None:
        """Reward and outcome from the final state; a raising reward is a fault, not a 0."""
        try:
            reward = float(self.reward_fn(task, state))
            if reward != reward or reward in (float("inf"), float("-inf")):
                raise ValueError(f"reward is {reward}")
            traj.reward = reward
            traj.success = bool(self.success_fn(task, state, reward))
        except Exception as e:  # noqa: BLE001 - a broken reward says nothing about the policy
            traj.stop_reason, traj.fault, traj.reward, traj.success = StopReason.ERROR, FaultKind.REWARD, 0.0, False
            traj.error = f"reward function raised {type(e).__name__}: {e}\n{_short_tb(e)}"
            return
        traj.steps = int(state.get("steps", steps_default))
        traj.invalid_actions = int(state.get("invalid_actions", 0))
        traj.stop_reason = StopReason(state.get("stop_reason", StopReason.DONE))
        traj.metadata = dict(state.get("metadata", {}))
        traj.skill = state.get("skill")

    def _finish(self, traj: Trajectory, t0: float) -> Trajectory:
        traj.wall_s = time.perf_counter() - t0
        if self.sink is not None:
            self.sink.write("trajectory", traj)
        crash_point("rollout")
        return traj


def _causes(e: BaseException) -> list[BaseException]:
    """``e`` and its causes/contexts (LangGraph and tools re-raise inside wrappers)."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in chain and len(chain) < 16:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


def _fault_kind(e: BaseException) -> FaultKind:
    """The kind of the fault ``e`` ended an episode with: one an env or tool declared
    (``EpisodeFault``), a failing model server, else an env/tool/graph exception."""
    causes = _causes(e)
    declared = next((c for c in causes if isinstance(c, EpisodeFault)), None)
    if declared is not None:
        return declared.kind
    return FaultKind.BACKEND if any(isinstance(c, BackendError) for c in causes) else FaultKind.ENV


def _is_unreachable(e: BaseException) -> bool:
    return any(isinstance(c, BackendUnavailable) for c in _causes(e))


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
