"""``seed-agents skills eval``: does a skill move the policy toward better actions?

SEED's distillation signal is the shift in the policy's log-probability of its own sampled
tokens when the episode's skill is put into the prompt. A skill that parses but does not
move the policy, or moves it the wrong way, gives no signal or a harmful one. So each
analyzer (base model, SFT model, an external model, the rule-based stand-in) is judged by
what its skills do to a fixed policy on held-out episodes:

- Delta, per episode: the per-token mean of log p(action | prompt + skill) minus
  log p(action | prompt), over the episode's policy calls. The prompts with the skill are
  built by ``teacher_prompt_ids``, exactly as training builds them; the completion ids are
  the recorded ones (nothing is re-tokenized); the forward pass is fp32.
- A workflow written about a success should make that episode's actions more likely
  (Delta > 0); an avoidance rule written about a failure should make its actions less
  likely (Delta < 0). The margin is mean Delta on successes minus mean Delta on failures.
- Paired, within a GRPO group that has both outcomes: with one episode's skill in every
  prompt, are the group's successful actions raised more than its failed ones? The win
  rate is over every (episode with a skill, mixed group) pair; all of the group's
  episodes count, the skill's own included.
- Coverage: the share of episodes with a valid skill. An invalid skill gives no signal.
- Optionally (``rerun``), success on fresh episodes of the same tasks with the skill in
  every step's prompt versus without, both arms sampled with the same per-episode seeds.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.aio import run_sync
from seed_agents.config import AgentConfig, ConfigError, first_error
from seed_agents.envs import EnvSuite
from seed_agents.types import LLMCall, SamplingParams, SkillExample, Task, Trajectory


class RerunConfig(BaseModel):
    """The optional re-run check: play held-out tasks again with and without a skill."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Run it (slow: it plays episodes).")
    env: str = Field("textworld", description="Environment suite of the collect run.")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for the env suite.")
    episodes_per_task: int = Field(2, ge=1, le=1024, description="Fresh episodes per task and arm (G); episode k of both arms uses sampling seed seed + k.")
    max_tasks: int = Field(4, ge=1, le=100000, description="Tasks re-run: the first, in task-id order, that have a valid skill from some analyzer.")
    sampling: SamplingParams = Field(default_factory=lambda: SamplingParams(max_tokens=16, temperature=0.4), description="Policy sampling (as in the collect run); its seed is set per episode.")
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig(max_turns=3, history="chat"), description="Env agent options (as in the collect run).")
    concurrency: int = Field(8, ge=1, le=1024, description="Episodes in flight.")


class UsefulnessConfig(BaseModel):
    """`seed-agents skills eval`: score each analyzer's skills with a fixed policy."""

    model_config = ConfigDict(extra="forbid")

    trajectories: Path | None = Field(None, description="trajectories.jsonl of a collect run (Trajectory records with token ids).")
    examples: list[Path] = Field(default_factory=list, description="examples.jsonl files, one per analyzer (SkillExample.analyzer names it).")
    model: str = Field("smollm2-135m", description="The policy that scores (alias, folder or hub id); its tokenizer must be the one that recorded the episodes.")
    injector: Literal["system", "task_line", "last_turn"] = Field("system", description="Where the skill goes, as in training (skills.injector).")
    tasks_from: Path | None = Field(None, description="Keep only these tasks: a JSON list of task ids, or a file with 'heldout_task_ids' (sft_summary.json).")
    split: str | None = Field(None, description="Keep only episodes of this split.")
    out: Path = Field(Path("runs/skills_eval"), description="Output directory (usefulness.json).")
    paired: bool = Field(True, description="Run the paired within-group comparison (scores each skill on its whole group).")
    max_episodes: int | None = Field(None, ge=1, description="Score at most this many episodes per analyzer (the first in file order).")
    batch_size: int = Field(8, ge=1, le=1024, description="Sequences per scoring forward pass (a batch's shared prompt tokens run once).")
    share_prefix: bool = Field(True, description="Run the prompt tokens a batch shares once (exact up to float rounding; off: every sequence whole).")
    seed: int = Field(0, description="Base sampling seed of the re-run check.")
    rerun: RerunConfig = Field(default_factory=RerunConfig, description="The optional re-run check (--rerun turns it on).")


