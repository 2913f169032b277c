"""``seed-agents skills collect``: the stage-1 data set, one analyzed episode per line.

The base policy plays training tasks (G episodes per task, paper T=0.4, no hindsight
node); an analyzer (a stronger model, or the offline rule-based stand-in) reads each
finished episode with the *same* prompt the policy gets during training and writes
``{"episode_summary", "episode_skill"}``. Every analyzed episode becomes one
``SkillExample`` in ``examples.jsonl``, valid or not, the moment it is done.

Resumable by construction: episodes go to ``trajectories.jsonl`` as they finish and a
re-run plays only the missing (task, sample) pairs (errored episodes are played again);
an episode whose id is already in ``examples.jsonl`` is never analyzed twice; a request
that failed after its retries is *not* written, so the next run retries it. A
half-written last line (a killed run) is dropped before appending. To compare analyzers
on the same episodes, point ``from_trajectories`` at one run's ``trajectories.jsonl``
and give each analyzer its own ``out``.
"""

from __future__ import annotations

import asyncio
import filecmp
import json
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.aio import run_sync
from seed_agents.config import (
    AgentConfig,
    BackendConfig,
    ConfigError,
    first_error,
)
from seed_agents.envs import EnvSuite, as_env_suite
from seed_agents.redact import redact
from seed_agents.runner import RunnerConfig
from seed_agents.stage1.analyzers import (
    Analyzer,
    AnalyzerConfig,
    AnalyzerReply,
    PolicyAnalyzer,
    make_analyzer,
)
from seed_agents.types import (
    AnswerFormat,
    EpisodeRecord,
    SamplingParams,
    SkillExample,
    SkillFailures,
    SkillOpening,
    Task,
    Trajectory,
)


class CollectConfig(BaseModel):
    """`seed-agents skills collect`: roll out the base policy, analyze every episode."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field("textworld", description="Environment suite (entry point group seed_agents.envs).")
    split: str = Field("train", description="Task split to roll out (stage 1 uses training tasks).")
    num_tasks: int = Field(8, ge=1, le=100000, description="Distinct tasks (paper: 180 ALFWorld tasks).")
    seed: int = Field(0, description="Seed for sampling and env shuffles.")
    out: Path = Field(Path("runs/skills"), description="Output directory; a re-run with the same one resumes.")
    backend: BackendConfig = Field(default_factory=BackendConfig, description="The policy that plays the episodes.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(max_tokens=16, temperature=0.4),
                                     description="Policy sampling (paper: T=0.4).")
    runner: RunnerConfig = Field(default_factory=lambda: RunnerConfig(group_size=4),
                                 description="Episode scheduling; group_size is G, episodes per task (paper: 8).")
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(max_turns=3, history="chat"),
                               description="Env agent options (defaults: the CPU demo of `seed-agents train`).")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the env suite.")
    analyzer: AnalyzerConfig = Field(default_factory=AnalyzerConfig, description="Who writes the skills.")
    from_trajectories: Path | None = Field(None, description="Analyze the episodes of this trajectories.jsonl instead of rolling out (copied into `out`).")
    max_chars_per_step: int = Field(1500, ge=50, description="Analyzer prompt: characters kept per step (as in training).")
    max_steps: int = Field(30, ge=1, description="Analyzer prompt: steps shown; longer episodes keep their head and tail.")
    answer_format: AnswerFormat = Field("paper", description=(
        "Analyzer prompt: the reply's format example (as in training; seed_agents.skills.ANSWER_FORMATS)."))
    failures: SkillFailures = Field("write", description=(
        "skip: a failed episode is not analyzed (as training with skills.failures skip asks for none), so stage 1 "
        "teaches only the skills training will ask for; write: every episode."))
    opening: SkillOpening = Field("words", description=(
        "call: a policy analyzer's grammar opens each skill with 'Call <tool> with', a tool the episode "
        "offered (as skills.opening call in training). Other analyzers write words."))
    min_words: int = Field(5, ge=1, description="Shorter skills are rejected (as in training).")
    max_words: int = Field(120, ge=5, description="Longer skills are rejected (as in training).")


def episode_key(traj: Trajectory) -> tuple[str, str, int]:
    """Identifies an episode slot across re-runs: a re-played slot replaces the old record."""
    return traj.group_id, traj.task_id, traj.sample_index


def latest_trajectories(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The last record of each episode slot, in first-seen order."""
    by_key: dict[tuple[str, str, int], Trajectory] = {}
    for t in trajs:
        by_key[episode_key(t)] = t  # a dict keeps the first position and the last value
    return list(by_key.values())


