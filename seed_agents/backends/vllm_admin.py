"""One client for a vLLM server's admin routes: health, full-weight reload, LoRA load/unload.

Weight sync (``seed_agents.trainers.weight_sync``), the continual loop's serving
(``seed_agents.app.serving``) and the vLLM backend's health check all talk to the same few
routes; their error texts and hints (which server flag a missing route needs) live here
once. The routes, as vLLM 0.32 serves them:

- ``GET /health``: 200 once the engine is up;
- ``POST /collective_rpc`` (dev mode, ``VLLM_SERVER_DEV_MODE=1``): ``reload_weights`` (or our
  worker extension's ``seed_reload_weights``) from a saved folder, then
  ``POST /reset_prefix_cache`` (cached KV blocks were computed by the old weights);
- ``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

Admin requests are not retried: a reload is not idempotent on a half-dead engine, and a
caller that must keep serving (weight sync) reports the failure and stays on the old version.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from seed_agents.errors import WeightSyncError
from seed_agents.redact import redact
from seed_agents.vllm_ext import API_KEY_ENV  # noqa: F401 - the default variable, re-exported


def api_key_from_env(name: str | None) -> str | None:
    """The API key in environment variable ``name`` (None when unset or empty). Keys are only
    ever read from the environment, so no config, log or trace holds one."""
    return (os.environ.get(name) or None) if name else None


DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (`seed-agents serve` does)"
LORA_HINT = "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (`seed-agents serve` does)"


class VLLMAdmin:
    """The admin routes of the vLLM server at ``base_url``. ``api_key``, when given, is sent
    as a bearer token (a server started with ``--api-key``); it is never shown in errors."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def __repr__(self) -> str:
        return f"VLLMAdmin({self.base_url!r})"

    def health(self, timeout_s: float = 5.0) -> bool:
        """True if the server answers ``/health`` with 200 right now (no retries)."""
        try:
            return httpx.get(f"{self.base_url}/health", headers=self._headers, timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def reload_weights(self, folder: str, *, method: str = "reload_weights") -> None:
        """Load the complete saved ``folder`` into every worker, then drop the prefix cache."""
        self._post("/collective_rpc", {"method": method, "kwargs": {"weights_path": str(folder)}})
        self._post("/reset_prefix_cache", {})

    def load_lora(self, name: str, path: str, *, exist_ok: bool = False) -> None:
        """Serve the adapter at ``path`` under ``name``. With ``exist_ok``, vLLM's 400 "has
        already been loaded" is the state wanted (a restarted server forgets runtime
        adapters, so callers load again whenever in doubt)."""
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)},
                   ok_if="already" if exist_ok else None)

    def unload_lora(self, name: str, *, missing_ok: bool = False) -> None:
        """Stop serving ``name``. With ``missing_ok``, vLLM's 404 "... cannot be found" is fine."""
        self._post("/v1/unload_lora_adapter", {"lora_name": name}, ok_if="be found" if missing_ok else None)

    def _post(self, path: str, body: dict[str, Any], *, ok_if: str | None = None) -> httpx.Response:
        """POST ``body``; a 400/404 whose text says ``ok_if`` is the state we wanted. Any other
        failure is one ``WeightSyncError`` line naming the route, the answer and the fix."""
        url = self.base_url + path
        try:
            r = httpx.post(url, json=body, headers=self._headers, timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise WeightSyncError(f"POST {url} failed ({type(e).__name__}: {redact(str(e))}); is the vLLM server "
                                  f"still running there? Restart it, then rerun with --resume") from e
        if r.status_code < 400 or (ok_if and r.status_code in (400, 404) and ok_if in r.text.lower()):
            return r
        # A 404 is a missing *route* only when the body is the router's own {"detail": "Not Found"};
        # vLLM also answers 404 for e.g. "No adapter found for <path>", where the hint would mislead.
        route_missing = r.status_code == 404 and _json(r) == {"detail": "Not Found"}
        hint = ""
        if route_missing and ("rpc" in path or "prefix" in path):
            hint = f"; {DEV_MODE_HINT}"
        elif "lora" in path and (route_missing or r.status_code == 400):
            hint = f"; {LORA_HINT}"
        text = " ".join(redact(r.text, max_chars=500).split())  # one line, secrets out before the cut
        raise WeightSyncError(f"POST {url} -> HTTP {r.status_code}: {text}{hint}")


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
