"""``SEEDTrainer``: TRL's GRPOTrainer with LangGraph rollouts and the SEED objective.

Where it departs from stock GRPO, and why:
- Generation is replaced by a ``Rollout`` (the LangGraph runner + hindsight node). Rows
  come from captured calls: token ids and old log-probs are the ones the server sampled,
  never re-tokenized. A TRL dataset row is one task; TRL repeats it G times and we run G
  episodes of it (duplicates in the batch are collapsed into one task).
- Rows are variable per episode (step-level agents make one row per call), so advantages
  are computed here over every row of a task's group (``group_advantages``), not by TRL's
  ``view(-1, G)``.
- The loss is ``seed_objective``: PPO-clip + entropy + KL(k3) + lambda * gated OPD, whose
  teacher log-probs are the *pre-update* policy re-scoring the sampled completion with
  the episode's hindsight skill injected into the prompt (with ``fuse_teacher``, on top of
  the prompt keys and values the loss forward itself computes: the weights are still the
  pre-update ones there when one optimizer step uses the batch).
- Log-probs are scored at temperature 1 (``temperature=1.0`` is forced for scoring):
  backends return raw log-softmax, and both sides of every ratio must agree.
- The task order of each epoch is a function of (seed, epoch) (``EpochSeededSampler``):
  TRL's sampler draws every epoch from one running generator, so a run resumed at an
  epoch boundary would replay the tasks in another order than the uninterrupted run.
Everything else (accelerate/DeepSpeed/FSDP, PEFT, checkpoints, ``report_to``, the
reference model) is TRL's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler

from seed_agents.backends.prefix import common_prefix_len, worth_sharing
from seed_agents.config.core import PAPER, PAPER_LEARNING_RATE
from seed_agents.distill import SEEDCoefficients, group_advantages, seed_objective
from seed_agents.errors import NoTrainableRows
from seed_agents.memory import PEAK_RSS, release_free_memory
from seed_agents.trainers.activations import ActivationCost, budget_bytes, recompute
from seed_agents.trainers.activations import measure as measure_activations
from seed_agents.trainers.head import completion_logps, plain_head
from seed_agents.trainers.shared_prefix import PromptKV, logps_on_prompt_kv, shared_prefix_logps
from seed_agents.trainers.shared_prefix import checkpointed_layers, recomputes
from seed_agents.trainers.shared_prefix import supported as prefix_supported
from seed_agents.types import Row, Task, Trajectory


@dataclass
class SEEDConfig(GRPOConfig):
    """GRPOConfig plus the SEED knobs. Defaults are the paper's (``seed_agents.config.core.PAPER``)
    where TRL's differ. ``beta`` keeps TRL's meaning (the KL coefficient); the paper's gate
    beta is ``gate_sharpness``."""

    opd_coef: float = field(default=PAPER.lam, metadata={"help": "lambda: weight of the gated OPD term; 0 = plain GRPO."})
    gate_sharpness: float = field(default=PAPER.gate_sharpness, metadata={"help": "Sharpness of the sigmoid gate on (teacher - student) log-probs (the paper's beta)."})
    advantage_norm: Literal["mean_std", "mean"] = field(default="mean_std", metadata={"help": "Group advantage: (r-mean)/std (ALFWorld) or r-mean (WebShop)."})
    score_batch_size: int = field(default=16, metadata={"help": "Most rows per forward when scoring teacher/reference log-probs (chunk_tokens bounds each forward too); more rows share one prefix forward."})
    share_prefix: bool = field(default=True, metadata={"help": "Compute the prompt tokens a chunk's rows share once and run each row's own tokens on top (trainers/shared_prefix.py); exact up to float rounding."})
    fuse_teacher: bool = field(default=False, metadata={"help": "Score the teacher on the prompt keys and values the loss forward computes (trainers/shared_prefix.logps_on_prompt_kv). Needs share_prefix and one optimizer step per rollout batch."})
    release_memory: bool = field(default=True, metadata={"help": "Give the heap's freed memory back to the OS after each step's rollouts, scoring, update and held-out evaluation (glibc malloc_trim, seed_agents/memory.py); values are unchanged."})
    sampled_head: bool = field(default=True, metadata={"help": "Run the LM head, log-softmax and entropy at the trained (loss-mask) completion positions only (trainers/head.py); the others read 0. Exact up to float rounding; needs chunk_tokens > 0."})
    chunk_tokens: int = field(default=8192, metadata={"help": "Token budget (rows x trimmed width) of one forward in the loss and in scoring, rows grouped by length and padding trimmed. 0: TRL's layout (every row padded to the widest)."})
    keep_activations_gb: float | None = field(default=0.0, metadata={"help": "With gradient_checkpointing: an update whose activations are estimated under this many GB keeps them (trainers/activations.py). None: a third of the free memory; 0: always recompute."})
    # TRL fields with the paper's values
    beta: float = field(default=PAPER.kl, metadata={"help": "KL(pi || pi_ref) coefficient (k3 estimator)."})
    epsilon: float = field(default=PAPER.clip_eps, metadata={"help": "PPO clip range."})
    entropy_coef: float = field(default=PAPER.entropy, metadata={"help": "Entropy bonus coefficient."})
    learning_rate: float = field(default=PAPER_LEARNING_RATE, metadata={"help": "Paper: 1e-6."})
    loss_type: str = field(default="bnpo", metadata={"help": "Token-mean over the batch (the paper's masked token-mean)."})
    temperature: float = field(default=1.0, metadata={"help": "Scoring temperature; must be 1: backends return raw logprobs."})
    steps_per_generation: int | None = field(default=1, metadata={"help": "One optimizer step per rollout batch."})
    remove_unused_columns: bool | None = field(default=False, metadata={"help": "Rows carry the task JSON in 'prompt'."})

    def __post_init__(self) -> None:
        # transformers 5 renamed gradient_checkpointing to activation_checkpointing and warns
        # whenever only the old name is set, which TRL's default does on every run; carry the
        # value over under the new name (4.x has no such field, and no warning).
        if getattr(self, "activation_checkpointing", False) is None and self.gradient_checkpointing is not None:
            self.activation_checkpointing = self.gradient_checkpointing
        super().__post_init__()
        if self.temperature != 1.0:
            raise ValueError("SEEDConfig.temperature must be 1.0: rollouts carry raw (T=1) logprobs; set the sampling temperature on the rollout")
        if self.loss_type != "bnpo":
            raise ValueError("SEEDConfig.loss_type must be 'bnpo' (masked token-mean), the normalization of the SEED objective")
        if self.num_generations and self.per_device_train_batch_size % self.num_generations:
            raise ValueError(f"per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple of "
                             f"num_generations ({self.num_generations}): a group must not be split across ranks")
        if self.fuse_teacher and (not self.share_prefix or self.num_iterations != 1 or self.steps_per_generation != 1
                                  or self.gradient_accumulation_steps != 1):
            raise ValueError("fuse_teacher scores the teacher in the loss forward, which must run the pre-update weights "
                             "and share the prompt's prefix: it needs share_prefix, num_iterations 1, "
                             "steps_per_generation 1 and gradient_accumulation_steps 1")
        if self.opd_coef < 0 or self.gate_sharpness < 0:
            raise ValueError("opd_coef and gate_sharpness must be >= 0")
        if self.keep_activations_gb is not None and self.keep_activations_gb < 0:
            raise ValueError("keep_activations_gb must be >= 0 (0: always recompute) or None (a share of the free memory)")


class EpochSeededSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` whose shuffle is re-seeded from (seed, epoch) at every
    ``set_epoch`` (the Trainer calls it before each epoch, resumed or not), so the order
    of an epoch never depends on how many epochs this process has already iterated."""

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.generator.manual_seed(((self.seed or 0) * 1_000_003 + epoch) % 2**63)