def run_collect(cfg: CollectConfig, *, suite: Any = None, llm: Any = None, analyzer: Analyzer | None = None) -> dict[str, Any]:
    """Roll out (unless ``from_trajectories``), analyze, write; return the summary.

    ``suite`` (an ``EnvSuite``), ``llm`` (the policy's chat model) and ``analyzer`` replace
    what the config would build, for tests and for callers that already hold them.
    """
    suite = _preflight(cfg, suite, llm, analyzer)
    t0 = time.perf_counter()
    owned: list[Any] = []  # backends built here, closed at the end
    try:
        return _collect(cfg, suite, llm, analyzer, owned, t0)
    finally:
        for backend in owned:
            backend.close()


def _preflight(cfg: CollectConfig, suite: Any, llm: Any, analyzer: Analyzer | None) -> EnvSuite | None:
    """The checks that need no model loaded: ``out`` can be written and holds no other
    episodes, the env and its split give the tasks, a ``rule_based`` analyzer exists for
    the env, the model folders exist, the server answers. Nothing is written. Returns the
    env suite (None with ``from_trajectories`` and an analyzer that needs no suite)."""
    from seed_agents.preflight import check_backend, check_out, load_suite, suite_tasks

    out = Path(cfg.out)
    check_out(out, holds_run=False, overwrite=None, what="a collect run")  # a re-run resumes: only writability
    a = cfg.analyzer
    if cfg.from_trajectories is not None:
        src, traj_path = Path(cfg.from_trajectories), out / "trajectories.jsonl"
        if not src.is_file():
            raise ConfigError(f"--from-trajectories: no such file {src}; pass the trajectories.jsonl of an eval or "
                              f"collect run")
        if traj_path.exists() and not filecmp.cmp(src, traj_path, shallow=False):
            raise ConfigError(f"{out} already holds other episodes (trajectories.jsonl); choose another --out")
    rule_based = analyzer is None and a.kind == "rule_based"
    if suite is None and (cfg.from_trajectories is None or rule_based):
        suite = load_suite(cfg.env, seed=cfg.seed, options=cfg.env_options)
    suite = as_env_suite(suite) if suite is not None else None
    if cfg.from_trajectories is None:
        suite_tasks(suite, cfg.env, cfg.split, cfg.num_tasks)
    if rule_based and suite is not None and suite.offline_analyzer() is None:
        raise ConfigError(f"--analyzer rule_based: the env {cfg.env!r} offers no offline analyzer; choose "
                          f"--analyzer openai, langchain or policy")
    policy_llm_needed = cfg.from_trajectories is None or (analyzer is None and a.kind == "policy"
                                                          and a.backend is None and not a.model)
    if llm is None and policy_llm_needed:
        check_backend(cfg.backend)
    if analyzer is None and a.kind == "policy" and (a.backend is not None or a.model):
        check_backend(a.backend or BackendConfig(kind="local", model=a.model), flag="--analyzer-model")
    return suite