# -- the math (pure; unit-tested on hand-made numbers) ------------------------------------


def per_token_delta(logp_with: float, logp_without: float, n_tokens: int) -> float | None:
    """Mean per-token log-prob shift of a completion span; None when it has no tokens."""
    return (logp_with - logp_without) / n_tokens if n_tokens > 0 else None


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def outcome_deltas(deltas: Sequence[float], successes: Sequence[bool]) -> dict[str, Any]:
    """Mean Delta on successful and on failed episodes, their difference (the margin), counts."""
    if len(deltas) != len(successes):
        raise ValueError(f"{len(deltas)} deltas but {len(successes)} outcomes")
    won = [d for d, s in zip(deltas, successes) if s]
    lost = [d for d, s in zip(deltas, successes) if not s]
    ms, mf = mean(won), mean(lost)
    return {"delta_success": ms, "delta_failure": mf, "margin": None if ms is None or mf is None else ms - mf,
            "n_success": len(won), "n_failure": len(lost)}


def paired_outcome(success_deltas: Sequence[float], failure_deltas: Sequence[float]) -> float | None:
    """1 when a skill raises the group's successful actions more than its failed ones (by
    mean per-episode Delta), 0 when less, 0.5 on a tie; None without both outcomes."""
    ms, mf = mean(success_deltas), mean(failure_deltas)
    if ms is None or mf is None:
        return None
    return 1.0 if ms > mf else 0.0 if ms < mf else 0.5


# -- scoring ------------------------------------------------------------------------------


