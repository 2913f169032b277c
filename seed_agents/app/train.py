"""`seed-agents train`: the reference loop, wired top to bottom.

    tasks -> (runner: agent graph + hindsight node, G episodes per task)
          -> rows + teacher prompts -> SEEDTrainer step -> weight sync -> next iteration

``run_train`` reads in order: check everything, write the run dir, build the policy
(``seed_agents.app.policy``), the rollout (an env suite's graph, any graph with its tasks
and reward, or recorded sessions from a trace store), the trainer and the periodic
held-out evaluation, then train, then print the summary (``seed_agents.observe.run_summary``,
read back from the run dir). The run directory holds metrics.jsonl, trajectories.jsonl,
skills.jsonl, checkpoints/, learning_curve.png and summary.json (and with an ``eval``
section eval.jsonl, eval_trajectories.jsonl, eval_tasks.jsonl); ``--resume`` continues from
the last checkpoint and first drops trace records of iterations the checkpoint does not
contain, so nothing is duplicated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import TrainerCallback

from seed_agents.aio import run_sync
from seed_agents.app.builders import agent_config, read_tasks, rollout_seed
from seed_agents.app.policy import (Policy, build_analyzer, build_policy, check_report_to, compute_format, initial_weights,
                                     seed_config)
from seed_agents.capture import JsonlSink, capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.config import TrainConfig
from seed_agents.errors import ConfigError
from seed_agents.faults import crash_point
from seed_agents.graphs.hindsight import with_hindsight
from seed_agents.imports import load_object
from seed_agents.memory import PEAK_RSS, limit_heap_growth, release_free_memory
from seed_agents.metrics import summarize
from seed_agents.observe.run_summary import EVAL_TASKS, format_summary, run_summary
from seed_agents.preflight import check_backend, check_out, load_suite, suite_tasks
from seed_agents.runner import EpisodeRunner, check_fault_budget, default_reward
from seed_agents.skills import make_injector
from seed_agents.store import RewardPolicy, StoreError, TraceStore
from seed_agents.task_calls import task_calls
from seed_agents.trainers.rollout import GraphRollout
from seed_agents.trainers.seed_trainer import SEEDTrainer
from seed_agents.trainers.store_rollout import StoreRollout, store_tasks
from seed_agents.trainers.weight_sync import InProcessSync


def run_train(cfg: TrainConfig, resume: bool = False) -> dict[str, Any]:
    limit_heap_growth()  # the CLI has; a caller of the library may not have
    # -- checks: nothing in the run dir is written until the config, the env and its tasks,
    # the model and the server are known to be good --------------------------------------
    started = time.perf_counter()
    out = Path(cfg.out)
    checkpoint, done_steps = check_run_dir(out, resume)
    check_report_to(cfg.trainer.report_to)
    src = load_task_source(cfg, out, resume)

    # -- the run dir: written from here on ------------------------------------------------
    if resume:
        if checkpoint is None:
            print(f"--resume: {out} has no complete checkpoint yet; restarting it from step 0", flush=True)
        truncate_traces(out, done_steps)
    # restarted at step 0 over a finished evaluation of the same initial weights: keep it, once
    initial_eval_kept = resume and done_steps == 0 and keep_initial_eval(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    check_format(out, compute_format(cfg.backend), resume)
    if src.store is not None and not (out / STORE_TASKS).exists():
        (out / STORE_TASKS).write_text("".join(t.model_dump_json() + "\n" for t in src.tasks), encoding="utf-8")
    if src.eval_tasks is not None:  # what the summary reads "called the right tool" against
        (out / EVAL_TASKS).write_text("".join(t.model_dump_json() + "\n" for t in src.eval_tasks), encoding="utf-8")
    torch.manual_seed(cfg.seed)

    # -- policy, agent graph (+ hindsight node) or stored sessions, trainer -------------
    with contextlib.ExitStack() as owned:  # a vLLM server the run starts for itself stops with it
        policy = build_policy(cfg, out, owned)
        rollout = build_rollout(cfg, src, policy, out)
        args = seed_config(cfg, out)
        if args.world_size > 1 and args.process_index > 0:  # each rank plays its own episodes
            rollout.out_dir = out / f"rank{args.process_index}"
        dataset = datasets.Dataset.from_list([{"prompt": task.model_dump_json()} for task in src.tasks])
        trainer = SEEDTrainer(model=policy.model, args=args, train_dataset=dataset, rollout=rollout,
                              processing_class=policy.tokenizer)
        evaluate = build_periodic_eval(cfg, src, policy, out, world_size=args.world_size)
        trainer.add_callback(_SyncAndLog(policy.sync, policy.backend, out, evaluate=evaluate,
                                         every=cfg.eval.every if cfg.eval else 0,
                                         at_start=bool(cfg.eval and cfg.eval.at_start) and not initial_eval_kept,
                                         last=cfg.iterations, resync=resume))
        t0 = time.perf_counter()
        trainer.train(resume_from_checkpoint=checkpoint if resume else None)
        png = plot_learning_curve(out)
        summary = {**run_summary(out), "iterations": trainer.state.global_step,
                   "policy_version": policy.backend.policy_version, "initial_weights": str(policy.weights),
                   "train_s": time.perf_counter() - t0, "wall_s": time.perf_counter() - started,
                   "peak_rss_gb": _peak_rss_gib(),
                   "learning_curve": str(png) if png else None}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if args.process_index == 0:
            print(format_summary(summary), flush=True)
        return summary


FORMAT_FILE = "format.json"
"""The number formats a run started in, as its settings resolved on that machine."""


def check_format(out: Path, fmt: dict[str, str], resume: bool) -> None:
    """Record the formats a run starts in; a resume that resolves them otherwise says so.

    Why: ``backend.precision`` and ``backend.attention`` default to ``auto``, which depends
    on the CPU, so a run started on a CPU with bf16 and resumed on one without would carry on
    in fp32 and no longer match an unbroken run; the line names the flags that keep the
    formats it started in. The record keeps the start's formats."""
    path = out / FORMAT_FILE
    if resume and path.exists():
        was = json.loads(path.read_text())
        if was != fmt:
            flags = f"--backend.precision {was['update']}"
            if "attention" in was and was.get("rollouts") != "float32":
                flags += f" --backend.attention {'float32' if was['attention'] == 'float32' else 'same'}"
            print(f"note: {out} started computing in {json.dumps(was)} and its settings resolve to {json.dumps(fmt)} "
                  f"here, so the steps from now on differ from an unbroken run's by float rounding; to keep the "
                  f"formats it started in, resume it with {flags}", flush=True)
        return
    path.write_text(json.dumps(fmt, indent=2))