@dataclass
class RolloutBatch:
    """What one iteration's rollouts produce for the trainer."""

    trajectories: list[Trajectory]
    rows: list[Row]
    teacher_prompt_ids: list[list[int] | None]  # per row; None: no valid skill for its episode
    metrics: dict[str, float]


class Rollout(Protocol):
    """Plays tasks and returns rows; see ``trainers.rollout.GraphRollout``."""

    def collect(self, tasks: list[Task], group_size: int, iteration: int) -> RolloutBatch: ...


def _env_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """Placeholder registered with TRL, which insists on a reward source: SEED's rewards
    come from the environment through the rollout and are never computed by TRL."""
    raise RuntimeError("SEEDTrainer computes rewards from trajectories; this function is never called")


def _pad(seqs: list[list[Any]], value: Any, left: bool, dtype: torch.dtype) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    out = torch.full((len(seqs), width), value, dtype=dtype)
    for row, seq in enumerate(seqs):
        if seq:
            values = torch.tensor(seq, dtype=dtype)
            if left:
                out[row, width - len(seq):] = values
            else:
                out[row, : len(seq)] = values
    return out


def rows_to_tensors(rows: list[Row], advantages_B: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded completions, masks and old log-probs."""
    prompt_ids = _pad([r.prompt_ids for r in rows], pad_id, left=True, dtype=torch.long)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": _pad([[1] * len(r.prompt_ids) for r in rows], 0, left=True, dtype=torch.long),
        "completion_ids": _pad([r.completion_ids for r in rows], pad_id, left=False, dtype=torch.long),
        # attention covers every completion token; the loss mask only the sampled ones
        "completion_mask": _pad([[1] * len(r.completion_ids) for r in rows], 0, left=False, dtype=torch.long),
        "loss_mask": _pad([r.loss_mask for r in rows], 0, left=False, dtype=torch.long),
        "old_per_token_logps": _pad([r.old_logprobs for r in rows], 0.0, left=False, dtype=torch.float32),
        # guided openings' prefill: trained, not sampled (old log-probs filled in by the trainer)
        "guide_mask": _pad([r.guide_mask or [0] * len(r.completion_ids) for r in rows], 0, left=False, dtype=torch.long),
        "advantages": advantages_B,
    }


def length_chunks(prompt_lens: list[int], completion_lens: list[int], budget: int,
                  max_rows: int | None = None) -> list[list[int]]:
    """Row indices grouped for forwards: sorted by length, each chunk as many rows as keep
    ``rows x (widest prompt + widest completion)`` within ``budget`` tokens (at least one
    row; at most ``max_rows``). Sorting puts rows of like length together, so the padding
    each chunk still computes is small."""
    order = sorted(range(len(prompt_lens)), key=lambda i: (prompt_lens[i] + completion_lens[i], i))
    chunks: list[list[int]] = []
    rows: list[int] = []
    p = c = 0
    for i in order:
        wp, wc = max(p, prompt_lens[i]), max(c, completion_lens[i])
        if rows and ((len(rows) + 1) * (wp + wc) > budget or (max_rows is not None and len(rows) >= max_rows)):
            chunks.append(rows)
            rows, wp, wc = [], prompt_lens[i], completion_lens[i]
        rows.append(i)
        p, c = wp, wc
    if rows:
        chunks.append(rows)
    return chunks


def _chunk_cost(prompts: list[list[int]], completion_lens: list[int], rows: list[int]) -> int:
    """Tokens a chunk's forward computes: its shared prefix once (``worth_sharing``), then
    every row padded to the widest own prompt tail plus the widest completion."""
    shared = worth_sharing([prompts[i] for i in rows])
    width = max(len(prompts[i]) for i in rows) - shared + max(completion_lens[i] for i in rows)
    return shared + len(rows) * width


def prefix_chunks(prompts: list[list[int]], completion_lens: list[int], budget: int,
                  max_rows: int | None = None) -> list[list[int]]:
    """Row indices grouped for forwards that share their prompt's prefix: ``length_chunks``'
    job when the shared prefix is computed once (``SEEDConfig.share_prefix``).

    Rows are taken in token order, so the rows that begin alike sit side by side: the turns
    of one episode (under SEED's teacher prompts, the same skill), the replays of one task.
    Ordered by length instead, a chunk mixes episodes, and the prefix its rows share ends
    where the first skill or question begins. A row joins the chunk before it when that costs
    no more tokens than a forward of its own (``_chunk_cost``: what sharing saves against what
    padding adds), within the same bound as ``length_chunks``: ``rows x (widest prompt +
    widest completion) <= budget`` (at least one row), at most ``max_rows``."""
    order = sorted(range(len(prompts)), key=lambda i: (prompts[i], completion_lens[i], i))
    chunks: list[list[int]] = []
    rows: list[int] = []
    cost = 0
    for i in order:
        if rows:
            grown = [*rows, i]
            wp, wc = max(len(prompts[j]) for j in grown), max(completion_lens[j] for j in grown)
            fits = len(grown) * (wp + wc) <= budget and (max_rows is None or len(grown) <= max_rows)
            grown_cost = _chunk_cost(prompts, completion_lens, grown) if fits else 0
            if fits and grown_cost <= cost + len(prompts[i]) + completion_lens[i]:
                rows, cost = grown, grown_cost
                continue
            chunks.append(rows)
        rows, cost = [i], len(prompts[i]) + completion_lens[i]
    if rows:
        chunks.append(rows)
    return chunks


def tail_groups(lengths: list[int], fixed_cost: int = 128) -> list[list[int]]:
    """Indices grouped for the fused teacher's forwards: in order of length, a row opens a new
    group when padding the group to it would compute more than ``fixed_cost`` extra tokens
    (about what another forward costs in fixed work). The tails differ several-fold (a skill
    of 30 tokens and a 16-token completion beside a skill of 120 and a 64-token call); one
    padded forward over them would compute mostly padding."""
    groups: list[list[int]] = []
    width = 0
    for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if groups and (lengths[i] - width) * len(groups[-1]) <= fixed_cost:
            groups[-1].append(i)
        else:
            groups.append([i])
        width = lengths[i]
    return groups


@dataclass
class _TeacherRequest:
    """The teacher prompts of a loss forward's rows (None: no skill), and the log-probs the
    forward's chunks fill in on top of their prompt keys and values (``fuse_teacher``)."""

    prompts: list[list[int] | None]
    logps: torch.Tensor
    done: torch.Tensor


def _log_peak(metrics: dict[str, list[float]], name: str) -> None:
    """The phase's peak RSS (``seed_agents.memory.PEAK_RSS``) as the step's metric ``name``;
    nothing where it cannot be measured."""
    peak = PEAK_RSS.phase_gb()
    if peak is not None:
        metrics[name].append(peak)


class _UpdatePeak(TrainerCallback):
    """The update's peak RSS (loss forward, backward, optimizer step), read when the step ends,
    before a weight sync or held-out evaluation starts (this callback is registered before
    those of ``seed_agents.app.train``) and before the step's metrics are logged."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
        _log_peak(self.trainer._metrics["train"], "mem/update_peak_gb")


class SEEDTrainer(GRPOTrainer):
    """Thin subclass: our rollouts and our loss; TRL's everything else."""

    def __init__(self, model: Any, args: SEEDConfig, train_dataset: Any, rollout: Rollout, **kwargs: Any) -> None:
        super().__init__(model=model, reward_funcs=[_env_reward], args=args, train_dataset=train_dataset, **kwargs)
        self.rollout = rollout
        self.coef = SEEDCoefficients(clip_eps=args.epsilon, entropy=args.entropy_coef, lam=args.opd_coef,
                                     kl=args.beta, gate_sharpness=args.gate_sharpness)
        self.last_batch: RolloutBatch | None = None
        self._teacher_request: _TeacherRequest | None = None
        self._activation_cost: ActivationCost | None = None
        self._keeping: bool | None = None  # the last update's choice, to print only the changes
        self.add_callback(_UpdatePeak(self))

    def _get_train_sampler(self, dataset: Any = None) -> EpochSeededSampler:
        dataset = self.train_dataset if dataset is None else dataset
        return EpochSeededSampler(
            data_source=dataset, mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset, seed=self.args.seed)

    # -- rollouts -> tensors ---------------------------------------------------------
    # -- forwards over rows of mixed lengths -------------------------------------------------
    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           compute_entropy: bool = False, scored: torch.Tensor | None = None,
                                           **kwargs: Any) -> Any:
        """TRL's scorer, run on length-grouped, trimmed chunks (``length_chunks``; with a
        shared prefix, ``prefix_chunks``: grouped by their prompts' tokens).

        TRL pads every row to the batch's widest prompt plus its widest completion; a step-level
        agent's rows differ several-fold in length (a first turn against a fifth, a one-word
        answer against a 64-token call), so most of that padding was computed. Rows are scored
        in groups of similar length with each group's padding cut off, and the results are put
        back in the batch's order and width. Exact up to float rounding: padding is masked out,
        and a left-pad shift leaves RoPE's relative positions unchanged (the unit tests compare
        both layouts). Multimodal inputs, and the loss under DDP, keep TRL's path.

        ``scored`` ((rows, ``logits_to_keep``) bool, the positions the caller reads): with
        ``sampled_head`` the LM head runs there only and the other positions are 0
        (``trainers.head``).
        """
        if (self.args.chunk_tokens <= 0 or any(v is not None for v in kwargs.values())
                or (torch.is_grad_enabled() and isinstance(model, torch.nn.parallel.DistributedDataParallel))):
            # Under DDP the loss gets one forward through the wrapper, as TRL's: DDP all-reduces a
            # parameter's gradient once per forward it saw, so chunks (several forwards), a decoder
            # called past the wrapper (no all-reduce) or a checkpointed prefix replayed in backward
            # (a forward during the reduction) would each break the ranks' lockstep.
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, compute_entropy=compute_entropy,
                **kwargs)
        width = input_ids.size(1)
        prompt_width = width - logits_to_keep
        prompt_lens = attention_mask[:, :prompt_width].sum(1).tolist()
        completion_lens = attention_mask[:, prompt_width:].sum(1).tolist()
        parts: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []
        # Token order for the scoring passes (teacher, reference, old log-probs: no gradient),
        # where SEED's extra cost is; the loss forward keeps length order until a benchmark
        # shows token order pays there too (its chunks can be smaller, and a forward has a
        # fixed cost the token count does not see).
        if self._may_share(model) and not torch.is_grad_enabled():
            prompts = [input_ids[i, prompt_width - n:prompt_width].tolist() for i, n in enumerate(prompt_lens)]
            chunks = prefix_chunks(prompts, completion_lens, self.args.chunk_tokens, max_rows=batch_size)
        else:
            chunks = length_chunks(prompt_lens, completion_lens, self.args.chunk_tokens, max_rows=batch_size)
        for rows in chunks:
            p = max(max(prompt_lens[i] for i in rows), 1)
            c = max(max(completion_lens[i] for i in rows), 1)
            idx = torch.tensor(rows, device=input_ids.device)
            span = slice(prompt_width - p, prompt_width + c)
            ids, mask = input_ids[idx, span], attention_mask[idx, span]
            keep = scored[idx, :c] if scored is not None and self.args.sampled_head else None
            shared = self._shared_prefix(model, ids, p, [prompt_lens[i] for i in rows])
            if shared:
                kept: list[PromptKV] | None = [] if self._teacher_request is not None else None
                logps, entropies = shared_prefix_logps(model, ids, mask, c, shared, compute_entropy=compute_entropy,
                                                       autocast=self.accelerator.autocast, keep_kv=kept, keep=keep)
                if kept:
                    self._fused_teacher(model, kept[0], rows, ids, p, [prompt_lens[i] for i in rows],
                                        [completion_lens[i] for i in rows], keep=keep)
            elif keep is not None and plain_head(model) is not None:
                logps, entropies = completion_logps(model, ids, mask, c, keep, compute_entropy=compute_entropy,
                                                    autocast=self.accelerator.autocast, recompute=recomputes(model))
            else:
                logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, mask, c, compute_entropy=compute_entropy)
            pad = (0, logits_to_keep - c)
            parts.append((rows, torch.nn.functional.pad(logps, pad),
                          torch.nn.functional.pad(entropies, pad) if entropies is not None else None))
        order = torch.tensor([i for rows, _, _ in parts for i in rows], device=input_ids.device)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        logps = torch.cat([lp for _, lp, _ in parts])[back]
        entropies = torch.cat([e for _, _, e in parts])[back] if compute_entropy else None
        return logps, entropies, None

    def _fused_teacher(self, model: Any, kv: PromptKV, rows: list[int], ids: torch.Tensor, prompt_width: int,
                       prompt_lens: list[int], completion_lens: list[int], keep: torch.Tensor | None = None) -> None:
        """A loss chunk's teacher log-probs, scored on top of the prompt keys and values its
        forward kept (``fuse_teacher``): each teacher prompt shares its row's prompt up to
        where the skill went in. A row whose teacher shares nothing, or has no token of its
        own before the completion, is left to a pass of its own. ``keep`` (the chunk's rows,
        completion positions): where the loss reads the teacher (``sampled_head``; the OPD mask
        is inside the loss mask), the head's only positions."""
        request = self._teacher_request
        assert request is not None
        local: list[int] = []
        shared: list[int] = []
        tails: list[list[int]] = []
        lens: list[int] = []
        for j, i in enumerate(rows):
            teacher = request.prompts[i]
            if teacher is None or not completion_lens[j]:
                continue
            n = common_prefix_len([ids[j, prompt_width - prompt_lens[j]:prompt_width].tolist(), teacher])
            if n < 1 or n >= len(teacher):
                continue
            local.append(j)
            shared.append(n)
            tails.append(teacher[n:] + ids[j, prompt_width:prompt_width + completion_lens[j]].tolist())
            lens.append(completion_lens[j])
        for group in tail_groups([len(t) for t in tails]):
            longest = max(lens[k] for k in group)
            group_keep = None if keep is None else torch.stack(
                [torch.nn.functional.pad(keep[local[k], :lens[k]], (0, longest - lens[k])) for k in group])
            got = logps_on_prompt_kv(model, kv, [local[k] for k in group], [shared[k] for k in group],
                                     [tails[k] for k in group], [lens[k] for k in group],
                                     autocast=self.accelerator.autocast, keep=group_keep)
            for g, k in enumerate(group):
                request.logps[rows[local[k]], :lens[k]] = got[g, :lens[k]].to(request.logps.dtype)
                request.done[rows[local[k]]] = True

    def _may_share(self, model: Any) -> bool:
        """Whether this forward may compute a shared prefix once (``share_prefix`` on, and
        under gradients only where ``trainers.shared_prefix`` supports the model)."""
        return self.args.share_prefix and (not torch.is_grad_enabled() or prefix_supported(model))

    def _shared_prefix(self, model: Any, ids: torch.Tensor, prompt_width: int, prompt_lens: list[int]) -> int:
        """How many leading tokens a chunk's rows share, where computing them once pays
        (``trainers.shared_prefix``); 0: score the chunk as TRL does."""
        if not self._may_share(model):
            return 0
        return worth_sharing([ids[i, prompt_width - n:prompt_width].tolist() for i, n in enumerate(prompt_lens)])

    def _generate_and_score_completions(self, generation_batch: list[dict[str, Any]]) -> dict[str, Any]:
        tasks = list({t.task_id: t for t in (Task.model_validate_json(x["prompt"]) for x in generation_batch)}.values())
        metrics = self._metrics["train"]
        PEAK_RSS.reset()
        t0 = time.perf_counter()
        # The iteration is the optimizer step about to happen: stable across --resume.
        batch = self.rollout.collect(tasks, self.num_generations, self.state.global_step)
        _log_peak(metrics, "mem/rollout_peak_gb")
        if self.args.release_memory:  # the episodes' key/value caches, freed, before scoring grows the heap
            release_free_memory()
        t_rollout = time.perf_counter() - t0
        self.last_batch = batch
        PEAK_RSS.reset()
        t1 = time.perf_counter()
        out = self.score_batch(batch)
        _log_peak(metrics, "mem/score_peak_gb")
        if self.args.release_memory:  # the scoring passes' logits, before the loss forward
            release_free_memory()
        t_score = time.perf_counter() - t1
        PEAK_RSS.reset()  # the update's: read at the step's end (_UpdatePeak)

        for name, value in batch.metrics.items():
            metrics[name].append(value)
        measured = [t.reward for t in batch.trajectories if t.fault is None]  # faults carry no reward
        metrics["reward"].append(sum(measured) / len(measured) if measured else 0.0)
        metrics["time/rollout_s"].append(t_rollout)
        metrics["time/score_s"].append(t_score)
        metrics["rows"].append(float(len(batch.rows)))
        return out

    def score_batch(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Rows -> the loss inputs: advantages, padded tensors, teacher and reference
        log-probs. No rollouts: benchmarks and tests can re-score a fixed batch."""
        if not batch.rows:
            faulted = sum(t.fault is not None for t in batch.trajectories)
            raise NoTrainableRows(
                f"no trainable rows this iteration: of {len(batch.trajectories)} episodes, {faulted} ended in "
                f"infrastructure faults and no group kept two clean episodes with LLM calls; "
                f"see trajectories.jsonl, fix the cause and rerun with --resume")
        reward_of = {t.trajectory_id: t.reward for t in batch.trajectories}
        rewards = [reward_of[r.trajectory_id] for r in batch.rows]
        adv = group_advantages(rewards, [r.group_id for r in batch.rows], norm=self.args.advantage_norm)
        pad_id = self.processing_class.pad_token_id
        if pad_id is None:
            pad_id = self.processing_class.eos_token_id
        out = rows_to_tensors(batch.rows, adv, pad_id)
        device = self.accelerator.device
        out = {k: v.to(device) for k, v in out.items()}
        out["old_per_token_logps"] = self._guide_old_logps(out)
        if self._fuses_teacher():  # scored in the loss forward, on its prompt keys and values
            has_skill = [p is not None for p in batch.teacher_prompt_ids]
            out["teacher_per_token_logps"] = torch.zeros_like(out["old_per_token_logps"])
            out["opd_mask"] = torch.tensor(has_skill, device=device).unsqueeze(-1).to(out["loss_mask"].dtype) * out["loss_mask"]
            prompts = [p or [] for p in batch.teacher_prompt_ids]
            out["teacher_prompt_ids"] = _pad(prompts, pad_id, left=True, dtype=torch.long).to(device)
            out["teacher_prompt_mask"] = _pad([[1] * len(p) for p in prompts], 0, left=True, dtype=torch.long).to(device)
        else:
            out["teacher_per_token_logps"], out["opd_mask"] = self._teacher_logps(batch, out, pad_id)
        if self.beta != 0.0:
            out["ref_per_token_logps"] = self._ref_logps(out)
        return out

    @torch.no_grad()
    def _score(self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, out: dict[str, torch.Tensor]) -> torch.Tensor:
        input_ids = torch.cat([prompt_ids, out["completion_ids"]], dim=1)
        attention = torch.cat([prompt_mask, out["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention, out["completion_ids"].size(1), batch_size=self.args.score_batch_size,
            scored=out.get("loss_mask"))
        return logps

    def _guide_old_logps(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Old log-probs with a guided opening's prefill scored by the pre-update policy.

        The prefill was not sampled, so no server recorded a log-prob for it. Scoring it
        with the policy about to be updated puts the PPO ratio of those tokens at 1 at the
        first step, as for sampled ones: the update is the advantage times the gradient of
        their log-prob (clipped like the rest), i.e. the outcome decides whether opening
        with a call becomes more or less likely. An approximation, stated in
        docs/training.md: the tokens came from the steering, not from this policy."""
        guided = out["guide_mask"].bool()
        rows = guided.any(-1)
        if not rows.any():
            return out["old_per_token_logps"]
        idx = rows.nonzero().squeeze(-1)
        sub = {"completion_ids": out["completion_ids"][idx], "completion_mask": out["completion_mask"][idx],
               "loss_mask": out["loss_mask"][idx]}
        own = self._score(self.model, out["prompt_ids"][idx], out["prompt_mask"][idx], sub).to(out["old_per_token_logps"].dtype)
        old = out["old_per_token_logps"].clone()
        old[idx] = torch.where(guided[idx], own, old[idx])
        # whether the opening transfers shows first here, before a greedy choice flips: the
        # policy's log-prob of the prefill's first token (the call's opening) where it was free
        first = guided[idx].float().argmax(-1)
        metrics = self._metrics["train"]
        metrics["guide/first_logp"].append(own.gather(-1, first[:, None]).mean().item())
        metrics["guide/logp"].append(own[guided[idx]].mean().item())
        return old

    def _fuses_teacher(self) -> bool:
        return bool(self.args.fuse_teacher and self.coef.lam and self.coef.gate_sharpness)

    def _teacher_logps(self, batch: RolloutBatch, out: dict[str, torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-update policy log-probs of the sampled completions under the skill prompt.

        Ungated (``gate_sharpness`` 0) the gate is 0.5 on every token, so the teacher cannot
        change the gradient (``-0.5 * grad l_theta``): no teacher pass runs, and the
        recorded log-probs stand in for it, so the logged OPD loss reads as the drift from
        them rather than as a teacher's margin."""
        has_skill = torch.tensor([p is not None for p in batch.teacher_prompt_ids], device=out["advantages"].device)
        if not self.coef.gate_sharpness:
            opd_mask = has_skill.unsqueeze(-1).to(out["loss_mask"].dtype) * out["loss_mask"]
            return out["old_per_token_logps"].detach().clone(), opd_mask
        teacher_logps = torch.zeros_like(out["old_per_token_logps"])
        if self.coef.lam and has_skill.any():
            self._teacher_pass(batch.teacher_prompt_ids, has_skill.nonzero().squeeze(-1), out, teacher_logps, pad_id)
        opd_mask = has_skill.unsqueeze(-1).to(out["loss_mask"].dtype) * out["loss_mask"]
        return teacher_logps, opd_mask

    def _teacher_pass(self, prompts: list[list[int] | None], idx: torch.Tensor, out: dict[str, torch.Tensor],
                      into: torch.Tensor, pad_id: int) -> None:
        """The teacher log-probs of rows ``idx`` in a forward of their own, into ``into``."""
        chosen = [prompts[i] or [] for i in idx.tolist()]
        t_ids = _pad(chosen, pad_id, left=True, dtype=torch.long).to(into.device)
        t_mask = _pad([[1] * len(p) for p in chosen], 0, left=True, dtype=torch.long).to(into.device)
        sub = {"completion_ids": out["completion_ids"][idx], "completion_mask": out["completion_mask"][idx],
               "loss_mask": out["loss_mask"][idx]}
        into[idx] = self._score(self.model, t_ids, t_mask, sub).to(into.dtype)

    def _ref_logps(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.ref_model is not None:
            return self._score(self.ref_model, out["prompt_ids"], out["prompt_mask"], out)
        from trl.trainer.utils import use_adapter  # PEFT: the base model is the reference

        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self._score(self.model, out["prompt_ids"], out["prompt_mask"], out)

    def _finish_teacher(self, request: _TeacherRequest, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The fused teacher's log-probs, the rows no chunk could score on its prompt keys and
        values scored in a pass of their own; the share fused goes to the metrics."""
        wanted = torch.tensor([p is not None for p in request.prompts], device=request.done.device)
        left = (wanted & ~request.done).nonzero().squeeze(-1)
        if left.numel():
            pad_id = self.processing_class.pad_token_id
            self._teacher_pass(request.prompts, left, inputs, request.logps,
                               self.processing_class.eos_token_id if pad_id is None else pad_id)
        if wanted.any():
            self._metrics["train"]["teacher/fused_rows"].append((request.done & wanted).float().sum().item()
                                                                / wanted.float().sum().item())
        return request.logps

    # -- loss ------------------------------------------------------------------------
    def compute_loss(self, model: Any, inputs: dict[str, torch.Tensor], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's loss; its checkpointed layers keep their activations instead of recomputing them
        in backward where ``_keeps_activations`` says they fit."""
        keep = self._keeps_activations(model, inputs)
        with recompute(model, False) if keep else contextlib.nullcontext():
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def _keeps_activations(self, model: Any, inputs: dict[str, torch.Tensor]) -> bool:
        """Whether this update keeps its activations: only with ``keep_activations_gb`` above 0
        and its activations, estimated from its tokens, under that budget
        (``trainers.activations``). The estimate and the choice go to the step's metrics; the
        choice is printed when it changes."""
        keep_gb = self.args.keep_activations_gb
        if keep_gb == 0 or not torch.is_grad_enabled() or not checkpointed_layers(model):
            return False  # nothing to choose: checkpointed layers recompute, as in TRL
        if self._activation_cost is None:
            self._activation_cost = measure_activations(model, self.accelerator.autocast)
        tokens = int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
        need, budget = self._activation_cost.estimate(tokens), budget_bytes(keep_gb, inputs["prompt_ids"].device)
        keep = need <= budget
        self._metrics["train"]["update/activations_gb"].append(need / 1e9)
        self._metrics["train"]["update/recompute"].append(float(not keep))
        if keep != self._keeping:
            print(f"update: activations ~{need / 1e9:.1f} GB for {tokens} tokens (estimated), budget {budget / 1e9:.1f} GB"
                  f"{'' if keep_gb is not None else ' (a third of the free memory)'}: "
                  + ("kept, nothing recomputed" if keep else "recomputed in backward (gradient checkpointing)"), flush=True)
        self._keeping = keep
        return keep

    def _compute_loss(self, model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        teacher = inputs["teacher_per_token_logps"]
        request = None
        if "teacher_prompt_ids" in inputs:  # fuse_teacher: the chunks below fill it in
            prompts = [ids[m.bool()].tolist() or None
                       for ids, m in zip(inputs["teacher_prompt_ids"], inputs["teacher_prompt_mask"])]
            request = _TeacherRequest(prompts, torch.zeros_like(teacher),
                                      torch.zeros(len(prompts), dtype=torch.bool, device=teacher.device))
        self._teacher_request = request
        try:
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention, inputs["completion_ids"].size(1), compute_entropy=True,
                scored=inputs["loss_mask"])
        finally:
            self._teacher_request = None
        if request is not None:
            teacher = self._finish_teacher(request, inputs)
        loss, metrics = seed_objective(
            logps, inputs["old_per_token_logps"], inputs["advantages"], inputs["loss_mask"],
            entropy_B_T=entropies, ref_logp_B_T=inputs.get("ref_per_token_logps"),
            teacher_logp_B_T=teacher, opd_mask_B_T=inputs["opd_mask"], coef=self.coef)
        for name, value in metrics.items():
            self._metrics["train"][name].append(value)
        # like TRL's token-mean losses: scaled for gradient accumulation (HF auto-scaling is off)
        return loss / (self.current_gradient_accumulation_steps if self.model.training else 1.0)
