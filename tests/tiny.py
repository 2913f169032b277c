"""The tiny random model in training mode, as the trainer runs it (shared by the unit tests of
the trainer's scoring paths)."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM


def train_mode_model(model_dir: str, *, checkpointing: bool) -> Any:
    """The model at ``model_dir`` in fp32, training mode, with activation checkpointing on or off
    (non-reentrant, as TRL turns it on)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if checkpointing:
        enable_checkpointing(model)
    return model


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing, as ``Trainer.train()`` turns it on."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def row_inputs(rows: list[Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """(the trainer's tensors of ``rows``, prompt + completion ids, their attention mask), laid out
    as TRL lays rows out (``rows_to_tensors``, zero advantages)."""
    from seed_agents.trainers.seed_trainer import rows_to_tensors

    t = rows_to_tensors(rows, torch.zeros(len(rows)), pad_id=0)
    return t, torch.cat([t["prompt_ids"], t["completion_ids"]], 1), torch.cat([t["prompt_mask"], t["completion_mask"]], 1)
