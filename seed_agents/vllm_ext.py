"""A vLLM worker extension loaded into the *server* process (``--worker-extension-cls``).

vLLM 0.32's CPU build packs the output layer for its matmul kernels once, at start-up.
With tied input/output embeddings (SmolLM2, Qwen2.5-0.5B, ...) a checkpoint has no
``lm_head.weight``, so ``reload_weights`` updates the embedding but never re-packs the
output layer, and the server keeps sampling from the start-up logits (measured: ~0.1 nat
drift from the trainer after one update). ``seed_reload_weights`` reloads and then re-runs
the output layer's post-load processing, which makes a full sync exact again.

Imports nothing from seed_agents or its dependencies: it runs in vLLM's own venv.
"""

from __future__ import annotations

from typing import Any


class SeedWorkerExtension:
    """Mixed into vLLM's worker class; reached via ``POST /collective_rpc``."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def seed_reload_weights(self, weights_path: str) -> int:
        """``reload_weights`` from a folder, then re-pack the output layer; returns the
        number of re-packed layers (0 on builds that need none)."""
        self.model_runner.reload_weights(weights_path=weights_path)
        repacked = 0
        for name, module in self.model_runner.get_model().named_modules():
            method = getattr(module, "quant_method", None)
            if name.endswith("lm_head") and method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                repacked += 1
        return repacked