TRACE_FILES = ("metrics.jsonl", "trajectories.jsonl", "skills.jsonl", "eval.jsonl", "eval_trajectories.jsonl")


def _iteration_of(record: dict[str, Any]) -> int:
    if "iteration" in record:
        return int(record["iteration"])
    return int(record.get("metadata", {}).get("iteration", -1))


def truncate_traces(out: Path, keep_before: int, names: tuple[str, ...] = TRACE_FILES) -> None:
    """Drop records of iterations >= ``keep_before`` (they will be re-run on resume)."""
    for name in names:
        path = out / name
        if not path.exists():
            continue
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if _iteration_of(json.loads(line)) < keep_before:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a half-written line from a killed run
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
        tmp.replace(path)


def keep_initial_eval(out: Path) -> bool:
    """Whether ``out`` holds a finished evaluation of the initial policy: its eval.jsonl row
    and as many initial trajectories as the row counts (they are written before it). A run
    restarted at step 0 serves the same initial weights, so it keeps that evaluation instead
    of adding a second one beside it; anything less (killed before the row, a trace cut short)
    is dropped, to be redone. Call after ``truncate_traces(out, 0)`` (every line left parses)."""
    def initial(name: str) -> list[dict[str, Any]]:
        path = out / name
        records = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []
        return [r for r in records if _iteration_of(r) == -1]

    rows = initial("eval.jsonl")
    if len(rows) == 1 and rows[0].get("episodes") == len(initial("eval_trajectories.jsonl")):
        return True
    truncate_traces(out, -1, names=("eval.jsonl", "eval_trajectories.jsonl"))
    return False


def store_policy(cfg: TrainConfig) -> Any:
    assert cfg.store is not None
    return RewardPolicy(precedence=cfg.store.precedence, combine=cfg.store.combine)


