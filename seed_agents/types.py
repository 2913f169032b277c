"""The contract between rollout, capture and training.

Every number a trainer needs is in these records: the exact prompt token ids the model
saw, the completion token ids it sampled and the log-probabilities the *serving* model
assigned to them, stamped with the policy version that sampled them. Nothing downstream
re-tokenizes text; text fields are for humans and for the analyzer prompt only.

Log-probabilities are the model's raw log-softmax at temperature 1 (vLLM's default
``raw_logprobs`` mode), so they are directly comparable with a trainer's forward pass on
the same ids regardless of the sampling temperature.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

Purpose = Literal["policy", "analyzer", "other"]
FinishReason = Literal["stop", "length", "error"]
AnswerFormat = Literal["paper", "described", "workflow"]
"""The analyzer prompt's reply example (``seed_agents.skills.ANSWER_FORMATS``)."""
SkillOpening = Literal["words", "call"]
"""How the skill grammar opens a policy-written skill: ``words`` (the paper's free text; the
grammar only asks for words first), ``call`` ("Call <one of the episode's tools> with ...")."""
SkillFailures = Literal["write", "skip"]
"""Whether a failed episode gets a skill: ``write`` (the paper: avoidance rules), ``skip`` (no
analyzer call; its rows get no teacher, as with an invalid skill)."""


def new_id() -> str:
    return uuid.uuid4().hex[:16]


class StopReason(str, Enum):
    """Why an episode ended. Only ``DONE`` is a natural end of the task."""

    DONE = "done"  # the environment or the agent finished the task (won or lost)
    MAX_TURNS = "max_turns"  # the agent's turn budget ran out
    TIMEOUT = "timeout"  # the per-episode wall-clock limit was hit
    ERROR = "error"  # the env, a tool or the backend raised; see Trajectory.error


class FaultKind(str, Enum):
    """An infrastructure fault: why an episode says nothing about the policy.

    A faulted episode is recorded (its calls, its error) and counted, but never trained
    on and never part of a group's advantage statistics: an env crash, a hung tool, a
    dead server or a raising reward function is not evidence that the policy acted badly.
    The policy's own failures (a lost game, running out of turns, an invalid action, an
    unparsable answer the graph handles) are outcomes, not faults.
    """

    ENV = "env"  # an env, tool or graph exception escaped the agent graph
    TIMEOUT = "timeout"  # the per-episode wall-clock limit was hit
    BACKEND = "backend"  # the model server failed or could not be reached
    REWARD = "reward"  # the reward or success function raised
    SKIPPED = "skipped"  # never started: the run stopped scheduling (e.g. backend down)
    UNREPLAYABLE = "unreplayable"  # a shadow replay needed a write it may not send to production


