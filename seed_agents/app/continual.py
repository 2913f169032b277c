"""The continual loop: learn from a deployed agent's rewarded sessions, behind a gate.

One cycle, top to bottom (``ContinualLoop.step``):

1. **claim** (``TraceStore.start_cycle``): up to ``sessions_per_cycle`` rewarded sessions,
   each claimed by exactly one cycle, ever; the cycle row records the promoted version it
   starts from.
2. **replay**: each session's task is played ``group_size`` times by the promoted
   version, tools in shadow mode over the session's recorded responses (``tools.replay``):
   reads from the recording or live under a rate limit, writes to the sandbox or the
   recording, else the episode is unreplayable (a fault, never trained on). A URL sandbox
   with a reset hook is reset before each episode that uses it, and those episodes play one
   at a time (a failed reset faults the episode); a sandbox app is fresh per episode. The task is
   ``metadata["task"]`` when set, else the session's own transcript (its first user
   message, ``seed_agents.transcript``); the recording is ``metadata["recording"]`` when set,
   else the transcript's tool results (``tools.replay.recording_from_transcript``). A replay
   samples as the session's calls did (``metadata["sampling"]``: max_tokens, temperature,
   tool_choice) where the config leaves those unset (``ContinualConfig.play``); where the
   config sets one that differs, the loop says so once. The hindsight node writes each
   replay's skill (SEED). A session is a group; with fewer than ``min_signal_groups``
   groups with unequal rewards the cycle does not train: it is ``skipped``
   (``TraceStore.skip_cycle``), its sessions without reward variance become ``unusable``
   and the others go back to the queue.
3. **train**: one SEED step on a LoRA adapter that starts from the promoted adapter (and,
   with ``carry_optimizer``, from the optimizer state saved with it: cycles then train as
   the steps of one run), with
   the train command's builders (``seed_agents.app.policy``); the adapter is saved whole, then ``finish_training`` stores
   it as the next candidate, the cycle as ``trained`` and the claims as ``trained`` (or
   ``unusable``: fewer than two clean replays) in one transaction.
4. **load**: the candidate goes into the server under ``{name}-v{N}`` (vLLM
   ``/v1/load_lora_adapter``; in process for the local backend): ``loaded``.
5. **canary + decide**: candidate and promoted version (with ``gate.anchor_margin``, the
   anchor too, once it no longer serves) play the fixed canary tasks with the same seeds
   (tools in a fresh sandbox app, the replay section's sandbox, or replay mode),
   ``gate.decide`` compares them (and says how many pairs played identically and how
   many of the update's groups had no reward variance), ``VersionRegistry.record_decision``
   promotes or rejects with the evidence and every canary episode (``continual.canary.CanaryEpisode``:
   its tool calls, results, answer), and the cycle is ``decided``.

``evaluate`` (steps 4-5 without the decision) is also what ``seed_agents.app.drill`` runs
on a deliberately regressed candidate to rehearse the gate.

Progress goes to stderr: a bar per phase (replays, canary) on a terminal, else one line
per phase; the cycle's line (its decision) to ``log``.

Crash safety: every arrow above is a transaction on the cycle row, so a process killed
anywhere finds its cycle on restart (``TraceStore.open_cycle``) and takes it up where the
store says it is: ``claimed`` -> replay and train again with the same sessions (nothing of
the killed attempt was stored); ``trained`` -> load; ``loaded`` -> run the whole canary
again (a candidate is decided only on a complete evaluation made by this process) unless
the decision was already stored, which is then adopted. The candidate never serves before
its decision: only ``VersionRegistry`` moves the promoted pointer. Crash points
(``seed_agents.faults``): ``rollout`` (each replay or canary episode), ``update`` (before the
optimizer step), ``continual-trained``, ``continual-loaded``, ``continual-decision``.

This is the app layer: it imports ``seed_agents.graphs``, ``seed_agents.tools`` and
``seed_agents.trainers`` at the top; the CLI loads it only when ``continual`` runs. Where
versions are sampled from (vLLM or in process) is ``seed_agents.app.serving``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import datasets
import httpx
import torch
from peft import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import TrainerCallback

from seed_agents.app.builders import read_tasks
from seed_agents.app.continual_config import ContinualConfig, Play, most_common
from seed_agents.app.policy import build_policy, seed_config
from seed_agents.app.serving import Serving, serving_for
from seed_agents.capture import JsonlSink
from seed_agents.chat_model import SeedChatModel
from seed_agents.config import TrainConfig
from seed_agents.continual.canary import CanaryEpisode, Side, anchor_side, split_sides
from seed_agents.continual.gate import GateDecision, UpdateSignal, decide
from seed_agents.continual.versions import VersionRegistry
from seed_agents.errors import ContinualError
from seed_agents.faults import crash_point
from seed_agents.graphs.hindsight import with_hindsight
from seed_agents.graphs.tool_agent import build_tool_agent
from seed_agents.imports import load_object, load_reward
from seed_agents.runner import EpisodeRunner
from seed_agents.skills import make_injector
from seed_agents.store import (
    CycleRecord,
    ModelVersionRecord,
    QueueLengths,
    RewardPolicy,
    StoreError,
    TraceStore,
)
from seed_agents.tools.openapi import load_spec, openapi_tools, read_only_predicate
from seed_agents.tools.replay import Recording, ReplayConfig, ReplayTransport, TokenBucket, recording_from_transcript
from seed_agents.trainers.rollout import GraphRollout
from seed_agents.trainers.seed_trainer import SEEDTrainer
from seed_agents.transcript import DeployedSampling, session_sampling, session_transcript, transcript_of
from seed_agents.types import FaultKind, Task, Trajectory

__all__ = ["ContinualError", "ContinualLoop", "CycleOutcome", "cycle_overview"]


@dataclass
class CycleOutcome:
    """What one cycle did; ``line()`` is what the CLI prints."""
    cycle_id: int
    state: str
    sessions: int
    unusable: int = 0
    released: int = 0
    replays: int = 0
    replay_reward: float | None = None
    base_version: int | None = None
    candidate_version: int | None = None
    decision: GateDecision | None = None
    serving: int | None = None
    resumed_from: str | None = None
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        head = f"cycle {self.cycle_id}" + (f" (resumed at {self.resumed_from})" if self.resumed_from else "")
        parts = [f"{head}: {self.sessions} sessions" + (f" ({self.unusable} unusable)" if self.unusable else "")]
        if self.replays:
            parts.append(f"{self.replays} replays, reward {self.replay_reward:.2f}")
        if self.candidate_version is not None:
            parts.append(f"v{self.candidate_version} from v{self.base_version}")
        if self.decision is not None:
            d = self.decision
            means = (f"canary {d.candidate_mean:.2f} vs {d.promoted_mean:.2f}: "
                     if d.candidate_mean is not None and d.promoted_mean is not None else "")
            parts.append(means + d.summary())
        parts += self.notes
        parts.append(f"{self.state}; v{self.serving} serves ({self.wall_s:.0f}s)")
        return " -> ".join(parts)


def cycle_overview(store: TraceStore, name: str | None = None, *, limit: int = 20,
                   policy: RewardPolicy | None = None) -> tuple[QueueLengths, list[CycleRecord]]:
    """For dashboards (``seed-agents status``, /metrics): the session queue and the last cycles."""
    return store.queue_lengths(policy), store.cycles(name, limit=limit)


# --------------------------------------------------------------------------------- loop


class ContinualLoop:
    """Runs cycles for one model name against one store (see the module docstring)."""

    def __init__(self, cfg: ContinualConfig, *, store: TraceStore | None = None, serving: Serving | None = None,
                 log: Callable[[str], None] = print, bootstrap: bool = True, progress: TextIO | None = None) -> None:
        """``bootstrap``: make the base model v0 and promote it when nothing is promoted yet
        (the loop's first start); a drill passes False, since it must change nothing.
        ``progress``: where phases are shown (default stderr; a bar only if it is a terminal)."""
        self.cfg, self.log = cfg, log
        self.progress = CycleProgress(progress, bars=cfg.runner.progress)
        self._warned: set[str] = set()
        self.tools_cfg, self.replay_cfg = cfg.agent.tools, cfg.replay
        try:
            self.reward = load_reward(cfg.agent.reward)
            self.sandbox_app = load_object(cfg.canary.sandbox_app) if cfg.canary.sandbox_app else None
            if cfg.replay.sandbox_app:
                load_object(cfg.replay.sandbox_app)  # fails here, not in the first replay
        except ValueError as e:
            raise ContinualError(f"config: {' '.join(str(e).split())}") from None
        spec_source = cfg.agent.spec or f"{self.tools_cfg.base_url.rstrip('/')}/openapi.json"
        try:
            self.spec = load_spec(spec_source, allow_hosts=self.tools_cfg.allow_hosts)
        except (ValueError, OSError) as e:
            raise ContinualError(f"cannot load the OpenAPI spec {spec_source}: {' '.join(str(e).split())}") from None
        try:
            tools = openapi_tools(self.spec, self.tools_cfg)
        except ValueError as e:
            raise ContinualError(f"agent.tools: {' '.join(str(e).split())}") from None
        names = [t.name for t in tools]
        self.tool_names = frozenset(names)
        if cfg.agent.tool_choice not in ("auto", "none", "required", "any", *names):
            raise ContinualError(f"agent.tool_choice {cfg.agent.tool_choice!r} is not auto, none, required or one of "
                                 f"the spec's tools ({', '.join(names)})")
        self.read_only = read_only_predicate(tools, self.tools_cfg.base_url)
        self.canary_tasks = read_tasks(cfg.canary.tasks)
        self.policy = RewardPolicy(precedence=cfg.precedence, ignore_unlisted=cfg.ignore_unlisted)
        try:
            self.store = store or TraceStore.open(cfg.store)
        except StoreError as e:
            raise ContinualError(str(e)) from None
        self.registry = VersionRegistry(self.store)
        self.serving = serving or serving_for(cfg.backend, replicas=cfg.replicas)
        if bootstrap:
            self.registry.bootstrap(cfg.name, served_name=cfg.backend.model)
        self._sandbox_turns: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self.live_reads = TokenBucket(cfg.replay.live_reads_per_s, cfg.replay.live_read_burst)  # every replay's and canary's

    # ------------------------------------------------------------------ driving

    def run(self, cycles: int | None = None, *, once: bool = False) -> list[CycleOutcome]:
        """Run cycles: ``once``: at most one (none when no session waits); ``cycles``: until
        that many ran, waiting ``poll_s`` while the queue is empty; neither: forever."""
        done: list[CycleOutcome] = []
        while cycles is None or len(done) < cycles:
            outcome = self.step()
            if outcome is not None:
                done.append(outcome)
                self.log(outcome.line())
                if outcome.released and not once:  # they wait for more signal: not replayed again at once
                    time.sleep(self.cfg.poll_s)
            elif once:
                self.log(f"no rewarded session waiting for {self.cfg.name!r}; nothing to do")
            else:
                time.sleep(self.cfg.poll_s)
            if once:
                break
        return done

    def step(self) -> CycleOutcome | None:
        """Resume the unfinished cycle, else start one; None when no session waits."""
        t0 = time.perf_counter()
        cycle = self.store.open_cycle(self.cfg.name)
        resumed = cycle.state if cycle is not None else None
        if cycle is None:
            promoted = self._promoted()
            started = self.store.start_cycle(self.cfg.name, base_version=promoted.version,
                                             limit=self.cfg.sessions_per_cycle, policy=self.policy)
            if started is None:
                return None
            cycle = started[0]
        elif cycle.state == "claimed":  # nothing of the killed attempt was stored: start over from today's version
            cycle = self.store.resume_cycle(cycle.cycle_id, base_version=self._promoted().version)
        else:
            cycle = self.store.resume_cycle(cycle.cycle_id)
        outcome = CycleOutcome(cycle_id=cycle.cycle_id, state=cycle.state, resumed_from=resumed,
                               sessions=len(self.store.cycle_sessions(cycle.cycle_id)), base_version=cycle.base_version)
        deployed = self._deployed(cycle.cycle_id)
        self._warn_unlike(deployed.values())
        if cycle.state == "claimed":
            cycle = self._replay_and_train(cycle, outcome, deployed)
        if cycle.state == "trained":
            cycle = self._load(cycle)
        if cycle.state == "loaded":
            cycle = self._evaluate_and_decide(cycle, outcome, most_common(deployed.values()))
        outcome.state, outcome.candidate_version = cycle.state, cycle.candidate_version
        outcome.unusable = outcome.unusable or len(self.store.cycle_sessions(cycle.cycle_id, "unusable"))
        outcome.serving, outcome.wall_s = self._promoted().version, time.perf_counter() - t0
        return outcome

    # --------------------------------------------------------- claimed -> trained

    def _replay_and_train(self, cycle: CycleRecord, outcome: CycleOutcome,
                          deployed: dict[str, DeployedSampling | None]) -> CycleRecord:
        base = self._version(cycle.base_version)
        sids = self.store.cycle_sessions(cycle.cycle_id)
        trajs, unusable = asyncio.run(self._replays(cycle.cycle_id, sids, base, deployed))
        outcome.replays = len(trajs)
        clean = [t for t in trajs if t.fault is None]
        outcome.replay_reward = sum(t.reward for t in clean) / len(clean) if clean else 0.0
        infra = [t for t in trajs if t.fault is not None and t.fault != FaultKind.UNREPLAYABLE]
        if trajs and len(infra) > self.cfg.runner.max_fault_fraction * len(trajs):
            kinds = sorted({t.fault.value for t in infra if t.fault is not None})
            self.store.release_cycle(cycle.cycle_id, f"{len(infra)} of {len(trajs)} replays faulted ({', '.join(kinds)})")
            raise ContinualError(f"cycle {cycle.cycle_id}: {len(infra)} of {len(trajs)} replays ended in infrastructure "
                                 f"faults ({', '.join(kinds)}); its sessions went back to the queue. See "
                                 f"{self._cycle_dir(cycle.cycle_id) / 'replays.jsonl'}, fix the cause and restart")
        outcome.unusable = len(unusable)
        if len(unusable) == len(sids):
            outcome.notes.append("no session had two clean replays: skipped")
            return self.store.skip_cycle(cycle.cycle_id, unusable)
        trainable = [t for t in trajs if t.metadata.get("session_id") not in unusable]
        flat = _flat_groups(trainable)
        signal = UpdateSignal(groups=len(sids) - len(unusable), flat_groups=len(flat))
        if signal.signal_groups < self.cfg.min_signal_groups:
            return self._skip_without_signal(cycle, outcome, signal, unusable, flat)
        t0 = time.perf_counter()
        path, metrics = self._train(cycle.cycle_id, base, trainable)
        self.progress.line(f"cycle {cycle.cycle_id}: update on {_n(signal.groups, 'group')} ({signal.signal_groups} "
                           f"with unequal rewards) done in {time.perf_counter() - t0:.0f}s")
        crash_point("continual-train-saved")
        cycle, _ = self.store.finish_training(
            cycle.cycle_id, path=str(path), unusable=unusable,
            metadata={"metrics": metrics, "replays": len(trajs), "replay_reward": outcome.replay_reward,
                      "signal": signal.model_dump()})
        crash_point("continual-trained")
        return cycle

    def _skip_without_signal(self, cycle: CycleRecord, outcome: CycleOutcome, signal: UpdateSignal,
                             unusable: dict[str, str], flat: dict[str, str]) -> CycleRecord:
        """Too few groups with unequal rewards to train on: an update would move the adapter
        without the rewards saying which way. Sessions without reward variance are spent
        (``unusable``, with why); those with it go back to the queue for a later cycle."""
        why = (f"{signal.signal_groups} of {signal.groups} groups had unequal rewards, fewer than min_signal_groups "
               f"{self.cfg.min_signal_groups}")
        back = [sid for sid in self.store.cycle_sessions(cycle.cycle_id) if sid not in unusable and sid not in flat]
        outcome.unusable, outcome.released = len(unusable) + len(flat), len(back)
        outcome.notes.append(f"{why}: skipped without training" + (f", {_n(len(back), 'session')} queued again"
                                                                    if back else ""))
        return self.store.skip_cycle(cycle.cycle_id, {**unusable, **flat}, release=back, reason=why)

    async def _replays(self, cycle_id: int, sids: Sequence[str], base: ModelVersionRecord,
                       deployed: dict[str, DeployedSampling | None] | None = None,
                       ) -> tuple[list[Trajectory], dict[str, str]]:
        """``group_size`` shadow replays of each session's task by ``base``, sampled as the
        session was (``deployed``, where the config does not say); sessions that cannot make a
        group (no task recorded, fewer than two clean replays), with why."""
        deployed = deployed or {}
        backend = self.serving.backend(base)
        unusable: dict[str, str] = {}
        jobs, transports = [], []
        for sid in sids:
            found = self._replay_inputs(sid)
            if isinstance(found, str):
                unusable[sid] = found
                continue
            task, recording = found
            transport = ReplayTransport(self.replay_cfg, recording, is_read_only=self.read_only, limiter=self.live_reads)
            transports.append(transport)
            for i in range(self.cfg.group_size):
                jobs.append((sid, task, i, transport.fork()))
        sem = asyncio.Semaphore(self.cfg.runner.concurrency)

        async def one(sid: str, task: Task, i: int, transport: Any) -> Trajectory:
            async with sem:
                traj = await self._episode(backend, task, group_id=f"c{cycle_id}-{sid}", sample_index=i, seed=None,
                                           transport=transport, hindsight=self.cfg.skills.source == "self",
                                           play=self.cfg.play(deployed.get(sid), tools=self.tool_names))
            traj.metadata.update(session_id=sid, cycle=cycle_id,
                                 replay={**transport.counters.as_dict(), "sandbox_resets": transport.sandbox_resets})
            tick(traj)
            return traj

        if jobs:
            self.progress.line(f"cycle {cycle_id}: replaying {_n(len(jobs) // self.cfg.group_size, 'session')} "
                               f"{self.cfg.group_size} times each with v{base.version}", bar_too=False)
        try:
            with self.progress.phase(f"cycle {cycle_id}: replays", len(jobs)) as tick:
                trajs = list(await asyncio.gather(*(one(*job) for job in jobs)))
        finally:
            for transport in transports:
                await transport.aclose()
                transport.close()
        with JsonlSink(self._cycle_dir(cycle_id) / "replays.jsonl") as sink:
            for t in trajs:
                sink.write("trajectory", t)
        for sid in dict.fromkeys(t.metadata["session_id"] for t in trajs):
            mine = [t for t in trajs if t.metadata["session_id"] == sid]
            clean = [t for t in mine if t.fault is None]
            if len(clean) < 2:
                kinds = ", ".join(sorted({t.fault.value for t in mine if t.fault is not None}))
                unusable[sid] = f"{len(clean)} of {len(mine)} replays clean (faults: {kinds})"
        return trajs, unusable

    def _replay_inputs(self, sid: str) -> tuple[Task, Recording] | str:
        """The session's task and recording (explicit ones first, else its transcript), or why it has none."""
        session = self.store.get_session(sid)
        if session is None:
            return "the session is not in the store"
        transcript = session_transcript(session.metadata)
        if transcript is None:  # stored before transcripts were kept: read the last call's conversation
            calls = [c for c in self.store.calls(sid) if c.purpose == "policy"]
            transcript = transcript_of(calls[-1].messages, calls[-1].tools) if calls else None
        raw_task = session.metadata.get("task")
        task = Task.model_validate(raw_task) if raw_task is not None else (
            transcript.task(session.task_key or sid) if transcript is not None else None)
        if task is None:
            return "no task: the session has no user message and no metadata['task']; it cannot be replayed"
        recorded = session.metadata.get("recording")
        if recorded:
            return task, Recording.load(recorded, append=False)
        results = transcript.tool_results if transcript is not None else []
        return task, recording_from_transcript(self.spec, self.tools_cfg, results, self.replay_cfg,
                                               is_read_only=self.read_only)

    def _train(self, cycle_id: int, base: ModelVersionRecord, trajs: list[Trajectory]) -> tuple[Path, dict[str, float]]:
        """One SEED step on a LoRA adapter starting from ``base``'s; the adapter is saved
        to ``adapters/cycle-<id>`` whole (written beside it, then renamed) or not at all."""
        out = self._cycle_dir(cycle_id)
        groups = sorted({t.group_id for t in trajs})
        tcfg = TrainConfig.model_validate(self.cfg.train_fields(out, len(groups)))
        policy = build_policy(tcfg, out)
        if base.path:
            load_adapter_weights(policy.model, base.path)
        injector = make_injector(self.cfg.skills.injector)
        batch = GraphRollout(None, policy.llm, skills=self.cfg.skills.source, injector=injector,  # type: ignore[arg-type]
                             merge_rows=self.cfg.trainer.merge_rows).build(trajs)

        class _Batch:
            """The rollout the trainer calls: the replays were already played."""

            def collect(self, tasks: list[Task], group_size: int, iteration: int) -> Any:
                return batch

        class _CrashPoint(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                crash_point("update")

        carried = Path(base.path) / OPTIMIZER_FILE if base.path and self.cfg.carry_optimizer else None

        class _CarryOptimizer(TrainerCallback):
            """The promoted adapter's optimizer state, loaded once TRL has built the optimizer."""

            def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
                if carried is not None and carried.is_file():
                    load_optimizer_state(optimizer, carried)

        dataset = datasets.Dataset.from_list([{"prompt": Task(task_id=g).model_dump_json()} for g in groups])
        trainer = SEEDTrainer(model=policy.model, args=seed_config(tcfg, out), train_dataset=dataset, rollout=_Batch(),
                              processing_class=policy.tokenizer)
        trainer.add_callback(_CrashPoint())
        trainer.add_callback(_CarryOptimizer())
        trainer.train()
        metrics = {k: float(v) for k, v in (trainer.state.log_history[-1] if trainer.state.log_history else {}).items()
                   if isinstance(v, int | float)}
        optimizer = trainer.optimizer.state_dict() if self.cfg.carry_optimizer else None
        final = save_adapter(policy.model, self.cfg.out / "adapters" / f"cycle-{cycle_id}", optimizer=optimizer)
        del trainer, policy
        gc.collect()
        return final.resolve(), metrics

    # ---------------------------------------------------------- trained -> loaded

    def _load(self, cycle: CycleRecord) -> CycleRecord:
        candidate = self._version(cycle.candidate_version)
        served = self.serving.load(candidate)
        cycle = self.store.advance_cycle(cycle.cycle_id, ("trained",), "loaded", metadata={"served_as": served})
        crash_point("continual-loaded")
        return cycle

    # --------------------------------------------------------- loaded -> decided

    def _evaluate_and_decide(self, cycle: CycleRecord, outcome: CycleOutcome,
                             deployed: DeployedSampling | None) -> CycleRecord:
        name = self.cfg.name
        candidate = self._version(cycle.candidate_version)
        if candidate.status != "candidate":  # decided before the kill; adopt the stored decision
            stored = [d for d in self.registry.decisions(name) if d.version == candidate.version]
            if not stored:
                raise ContinualError(f"cycle {cycle.cycle_id}: candidate v{candidate.version} is {candidate.status} "
                                     f"without a stored decision; inspect it with `seed-agents versions list`")
            outcome.notes.append(f"decision #{stored[-1].decision_id} already stored: {stored[-1].summary}")
            return self.store.advance_cycle(cycle.cycle_id, ("loaded",), "decided", decision_id=stored[-1].decision_id)
        promoted = self._promoted()
        raw_signal = candidate.metadata.get("signal")
        update = UpdateSignal.model_validate(raw_signal) if isinstance(raw_signal, dict) else None
        decision, episodes = self.evaluate(promoted, candidate, deployed=deployed, update=update,
                                           label=f"cycle {cycle.cycle_id}: canary")
        outcome.decision = decision
        try:
            record = self.registry.record_decision(name, candidate.version, decision, baseline=promoted.version,
                                                   canary=episodes)
        except StoreError as e:  # the promoted version moved while we evaluated: no decision against a stale baseline
            record = self.registry.discard(name, candidate.version, reason=f"compared with v{promoted.version}, "
                                           f"which stopped serving during the canary ({' '.join(str(e).split())})",
                                           canary=episodes)
            outcome.notes.append("baseline moved during the canary: discarded")
        crash_point("continual-decision")
        if not decision.promote:
            self.serving.unload(candidate)
        return self.store.advance_cycle(cycle.cycle_id, ("loaded",), "decided", decision_id=record.decision_id,
                                        metadata={"verdict": decision.verdict, "compared_with": promoted.version})

    def evaluate(self, promoted: ModelVersionRecord, candidate: ModelVersionRecord, *,
                 deployed: DeployedSampling | None = None, update: UpdateSignal | None = None,
                 label: str = "canary") -> tuple[GateDecision, list[CanaryEpisode]]:
        """Load ``candidate`` (again: a restarted server forgets runtime adapters), play the
        canary with both versions (and the anchor, when the gate has an anchor margin and
        the anchor is not the promoted version) and ask the gate; nothing is stored.
        ``deployed``: how the deployment samples (where the config does not say); ``update``:
        the reward signal of the candidate's update, kept with the decision."""
        self.serving.load(candidate)
        anchor = self._anchor() if self.cfg.gate.anchor_margin is not None else None
        third = anchor if anchor is not None and anchor.version != promoted.version else None
        if third is not None:
            self.serving.load(third)
        play = self.cfg.play(deployed, canary=True, tools=self.tool_names)
        episodes = asyncio.run(self._canary(promoted, candidate, third, play=play, label=label))
        promoted_results, candidate_results = split_sides(episodes)
        anchor_results = None
        if anchor is not None:  # the anchor played as its own side, or it is the promoted version
            anchor_results = anchor_side(episodes) if third is not None else promoted_results
        decision = decide(promoted_results, candidate_results, self.cfg.gate, anchor=anchor_results, update=update)
        return decision, episodes

    def _anchor(self) -> ModelVersionRecord:
        """The gate's anchor: the oldest version of this name that served and was not
        rejected since (promoted or retired), v0 unless a rollback went past it."""
        good = [v for v in self.store.model_versions(self.cfg.name) if v.status in ("promoted", "retired")]
        if not good:
            raise ContinualError(f"{self.cfg.name!r} has no promoted or retired version to anchor the gate on")
        return min(good, key=lambda v: v.version)

    async def _canary(self, promoted: ModelVersionRecord, candidate: ModelVersionRecord,
                      anchor: ModelVersionRecord | None = None, *, play: Play, label: str) -> list[CanaryEpisode]:
        """Each version (the anchor too, when given) on every (canary task, seed k); episode
        k samples with seed k."""
        sem = asyncio.Semaphore(self.cfg.runner.concurrency)

        async def one(side: Side, version: ModelVersionRecord, task: Task, k: int) -> CanaryEpisode:
            final: dict[str, Any] = {}
            async with sem:
                traj = await self._episode(self.serving.backend(version), task, group_id=f"canary-{task.task_id}",
                                           sample_index=k, seed=self.cfg.seed * 1_000_003 + k,
                                           transport=self._canary_transport(), hindsight=False, play=play, final=final)
            tick(traj)
            return CanaryEpisode.of(traj, side=side, version=version.version, seed=k, messages=final.get("messages"))

        sides: tuple[tuple[Side, ModelVersionRecord], ...] = (("promoted", promoted), ("candidate", candidate))
        if anchor is not None:
            sides += (("anchor", anchor),)
        plays = [(s, v, t, k) for s, v in sides for t in self.canary_tasks for k in range(self.cfg.canary.seeds)]
        with self.progress.phase(label, len(plays)) as tick:
            return list(await asyncio.gather(*(one(*p) for p in plays)))

    def _canary_transport(self) -> Any:
        """A fresh sandbox app per episode (same state for every episode), the replay
        section's sandbox (reset before the episode), else replay mode."""
        if self.sandbox_app is not None:
            return httpx.ASGITransport(app=self.sandbox_app())
        recording = Recording.load(self.cfg.canary.recording, append=False) if self.cfg.canary.recording else Recording()
        if self.cfg.canary.replay_sandbox:
            return ReplayTransport(self.replay_cfg, recording, is_read_only=self.read_only, limiter=self.live_reads)
        return ReplayTransport(ReplayConfig(mode="replay"), recording)

    # ---------------------------------------------------------------- episodes

    async def _episode(self, backend: Any, task: Task, *, group_id: str, sample_index: int, seed: int | None,
                       transport: Any, hindsight: bool, play: Play,
                       final: dict[str, Any] | None = None) -> Trajectory:
        """One episode of the deployed agent with its tools on ``transport``, sampling as
        ``play`` says; nothing of it is written to the store (a replay is not traffic).
        ``final`` receives the graph's final state (its messages: what the canary keeps of
        the episode)."""
        sampling = play.sampling.model_copy(update={"seed": seed})
        llm = SeedChatModel(backend=backend, tokenizer=self.serving.tokenizer, sampling=sampling,
                            model_name=self.cfg.name)
        tools = openapi_tools(self.spec, self.tools_cfg, transport=transport)
        system_prompt = self.cfg.agent.system_prompt or task.data.get("system_prompt")  # the deployed one when unset
        graph = build_tool_agent(llm, tools, system_prompt=system_prompt,
                                 max_turns=self.cfg.agent.max_turns, **play.tool_choices())
        if hindsight:
            s = self.cfg.skills
            graph = with_hindsight(graph, llm, success_fn=lambda state: self.reward(task, state) >= 1.0,
                                   max_tokens=s.max_tokens, min_words=s.min_words, max_words=s.max_words)
        # A URL sandbox with a reset hook is one shared state: reset it as the episode's
        # env (a failed reset is the episode's fault) and play its episodes one at a time.
        shared = isinstance(transport, ReplayTransport) and transport.exclusive_sandbox
        reward = self.reward if final is None else _keeping_state(self.reward, final)
        runner = EpisodeRunner(graph, self.cfg.runner, reward_fn=reward,
                               make_env=(lambda _task: transport.reset_sandbox()) if shared else None)
        try:
            if not shared:
                return await runner.run_episode(task, group_id, sample_index)
            async with self._sandbox_turn():
                return await runner.run_episode(task, group_id, sample_index)
        finally:
            if isinstance(transport, ReplayTransport):  # a fork owns nothing; a canary's own transport its connections
                await transport.aclose()
                transport.close()

    def _sandbox_turn(self) -> asyncio.Lock:
        """The lock that lets one episode at a time use the shared sandbox (one per event loop)."""
        loop = asyncio.get_running_loop()
        if self._sandbox_turns is None or self._sandbox_turns[0] is not loop:
            self._sandbox_turns = (loop, asyncio.Lock())
        return self._sandbox_turns[1]

    # ----------------------------------------------------------------- helpers

    def _deployed(self, cycle_id: int) -> dict[str, DeployedSampling | None]:
        """How the deployment sampled each session of the cycle (None: not recorded)."""
        out: dict[str, DeployedSampling | None] = {}
        for sid in self.store.cycle_sessions(cycle_id):
            session = self.store.get_session(sid)
            out[sid] = session_sampling(session.metadata) if session is not None else None
        return out

    def _warn_unlike(self, deployed: Iterable[DeployedSampling | None]) -> None:
        """One line, once per difference in this process: where the config's sampling is not the deployment's."""
        new = [d for d in self.cfg.unlike_deployment(deployed, tools=self.tool_names) if d not in self._warned]
        if new:
            self._warned.update(new)
            self.log(f"warning: the loop samples unlike the deployment: {'; '.join(new)} (leave these out of the "
                     f"config to replay sessions as they were sampled)")

    def _promoted(self) -> ModelVersionRecord:
        record = self.store.promoted_version(self.cfg.name)
        if record is None:
            raise ContinualError(f"{self.cfg.name!r} has no promoted version (rolled back past the first?); "
                                 f"promote one with `seed-agents versions promote N`")
        return record

    def _version(self, version: int | None) -> ModelVersionRecord:
        found = [v for v in self.store.model_versions(self.cfg.name) if v.version == version]
        if not found:
            raise ContinualError(f"{self.cfg.name} v{version} is not in the store")
        return found[0]

    def _cycle_dir(self, cycle_id: int) -> Path:
        path = self.cfg.out / "cycles" / str(cycle_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        self.store.close()


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _flat_groups(trajs: Sequence[Trajectory]) -> dict[str, str]:
    """Sessions whose clean replays all got the same reward (zero advantages: the rewards
    teach nothing through them), with why."""
    rewards: dict[str, list[float]] = {}
    for t in trajs:
        if t.fault is None:
            rewards.setdefault(str(t.metadata.get("session_id")), []).append(t.reward)
    return {sid: f"no reward variance: its {len(rs)} clean replays all scored {rs[0]:g}"
            for sid, rs in rewards.items() if max(rs) - min(rs) <= 1e-9}


class CycleProgress:
    """What a cycle is doing, on ``stream`` (stderr when None, looked up at each write): a bar
    per phase on a terminal when ``bars``, else one line per phase as it ends."""

    def __init__(self, stream: TextIO | None = None, *, bars: bool = True) -> None:
        self._stream, self._bars = stream, bars

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    @property
    def bars(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return self._bars and callable(isatty) and bool(isatty())

    def line(self, text: str, *, bar_too: bool = True) -> None:
        """``text`` as a line; ``bar_too`` False: only where no bar shows the same."""
        if bar_too or not self.bars:
            print(text, file=self.stream, flush=True)

    @contextmanager
    def phase(self, what: str, total: int) -> Iterator[Callable[[Trajectory], None]]:
        """A phase of ``total`` episodes; call the yielded function with each one that ends."""
        t0, done, faulted = time.perf_counter(), [0], [0]
        bar = None
        if self.bars and total:
            from tqdm import tqdm

            bar = tqdm(total=total, desc=what, unit="ep", dynamic_ncols=True, file=self.stream)

        def tick(traj: Trajectory) -> None:
            done[0] += 1
            faulted[0] += traj.fault is not None
            if bar is not None:
                bar.set_postfix(faulted=faulted[0], refresh=False)
                bar.update(1)

        try:
            yield tick
        finally:
            if bar is not None:
                bar.close()
        if bar is None and total:
            faults = f", {faulted[0]} faulted" if faulted[0] else ""
            self.line(f"{what} {done[0]}/{total} done{faults} ({time.perf_counter() - t0:.0f}s)")


def _keeping_state(reward: Callable[[Task, dict[str, Any]], float],
                   final: dict[str, Any]) -> Callable[[Task, dict[str, Any]], float]:
    """``reward``, also keeping the final state it scores in ``final`` (the runner hands
    the graph's final state to the reward only)."""
    def keep(task: Task, state: dict[str, Any]) -> float:
        final.update(state)
        return reward(task, state)
    return keep


OPTIMIZER_FILE = "optimizer.pt"


def save_adapter(model: Any, final: Path, *, optimizer: dict[str, Any] | None = None) -> Path:
    """Save the LoRA adapter of ``model`` to ``final`` whole (written beside it, then renamed)
    or not at all; a folder left there by a killed attempt that stored nothing is replaced.
    ``optimizer``: the optimizer's ``state_dict``, saved in the same folder (``OPTIMIZER_FILE``)
    for the cycle that trains from this adapter next."""
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer, tmp / OPTIMIZER_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def load_optimizer_state(optimizer: Any, file: Path) -> None:
    """Load a stored optimizer ``state_dict`` (tensors and numbers only: ``weights_only``)
    into ``optimizer``, which must hold the same parameters in the same order: the per-weight
    state (Adam's moments, its step count). The groups' settings stay this run's: torch would
    restore the stored ones, and the stored learning rate is what the last cycle's scheduler
    left (0 at the end of a linear decay), not what this cycle asks for."""
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(torch.load(file, weights_only=True))
    except (ValueError, KeyError, RuntimeError) as e:
        raise ContinualError(f"the promoted adapter's optimizer state {file} does not fit this run's optimizer "
                             f"({' '.join(str(e).split())[:200]}); keep the LoRA settings of the run, or set "
                             f"carry_optimizer: false") from None
    # torch checks only how many parameters each group holds; a moment of another shape
    # would fail at the step, mid-cycle
    for group in optimizer.param_groups:
        for param in group["params"]:
            for value in optimizer.state.get(param, {}).values():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ContinualError(f"the promoted adapter's optimizer state {file} holds a {tuple(value.shape)} "
                                         f"moment for a {tuple(param.shape)} weight; keep the LoRA settings of the "
                                         f"run, or set carry_optimizer: false")
    for group, kept in zip(optimizer.param_groups, settings, strict=True):
        group.update(kept)


def load_adapter_weights(model: Any, path: str) -> None:
    """Start the fresh LoRA of ``build_policy`` from a stored adapter (same rank and targets)."""
    file = Path(path) / "adapter_model.safetensors"
    if not file.is_file():
        raise ContinualError(f"the promoted adapter {path} has no adapter_model.safetensors; was it moved?")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    if getattr(result, "unexpected_keys", None):
        raise ContinualError(f"the promoted adapter {path} does not fit trainer.lora_r / the model "
                             f"({len(result.unexpected_keys)} unexpected tensors); keep the LoRA settings of the run")
