"""Push trained weights into the running server; bump ``policy_version`` only on success.

Three ways, one contract (``sync(model) -> new_version``):
- ``FullWeightSync``: save a versioned folder, then vLLM's dev endpoint
  ``/collective_rpc`` ``reload_weights(weights_path=...)`` and ``/reset_prefix_cache``
  (cached KV blocks were computed by the old weights).
- ``LoRASync``: save the adapter, ``/v1/load_lora_adapter`` under a *new name per version*
  (a same-name reload can serve stale prefix-cache blocks), point the backend at it,
  then unload the previous adapter.
- ``InProcessSync``: the local backend shares the trainer's model; weights are already
  live, only the version moves.
A failed sync raises ``WeightSyncError`` and leaves the backend on the old version and
name, so rollouts never silently mix versions: every captured call carries the version
the backend had when it sent the request.

Known limits of full reloads on vLLM 0.32's CPU build (measured, see
tests/integration/test_train_vllm.py): for models with tied input/output embeddings
(SmolLM2) the CPU kernels keep the output layer packed at start-up, so after a plain
``reload_weights`` the server's logprobs drift from the trainer's; servers
started with our worker extension (``seed_agents/vllm_ext.py``) take
``method="seed_reload_weights"``, which re-packs it. LoRA sync is exact either way. And a ``reload_weights``
that fails *inside* vLLM can leave its engine unusable, so the folder is always written
completely before the request is sent. The requests themselves go through the one admin
client, ``seed_agents.backends.vllm_admin.VLLMAdmin``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Protocol

from seed_agents.backends.vllm_admin import VLLMAdmin
from seed_agents.errors import WeightSyncError


class WeightSync(Protocol):
    def sync(self, model: Any) -> int:
        """Push ``model``'s weights; return the new version (raises WeightSyncError)."""
        ...

    def follow(self) -> int:
        """On ranks other than the one that synced: adopt the new version (and name)."""
        ...


class _Versioned:
    def __init__(self, backend: Any, save_root: str | Path, keep_last: int, timeout_s: float) -> None:
        self.backend = backend
        self.save_root = Path(save_root).absolute()  # the server reads it from another process and folder
        self.keep_last = max(1, keep_last)
        self.timeout_s = timeout_s
        self.last_sync_s = 0.0

    @property
    def admin(self) -> VLLMAdmin:
        """The server's admin routes (the backend's URL can change between syncs in tests)."""
        return self.backend.admin(timeout_s=self.timeout_s)  # carries the backend's API key

    def _folder(self, version: int) -> Path:
        return self.save_root / f"v{version:06d}"

    def _prune(self, version: int) -> None:
        for old in sorted(self.save_root.glob("v*")):
            if old.is_dir() and int(old.name[1:]) <= version - self.keep_last:
                shutil.rmtree(old, ignore_errors=True)


class FullWeightSync(_Versioned):
    """Full weights through a shared filesystem (the CPU and single-node path)."""

    def __init__(self, backend: Any, save_root: str | Path, *, keep_last: int = 2, timeout_s: float = 600.0,
                 method: str = "reload_weights") -> None:
        """``method="seed_reload_weights"`` when the server runs our worker extension
        (``seed-agents serve`` and the test server do): exact for tied embeddings."""
        super().__init__(backend, save_root, keep_last, timeout_s)
        self.method = method

    def sync(self, model: Any) -> int:
        t0 = time.perf_counter()
        version = self.backend.policy_version + 1
        folder = self._folder(version)
        if hasattr(model, "merge_and_unload"):
            raise WeightSyncError("FullWeightSync got a PEFT model; use LoRASync (or merge the adapter first)")
        model.save_pretrained(folder, safe_serialization=True)
        self.admin.reload_weights(str(folder), method=self.method)
        self.backend.policy_version = version
        self._prune(version)
        self.last_sync_s = time.perf_counter() - t0
        return version

    def follow(self) -> int:
        self.backend.policy_version += 1
        return self.backend.policy_version


class LoRASync(_Versioned):
    """LoRA adapters, a fresh adapter name per version."""

    def __init__(self, backend: Any, save_root: str | Path, *, name_prefix: str = "policy", keep_last: int = 2,
                 timeout_s: float = 300.0) -> None:
        super().__init__(backend, save_root, keep_last, timeout_s)
        self.name_prefix = name_prefix
        self.loaded: str | None = None

    def sync(self, model: Any) -> int:
        t0 = time.perf_counter()
        version = self.backend.policy_version + 1
        folder = self._folder(version)
        if not hasattr(model, "peft_config"):
            raise WeightSyncError("LoRASync needs a PEFT model (peft.get_peft_model)")
        model.save_pretrained(folder)
        name = f"{self.name_prefix}-v{version}"
        self.admin.load_lora(name, str(folder))
        previous, self.loaded = self.loaded, name
        self.backend.model = name
        self.backend.policy_version = version
        if previous is not None:
            try:
                self.admin.unload_lora(previous)
            except WeightSyncError:
                pass  # the new adapter is live; a leftover old one only costs memory
        self._prune(version)
        self.last_sync_s = time.perf_counter() - t0
        return version

    def follow(self) -> int:
        version = self.backend.policy_version + 1
        self.loaded = self.backend.model = f"{self.name_prefix}-v{version}"
        self.backend.policy_version = version
        return version


class InProcessSync:
    """For ``LocalBackend(model=trainer_model)``: weights are shared, only the version moves."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.last_sync_s = 0.0

    def sync(self, model: Any) -> int:
        if getattr(self.backend, "model", None) is not model:
            raise WeightSyncError("InProcessSync needs the backend to share the trainer's model object")
        self.backend.policy_version += 1
        return self.backend.policy_version

    def follow(self) -> int:  # every rank holds its own model: each syncs itself
        raise RuntimeError("InProcessSync is per rank; call sync() on every rank")