def store_run_id(out: Path) -> str:
    """A stable id for this run dir: its updates claim sessions under ``<id>-it<k>``, so a
    resumed run finds the sessions its interrupted iteration had already claimed."""
    return "train-" + hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:12]


STORE_TASKS = "store_tasks.jsonl"
"""The task keys a --from-store run trains on, fixed at its start: on --resume the store has
fewer unconsumed sessions (this run claimed some), yet the data order must not change."""


def open_store_tasks(cfg: TrainConfig, out: Path, resume: bool) -> tuple[Any, list[Any]]:
    """The store and its trainable task keys; enough of them for every iteration, since
    each session trains once (a task key's sessions are all claimed by one update)."""
    assert cfg.store is not None
    try:
        store = TraceStore.open(cfg.store.url)
        if resume and (out / STORE_TASKS).exists():
            return store, read_tasks(out / STORE_TASKS)
        tasks = store_tasks(store, store_policy(cfg), min_sessions=2)
    except StoreError as err:
        raise ConfigError(f"--from-store: {err}") from None
    need = cfg.iterations * cfg.tasks_per_iteration
    if len(tasks) < need:
        raise ConfigError(f"--from-store: the store has {len(tasks)} task keys with at least 2 trainable sessions; "
                          f"{cfg.iterations} iterations x {cfg.tasks_per_iteration} tasks need {need}: "
                          f"lower iterations or tasks_per_iteration, or record more traffic")
    return store, tasks


COMPLETE_MARKER = "seed_agents_complete"


def last_checkpoint(out: Path) -> tuple[str | None, int]:
    """The newest *complete* checkpoint and its step. A checkpoint counts once our
    callback has marked it after TRL finished writing it (``on_save``), so a run killed
    mid-save resumes from the one before instead of failing on a half-written folder."""
    complete = []
    for path in (out / "checkpoints").glob("checkpoint-*"):
        step = path.name.split("-")[-1]
        if step.isdigit() and (path / COMPLETE_MARKER).is_file():
            complete.append((int(step), path))
    if not complete:
        return None, 0
    step, path = max(complete)
    return str(path), step


def mark_checkpoint_complete(checkpoint_dir: Path) -> None:
    """Written last, atomically: its presence means every file before it is on disk."""
    tmp = checkpoint_dir / (COMPLETE_MARKER + ".tmp")
    tmp.write_text("ok\n", encoding="utf-8")
    tmp.replace(checkpoint_dir / COMPLETE_MARKER)


