"""Model backends: a vLLM server over HTTP, or transformers in-process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from seed_agents.backends.base import Backend, BackendError, BackendUnavailable
from seed_agents.errors import ConfigError

if TYPE_CHECKING:
    from seed_agents.config.core import BackendConfig

__all__ = ["Backend", "BackendError", "BackendUnavailable", "local_kwargs", "make_backend"]


def local_kwargs(cfg: BackendConfig, who: str = "local backend") -> dict[str, Any]:
    """``LocalBackend`` arguments for the config's local-only settings (the number format,
    attention's) and a benchmark's engine options (``seed_agents.backends.engine``), one place
    for every caller that builds one; the choice of format is printed with its reason, and
    engine options other than the defaults are printed too."""
    from seed_agents.backends.engine import ENGINE_ENV, LocalEngineOptions
    from seed_agents.precision import resolve_attention, resolve_served

    dtype, why = resolve_served(cfg.precision, "local")
    fp32_attention, why_attention = resolve_attention(cfg.attention, dtype)
    engine = LocalEngineOptions.from_env()
    bench = f"; {ENGINE_ENV}: {engine.changed()}" if engine.changed() else ""
    print(f"{who} computes in {why}; {why_attention}{bench}", flush=True)
    return {"compute_dtype": dtype, "fp32_attention": fp32_attention, **engine.backend_kwargs()}


def make_backend(cfg: BackendConfig) -> tuple[Backend, Any]:
    """Build the backend and the tokenizer that renders its prompts from a config."""
    from transformers import AutoTokenizer

    from seed_agents.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.tokenizer)) if cfg.tokenizer else None
    if cfg.kind == "local":
        from seed_agents.backends.local import LocalBackend

        backend = LocalBackend(cfg.model, tokenizer=tokenizer, max_batch_size=cfg.max_batch_size, **local_kwargs(cfg))
        return backend, backend.tokenizer
    from seed_agents.backends.vllm import VLLMBackend
    from seed_agents.backends.vllm_admin import api_key_from_env

    if cfg.base_url is None:  # the command starts its server first (seed_agents.app.own_server)
        raise ConfigError("backend.base_url is unset: name the vLLM server's URL (--backend.base-url), "
                          "or run through a command that starts its own server (train, eval)")
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model))
    backend = VLLMBackend(cfg.base_url, cfg.model, max_concurrency=cfg.max_concurrency,
                          timeout_s=cfg.timeout_s, max_retries=cfg.max_retries,
                          api_key=api_key_from_env(cfg.api_key_env))
    return backend, tokenizer
