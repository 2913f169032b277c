"""TRL's ``SFTTrainer`` with the LM head applied to the completion tokens only.

Stage 1 trains on (analyzer prompt -> skill JSON) pairs: ~750 prompt tokens and ~65
completion tokens each, with the loss on the completion only. TRL's fused LM head
projects every position through the 49k-row head in chunks before it masks the prompt out,
so on a CPU that head, its log-softmax and their backward are a large part of a step
(docs/benchmarks.md, "The README's first command, before and now"). Here the backbone's hidden states are
gathered at the positions whose next token is a label first, and only those ~260 rows meet
the head: the same loss (the test compares it and its gradients with TRL's own on one
batch), a fraction of the work.

Models whose logits TRL scales or soft-caps (``logit_scale``, ``final_logit_softcapping``
and kin) go through TRL's own path unchanged: only the plain head is reproduced here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from trl import SFTTrainer

from seed_agents.models import SCALED_LOGITS as SCALED

IGNORE = -100


def completion_nll(hidden: torch.Tensor, labels: torch.Tensor, head: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """(summed negative log-likelihood, scored tokens) of ``labels``.

    ``hidden``: (B, T, H) last hidden states; ``labels``: (B, T) with ``IGNORE`` where no
    loss is wanted (prompt, padding); position t predicts ``labels[:, t + 1]``. The head and
    the log-softmax run on the scored rows only, in fp32 (as the loss of the fused head).
    """
    target = labels[:, 1:]
    keep = target != IGNORE
    rows = hidden[:, :-1][keep]
    logits = head(rows).float()
    return F.cross_entropy(logits, target[keep], reduction="sum"), int(keep.sum())


class CompletionOnlySFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss scores only the completion rows (see the module doc). It
    logs the loss only: TRL's entropy and token-accuracy metrics come from its fused head."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        lm = self.accelerator.unwrap_model(model)
        if hasattr(lm, "get_base_model"):  # a PEFT model: the LoRA layers sit inside the base model's modules
            lm = lm.get_base_model()
        text = lm.config.get_text_config()
        scaled = any(getattr(text, k, None) is not None for k in SCALED)
        if return_outputs or self.aux_loss_enabled or "shift_labels" in inputs or scaled:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        kwargs = {k: v for k, v in inputs.items() if k not in ("labels", "use_cache")}
        # the decoder and the head are called here, not through the model's forward, which is
        # where accelerate puts the mixed-precision autocast: enter it ourselves (bf16 SFT)
        with self.accelerator.autocast():
            hidden = lm.get_decoder()(**kwargs, use_cache=False).last_hidden_state
            nll, n = completion_nll(hidden, inputs["labels"], lm.get_output_embeddings())
        # normalized as TRL's SFT loss is: by the label tokens of the whole accumulated batch when the
        # Trainer counts them (num_items_in_batch), else by this batch's, never by zero
        count = n if num_items_in_batch is None else num_items_in_batch
        loss = nll / torch.as_tensor(count).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return loss