def _key(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> bytes:
    """A compact cache key for a token sequence pair (a digest, not the ids themselves)."""
    data = array("q", [*prompt_ids, -1, *completion_ids]).tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()


class Scorer:
    """Sum of log p(completion | prompt) under ``model`` (fp32), cached by token ids.

    Identical token sequences always get the identical number, so a skill that leaves a
    prompt unchanged gives a Delta of exactly 0, whatever batch it was scored in.

    Pairs are batched in token order, so a batch holds prompts that begin alike (one
    episode's turns, one skill's episodes, the skill-free prompts with their shared system
    prompt and tool schemas); the tokens a batch shares run once (``share_prefix``) and the
    vocabulary projection runs only on completions (``scoring.completion_logprobs``). Both
    are exact up to float rounding, which is far below the margins this scores.
    """

    def __init__(self, model: Any, *, pad_token_id: int = 0, batch_size: int = 8, share_prefix: bool = True) -> None:
        self.model, self.pad_token_id, self.batch_size, self.share_prefix = model, pad_token_id, batch_size, share_prefix
        self.cache: dict[bytes, float] = {}
        self.forward_sequences = 0
        self.forward_tokens = 0  # tokens the forwards ran (a shared prefix counts once per batch)

    def prefetch(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        """Score every pair not yet cached, in batches of prompts that begin alike."""
        import torch

        from seed_agents.backends.prefix import prefix_batches, worth_sharing
        from seed_agents.scoring import completion_logprobs

        todo: dict[bytes, tuple[Sequence[int], Sequence[int]]] = {}
        for p, c in pairs:
            k = _key(p, c)
            if k not in self.cache:
                todo[k] = (p, c)
        order = sorted(todo, key=lambda k: (tuple(todo[k][0]), len(todo[k][1])))
        self.model.eval()
        if self.share_prefix:
            batches = prefix_batches([list(todo[k][0]) for k in order], self.batch_size)
        else:
            batches = [list(range(i, min(i + self.batch_size, len(order)))) for i in range(0, len(order), self.batch_size)]
        for batch in batches:
            keys = [order[i] for i in batch]
            prompts, completions = [todo[k][0] for k in keys], [todo[k][1] for k in keys]
            shared = worth_sharing([list(p) for p in prompts]) if self.share_prefix else 0
            with torch.no_grad():
                logps_B_T, mask_B_T = completion_logprobs(self.model, prompts, completions, prefix_len=shared,
                                                          pad_token_id=self.pad_token_id)
            sums_B = (logps_B_T.double() * mask_B_T).sum(-1).tolist()
            self.cache.update(zip(keys, sums_B))
            self.forward_sequences += len(keys)
            self.forward_tokens += shared + sum(len(p) - shared + len(c) for p, c in zip(prompts, completions))

    def __call__(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> float:
        k = _key(prompt_ids, completion_ids)
        if k not in self.cache:
            self.prefetch([(prompt_ids, completion_ids)])
        return self.cache[_key(prompt_ids, completion_ids)]


@dataclass
class EpisodeScore:
    """One episode's actions scored without and with one skill."""

    trajectory_id: str
    task_id: str
    group_id: str
    success: bool
    skill_of: str  # trajectory id of the episode whose skill was inserted
    tokens: int
    logp_without: float
    logp_with: float

    @property
    def delta(self) -> float | None:
        return per_token_delta(self.logp_with, self.logp_without, self.tokens)


class _Unchanged:
    def inject(self, messages: list[Any], skill: str) -> list[Any]:
        return list(messages)


def _calls(traj: Trajectory) -> list[LLMCall]:
    return [c for c in traj.policy_calls if c.completion_ids]


class SkillScoring:
    """Scores episodes with and without skills; the prompts with a skill are built by the
    same ``teacher_prompt_ids`` that training uses."""

    def __init__(self, scorer: Scorer, llm: Any, injector: Any, chunk: int = 64) -> None:
        self.scorer, self.llm, self.injector, self.chunk = scorer, llm, injector, chunk

    def render_mismatches(self, trajs: Sequence[Trajectory]) -> tuple[int, int]:
        """(calls whose recorded prompt the scoring tokenizer does not reproduce, calls)."""
        from seed_agents.skills import teacher_prompt_ids

        calls = [c for t in trajs for c in _calls(t)]
        bad = sum(teacher_prompt_ids(self.llm, c, "", _Unchanged()) != c.prompt_ids for c in calls)
        return bad, len(calls)

    def score(self, jobs: Sequence[tuple[Trajectory, str, str]]) -> list[EpisodeScore]:
        """``jobs``: (episode, skill, trajectory id the skill came from). Scored in batched
        chunks; the teacher prompts of a chunk are dropped once it is scored."""
        from seed_agents.skills import teacher_prompt_ids

        out = []
        for i in range(0, len(jobs), self.chunk):
            rows = []
            for traj, skill, skill_of in jobs[i : i + self.chunk]:
                calls = _calls(traj)
                rows.append((traj, skill_of, calls, [teacher_prompt_ids(self.llm, c, skill, self.injector) for c in calls]))
            self.scorer.prefetch([pair for _, _, calls, teacher in rows for c, t in zip(calls, teacher)
                                  for pair in ((c.prompt_ids, c.completion_ids), (t, c.completion_ids))])
            for traj, skill_of, calls, teacher in rows:
                out.append(EpisodeScore(
                    trajectory_id=traj.trajectory_id, task_id=traj.task_id, group_id=traj.group_id,
                    success=traj.success, skill_of=skill_of, tokens=sum(len(c.completion_ids) for c in calls),
                    logp_without=sum(self.scorer(c.prompt_ids, c.completion_ids) for c in calls),
                    logp_with=sum(self.scorer(t, c.completion_ids) for c, t in zip(calls, teacher)),
                ))
        return out


def evaluate_analyzer(scoring: SkillScoring, examples: Sequence[SkillExample], trajs: dict[str, Trajectory], *,
                      paired: bool = True, max_episodes: int | None = None) -> dict[str, Any]:
    """One analyzer's row (and its per-episode scores) on the episodes in ``trajs``."""
    found = [ex for ex in examples if ex.trajectory_id in trajs][: max_episodes or None]
    valid = [ex for ex in found if ex.valid]
    own = scoring.score([(trajs[ex.trajectory_id], ex.skill, ex.trajectory_id) for ex in valid])
    scored = [s for s in own if s.delta is not None]
    row: dict[str, Any] = {
        "examples": len(found), "valid": len(valid), "coverage": len(valid) / len(found) if found else None,
        "episodes_scored": len(scored),
        **outcome_deltas([s.delta for s in scored], [s.success for s in scored]),
    }
    pairs: list[dict[str, Any]] = []
    if paired:
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs.values():
            groups[t.group_id].append(t)
        mixed = {g: ts for g, ts in groups.items() if len({t.success for t in ts}) == 2}
        jobs, owners = [], []
        for ex in valid:
            members = mixed.get(trajs[ex.trajectory_id].group_id, [])
            for t in members:
                jobs.append((t, ex.skill, ex.trajectory_id))
                owners.append(ex.trajectory_id)
        by_owner: dict[str, list[EpisodeScore]] = defaultdict(list)
        for owner, s in zip(owners, scoring.score(jobs)):
            if s.delta is not None:
                by_owner[owner].append(s)
        for owner, scores in by_owner.items():
            outcome = paired_outcome([s.delta for s in scores if s.success], [s.delta for s in scores if not s.success])
            if outcome is not None:
                pairs.append({"skill_of": owner, "group_id": scores[0].group_id, "win": outcome,
                              "delta_success": mean([s.delta for s in scores if s.success]),
                              "delta_failure": mean([s.delta for s in scores if not s.success])})
    row["paired_win_rate"] = mean([p["win"] for p in pairs])
    row["n_pairs"] = len(pairs)
    return {"row": row, "episodes": [{**asdict(s), "delta": s.delta} for s in own], "pairs": pairs}


# -- inputs -------------------------------------------------------------------------------


def read_task_filter(path: Path) -> set[str]:
    """Task ids from a JSON list, or from a file with 'heldout_task_ids' / 'task_ids'."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read task ids from {path}: {e}; pass a JSON list of task ids or the "
                          f"sft_summary.json of `skills sft`") from None
    if isinstance(data, dict):
        data = data.get("heldout_task_ids", data.get("task_ids"))
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise ConfigError(f"{path}: expected a JSON list of task ids or an object with 'heldout_task_ids'")
    return set(data)


def load_inputs(cfg: UsefulnessConfig) -> tuple[dict[str, Trajectory], dict[str, list[SkillExample]], dict[str, Any]]:
    """(episodes kept by the filters, examples by analyzer, counts)."""
    from seed_agents.capture import read_jsonl

    if cfg.trajectories is None:
        raise ConfigError("no trajectories: pass the collect run's trajectories.jsonl (--trajectories)")
    if not cfg.examples:
        raise ConfigError("no examples files: pass at least one examples.jsonl (--examples)")
    for path in [cfg.trajectories, *cfg.examples]:
        if not Path(path).is_file():
            raise ConfigError(f"{path} does not exist; pass the files a collect run wrote")
    try:
        all_trajs = read_jsonl(cfg.trajectories, Trajectory)
    except ValueError as e:
        raise ConfigError(f"{cfg.trajectories}: not a file of Trajectory records ({first_error(e)}); pass the "
                          f"trajectories.jsonl of a collect run") from None
    keep = read_task_filter(cfg.tasks_from) if cfg.tasks_from else None
    trajs = {t.trajectory_id: t for t in all_trajs
             if (keep is None or t.task_id in keep) and (cfg.split is None or t.split == cfg.split)}
    by_analyzer: dict[str, list[SkillExample]] = defaultdict(list)
    seen: set[tuple[str, str]] = set()
    for path in cfg.examples:
        try:
            records = read_jsonl(path, SkillExample)
        except ValueError as e:
            raise ConfigError(f"{path}: not a file of SkillExample records ({first_error(e)}); pass the "
                              f"examples.jsonl of a collect run") from None
        for ex in records:
            if (ex.analyzer, ex.example_id) not in seen:
                seen.add((ex.analyzer, ex.example_id))
                by_analyzer[ex.analyzer].append(ex)
    ids = {t.trajectory_id for t in all_trajs}
    counts = {"trajectories": len(all_trajs), "kept": len(trajs),
              "examples_without_trajectory": sum(ex.trajectory_id not in ids for exs in by_analyzer.values() for ex in exs)}
    if not trajs:
        raise ConfigError(f"no episodes left in {cfg.trajectories} after the task/split filters")
    if not by_analyzer:
        raise ConfigError(f"no examples in {', '.join(map(str, cfg.examples))}")
    return trajs, dict(by_analyzer), counts


# -- the re-run check ---------------------------------------------------------------------


@functools.cache
def _skilled_class() -> type:
    from seed_agents.chat_model import SeedChatModel

    class SkilledChatModel(SeedChatModel):
        """A ``SeedChatModel`` that puts ``skill`` into every prompt it renders."""

        skill: str = ""
        injector: Any = Field(None, exclude=True)

        def render(self, messages, tools=None):  # noqa: ANN001, ANN201
            if self.skill:
                messages = self.injector.inject(list(messages), self.skill)
            return super().render(messages, tools)

    return SkilledChatModel


def skilled_chat_model(base: Any, skill: str, injector: Any, sampling: SamplingParams) -> Any:
    """A chat model over ``base``'s backend and tokenizer that puts ``skill`` into every
    prompt it renders (recorded messages include it); no skill: renders like ``base``."""
    return _skilled_class()(backend=base.backend, tokenizer=base.tokenizer, sampling=sampling, skill=skill,
                            injector=injector, tool_format=base.tool_format, model_name=base.model_name)


def find_tasks(suite: EnvSuite, wanted: dict[str, str]) -> dict[str, Task]:
    """Task objects for ``{task_id: split}`` from the suite's manifests (fixed ids)."""
    found: dict[str, Task] = {}
    for split in sorted(set(wanted.values())):
        need = {t for t, s in wanted.items() if s == split}
        n = max(8, 2 * len(need))
        while need - found.keys():
            try:
                tasks = suite.tasks(split, n)
            except ValueError:
                break
            found.update({t.task_id: t for t in tasks if t.task_id in need})
            if len(tasks) < n or n >= 1 << 17:
                break
            n *= 2
    return found


def rerun_check(suite: EnvSuite, llm: Any, tasks: Sequence[Task], skills: dict[str, dict[str, list[str]]],
                cfg: RerunConfig, injector: Any, seed: int = 0, sink: Any = None) -> dict[str, dict[str, Any]]:
    """Per analyzer: success on fresh episodes with its skills vs without, same seeds.

    ``skills[analyzer][task_id]`` are that analyzer's valid skills for the task; episode
    k of a task uses skill k mod len(skills) and sampling seed ``seed + k`` in both arms,
    so the arms differ only by the skill. The baseline arm is played once and shared.
    A ``LocalBackend`` must serve one request at a time (``max_batch_size=1``) for the
    seeds to make runs reproducible. Episodes go to ``sink`` (group ids name the arm).
    """
    from seed_agents.runner import EpisodeRunner, RunnerConfig

    G = cfg.episodes_per_task
    specs: list[tuple[str, Task, int, str]] = []  # (arm, task, k, skill); arm "" is the baseline
    for task in tasks:
        arms = [(a, by_task[task.task_id]) for a, by_task in skills.items() if by_task.get(task.task_id)]
        if arms:
            specs += [("", task, k, "") for k in range(G)]
        for analyzer, task_skills in arms:
            specs += [(analyzer, task, k, task_skills[k % len(task_skills)]) for k in range(G)]

    async def play_all() -> list[Trajectory]:
        sem = asyncio.Semaphore(cfg.concurrency)

        async def one(arm: str, task: Task, k: int, skill: str) -> Trajectory:
            chat = skilled_chat_model(llm, skill, injector, cfg.sampling.model_copy(update={"seed": seed + k}))
            runner = EpisodeRunner(suite.build_graph(chat, **cfg.agent.model_dump()), RunnerConfig(progress=False),
                                   make_env=suite.make_env, sink=sink, labels={"arm": arm or "baseline"})
            async with sem:
                return await runner.run_episode(task, f"rerun-{arm or 'baseline'}-{task.task_id}", k)

        return list(await asyncio.gather(*(one(*s) for s in specs)))

    trajs = run_sync(play_all())
    outcome = {(arm, task.task_id, k): t for (arm, task, k, _), t in zip(specs, trajs)}
    result: dict[str, dict[str, Any]] = {}
    for analyzer in skills:
        keys = [(task_id, k) for arm, task_id, k in outcome if arm == analyzer]
        with_, without = [outcome[(analyzer, *key)] for key in keys], [outcome[("", *key)] for key in keys]
        result[analyzer] = {
            "episodes": len(keys), "tasks": len({t for t, _ in keys}),
            "success_with": mean([float(t.success) for t in with_]),
            "success_without": mean([float(t.success) for t in without]),
            "errors_with": sum(t.stop_reason.value == "error" for t in with_),
            "errors_without": sum(t.stop_reason.value == "error" for t in without),
        }
    return result


# -- the run ------------------------------------------------------------------------------


def run_usefulness(cfg: UsefulnessConfig) -> dict[str, Any]:
    """Score every analyzer's skills (and optionally re-run tasks); write usefulness.json."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.chat_model import SeedChatModel
    from seed_agents.models import check_model_folder, resolve_model
    from seed_agents.preflight import check_out, load_suite
    from seed_agents.skills import make_injector

    # -- checks: inputs, --out, the model and the re-run's env, before the slow scoring ------
    t0 = time.perf_counter()
    trajs, by_analyzer, counts = load_inputs(cfg)
    check_out(Path(cfg.out), holds_run=False, overwrite=None, what="a skills eval")
    path = resolve_model(cfg.model)
    check_model_folder(path)
    suite = load_suite(cfg.rerun.env, seed=cfg.seed, options=cfg.rerun.env_options) if cfg.rerun.enabled else None
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    injector = make_injector(cfg.injector)
    result = evaluate_skills(model, tokenizer, trajs, by_analyzer, injector=injector, paired=cfg.paired,
                             max_episodes=cfg.max_episodes, batch_size=cfg.batch_size, share_prefix=cfg.share_prefix)
    result["counts"] = {**counts, **result["counts"]}

    if cfg.rerun.enabled:
        from seed_agents.backends.local import LocalBackend
        from seed_agents.capture import JsonlSink

        skills = {a: _skills_by_task(exs, trajs) for a, exs in by_analyzer.items()}
        splits = {t.task_id: t.split for t in trajs.values()}
        task_ids = sorted({t for by_task in skills.values() for t in by_task})[: cfg.rerun.max_tasks]
        found = find_tasks(suite, {t: splits[t] for t in task_ids})
        missing = [t for t in task_ids if t not in found]
        if missing:
            print(f"re-run: {len(missing)} task(s) not in the {cfg.rerun.env} manifests, skipped: {missing[:5]}", flush=True)
        tasks = [found[t] for t in task_ids if t in found]
        suite.prepare(tasks)
        backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=1)  # one request at a time: seeds reproduce
        llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=cfg.rerun.sampling, model_name=cfg.model)
        print(f"re-run: {len(tasks)} tasks x {cfg.rerun.episodes_per_task} episodes, with and without skills ...", flush=True)
        out = Path(cfg.out)
        (out / "rerun_trajectories.jsonl").unlink(missing_ok=True)
        with JsonlSink(out / "rerun_trajectories.jsonl") as sink:
            rerun = rerun_check(suite, llm, tasks, skills, cfg.rerun, injector, seed=cfg.seed, sink=sink)
        for row in result["rows"]:
            r = rerun.get(row["analyzer"], {})
            row["rerun_success_with"], row["rerun_success_without"] = r.get("success_with"), r.get("success_without")
            row["rerun_episodes"] = r.get("episodes", 0)
        result["rerun"] = rerun

    result["wall_s"] = time.perf_counter() - t0
    result["config"] = json.loads(cfg.model_dump_json())
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "usefulness.json").write_text(json.dumps(result, indent=2))
    return result


def _skills_by_task(examples: Sequence[SkillExample], trajs: dict[str, Trajectory]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for ex in examples:
        if ex.valid and ex.trajectory_id in trajs:
            out[ex.task_id].append(ex.skill)
    return dict(out)


def evaluate_skills(model: Any, tokenizer: Any, trajs: dict[str, Trajectory], by_analyzer: dict[str, list[SkillExample]], *,
                    injector: Any = None, paired: bool = True, max_episodes: int | None = None,
                    batch_size: int = 8, share_prefix: bool = True) -> dict[str, Any]:
    """The log-probability check for every analyzer: ``{"rows": [...], "episodes": {...}, ...}``."""
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.skills import SystemBlockInjector

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scorer = Scorer(model, pad_token_id=int(pad or 0), batch_size=batch_size, share_prefix=share_prefix)
    scoring = SkillScoring(scorer, SeedChatModel(backend=None, tokenizer=tokenizer), injector or SystemBlockInjector())
    bad, n_calls = scoring.render_mismatches(list(trajs.values()))
    if bad:
        print(f"warning: the scoring tokenizer does not reproduce {bad} of {n_calls} recorded prompts; "
              "Deltas then mix the skill with a rendering change", flush=True)
    rows, episodes, pairs = [], {}, {}
    for analyzer in sorted(by_analyzer):
        print(f"scoring {analyzer} ...", flush=True)
        r = evaluate_analyzer(scoring, by_analyzer[analyzer], trajs, paired=paired, max_episodes=max_episodes)
        rows.append({"analyzer": analyzer, **r["row"]})
        episodes[analyzer], pairs[analyzer] = r["episodes"], r["pairs"]
    return {"rows": rows, "episodes": episodes, "pairs": pairs,
            "counts": {"policy_calls": n_calls, "render_mismatches": bad, "sequences_scored": scorer.forward_sequences,
                       "tokens_run": scorer.forward_tokens}}


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    def f(x: Any, spec: str = "+.4f") -> str:
        return "-" if x is None else format(x, spec)

    rerun = any("rerun_success_with" in r for r in rows)
    head = f"{'analyzer':<28}{'examples':>9}{'coverage':>9}{'dSucc':>9}{'dFail':>9}{'margin':>9}{'paired (n)':>13}"
    lines = [head + (f"{'rerun w/ | w/o':>18}" if rerun else "")]
    for r in rows:
        paired = f"{f(r['paired_win_rate'], '.2f')} ({r['n_pairs']})"
        line = (f"{r['analyzer'][:27]:<28}{r['examples']:>9}{f(r['coverage'], '.2f'):>9}{f(r['delta_success']):>9}"
                f"{f(r['delta_failure']):>9}{f(r['margin']):>9}{paired:>13}")
        if rerun:
            line += f"{f(r.get('rerun_success_with'), '.2f') + ' | ' + f(r.get('rerun_success_without'), '.2f'):>18}"
        lines.append(line)
    lines.append("dSucc/dFail: mean per-token log-prob shift of each episode's own actions with its skill in the prompt "
                 "(want > 0 on successes, < 0 on failures); margin = dSucc - dFail; paired: share of skills that raise "
                 "their group's successful actions more than its failed ones")
    return "\n".join(lines)
