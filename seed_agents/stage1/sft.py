"""``seed-agents skills sft``: teach the policy to be its own hindsight analyzer.

Stage 1 of SEED fine-tunes the policy on (analyzer prompt -> skill JSON) pairs written by
a stronger analyzer, so that in stage 2 the policy's own greedy analysis parses and says
something useful. This is TRL's ``SFTTrainer`` on a conversational prompt-completion
dataset with the loss on the completion only (``CompletionOnlySFTTrainer``: the LM head
meets the completion tokens only); the output folder is a plain Hugging Face
model (a LoRA adapter is merged into the weights) that ``seed-agents train`` takes as
``backend.model``.

The held-out split is by task, so the held-out prompts come from episodes of tasks the
model never trained on (several episodes of one task share most of their prompt text).
Two numbers say whether it worked, each before and after training: the held-out loss,
and the rate at which greedy replies to held-out prompts pass ``parse_skill`` (the same
strict parser stage 2 applies; an unparsable skill gives no distillation signal).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.aio import run_sync
from seed_agents.config import ConfigError, first_error
from seed_agents.types import SkillExample


class SFTRunConfig(BaseModel):
    """`seed-agents skills sft`: SFT on analyzer prompt -> skill JSON (paper: 3 epochs, lr 5e-6)."""

    model_config = ConfigDict(extra="forbid")

    examples: list[Path] = Field(default_factory=list, description="examples.jsonl files from `skills collect`; only valid examples are used.")
    model: str = Field("smollm2-135m", description="Model to fine-tune: alias, local folder or hub id.")
    out: Path = Field(Path("runs/skills_sft"), description="Output directory: model/ (for `seed-agents train`) and sft_summary.json.")
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of tasks held out (of examples, when there are too few tasks).")
    epochs: float = Field(3.0, gt=0.0, le=1000.0, description="Training epochs (paper: 3).")
    learning_rate: float = Field(5e-6, gt=0.0, le=1.0, description="Peak learning rate, linear decay (paper: 5e-6 full fine-tuning; LoRA wants ~1e-4 or more).")
    batch_size: int = Field(4, ge=1, le=4096, description="Examples per device per forward pass.")
    grad_accum: int = Field(1, ge=1, le=4096, description="Forward passes per optimizer step (effective batch = batch_size x grad_accum).")
    max_length: int = Field(4096, ge=32, le=131072, description="Longest prompt + completion in tokens; longer examples are dropped, not truncated (a cut prompt would train on a context the model never sees).")
    activation_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less memory, ~30% more compute (TRL's default is on; off suits small models).")
    lora_r: int | None = Field(None, ge=1, le=512, description="Train a LoRA adapter of this rank (merged into the saved weights) instead of all weights.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha.")
    seed: int = Field(0, description="Seed of the split, the data order and the initialization of LoRA.")
    eval_max_tokens: int = Field(256, ge=8, le=8192, description="Generation budget of the held-out parse-rate check (greedy).")
    max_eval_examples: int = Field(32, ge=1, le=100000, description="Held-out examples used for the parse-rate check (the loss uses all).")
    eval_batch_size: int = Field(8, ge=1, le=1024, description="Held-out prompts generated together in the parse-rate check.")
    completion_head: bool = Field(True, description="Apply the LM head to the completion tokens only (the same loss, a fraction of the work); false: TRL's fused head over every position, for side-by-side timing against TRL.")
    precision: Literal["auto", "float32", "bfloat16"] = Field("float32", description=(
        "The number format of the SFT's matmuls and parse-rate checks (autocast over fp32 weights, as "
        "backend.precision in train). auto: bfloat16 where the CPU has bf16 instructions."))


# -- data -------------------------------------------------------------------------------


def read_examples(paths: list[Path]) -> tuple[list[SkillExample], dict[str, int]]:
    """Valid examples from ``paths`` (deduplicated by analyzer and example id) and counts."""
    from seed_agents.capture import read_jsonl

    if not paths:
        raise ConfigError("no examples files: pass at least one examples.jsonl from `seed-agents skills collect` (--examples)")
    examples: list[SkillExample] = []
    seen: set[tuple[str, str]] = set()
    counts = Counter[str]()
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"examples file {path} does not exist; pass the examples.jsonl written by "
                              f"`seed-agents skills collect`")
        try:
            records = read_jsonl(path, SkillExample)
        except ValueError as e:
            raise ConfigError(f"{path}: not a file of SkillExample records ({first_error(e)}); pass the "
                              f"examples.jsonl written by `seed-agents skills collect`") from None
        for ex in records:
            counts["read"] += 1
            key = (ex.analyzer, ex.example_id)
            if key in seen:
                counts["duplicate"] += 1
                continue
            seen.add(key)
            if not ex.valid:
                counts["invalid"] += 1
                continue
            examples.append(ex)
    counts["valid"] = len(examples)
    if not examples:
        raise ConfigError(f"no valid examples in {', '.join(map(str, paths))} ({counts['read']} read, {counts['invalid']} invalid)")
    return examples, dict(counts)


def split_examples(examples: list[SkillExample], heldout_fraction: float, seed: int) -> tuple[list[SkillExample], list[SkillExample], dict[str, Any]]:
    """(train, held-out, info): held-out examples come from tasks not trained on.

    Tasks are shuffled with ``seed`` and round(fraction x tasks) of them are held out.
    When that leaves no held-out task or no training task, examples are split instead
    (``info["mode"] == "example"`` and ``info["note"]`` says why). Deterministic.
    """
    if len(examples) < 2:
        raise ConfigError(f"{len(examples)} valid example(s): a held-out split needs at least 2 (one to train on, one to hold out)")
    rng = random.Random(seed)
    tasks = sorted({ex.task_id for ex in examples})
    n_held = int(heldout_fraction * len(tasks) + 0.5)
    if 1 <= n_held < len(tasks):
        rng.shuffle(tasks)
        held = set(tasks[:n_held])
        train = [ex for ex in examples if ex.task_id not in held]
        heldout = [ex for ex in examples if ex.task_id in held]
        info = {"mode": "task", "note": None}
    else:
        order = list(range(len(examples)))
        rng.shuffle(order)
        n = min(len(examples) - 1, max(1, int(heldout_fraction * len(examples) + 0.5)))
        held_idx = set(order[:n])
        train = [ex for i, ex in enumerate(examples) if i not in held_idx]
        heldout = [ex for i, ex in enumerate(examples) if i in held_idx]
        info = {"mode": "example", "note": (
            f"only {len(tasks)} task(s): cannot hold out {heldout_fraction:g} of the tasks, so examples are split "
            "instead; held-out prompts share tasks with training prompts and the held-out numbers are optimistic")}
    info["train_task_ids"] = sorted({ex.task_id for ex in train})
    info["heldout_task_ids"] = sorted({ex.task_id for ex in heldout})
    return train, heldout, info


def _prompt(ex: SkillExample) -> list[dict[str, str]]:
    return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in ex.messages]


def to_dataset_rows(examples: list[SkillExample]) -> list[dict[str, Any]]:
    """TRL conversational prompt-completion rows."""
    return [{"prompt": _prompt(ex), "completion": [{"role": "assistant", "content": ex.completion}]} for ex in examples]


def _length(tokenizer: Any, ex: SkillExample) -> int:
    text = tokenizer.apply_chat_template(_prompt(ex) + [{"role": "assistant", "content": ex.completion}], tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# -- the held-out checks ----------------------------------------------------------------


def parse_rate(model: Any, tokenizer: Any, examples: list[SkillExample], *, max_tokens: int, batch_size: int = 8,
               samples: int = 3, compute_dtype: Any = None) -> dict[str, Any]:
    """Greedy replies to ``examples``' prompts, parsed by ``parse_skill``: the rate that
    parses, reject reasons, and a few replies to read. Rendered and decoded exactly as the
    stage-2 hindsight node does (``SeedChatModel`` over a ``LocalBackend``)."""
    from seed_agents.backends.local import LocalBackend
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.skills import messages_from_dicts, parse_skill
    from seed_agents.types import SamplingParams

    if not examples:
        return {"n": 0, "parse_rate": None, "reject_reasons": {}, "samples": []}
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=batch_size, compute_dtype=compute_dtype)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))

    async def replies() -> list[str]:
        out = await asyncio.gather(*(llm.ainvoke(messages_from_dicts(_prompt(ex))) for ex in examples))
        return [str(r.content) for r in out]

    texts = run_sync(replies())
    reasons = Counter[str]()
    ok = 0
    for text in texts:
        reason = parse_skill(text)[2]
        if reason is None:
            ok += 1
        else:
            reasons[reason.split(":")[0]] += 1
    return {"n": len(texts), "parse_rate": ok / len(texts), "reject_reasons": dict(reasons.most_common()),
            "samples": texts[:samples]}


# -- the run ----------------------------------------------------------------------------


SFT_FILES = ("sft_summary.json", "model", "checkpoints")
"""What `skills sft` writes into --out: what --overwrite replaces."""


def run_sft(cfg: SFTRunConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Split, measure, train, measure again, save; return (and write) the summary."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from seed_agents.models import check_model_folder, resolve_model
    from seed_agents.precision import resolve_precision
    from seed_agents.preflight import check_out, replace_run
    from seed_agents.stage1.completion_sft import CompletionOnlySFTTrainer

    # -- checks: nothing in --out is written or moved until the examples and the model are good
    t0 = time.perf_counter()
    examples, counts = read_examples(list(cfg.examples))
    out = Path(cfg.out)
    check_out(out, holds_run=(out / "sft_summary.json").exists(), overwrite=overwrite, what="an SFT run (sft_summary.json)")
    path = resolve_model(cfg.model)
    check_model_folder(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ConfigError(f"model {cfg.model!r} has no chat template, so the analyzer prompt cannot be rendered; "
                          f"pass a chat (instruct) model")
    kept = [ex for ex in examples if _length(tokenizer, ex) <= cfg.max_length]
    counts["too_long"] = len(examples) - len(kept)
    if not kept:
        raise ConfigError(f"all {len(examples)} valid examples are longer than max_length={cfg.max_length} tokens; "
                          f"raise --max-length")
    train, heldout, split = split_examples(kept, cfg.heldout_fraction, cfg.seed)
    if split["note"]:
        print(f"note: {split['note']}", flush=True)
    eval_subset = heldout[: cfg.max_eval_examples]

    dtype, why = resolve_precision(cfg.precision)
    print(f"SFT computes in {why}", flush=True)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    print(f"held-out parse rate of {cfg.model} ({len(eval_subset)} prompts, greedy) ...", flush=True)
    before = parse_rate(model, tokenizer, eval_subset, max_tokens=cfg.eval_max_tokens, batch_size=cfg.eval_batch_size,
                        compute_dtype=dtype)

    # -- the run: --overwrite's old model and summary are deleted only once it has finished
    with replace_run(out, SFT_FILES):  # sft_summary.json is written last: it marks a finished run
        peft_config = None
        if cfg.lora_r:
            from peft import LoraConfig

            peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM")
        args = SFTConfig(
            output_dir=str(out / "checkpoints"), num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
            per_device_train_batch_size=cfg.batch_size, per_device_eval_batch_size=cfg.batch_size,
            gradient_accumulation_steps=cfg.grad_accum, max_length=cfg.max_length, completion_only_loss=True,
            eval_strategy="epoch", save_strategy="no", logging_steps=1, report_to=[], seed=cfg.seed,
            activation_checkpointing=cfg.activation_checkpointing, use_cpu=not torch.cuda.is_available(),
            bf16=dtype == torch.bfloat16, disable_tqdm=True,
        )
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # TRL's map() steps would print eight bars per run
        try:
            trainer_cls = CompletionOnlySFTTrainer if cfg.completion_head else SFTTrainer
            trainer = trainer_cls(model=model, args=args, processing_class=tokenizer, peft_config=peft_config,
                                 train_dataset=datasets.Dataset.from_list(to_dataset_rows(train)),
                                 eval_dataset=datasets.Dataset.from_list(to_dataset_rows(heldout)))
            trainer.remove_callback(PrinterCallback)
            trainer.add_callback(_epoch_printer())
            loss_before = trainer.evaluate()["eval_loss"]
            print(f"held-out loss {loss_before:.4f}; training on {len(train)} examples ({cfg.epochs:g} epochs) ...", flush=True)
            train_out = trainer.train()
            last = next((e for e in reversed(trainer.state.log_history) if "eval_loss" in e), None)
            if last is not None and last["step"] == trainer.state.global_step:
                loss_after = last["eval_loss"]  # the end-of-epoch evaluation already measured the final weights
            else:
                loss_after = trainer.evaluate()["eval_loss"]
        finally:
            if bars:
                datasets.enable_progress_bars()

        # -- save a plain model folder: what `seed-agents train` loads as backend.model --------
        final = trainer.model
        if cfg.lora_r:
            final = final.merge_and_unload()
        model_dir = out / "model"
        if model_dir.exists():
            shutil.rmtree(model_dir)
        final.save_pretrained(str(model_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(model_dir))
        shutil.rmtree(out / "checkpoints", ignore_errors=True)

        print("held-out parse rate of the trained model ...", flush=True)
        after = parse_rate(final, tokenizer, eval_subset, max_tokens=cfg.eval_max_tokens, batch_size=cfg.eval_batch_size,
                           compute_dtype=dtype)
        summary = {
            "model": cfg.model, "model_dir": str(model_dir), "lora_r": cfg.lora_r, "examples": counts,
            "split": {**split, "n_train": len(train), "n_heldout": len(heldout)},
            "heldout_task_ids": split["heldout_task_ids"],
            "heldout_loss": {"before": loss_before, "after": loss_after},
            "parse_rate": {"before": before["parse_rate"], "after": after["parse_rate"], "n": after["n"]},
            "generations": {"before": before, "after": after},
            "train_loss": train_out.training_loss,
            "heldout_loss_curve": [{"step": 0, "epoch": 0.0, "loss": loss_before}] + [
                {"step": e["step"], "epoch": e.get("epoch", 0.0), "loss": e["eval_loss"]}
                for e in trainer.state.log_history if "eval_loss" in e],
            "wall_s": time.perf_counter() - t0,
            "config": json.loads(cfg.model_dump_json()),
        }
        out.mkdir(parents=True, exist_ok=True)
        (out / "sft_summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _epoch_printer(every_s: float = 30.0) -> Any:
    """A callback printing a progress line at most every ``every_s`` seconds (step, s/step,
    time left) and one line per epoch, instead of the Trainer's dict per step: an epoch on a
    loaded 2-core machine takes minutes, and a first run must not sit silent through it.
    (Built here: importing transformers at module level would slow down the CLI.)"""
    from transformers import TrainerCallback

    class EpochPrinter(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0 = self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            now = time.perf_counter()
            if now - self.last < every_s or not state.max_steps:
                return
            self.last = now
            per_step = (now - self.t0) / max(state.global_step, 1)
            left = per_step * (state.max_steps - state.global_step)
            print(f"SFT step {state.global_step}/{state.max_steps}  {per_step:.1f} s/step  about {left / 60:.1f} min left",
                  flush=True)

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and "eval_loss" in logs and state.global_step > 0:
                train = next((e["loss"] for e in reversed(state.log_history) if "loss" in e), float("nan"))
                print(f"epoch {logs.get('epoch', 0):.2f}  step {state.global_step}  train loss {train:.4f}  "
                      f"held-out loss {logs['eval_loss']:.4f}", flush=True)

    return EpochPrinter()


def format_summary(s: dict[str, Any]) -> str:
    sp, loss, pr = s["split"], s["heldout_loss"], s["parse_rate"]

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [
        f"split by {sp['mode']}: {sp['n_train']} train / {sp['n_heldout']} held-out examples "
        f"({len(sp['train_task_ids'])} / {len(sp['heldout_task_ids'])} tasks)",
        f"{'held-out':<22}{'before':>10}{'after':>10}",
        f"{'loss':<22}{f(loss['before']):>10}{f(loss['after']):>10}",
        f"{'skill parse rate':<22}{f(pr['before']):>10}{f(pr['after']):>10}   (n={pr['n']}, greedy)",
    ]
    return "\n".join(lines)
