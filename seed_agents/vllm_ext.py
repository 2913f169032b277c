"""A vLLM worker extension loaded into the *server* process (``--worker-extension-cls``).

vLLM 0.32's CPU build packs the output layer for its matmul kernels once, at start-up.
With tied input/output embeddings (SmolLM2, Qwen2.5-0.5B, ...) a checkpoint has no
``lm_head.weight``, so ``reload_weights`` updates the embedding but never re-packs the
output layer, and the server keeps sampling from the start-up logits, drifting from the
trainer from the first update on. ``seed_reload_weights`` reloads and then re-runs
the output layer's post-load processing, which makes a full sync exact again.

``BearerAuth`` is an ASGI middleware for the same server (``--middleware``): with it, every
route demands ``Authorization: Bearer <key>``, dev mode's ``/collective_rpc`` and the LoRA
routes included (vLLM's own ``--api-key`` guards only paths under /v1, /v2, /inference and
/cohere). Only ``GET /health`` stays open, for load-balancer and orchestrator probes; it
tells nothing but "up".

Imports nothing from seed_agents or its dependencies (stdlib only): it runs in vLLM's own venv.
"""

from __future__ import annotations

import hmac
import json
import os
from typing import Any

API_KEY_ENV = "SEED_AGENTS_VLLM_API_KEY"
"""The variable the server reads its key from (``VLLMServer`` sets it in the server's
environment, never on its command line)."""

OPEN_PATHS = frozenset({"/health"})

_UNAUTHORIZED = json.dumps(
    {"error": {"message": "missing or wrong API key: send `Authorization: Bearer <key>`",
               "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
).encode()


class BearerAuth:
    """ASGI middleware: 401 with an OpenAI-style error body unless the request carries
    ``Authorization: Bearer <$SEED_AGENTS_VLLM_API_KEY>``. The key is read once, when vLLM
    builds its app; a server started with the middleware but no key refuses to start."""

    def __init__(self, app: Any) -> None:
        key = os.environ.get(API_KEY_ENV, "")
        if not key:
            raise RuntimeError(f"seed_agents.vllm_ext.BearerAuth needs ${API_KEY_ENV} set to the API key")
        self.app = app
        self._expected = f"Bearer {key}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})

    def _allowed(self, scope: dict[str, Any]) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS and scope.get("method", "GET") in ("GET", "HEAD"):
            return True
        given = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                given = value
                break
        return hmac.compare_digest(given, self._expected)


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
