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
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