class SamplingParams(BaseModel):
    """What a backend needs to sample one completion."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(64, ge=1, le=32768, description="Maximum completion tokens.")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(None, description="Per-request sampling seed, if reproducibility matters.")
    stop_token_ids: tuple[int, ...] = Field((), description="Extra token ids that end the completion.")
    structural_tag: str | None = Field(None, description=(
        "Constrained decoding: an xgrammar structural tag (JSON text, built by "
        "seed_agents.backends.grammar) the completion follows; logprobs are the masked distribution's. "
        "None: unconstrained."))


class Completion(BaseModel):
    """One sampled completion, exactly as the backend produced it."""

    token_ids: list[int]
    logprobs: list[float] = Field(description="Raw (T=1) log-prob of each sampled token.")
    finish_reason: FinishReason
    policy_version: int = 0
    latency_s: float = 0.0

    @model_validator(mode="after")
    def _aligned(self) -> Completion:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs"
            )
        return self


class LLMCall(BaseModel):
    """One LLM call, captured token-exactly by ``SeedChatModel``."""

    call_id: str = Field(default_factory=new_id)
    messages: list[dict[str, Any]] = Field(description="The chat messages as rendered (role/content/tool_calls).")
    tools: list[dict[str, Any]] | None = Field(None, description="OpenAI-style tool schemas offered to the model.")
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str = Field("", description="Decoded completion, for humans and parsers.")
    policy_version: int = 0
    purpose: Purpose = "policy"
    finish_reason: FinishReason = "stop"
    latency_s: float = 0.0
    started_at: float = Field(default_factory=time.time)
    sampling: SamplingParams | None = None
    scope: dict[str, Any] = Field(default_factory=dict, description="Capture scope labels (run, task, group, ...).")
    complete: bool = Field(True, description="False: a stream its consumer abandoned; the ids sampled so far are kept for the record and never trained on.")
    guided: bool = Field(False, description="A guided opening: the model was free to call a tool or not and the runner steered it into a call (docs/training.md).")
    prefill_len: int = Field(0, ge=0, description="Guided calls: how many ids at the end of prompt_ids are the steering prefill, not in the prompt the model was offered; rows train them as guide tokens.")

    @model_validator(mode="after")
    def _aligned(self) -> LLMCall:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"{len(self.completion_ids)} completion ids but {len(self.logprobs)} logprobs"
            )
        if self.prefill_len and not self.guided:
            raise ValueError("prefill_len is set only on guided calls")
        if self.prefill_len >= max(len(self.prompt_ids), 1):
            raise ValueError(f"prefill_len {self.prefill_len} leaves no prompt of {len(self.prompt_ids)} ids")
        return self


class Task(BaseModel):
    """One task of a manifest. ``task_id`` is stable across runs and machines."""

    task_id: str
    split: str = "train"
    data: dict[str, Any] = Field(default_factory=dict, description="Env-specific task parameters.")


class Skill(BaseModel):
    """A hindsight skill: what the analyzer (the policy itself, greedy) learned from one episode.

    Invalid skills are kept, not dropped: ``valid`` is False and ``reject_reason`` says
    why (unparsable JSON, too short, control tokens, analyzer error). Only valid skills
    are injected into teacher prompts; the episode's RL term applies either way.
    """

    trajectory_id: str = Field("", description="The episode the skill was written about.")
    task_id: str = ""
    success: bool = Field(description="The episode's outcome as shown to the analyzer.")
    summary: str = Field("", description="The analyzer's episode_summary.")
    skill: str = Field("", description="The analyzer's episode_skill: one short, policy-facing rule.")
    valid: bool = False
    reject_reason: str | None = Field(None, description="Why the skill is unusable; None when valid.")
    call_id: str | None = Field(None, description="The analyzer's LLMCall (purpose='analyzer'), when captured.")
    raw: str = Field("", description="The analyzer's raw reply.")

    @model_validator(mode="after")
    def _consistent(self) -> Skill:
        if self.valid == (self.reject_reason is not None):
            raise ValueError("a skill is valid exactly when it has no reject_reason")
        return self


class Trajectory(BaseModel):
    """One episode: every captured call plus the outcome the environment reported."""

    trajectory_id: str = Field(default_factory=new_id)
    task_id: str
    group_id: str = Field(description="Episodes of the same task in the same iteration share it (GRPO group).")
    sample_index: int = 0
    split: str = "train"
    calls: list[LLMCall] = Field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    steps: int = 0
    invalid_actions: int = 0
    stop_reason: StopReason = StopReason.DONE
    metadata: dict[str, Any] = Field(default_factory=dict, description="Env metadata (game type, score, ...).")
    error: str | None = None
    fault: FaultKind | None = Field(None, description="Set when an infrastructure fault ended the episode: never trained on.")
    wall_s: float = 0.0
    skill: Skill | None = Field(None, description="The hindsight skill written about this episode, if any.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_fault(cls, data: Any) -> Any:
        """Records written before faults were typed: an errored or timed-out episode was
        always an infrastructure fault (policy failures end with ``done``/``max_turns``)."""
        if isinstance(data, dict) and "fault" not in data:
            reason = data.get("stop_reason")
            if reason in (StopReason.TIMEOUT, StopReason.TIMEOUT.value):
                data = {**data, "fault": FaultKind.TIMEOUT}
            elif reason in (StopReason.ERROR, StopReason.ERROR.value):
                data = {**data, "fault": FaultKind.ENV}
        return data

    @property
    def trainable(self) -> bool:
        """False for faulted episodes: their outcome says nothing about the policy."""
        return self.fault is None

    @property
    def policy_calls(self) -> list[LLMCall]:
        return [c for c in self.calls if c.purpose == "policy"]


class Row(BaseModel):
    """One training row: a prompt and a completion span with a per-token loss mask.

    ``completion_ids`` may span several LLM calls when their token prefixes continue
    exactly; tokens the model did not sample (observations, template glue) have
    ``loss_mask`` 0 and ``old_logprobs`` 0.0.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    trajectory_id: str
    task_id: str
    group_id: str
    call_ids: list[str]
    policy_version: int = 0
    guide_mask: list[int] = Field(default_factory=list, description="1 for guide tokens (steered, not sampled); empty: none.")

    @model_validator(mode="after")
    def _aligned(self) -> Row:
        n = len(self.completion_ids)
        if not (len(self.loss_mask) == len(self.old_logprobs) == n):
            raise ValueError(
                f"row lengths differ: completion {n}, mask {len(self.loss_mask)}, "
                f"logprobs {len(self.old_logprobs)}"
            )
        if self.guide_mask and len(self.guide_mask) != n:
            raise ValueError(f"row lengths differ: completion {n}, guide mask {len(self.guide_mask)}")
        if any(g and not m for g, m in zip(self.guide_mask, self.loss_mask, strict=False)):
            raise ValueError("a guide token must be trained (loss_mask 1)")
        return self

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)