def plot_learning_curve(out: Path) -> Path | None:
    path = out / "metrics.jsonl"
    if not path.exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "success_rate" in r]
    if not rows:
        return None
    # x = updates applied when the episodes were played: iteration i samples after i updates
    iterations = [r["iteration"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(iterations, [r["success_rate"] for r in rows], marker="o", label="training success")
    ax[0].plot(iterations, [r.get("skill_parse_rate", 0.0) for r in rows], marker=".", label="skill parse rate")
    evals = [json.loads(x) for x in (out / "eval.jsonl").read_text().splitlines() if x.strip()] if (out / "eval.jsonl").exists() else []
    if evals:
        ax[0].plot([r["updates"] for r in evals], [r["success_rate"] for r in evals], marker="s", label="held-out success")
    ax[0].set_xlabel("updates applied")
    ax[0].set_ylim(-0.05, 1.05)
    ax[0].legend()
    ax[1].plot(iterations, [r.get("loss/ppo", 0.0) for r in rows], marker="o", label="PPO loss")
    ax[1].plot(iterations, [r.get("loss/opd", 0.0) for r in rows], marker=".", label="OPD loss")
    ax[1].set_xlabel("iteration")
    ax[1].legend()
    fig.tight_layout()
    png = out / "learning_curve.png"
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png




def check_run_dir(out: Path, resume: bool) -> tuple[str | None, int]:
    """(the checkpoint to resume from, its step); a plain run over an existing run and a
    --resume without one are user errors. Writes nothing."""
    checkpoint, done_steps = last_checkpoint(out)
    # config.json is written first: a run killed before its first trace still holds it
    holds_run = any((out / name).exists() for name in (*TRACE_FILES, "config.json"))
    if resume:
        if checkpoint is None and not holds_run:
            raise ConfigError(f"--resume: no run under {out}; start a new run without --resume")
        # killed before its first complete checkpoint: restart at step 0 (traces dropped)
    elif holds_run or any((out / "checkpoints").glob("checkpoint-*")):
        raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    check_out(out, holds_run=False, overwrite=None, what="a run")
    return checkpoint, done_steps


@dataclass
class TaskSource:
    """Where a run's tasks come from and how an episode of one is played and scored: an
    env suite, any graph with its tasks and reward, or (``store``) recorded sessions."""
    tasks: list[Any]
    eval_tasks: list[Any] | None = None
    suite: Any = None
    build_graph: Any = None  # fn(chat_model) -> compiled graph, for graph training
    reward_fn: Any = None
    make_input: Any = None
    store: Any = None

    def make_graph(self, chat_model: Any, agent: Any) -> Any:
        if self.build_graph is not None:
            return self.build_graph(chat_model)
        return self.suite.build_graph(chat_model, **agent.model_dump())

    @property
    def make_env(self) -> Any:
        return self.suite.make_env if self.suite is not None else None


def load_task_source(cfg: TrainConfig, out: Path, resume: bool) -> TaskSource:
    """Tasks, env and reward, every one checked (with the model and server names) before
    the run dir is touched; the env suite's tasks are prepared (e.g. games generated)."""
    src = TaskSource(tasks=[], reward_fn=default_reward, make_input=lambda task: {"task": task})
    if cfg.store is not None:  # recorded sessions: a task is a task key, its group the sessions
        src.store, src.tasks = open_store_tasks(cfg, out, resume)
    if cfg.graph is not None:
        try:
            src.build_graph, src.reward_fn = load_object(cfg.graph.build), load_object(cfg.graph.reward)
        except ValueError as err:
            raise ConfigError(f"graph: {err}; fix graph.build / graph.reward ('pkg.module:name')") from None
        if src.store is None:
            src.tasks = read_tasks(cfg.graph.tasks)[: cfg.num_tasks]
        if len(src.tasks) < cfg.tasks_per_iteration:
            raise ConfigError(f"{cfg.graph.tasks} has {len(src.tasks)} tasks; tasks_per_iteration is "
                              f"{cfg.tasks_per_iteration}: add tasks or lower tasks_per_iteration")
        if cfg.graph.input == "messages":
            src.make_input = lambda task: {"task": task, "messages": [("user", task.data["question"])]}
    elif src.store is None or cfg.eval is not None:  # stored sessions need no env, unless to evaluate
        src.suite = load_suite(cfg.env, seed=cfg.seed, options=cfg.env_options)
        if src.store is None:
            src.tasks = suite_tasks(src.suite, cfg.env, cfg.split, cfg.num_tasks)
    if cfg.eval is not None:  # the periodic held-out eval's, checked now rather than after an update
        held_out = cfg.eval
        src.eval_tasks = (read_tasks(held_out.tasks)[: held_out.num_tasks] if held_out.tasks is not None
                          else suite_tasks(src.suite, cfg.env, held_out.split, held_out.num_tasks))
        for task in src.eval_tasks:
            try:
                task_calls(task.data)
            except ValueError as err:
                raise ConfigError(f"held-out task {task.task_id!r}: {err}") from None
    check_backend(cfg.backend, weights=initial_weights(cfg.backend), may_start=True)
    if cfg.skills.source in ("external", "frozen") and cfg.skills.analyzer is not None:
        check_backend(cfg.skills.analyzer, flag="skills.analyzer.model")
    if src.suite is not None and src.store is None:
        print(f"preparing {len(src.tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
        src.suite.prepare(src.tasks)
    return src


def build_rollout(cfg: TrainConfig, src: TaskSource, policy: Policy, out: Path) -> Any:
    """The ``Rollout`` the trainer calls each iteration: the agent graph wrapped by the
    hindsight node and played by the runner, or (``--from-store``) recorded sessions."""
    skills = cfg.skills
    injector = make_injector(skills.injector)
    analyzer = build_analyzer(cfg, policy, src.suite)
    if src.store is not None:

        return StoreRollout(src.store, policy.llm, run_id=store_run_id(out), policy=store_policy(cfg),
                            skills=skills.source, analyzer=analyzer, injector=injector,
                            merge_rows=cfg.trainer.merge_rows, skill_max_tokens=skills.max_tokens,
                            min_words=skills.min_words, max_words=skills.max_words,
                            answer_format=skills.answer_format, opening=skills.opening, failures=skills.failures, out_dir=out)
    graph = src.make_graph(policy.llm, agent_config(cfg, src.suite))
    if skills.source != "none":
        # graph agents are judged by their reward; the analyzer needs the outcome before it
        reward_fn = src.reward_fn
        success_fn = (lambda state: reward_fn(state["task"], state) >= 1.0) if cfg.graph is not None else None
        graph = with_hindsight(graph, analyzer, success_fn=success_fn, max_tokens=skills.max_tokens,
                               min_words=skills.min_words, max_words=skills.max_words,
                               answer_format=skills.answer_format, opening=skills.opening, failures=skills.failures)
    runner = EpisodeRunner(graph, cfg.runner, make_env=src.make_env, reward_fn=src.reward_fn, make_input=src.make_input,
                           seed=rollout_seed(cfg.seed, cfg.backend), guide_share=cfg.trainer.guide_share)
    return GraphRollout(runner, policy.llm, skills=skills.source, injector=injector, merge_rows=cfg.trainer.merge_rows,
                        out_dir=out)


def build_periodic_eval(cfg: TrainConfig, src: TaskSource, policy: Policy, out: Path, *, world_size: int) -> Any:
    """``evaluate(updates)``: held-out tasks, greedy, without the hindsight node; None when off."""
    if cfg.eval is None:
        return None
    held_out = cfg.eval
    if src.suite is not None:
        src.suite.prepare(src.eval_tasks)
    eval_llm = SeedChatModel(backend=policy.backend, tokenizer=policy.tokenizer, model_name=cfg.backend.model,
                             sampling=cfg.sampling.model_copy(update={"temperature": held_out.temperature}))
    runner = EpisodeRunner(src.make_graph(eval_llm, agent_config(cfg, src.suite)),
                           cfg.runner.model_copy(update={"group_size": held_out.group_size}),
                           make_env=src.make_env, reward_fn=src.reward_fn, make_input=src.make_input,
                           seed=rollout_seed(cfg.seed, cfg.backend))
    episodes_per_update = cfg.tasks_per_iteration * cfg.runner.group_size * world_size

    def evaluate(updates: int) -> None:
        run_periodic_eval(runner, src.eval_tasks, updates, updates * episodes_per_update, out)

    return evaluate


def run_periodic_eval(runner: Any, tasks: list[Any], updates: int, episodes: int, out: Path) -> dict[str, Any]:
    """Play the held-out tasks with the current policy; append one row to eval.jsonl.

    ``iteration`` is ``updates - 1`` (the iteration whose update was just applied; -1
    for the initial policy) so ``--resume`` truncates these rows like the other traces.
    """
    PEAK_RSS.reset()
    t0 = time.perf_counter()
    with capture(eval_after_updates=updates):
        trajs = run_sync(runner.run(tasks, group_prefix=f"eval{updates}"))
    summary = summarize(trajs, time.perf_counter() - t0)
    peak = PEAK_RSS.phase_gb()
    with JsonlSink(out / "eval_trajectories.jsonl") as sink:
        for traj in trajs:
            traj.metadata["iteration"] = updates - 1
            sink.write("trajectory", traj)
    check_fault_budget(trajs, runner.config.max_fault_fraction, what=f"held-out episodes after {updates} updates")
    row = {"iteration": updates - 1, "updates": updates, "episodes_consumed": episodes,
           **{k: summary[k] for k in ("episodes", "episodes_measured", "faults", "success_rate", "mean_reward",
                                      "mean_steps", "invalid_action_rate", "errors", "success_by_type", "wall_s")},
           **({"mem/eval_peak_gb": peak} if peak is not None else {})}
    with (out / "eval.jsonl").open("a", encoding="utf-8") as file:
        file.write(json.dumps(row) + "\n")
    print(f"eval after {updates:>3} updates ({episodes} training episodes): success {summary['success_rate']:.2f}  "
          f"reward {summary['mean_reward']:.2f}  ({summary['episodes']} held-out episodes, {summary['wall_s']:.0f}s)",
          flush=True)
    return row


class _SyncAndLog(TrainerCallback):
    """After each optimizer step: push the weights to the server; log one metrics row.

    Under ``accelerate launch`` with a shared server, rank 0 saves and posts the weights
    and the other ranks adopt the new version after a barrier; with in-process backends
    every rank syncs its own model. Only rank 0 writes metrics.jsonl.
    """
    def __init__(self, sync: Any, backend: Any, out: Path, *, evaluate: Any = None, every: int = 0,
                 at_start: bool = False, last: int = 0, resync: bool = False) -> None:
        self.sync, self.backend, self.out, self.resync = sync, backend, out, resync
        self.sync_s = self.step_s = 0.0
        self._step_t0: float | None = None
        self.evaluate, self.every, self.at_start, self.last = evaluate, every, at_start, last

    def _maybe_evaluate(self, state: Any) -> bool:
        """Rank 0 only; the other ranks wait for it at their next collective. Whether it evaluated."""
        if self.evaluate is None or not state.is_world_process_zero:
            return False
        updates = state.global_step
        if (updates == 0 and self.at_start) or (updates > 0 and (updates % self.every == 0 or updates == self.last)):
            self.evaluate(updates)
            return True
        return False

    def _sync(self, state: Any, model: Any) -> None:
        crash_point("sync")
        if isinstance(self.sync, InProcessSync) or state.is_world_process_zero:
            self.sync.sync(model)  # raises on failure: the run stops on the old version, never mixes
        _barrier()
        if not isinstance(self.sync, InProcessSync) and not state.is_world_process_zero:
            self.sync.follow()

    def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
        # policy_version == optimizer steps applied; a resumed run first serves its checkpoint
        # (a run resumed at step 0 its initial weights: a sync may have landed before the kill).
        if state.global_step > 0 or self.resync:
            self.backend.policy_version = state.global_step - 1
            self._sync(state, model)
        if state.global_step == 0:
            self._maybe_evaluate(state)

    def on_pre_optimizer_step(self, args, state, control, **kw):  # noqa: ANN001
        crash_point("update")

    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        self._step_t0 = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
        t0 = time.perf_counter()
        # rollouts, scoring, loss, backward and the optimizer step: the iteration but its sync
        self.step_s = t0 - self._step_t0 if self._step_t0 is not None else 0.0
        self._sync(state, model)
        self.sync_s = time.perf_counter() - t0
        release = getattr(args, "release_memory", False)
        if release:  # the update's, before a held-out evaluation grows the heap on top of it
            release_free_memory()
        if self._maybe_evaluate(state) and release:  # the evaluation's, before the next rollouts
            release_free_memory()

    def on_save(self, args, state, control, **kw):  # noqa: ANN001
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if path.is_dir():
                crash_point("checkpoint")
                mark_checkpoint_complete(path)

    def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
        if not logs or "success_rate" not in logs or not state.is_world_process_zero:
            return
        row = {"iteration": state.global_step - 1, **logs, "policy_version_after": self.backend.policy_version,
               "time/sync_s": self.sync_s, "time/step_s": self.step_s, "mem/process_peak_gb": _peak_rss_gib()}
        with (self.out / "metrics.jsonl").open("a", encoding="utf-8") as file:
            file.write(json.dumps(row) + "\n")
        print(f"iter {row['iteration']:>3}  success {logs['success_rate']:.2f}  reward {logs.get('reward', 0):.2f}  "
              f"parse {logs.get('skill_parse_rate', 0):.2f}  ppo {logs.get('loss/ppo', 0):+.4f}  "
              f"opd {logs.get('loss/opd', 0):+.4f}  gate {logs.get('opd/gate', 0):.2f}  v{self.backend.policy_version}  "
              f"peak {_peak_rss_gib():.1f} GiB", flush=True)


def _peak_rss_gib() -> float:
    """This process's peak resident memory so far, across the trainer's per-phase resets
    (``seed_agents.memory.PEAK_RSS``; where /proc lacks them, ``ru_maxrss``, which Linux reports in
    KiB). A resumed run's peak differs from an unbroken one's: the exact-resume tests leave the
    ``mem/`` keys out. The printed line shows which update raised it."""
    peak = PEAK_RSS.process_gb()
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
