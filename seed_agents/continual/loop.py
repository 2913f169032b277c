"""The continual loop: learn from a deployed agent's rewarded sessions, behind a gate.

One cycle, top to bottom (``ContinualLoop.step``):

1. **claim** (``TraceStore.start_cycle``): up to ``sessions_per_cycle`` rewarded sessions,
   each claimed by exactly one cycle, ever; the cycle row records the promoted version it
   starts from.
2. **replay**: each session's task (``metadata["task"]``) is played ``group_size`` times
   by the promoted version, tools in shadow mode over the session's recorded responses
   (``metadata["recording"]``, ``tools.replay``): reads from the recording or live under a
   rate limit, writes to the sandbox or the recording, else the episode is unreplayable
   (a fault, never trained on). The hindsight node writes each replay's skill (SEED).
3. **train**: one SEED step on a LoRA adapter that starts from the promoted adapter, with
   ``cli_train``'s builders; the adapter is saved whole, then ``finish_training`` stores
   it as the next candidate, the cycle as ``trained`` and the claims as ``trained`` (or
   ``unusable``: fewer than two clean replays) in one transaction.
4. **load**: the candidate goes into the server under ``{name}-v{N}`` (vLLM
   ``/v1/load_lora_adapter``; in process for the local backend): ``loaded``.
5. **canary + decide**: candidate and promoted version play the fixed canary tasks with
   the same seeds (tools in a fresh sandbox app or in replay mode), ``gate.decide``
   compares them, ``VersionRegistry.record_decision`` promotes or rejects with the
   evidence, and the cycle is ``decided``.

Crash safety: every arrow above is a transaction on the cycle row, so a process killed
anywhere finds its cycle on restart (``TraceStore.open_cycle``) and takes it up where the
store says it is: ``claimed`` -> replay and train again with the same sessions (nothing of
the killed attempt was stored); ``trained`` -> load; ``loaded`` -> run the whole canary
again (a candidate is decided only on a complete evaluation made by this process) unless
the decision was already stored, which is then adopted. The candidate never serves before
its decision: only ``VersionRegistry`` moves the promoted pointer. Crash points
(``seed_agents.faults``): ``rollout`` (each replay or canary episode), ``update`` (before the
optimizer step), ``continual-trained``, ``continual-loaded``, ``continual-decision``.

Imports of ``graphs``, ``tools`` and ``trainers`` happen inside functions: this module is a
composition root like ``cli_train`` (DESIGN.md, direction of imports).
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from seed_agents.config import UserError
from seed_agents.continual.config import ContinualConfig
from seed_agents.continual.gate import CanaryResult, GateDecision, decide
from seed_agents.continual.versions import VersionRegistry, served_name_of
from seed_agents.faults import crash_point
from seed_agents.store import ModelVersionRecord, RewardPolicy, StoreError, TraceStore
from seed_agents.store.store import CycleRecord, QueueLengths
from seed_agents.types import FaultKind, Task, Trajectory

__all__ = ["ContinualError", "ContinualLoop", "CycleOutcome", "cycle_overview"]


class ContinualError(UserError, RuntimeError):
    """The loop cannot go on for a reason an operator can fix (one line, exit 2)."""


@dataclass
class CycleOutcome:
    """What one cycle did; ``line()`` is what the CLI prints."""

    cycle_id: int
    state: str
    sessions: int
    unusable: int = 0
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


# ------------------------------------------------------------------------------ serving


class Serving(Protocol):
    """Where versions are sampled from: the running vLLM server, or in-process models."""

    tokenizer: Any

    def load(self, version: ModelVersionRecord) -> str:
        """Make ``version`` servable (idempotent); return the name it is served under."""
        ...

    def backend(self, version: ModelVersionRecord) -> Any:
        """A backend that samples from ``version`` (loaded first)."""
        ...

    def unload(self, version: ModelVersionRecord) -> None:
        """Free a version that will not serve (best effort)."""
        ...


class LocalServing:
    """In-process: one ``LocalBackend`` per version (base weights + the version's adapter),
    the last few kept. Tests and CPU demos; a real deployment serves through vLLM."""

    def __init__(self, weights: str, tokenizer: Any, *, max_batch_size: int, keep: int = 2) -> None:
        self.weights, self.tokenizer, self.max_batch_size, self.keep = weights, tokenizer, max_batch_size, keep
        self._backends: dict[str, Any] = {}

    def load(self, version: ModelVersionRecord) -> str:
        self.backend(version)
        return served_name_of(version)

    def backend(self, version: ModelVersionRecord) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        from seed_agents.backends.local import LocalBackend

        name = served_name_of(version)
        if name not in self._backends:
            model = AutoModelForCausalLM.from_pretrained(self.weights, dtype=torch.float32)
            if version.path:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, version.path)
            model.eval()
            while len(self._backends) >= self.keep:
                self._backends.pop(next(iter(self._backends)))
            self._backends[name] = LocalBackend(model, tokenizer=self.tokenizer, max_batch_size=self.max_batch_size,
                                                policy_version=version.version)
        return self._backends[name]

    def unload(self, version: ModelVersionRecord) -> None:
        self._backends.pop(served_name_of(version), None)


class VLLMServing:
    """A running vLLM server with runtime LoRA (``--enable-lora``,
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): each version is an adapter under its own
    served name (a same-name reload could serve stale prefix-cache blocks); version 0 is
    the base model's served name. One ``VLLMBackend`` per served name, kept until the
    version is unloaded: a canary asks for a backend per episode, and each backend owns a
    connection pool."""

    def __init__(self, cfg: Any, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self._backends: dict[str, Any] = {}

    def load(self, version: ModelVersionRecord) -> str:
        """POST the adapter (again: a restarted server forgets runtime adapters; vLLM
        answers 400 "has already been loaded" when it still has it, which is fine)."""
        name = served_name_of(version)
        if version.path:
            self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(version.path).resolve())},
                       ok_if="already")
        return name

    def backend(self, version: ModelVersionRecord) -> Any:
        from seed_agents.backends.vllm import VLLMBackend

        name = served_name_of(version)
        if name not in self._backends:
            self.load(version)
            self._backends[name] = VLLMBackend(self.cfg.base_url, name, max_concurrency=self.cfg.max_concurrency,
                                               timeout_s=self.cfg.timeout_s, max_retries=self.cfg.max_retries,
                                               policy_version=version.version)
        return self._backends[name]

    def unload(self, version: ModelVersionRecord) -> None:
        backend = self._backends.pop(served_name_of(version), None)
        if backend is not None:
            backend.close()
        if version.path:
            try:  # vLLM 0.32 answers 404 "... cannot be found" for a name it does not hold
                self._post("/v1/unload_lora_adapter", {"lora_name": served_name_of(version)}, ok_if="be found")
            except Exception as e:  # noqa: BLE001 - a leftover adapter only costs memory
                print(f"could not unload {served_name_of(version)} ({' '.join(str(e).split())}); it stays loaded")

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()

    def _post(self, path: str, body: dict[str, Any], *, ok_if: str) -> None:
        """POST to the server; a 400/404 whose text says ``ok_if`` (already loaded, not
        loaded) is the state we wanted. Hand-written beside ``trainers.weight_sync``'s
        ``LoRASync`` because that one also unloads the previous adapter, which here may
        be the version serving users."""
        import httpx

        from trainers.weight_sync import WeightSyncError

        url = self.cfg.base_url.rstrip("/") + path
        try:
            r = httpx.post(url, json=body, timeout=self.cfg.timeout_s)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"POST {url} failed ({type(e).__name__}); is the vLLM server running?") from e
        if r.status_code >= 400 and not (r.status_code in (400, 404) and ok_if in r.text.lower()):
            raise WeightSyncError(f"POST {url} -> HTTP {r.status_code}: {' '.join(r.text.split())[:300]}; start vLLM "
                                  f"with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")


# --------------------------------------------------------------------------------- loop


class ContinualLoop:
    """Runs cycles for one model name against one store (see the module docstring)."""

    def __init__(self, cfg: ContinualConfig, *, store: TraceStore | None = None, serving: Serving | None = None,
                 log: Callable[[str], None] = print) -> None:
        from seed_agents.imports import load_object
        from tools.openapi import (
            OpenAPIToolsConfig,
            load_spec,
            openapi_tools,
            read_only_predicate,
        )
        from tools.replay import ReplayConfig

        self.cfg, self.log = cfg, log
        try:
            self.tools_cfg = OpenAPIToolsConfig.model_validate(cfg.agent.tools)
            self.replay_cfg = ReplayConfig.model_validate({"mode": "shadow", **cfg.replay})
            self.reward = load_object(cfg.agent.reward)
            self.sandbox_app = load_object(cfg.canary.sandbox_app) if cfg.canary.sandbox_app else None
        except ValueError as e:
            raise ContinualError(f"config: {' '.join(str(e).split())}") from None
        spec_source = cfg.agent.spec or f"{self.tools_cfg.base_url.rstrip('/')}/openapi.json"
        try:
            self.spec = load_spec(spec_source, allow_hosts=self.tools_cfg.allow_hosts)
        except (ValueError, OSError) as e:
            raise ContinualError(f"cannot load the OpenAPI spec {spec_source}: {' '.join(str(e).split())}") from None
        self.read_only = read_only_predicate(openapi_tools(self.spec, self.tools_cfg), self.tools_cfg.base_url)
        self.canary_tasks = _read_tasks(cfg.canary.tasks)
        self.policy = RewardPolicy(precedence=cfg.precedence, ignore_unlisted=cfg.ignore_unlisted)
        try:
            self.store = store or TraceStore.open(cfg.store)
        except StoreError as e:
            raise ContinualError(str(e)) from None
        self.registry = VersionRegistry(self.store)
        self.serving = serving or _serving(cfg)
        self.registry.bootstrap(cfg.name, served_name=cfg.backend.model)

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
        if cycle.state == "claimed":
            cycle = self._replay_and_train(cycle, outcome)
        if cycle.state == "trained":
            cycle = self._load(cycle)
        if cycle.state == "loaded":
            cycle = self._evaluate_and_decide(cycle, outcome)
        outcome.state, outcome.candidate_version = cycle.state, cycle.candidate_version
        outcome.unusable = outcome.unusable or len(self.store.cycle_sessions(cycle.cycle_id, "unusable"))
        outcome.serving, outcome.wall_s = self._promoted().version, time.perf_counter() - t0
        return outcome

    # --------------------------------------------------------- claimed -> trained

    def _replay_and_train(self, cycle: CycleRecord, outcome: CycleOutcome) -> CycleRecord:
        base = self._version(cycle.base_version)
        sids = self.store.cycle_sessions(cycle.cycle_id)
        trajs, unusable = asyncio.run(self._replays(cycle.cycle_id, sids, base))
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
        path, metrics = self._train(cycle.cycle_id, base, trainable)
        crash_point("continual-train-saved")
        cycle, _ = self.store.finish_training(
            cycle.cycle_id, path=str(path), unusable=unusable,
            metadata={"metrics": metrics, "replays": len(trajs), "replay_reward": outcome.replay_reward})
        crash_point("continual-trained")
        return cycle

    async def _replays(self, cycle_id: int, sids: Sequence[str],
                       base: ModelVersionRecord) -> tuple[list[Trajectory], dict[str, str]]:
        """``group_size`` shadow replays of each session's task by ``base``; sessions that
        cannot make a group (no task recorded, fewer than two clean replays), with why."""
        from seed_agents.capture import JsonlSink
        from tools.replay import Recording, ReplayTransport

        backend = self.serving.backend(base)
        unusable: dict[str, str] = {}
        jobs, transports = [], []
        for sid in sids:
            session = self.store.get_session(sid)
            raw_task = session.metadata.get("task") if session is not None else None
            if raw_task is None:
                unusable[sid] = "no task recorded with the session (metadata['task']): it cannot be replayed"
                continue
            task = Task.model_validate(raw_task)
            recorded = session.metadata.get("recording") if session is not None else None
            recording = Recording.load(recorded, append=False) if recorded else Recording()
            transport = ReplayTransport(self.replay_cfg, recording, is_read_only=self.read_only)
            transports.append(transport)
            for i in range(self.cfg.group_size):
                jobs.append((sid, task, i, transport.fork()))
        sem = asyncio.Semaphore(self.cfg.runner.concurrency)

        async def one(sid: str, task: Task, i: int, transport: Any) -> Trajectory:
            async with sem:
                traj = await self._episode(backend, task, group_id=f"c{cycle_id}-{sid}", sample_index=i, seed=None,
                                           transport=transport, hindsight=self.cfg.skills.source == "self",
                                           temperature=self.cfg.sampling.temperature)
            traj.metadata.update(session_id=sid, cycle=cycle_id, replay=transport.counters.as_dict())
            return traj

        try:
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

    def _train(self, cycle_id: int, base: ModelVersionRecord, trajs: list[Trajectory]) -> tuple[Path, dict[str, float]]:
        """One SEED step on a LoRA adapter starting from ``base``'s; the adapter is saved
        to ``adapters/cycle-<id>`` whole (written beside it, then renamed) or not at all."""
        import datasets
        from transformers import TrainerCallback

        from seed_agents.cli_train import build_policy, seed_config
        from seed_agents.config import TrainConfig
        from seed_agents.skills import SystemBlockInjector, TaskLineInjector
        from trainers.rollout import GraphRollout
        from trainers.seed_trainer import SEEDTrainer

        out = self._cycle_dir(cycle_id)
        groups = sorted({t.group_id for t in trajs})
        tcfg = TrainConfig.model_validate(self.cfg.train_fields(out, len(groups)))
        policy = build_policy(tcfg, out)
        if base.path:
            _load_adapter_weights(policy.model, base.path)
        injector = TaskLineInjector() if self.cfg.skills.injector == "task_line" else SystemBlockInjector()
        batch = GraphRollout(None, policy.llm, skills=self.cfg.skills.source, injector=injector,  # type: ignore[arg-type]
                             merge_rows=self.cfg.trainer.merge_rows).build(trajs)

        class _Batch:
            """The rollout the trainer calls: the replays were already played."""

            def collect(self, tasks: list[Task], group_size: int, iteration: int) -> Any:
                return batch

        class _CrashPoint(TrainerCallback):
            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                crash_point("update")

        dataset = datasets.Dataset.from_list([{"prompt": Task(task_id=g).model_dump_json()} for g in groups])
        trainer = SEEDTrainer(model=policy.model, args=seed_config(tcfg, out), train_dataset=dataset, rollout=_Batch(),
                              processing_class=policy.tokenizer)
        trainer.add_callback(_CrashPoint())
        trainer.train()
        metrics = {k: float(v) for k, v in (trainer.state.log_history[-1] if trainer.state.log_history else {}).items()
                   if isinstance(v, int | float)}
        final = self.cfg.out / "adapters" / f"cycle-{cycle_id}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)  # left by a killed attempt that stored nothing
        os.replace(tmp, final)
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

    def _evaluate_and_decide(self, cycle: CycleRecord, outcome: CycleOutcome) -> CycleRecord:
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
        self.serving.load(candidate)  # again: a restarted server forgets runtime adapters
        promoted_results, candidate_results = asyncio.run(self._canary(promoted, candidate))
        decision = decide(promoted_results, candidate_results, self.cfg.gate)
        outcome.decision = decision
        try:
            record = self.registry.record_decision(name, candidate.version, decision, baseline=promoted.version)
        except StoreError as e:  # the promoted version moved while we evaluated: no decision against a stale baseline
            record = self.registry.discard(name, candidate.version, reason=f"compared with v{promoted.version}, "
                                           f"which stopped serving during the canary ({' '.join(str(e).split())})")
            outcome.notes.append("baseline moved during the canary: discarded")
        crash_point("continual-decision")
        if not decision.promote:
            self.serving.unload(candidate)
        return self.store.advance_cycle(cycle.cycle_id, ("loaded",), "decided", decision_id=record.decision_id,
                                        metadata={"verdict": decision.verdict, "compared_with": promoted.version})

    async def _canary(self, promoted: ModelVersionRecord,
                      candidate: ModelVersionRecord) -> tuple[list[CanaryResult], list[CanaryResult]]:
        """Both versions on every (canary task, seed k); episode k samples with seed k."""
        sem = asyncio.Semaphore(self.cfg.runner.concurrency)

        async def one(version: ModelVersionRecord, task: Task, k: int) -> CanaryResult:
            async with sem:
                traj = await self._episode(self.serving.backend(version), task, group_id=f"canary-{task.task_id}",
                                           sample_index=k, seed=self.cfg.seed * 1_000_003 + k,
                                           transport=self._canary_transport(), hindsight=False,
                                           temperature=self.cfg.canary.temperature)
            return CanaryResult.of(traj, seed=k)

        plays = [(v, t, k) for v in (promoted, candidate) for t in self.canary_tasks for k in range(self.cfg.canary.seeds)]
        results = await asyncio.gather(*(one(*p) for p in plays))
        half = len(results) // 2
        return list(results[:half]), list(results[half:])

    def _canary_transport(self) -> Any:
        """A fresh sandbox app per episode (same state for every episode), else replay mode."""
        import httpx

        from tools.replay import Recording, ReplayConfig, ReplayTransport

        if self.sandbox_app is not None:
            return httpx.ASGITransport(app=self.sandbox_app())
        recording = Recording.load(self.cfg.canary.recording, append=False) if self.cfg.canary.recording else Recording()
        return ReplayTransport(ReplayConfig(mode="replay"), recording)

    # ---------------------------------------------------------------- episodes

    async def _episode(self, backend: Any, task: Task, *, group_id: str, sample_index: int, seed: int | None,
                       transport: Any, hindsight: bool, temperature: float) -> Trajectory:
        """One episode of the deployed agent with its tools on ``transport``; nothing of it
        is written to the store (a replay is not traffic)."""
        from graphs.hindsight import with_hindsight
        from graphs.tool_agent import build_tool_agent
        from seed_agents.chat_model import SeedChatModel
        from seed_agents.runner import EpisodeRunner
        from tools.openapi import openapi_tools

        sampling = self.cfg.sampling.model_copy(update={"seed": seed, "temperature": temperature})
        llm = SeedChatModel(backend=backend, tokenizer=self.serving.tokenizer, sampling=sampling,
                            model_name=self.cfg.name)
        tools = openapi_tools(self.spec, self.tools_cfg, transport=transport)
        graph = build_tool_agent(llm, tools, system_prompt=self.cfg.agent.system_prompt,
                                 max_turns=self.cfg.agent.max_turns)
        if hindsight:
            s = self.cfg.skills
            graph = with_hindsight(graph, llm, success_fn=lambda state: self.reward(task, state) >= 1.0,
                                   max_tokens=s.max_tokens, min_words=s.min_words, max_words=s.max_words)
        runner = EpisodeRunner(graph, self.cfg.runner, reward_fn=self.reward)
        return await runner.run_episode(task, group_id, sample_index)

    # ----------------------------------------------------------------- helpers

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


def _serving(cfg: ContinualConfig) -> Serving:
    from transformers import AutoTokenizer

    from seed_agents.cli_train import initial_weights
    from seed_agents.models import resolve_model

    b = cfg.backend
    weights = resolve_model(initial_weights(b))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(b.tokenizer) if b.tokenizer else weights)
    if b.kind == "local":
        return LocalServing(weights, tokenizer, max_batch_size=b.max_batch_size)
    return VLLMServing(b, tokenizer)


def _load_adapter_weights(model: Any, path: str) -> None:
    """Start the fresh LoRA of ``build_policy`` from a stored adapter (same rank and targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    file = Path(path) / "adapter_model.safetensors"
    if not file.is_file():
        raise ContinualError(f"the promoted adapter {path} has no adapter_model.safetensors; was it moved?")
    result = set_peft_model_state_dict(model, load_file(str(file)))
    if getattr(result, "unexpected_keys", None):
        raise ContinualError(f"the promoted adapter {path} does not fit trainer.lora_r / the model "
                             f"({len(result.unexpected_keys)} unexpected tensors); keep the LoRA settings of the run")


def _read_tasks(path: Path) -> list[Task]:
    from seed_agents.cli_train import read_tasks

    return read_tasks(path)