class SkillExample(BaseModel):
    """One stage-1 example: an analyzer prompt and the skill JSON an analyzer wrote for it.

    ``skills collect`` writes these (one per analyzed episode, valid or not, so a re-run
    knows what is done); ``skills sft`` trains on the valid ones (prompt ``messages`` ->
    ``completion``); ``skills eval`` re-scores the episode's policy calls (kept in the
    collect run's trajectories.jsonl under ``trajectory_id``) with and without ``skill``.
    """

    example_id: str = Field(description="Stable id: the trajectory id (the resume key).")
    trajectory_id: str
    task_id: str
    split: str = "train"
    success: bool = Field(description="The episode's outcome as shown to the analyzer.")
    reward: float = 0.0
    messages: list[dict[str, Any]] = Field(description="The analyzer prompt as role/content dicts (system, user).")
    completion: str = Field("", description="The analyzer's raw reply (the SFT target when valid).")
    skill: str = Field("", description="The parsed episode_skill.")
    summary: str = Field("", description="The parsed episode_summary.")
    valid: bool = False
    reject_reason: str | None = None
    analyzer: str = Field(description="Who wrote it: 'rule-based-textworld', 'openai:<model>', 'policy:<model>', ...")
    prompt_tokens: int = Field(0, ge=0, description="As reported by the analyzer endpoint (0 when unknown).")
    completion_tokens: int = Field(0, ge=0)
    latency_s: float = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> SkillExample:
        if self.valid == (self.reject_reason is not None):
            raise ValueError("an example is valid exactly when it has no reject_reason")
        return self


# -- the structured episode an offline analyzer reads (recorded by the env agent) --------

class EnvStep(BaseModel):
    """One turn of an env agent as structured data: what it was shown and what it did.

    The env agent records these (``Trajectory.metadata["env_steps"]``), so an offline
    analyzer reads the commands, the admissible list and the env's verdict as data instead
    of parsing prompt text back out of the recorded LLM calls.
    """

    observation: str = Field(description="The env text the agent acted on (EnvObservation.text).")
    admissible_actions: list[str] = Field(default_factory=list, description="The commands it was offered, in the order shown.")
    reply: str = Field("", description="The model's raw reply.")
    action: str = Field(description="The command sent to the env (the reply parsed against the admissible list).")
    invalid: bool = Field(False, description="The env rejected the action; the game state did not change.")
    reward: float = Field(0.0, description="This step's reward (not cumulative).")
    done: bool = False


ENV_STEPS_KEY = "env_steps"
"""The ``metadata`` key (graph state, then ``Trajectory.metadata``) holding the episode's
``EnvStep`` records as plain dicts."""
FIRST_OBSERVATION_KEY = "first_observation"
"""The ``metadata`` key holding the env's text after reset (the env agent records it)."""


