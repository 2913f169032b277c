"""Where the continual loop's versions are sampled from: the running vLLM server, or
in-process models.

Each version is served under its own name (``served_name_of``): an adapter loaded with
vLLM's runtime LoRA, or a ``LocalBackend`` over the base weights plus the adapter. The loop
loads a candidate here before its canary and unloads a rejected one; the gateway serves
only what the version registry promotes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from seed_agents.app.policy import initial_weights
from seed_agents.backends.local import LocalBackend
from seed_agents.backends.vllm import VLLMBackend
from seed_agents.backends.vllm_admin import VLLMAdmin, api_key_from_env
from seed_agents.config import BackendConfig
from seed_agents.continual.versions import served_name_of
from seed_agents.errors import ConfigError, WeightSyncError
from seed_agents.models import resolve_model
from seed_agents.redact import redact
from seed_agents.store import ModelVersionRecord

__all__ = ["LocalServing", "Serving", "VLLMServing", "serving_for"]


class Serving(Protocol):
    """Where versions are sampled from: the running vLLM server, or in-process models."""

    tokenizer: Any

    def load(self, version: ModelVersionRecord) -> str:
        """Make ``version`` servable (idempotent); return the name it is served under."""
        ...

    def backend(self, version: ModelVersionRecord) -> Any:
        """A backend that samples from ``version`` (loaded first)."""
        ...

    def unload(self, version: ModelVersionRecord) -> None:
        """Free a version that will not serve (best effort)."""
        ...


class LocalServing:
    """In-process: one ``LocalBackend`` per version (base weights + the version's adapter),
    the last ``keep`` kept: a canary plays the promoted version, the candidate and the
    gate's anchor side by side, and a backend evicted mid-canary would be rebuilt per
    episode. Tests and CPU demos; a real deployment serves through vLLM."""

    def __init__(self, weights: str, tokenizer: Any, *, max_batch_size: int, keep: int = 3) -> None:
        self.weights, self.tokenizer, self.max_batch_size, self.keep = weights, tokenizer, max_batch_size, keep
        self._backends: dict[str, Any] = {}

    def load(self, version: ModelVersionRecord) -> str:
        self.backend(version)
        return served_name_of(version)

    def backend(self, version: ModelVersionRecord) -> Any:
        name = served_name_of(version)
        if name not in self._backends:
            model = AutoModelForCausalLM.from_pretrained(self.weights, dtype=torch.float32)
            if version.path:
                model = PeftModel.from_pretrained(model, version.path)
            model.eval()
            while len(self._backends) >= self.keep:
                self._backends.pop(next(iter(self._backends)))
            self._backends[name] = LocalBackend(model, tokenizer=self.tokenizer, max_batch_size=self.max_batch_size,
                                                policy_version=version.version)
        return self._backends[name]

    def unload(self, version: ModelVersionRecord) -> None:
        self._backends.pop(served_name_of(version), None)


class VLLMServing:
    """Running vLLM servers with runtime LoRA (``--enable-lora``,
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): each version is an adapter under its own
    served name (a same-name reload could serve stale prefix-cache blocks); version 0 is
    the base model's served name. One ``VLLMBackend`` per served name, kept until the
    version is unloaded: a canary asks for a backend per episode, and each backend owns a
    connection pool.

    With ``replicas`` (the gateways' other vLLM servers of the same model) every version is
    loaded into each server, so a promoted version is already served everywhere when the
    gateways switch to it. A server that fails to load it is reported in one line and left
    to the gateways, which keep it out of rotation until it has the version (they load it
    themselves when they may); only when no server loads it does ``load`` fail. The canary
    samples from the first server that loaded it (``cfg.base_url`` unless that one failed)."""

    def __init__(self, cfg: BackendConfig, tokenizer: Any, *, replicas: Sequence[str] = (),
                 log: Callable[[str], None] = print) -> None:
        self.cfg, self.tokenizer, self.log = cfg, tokenizer, log
        self._api_key = api_key_from_env(cfg.api_key_env)
        urls = [cfg.base_url, *(u for u in replicas if u.rstrip("/") != cfg.base_url.rstrip("/"))]
        self.admins = [VLLMAdmin(u, timeout_s=cfg.timeout_s, api_key=self._api_key) for u in urls]
        self.admin = self.admins[0]
        self.failed: dict[str, dict[str, str]] = {}  # served name -> server URL -> why it did not load it
        self._backends: dict[str, Any] = {}

    def load(self, version: ModelVersionRecord) -> str:
        """POST the adapter to every server (again: a restarted server forgets runtime
        adapters; vLLM answers 400 "has already been loaded" when it still has it, which is fine)."""
        name = served_name_of(version)
        if not version.path:
            return name
        failed: dict[str, str] = {}
        first: WeightSyncError | None = None
        for admin in self.admins:
            try:
                admin.load_lora(name, str(Path(version.path).resolve()), exist_ok=True)
            except WeightSyncError as e:
                failed[admin.base_url], first = " ".join(str(e).split()), first or e
        self.failed[name] = failed
        if first is not None and len(failed) == len(self.admins):
            raise first
        for url, why in failed.items():
            self.log(f"replica {redact(url)} did not load {name} ({why}); the gateways keep it out of rotation "
                     f"until it has v{version.version}")
        return name

    def backend(self, version: ModelVersionRecord) -> Any:
        name = served_name_of(version)
        if name not in self._backends:
            self.load(version)
            url = next(a.base_url for a in self.admins if a.base_url not in self.failed.get(name, {}))
            self._backends[name] = VLLMBackend(url, name, max_concurrency=self.cfg.max_concurrency,
                                               timeout_s=self.cfg.timeout_s, max_retries=self.cfg.max_retries,
                                               policy_version=version.version, api_key=self._api_key)
        return self._backends[name]

    def unload(self, version: ModelVersionRecord) -> None:
        backend = self._backends.pop(served_name_of(version), None)
        if backend is not None:
            backend.close()
        if not version.path:
            return
        for admin in self.admins:
            try:  # vLLM 0.32 answers 404 "... cannot be found" for a name it does not hold
                admin.unload_lora(served_name_of(version), missing_ok=True)
            except Exception as e:  # noqa: BLE001 - a leftover adapter only costs memory
                self.log(f"could not unload {served_name_of(version)} from {redact(admin.base_url)} "
                         f"({' '.join(str(e).split())}); it stays loaded")

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()


def serving_for(b: BackendConfig, *, replicas: Sequence[str] = ()) -> Serving:
    """The serving that fits the backend: vLLM (every version a runtime LoRA adapter, loaded
    into ``b.base_url`` and every one of ``replicas``), or in-process models (tests and CPU
    demos; versions trained there cannot reach a gateway)."""
    if replicas and b.kind == "local":
        raise ConfigError("replicas are vLLM servers: set backend.kind vllm (backend.base_url is the first of them)")
    weights = resolve_model(initial_weights(b))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(b.tokenizer) if b.tokenizer else weights)
    if b.kind == "local":
        return LocalServing(weights, tokenizer, max_batch_size=b.max_batch_size)
    return VLLMServing(b, tokenizer, replicas=replicas)