def _collect(cfg: CollectConfig, suite: EnvSuite | None, llm: Any, analyzer: Analyzer | None, owned: list[Any],
             t0: float) -> dict[str, Any]:
    out = Path(cfg.out)
    traj_path, ex_path = out / "trajectories.jsonl", out / "examples.jsonl"
    done = {e.example_id: e for e in _read(ex_path, SkillExample)}  # a half-written last line is skipped

    # -- episodes: reuse what is there, find what is missing -----------------------------
    missing: list[tuple[Task, int]] = []
    if cfg.from_trajectories is not None:
        existing = latest_trajectories(_read(traj_path if traj_path.exists() else Path(cfg.from_trajectories), Trajectory))
    else:
        existing = latest_trajectories(_read(traj_path, Trajectory))
        have = {(t.task_id, t.sample_index) for t in existing if t.fault is None}  # faults are re-played
        missing = [(task, i) for task in suite.tasks(cfg.split, cfg.num_tasks)
                   for i in range(cfg.runner.group_size) if (task.task_id, i) not in have]

    # -- the analyzer (before any rollout, so a mismatch fails fast) --------------------------
    a = cfg.analyzer
    if llm is None and (missing or (analyzer is None and a.kind == "policy" and a.backend is None and not a.model)):
        llm = _policy_llm(cfg, owned)
    if analyzer is None:
        try:
            analyzer = make_analyzer(a, llm=llm, suite=suite, min_words=cfg.min_words, max_words=cfg.max_words,
                                     opening=cfg.opening)
        except ValueError as e:
            raise ConfigError(f"analyzer: {e}") from None
        if isinstance(analyzer, PolicyAnalyzer) and analyzer.close_backend:
            owned.append(analyzer.llm.backend)
    others = sorted({e.analyzer for e in done.values()} - {analyzer.name})
    if others:
        raise ConfigError(f"{ex_path} holds examples written by {', '.join(others)}, not {analyzer.name}; choose "
                          f"another --out (with --from-trajectories {traj_path} to analyze the same episodes)")

    # -- out: written from here on, every input being checked ------------------------------
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    for path in (traj_path, ex_path):
        repair_tail(path)
    if cfg.from_trajectories is not None and not traj_path.exists():
        shutil.copyfile(cfg.from_trajectories, traj_path)  # the out dir stays self-contained for `skills eval`

    # -- rollouts: only the missing (task, sample) slots ---------------------------------------
    new: list[Trajectory] = []
    t_roll = time.perf_counter()
    if missing:
        new = _roll_out(cfg, suite, llm, missing, traj_path)
    elif existing and cfg.from_trajectories is None:
        print(f"{traj_path} holds all {len(existing)} episodes; no new rollouts", flush=True)
    trajs = latest_trajectories([*existing, *new])
    rollout_s = time.perf_counter() - t_roll

    # -- analysis: every finished, not yet analyzed episode, concurrently ------------------
    # an infrastructure fault (crash, timeout, raising reward) says nothing about the policy:
    # no skill is written about it, so stage 1 never imitates a verdict on a broken episode
    errored = [t for t in trajs if t.fault is not None]
    no_calls = [t for t in trajs if t.fault is None and not t.policy_calls]
    skipped_failures = [t for t in trajs if t.fault is None and t.policy_calls and cfg.failures == "skip"
                        and not t.success]
    todo = [t for t in trajs if t.fault is None and t.policy_calls and t.trajectory_id not in done
            and not (cfg.failures == "skip" and not t.success)]
    t1 = time.perf_counter()
    written, failures, cost = run_sync(_analyze_all(cfg, analyzer, todo, ex_path))
    analysis_s = time.perf_counter() - t1

    # -- summary -------------------------------------------------------------------------
    examples = [*done.values(), *written]
    valid = sum(e.valid for e in examples)
    summary = {
        "analyzer": analyzer.name,
        "episodes": len(trajs),
        "rolled_out_now": len(new),
        "skipped_errors": len(errored),
        "skipped_no_calls": len(no_calls),
        "skipped_failures": len(skipped_failures),
        "analyzed_before": len(done),
        "analyzed_now": len(written),
        "examples": len(examples),
        "valid": valid,
        "valid_now": sum(e.valid for e in written),
        "parse_rate": valid / len(examples) if examples else 0.0,
        "failed_requests": len(failures),
        "prompt_tokens": sum(e.prompt_tokens for e in written),
        "completion_tokens": sum(e.completion_tokens for e in written),
        "cost_usd": cost,
        "reject_reasons": dict(Counter((e.reject_reason or "").split(":")[0] for e in examples if not e.valid)),
        "first_errors": list(dict.fromkeys(r.error or "" for _, r in failures))[:3],
        "rollout_wall_s": rollout_s,
        "analysis_wall_s": analysis_s,
        "wall_s": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# -- rollouts ----------------------------------------------------------------------------------


def _policy_llm(cfg: CollectConfig, owned: list[Any]) -> Any:
    import torch

    from seed_agents.backends import BackendUnavailable, make_backend
    from seed_agents.backends.base import ServedBackend
    from seed_agents.chat_model import SeedChatModel

    torch.manual_seed(cfg.seed)
    print(f"loading {cfg.backend.kind} backend for {cfg.backend.model} ...", flush=True)
    backend, tokenizer = make_backend(cfg.backend)
    owned.append(backend)
    if isinstance(backend, ServedBackend) and not backend.health():
        raise BackendUnavailable(f"no vLLM server answers at {cfg.backend.base_url}; start one with "
                                 f"`seed-agents serve --model {cfg.backend.model}`")
    return SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=cfg.sampling, model_name=cfg.backend.model)