class EpisodeRecord(BaseModel):
    """What an offline analyzer reads about one finished episode: structured, never prompt text."""

    task_id: str = ""
    success: bool = False
    reward: float = 0.0
    first_observation: str = Field("", description="The env's text after reset (it states the task).")
    steps: list[EnvStep] = Field(default_factory=list, description="Every turn, in order.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="The env's info (objective, game type, ...), env steps left out.")
    tools: list[str] = Field(default_factory=list, description="The names of the tools the policy's calls were offered (skills.tool_names; empty for a text env): what a `skills.opening call` skill may name.")

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], *, task_id: str = "", success: bool = False,
                      reward: float = 0.0, tools: Sequence[str] = ()) -> EpisodeRecord:
        """From a final graph state's (or a trajectory's) ``metadata``; ``steps`` is empty
        when the graph recorded none (an older trajectory, a graph that is not an env agent)."""
        raw = metadata.get(ENV_STEPS_KEY) or []
        info = {k: v for k, v in metadata.items() if k not in (ENV_STEPS_KEY, FIRST_OBSERVATION_KEY)}
        return cls(task_id=task_id, success=success, reward=reward, steps=[EnvStep.model_validate(s) for s in raw],
                   first_observation=str(metadata.get(FIRST_OBSERVATION_KEY) or ""), metadata=info, tools=list(tools))


# -- what a reward function is handed: the loop's form and the gateway's verifier form ------

class SessionRecord(BaseModel):
    """One session: the calls of one conversation or episode, and its life cycle.

    The store's read model of a session (``seed_agents.store``), and what a ``Verifier``
    reads. ``metadata`` holds, under ``"task"``, the task as a plain dict in ``Task``'s JSON
    form (``{"task_id", "split", "data"}``; ``Task.model_validate`` makes it a ``Task``), when
    the session has one: set with ``PUT /v1/sessions/{id}/metadata``, and always in a replay.
    """

    session_id: str
    task_key: str | None = Field(description=(
        "What the session attempts (the client's X-Task-Key). `train --from-store` trains the sessions of one key "
        "as one GRPO group and the judge scores them against each other; the continual loop replays each session "
        "as a group of its own and names the replayed task by the key."))
    created_at: float
    ended_at: float | None = Field(description="None while the session may still receive calls.")
    metadata: dict[str, Any] = Field(description=(
        "Free-form; the keys the project writes: 'task' (a dict in Task's JSON form) and 'recording' when set, "
        "'transcript' and 'sampling' (how it sampled) for a session the gateway or a StoreSink recorded, 'episode' "
        "for one written from a trajectory."))
    flagged_reason: str | None = Field(description="Why the session must never be trained on (e.g. a secret seen).")
    consumed_by: str | None = Field(description="The update that trained on it; a session is trained at most once.")
    num_calls: int


class EpisodeReward(Protocol):
    """The loop's and the runner's reward: ``reward(task, state) -> float``.

    ``task`` is a ``Task`` (not a dict); ``state`` is the agent graph's final state, a dict:
    for the tool agent of the continual loop ``state["answer"]`` (the text of the reply that
    called no tool; absent when the turns ran out) and ``state["messages"]`` (the conversation
    as LangChain messages, ``BaseMessage`` objects).
    Success is a reward >= 1. The parameters must be named ``task`` and ``state`` (or
    ``final_state``): ``seed_agents.imports.reward_form`` tells the two forms apart by name.
    """

    def __call__(self, task: Task, state: dict[str, Any], /) -> float: ...


class Verifier(Protocol):
    """The gateway's verifier, which the continual loop also takes as its reward:
    ``verifier(session, calls) -> float | None`` (None: no opinion; the loop scores it 0).

    At the gateway (``POST /v1/sessions/{id}/end``): ``session`` is the stored
    ``SessionRecord`` and ``calls`` every call of the session, in order. In a replay or a
    canary episode of the loop: a ``SessionRecord`` made for the episode (``session_id`` and
    ``task_key`` are the task's ``task_id``, ``metadata`` is ``{"task": <the task as a dict>}``)
    and that episode's policy calls so far, in order. Either way each call is an ``LLMCall``:
    ``messages`` the prompt as rendered (role/content dicts after the tool format's conversion;
    a forced call's prefill is the last, assistant, entry), ``text`` the reply as decoded
    (without that prefill). The loop may call it more than once per episode (the hindsight
    node asks whether the episode succeeded), so it must not count or change anything.
    The parameters must be named ``session`` and ``calls``.
    """

    def __call__(self, session: SessionRecord, calls: list[LLMCall], /) -> float | None: ...