def _roll_out(cfg: CollectConfig, suite: EnvSuite, llm: Any, specs: list[tuple[Task, int]], path: Path) -> list[Trajectory]:
    from seed_agents.capture import JsonlSink, capture
    from seed_agents.runner import EpisodeRunner

    tasks = list({t.task_id: t for t, _ in specs}.values())
    print(f"preparing {len(tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
    suite.prepare(tasks)
    graph = suite.build_graph(llm, **cfg.agent.model_dump())
    print(f"rolling out {len(specs)} episodes ({len(tasks)} tasks, T={cfg.sampling.temperature:g}) ...", flush=True)
    with JsonlSink(path) as sink:
        # seeded like training rollouts (reproducible on the local backend, see cli_train.rollout_seed)
        runner = EpisodeRunner(graph, cfg.runner, make_env=suite.make_env, sink=sink,
                               seed=cfg.seed if cfg.backend.kind == "local" else None)
        with capture(run=Path(cfg.out).name, split=cfg.split):  # a resumed run plays only the missing slots
            return run_sync(runner.run(tasks, only={(t.task_id, i) for t, i in specs}))


# -- analysis ------------------------------------------------------------------------------------


async def _analyze_all(cfg: CollectConfig, analyzer: Analyzer, todo: list[Trajectory],
                       path: Path) -> tuple[list[SkillExample], list[tuple[Trajectory, AnalyzerReply]], float]:
    """Analyze ``todo`` concurrently (the analyzer bounds and paces its requests); each
    example is appended to ``path`` as soon as it is done. Returns the examples written,
    the failed requests, and the cost of all requests."""
    from seed_agents.capture import JsonlSink
    from seed_agents.chat_model import to_chat_dicts
    from seed_agents.skills import (
        build_analyzer_messages,
        episode_steps,
        first_user_message,
        parse_skill,
        tool_names,
    )

    written: list[SkillExample] = []
    failures: list[tuple[Trajectory, AnalyzerReply]] = []
    cost = 0.0
    bar = _bar(len(todo), "analyzed", cfg.runner.progress and bool(todo))

    async def one(traj: Trajectory, sink: JsonlSink) -> None:
        nonlocal cost
        steps, text = episode_steps(traj.calls), first_user_message(traj.calls)
        messages = build_analyzer_messages(text, traj.success, steps, max_chars_per_step=cfg.max_chars_per_step,
                                           max_steps=cfg.max_steps, answer_format=cfg.answer_format)
        try:
            episode = EpisodeRecord.from_metadata(traj.metadata, task_id=traj.task_id, success=traj.success,
                                                  reward=traj.reward, tools=tool_names(traj.calls))
            reply = await analyzer.analyze(messages, episode)
        except Exception as e:  # noqa: BLE001 - a broken analyzer fails this episode, not the run
            reply = AnalyzerReply(error=redact(f"{type(e).__name__}: {e}"))  # errors are written to summary.json
        cost += reply.cost_usd
        if bar is not None:
            bar.update(1)
        if reply.error is not None:
            failures.append((traj, reply))  # not written: the next run retries it
            return
        summary, skill, reason = parse_skill(reply.text, min_words=cfg.min_words, max_words=cfg.max_words)
        example = SkillExample(
            example_id=traj.trajectory_id, trajectory_id=traj.trajectory_id, task_id=traj.task_id, split=traj.split,
            success=traj.success, reward=traj.reward, messages=to_chat_dicts(messages), completion=reply.text,
            skill=skill, summary=summary, valid=reason is None, reject_reason=reason, analyzer=analyzer.name,
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, latency_s=reply.latency_s,
        )
        sink.write("example", example)
        written.append(example)

    try:
        with JsonlSink(path) as sink:
            await asyncio.gather(*(one(t, sink) for t in todo))
    finally:
        if bar is not None:
            bar.close()
        await analyzer.aclose()
    return written, failures, cost


# -- files -----------------------------------------------------------------------------------------


def repair_tail(path: Path) -> None:
    """Make ``path`` end with a complete line before appending: a half-written last record
    (a killed writer) is dropped, a complete one missing only its newline gets it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        size = f.seek(0, 2)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        cut, pos = 0, size
        while pos > 0:
            start = max(0, pos - 65536)
            f.seek(start)
            i = f.read(pos - start).rfind(b"\n")
            if i >= 0:
                cut = start + i + 1
                break
            pos = start
        f.seek(cut)
        tail = f.read()
        try:
            json.loads(tail)
        except ValueError:
            f.truncate(cut)
            print(f"{path}: dropped a half-written last line ({len(tail)} bytes)", flush=True)
            return
        f.write(b"\n")


def _read(path: Path, model: type[BaseModel]) -> list[Any]:
    from seed_agents.capture import read_jsonl

    try:
        return read_jsonl(path, model) if path.exists() else []
    except ValueError as e:
        raise ConfigError(f"{path} is not a file of {model.__name__} records ({first_error(e)}); pass a file "
                          f"written by seed-agents, or another --out") from None


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True)


def format_summary(summary: dict[str, Any]) -> str:
    keys = ["analyzer", "episodes", "rolled_out_now", "skipped_errors", "skipped_no_calls", "analyzed_before",
            "analyzed_now", "examples", "valid", "parse_rate", "failed_requests", "prompt_tokens",
            "completion_tokens", "cost_usd", "wall_s"]
    lines = [f"{'metric':<20} value", f"{'-' * 20} {'-' * 12}"]
    for k in keys:
        v = summary[k]
        lines.append(f"{k:<20} {v:.4f}" if isinstance(v, float) else f"{k:<20} {v}")
    if summary["reject_reasons"]:
        lines.append(f"{'reject_reasons':<20} {summary['reject_reasons']}")
    return "\n".join(lines)
