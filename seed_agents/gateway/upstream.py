"""The vLLM server behind the gateway: token ids out, token ids and logprobs back.

Requests are vLLM ``/v1/completions`` with a token-id ``prompt``, ``return_token_ids``
and ``logprobs: 0`` (the sampled token's raw log-prob), as ``VLLMBackend`` sends them,
so a gateway call and a ``SeedChatModel`` call store the same kind of record. Streaming
uses the same request with ``stream: true``: vLLM then sends one SSE event per engine
step whose ``choices[0]`` holds the new ``token_ids`` and their
``logprobs.token_logprobs`` (the first event also carries ``prompt_token_ids``; the last
one the ``finish_reason``).

This module owns the upstream's API key: it is read once from the named environment
variable, sent only in the ``Authorization`` header of upstream requests, and never
appears in a reply, a log line or an error message.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from seed_agents.backends.base import BackendError, CompletionPiece
from seed_agents.backends.vllm import STREAM_DONE, completion_body, parse_stream_event
from seed_agents.gateway.errors import GatewayError
from seed_agents.types import Completion, FinishReason, SamplingParams

log = logging.getLogger("seed_agents.gateway")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length"}
_RETRY_STATUS = (502, 503)
#: Seconds a pooled upstream connection may idle before the gateway drops it: well below
#: vLLM's (uvicorn's) 5 s keep-alive, so the gateway never reuses a connection the server
#: is closing at that moment (seen under load as ReadError / RemoteProtocolError -> 502).
KEEPALIVE_S = 2.0


class UpstreamError(GatewayError):
    """The upstream failed; the status/type say how the client should see it."""


class _Retryable(Exception):
    """Carries an ``UpstreamError`` worth another attempt through tenacity."""

    def __init__(self, error: UpstreamError) -> None:
        super().__init__(error.message)
        self.error = error


class Upstream:
    """An async client for one vLLM server; the served ``model`` and ``policy_version``
    may be switched at run time (new requests use the new pair, in-flight ones keep theirs)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        policy_version: int = 0,
        timeout_s: float = 300.0,
        retries: int = 2,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.policy_version = policy_version
        self.retries = retries
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._api_key = api_key
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_S)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=limits, transport=transport, headers=self._headers,
        )

    @classmethod
    def from_env(cls, base_url: str, model: str, api_key_env: str | None, **kwargs: Any) -> Upstream:
        """Read the upstream key from the variable NAMED ``api_key_env`` (unset: no auth)."""
        key = os.environ.get(api_key_env) if api_key_env else None
        if api_key_env and not key:
            log.warning("upstream_api_key_env names %s, which is not set; calling the upstream without a key", api_key_env)
        return cls(base_url, model, api_key=key, **kwargs)

    @property
    def secret_values(self) -> list[str]:
        """The key, for the redactor only."""
        return [self._api_key] if self._api_key else []

    def __repr__(self) -> str:
        return f"Upstream({self.base_url!r}, model={self.model!r}, policy_version={self.policy_version})"

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- requests -----------------------------------------------------------------------

    def body(self, model: str, prompt_ids: list[int], params: SamplingParams, *, stream: bool) -> dict[str, Any]:
        return completion_body(model, prompt_ids, params, stream=stream)

    async def models(self) -> list[str]:
        """Names the upstream serves (raises ``UpstreamError`` when it cannot say)."""
        response = await self._send(lambda: self._client.get("/v1/models"))
        try:
            return [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise UpstreamError(502, "the upstream's /v1/models reply is not an OpenAI model list", type="upstream_error", code="bad_upstream_reply") from None

    async def probe(self, timeout_s: float) -> list[str]:
        """The names served, asked once with a short timeout (health checks: a replica that
        does not answer at once is out of rotation anyway, so no retries)."""
        try:
            response = await self._client.get("/v1/models", timeout=timeout_s)
        except httpx.TimeoutException:
            raise UpstreamError(504, "the model server did not answer in time", type="upstream_timeout", code="upstream_timeout") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, f"cannot reach the model server ({type(e).__name__})", type="upstream_unavailable", code="upstream_unreachable") from None
        if response.status_code >= 400:
            raise _status_error(response)
        try:
            return [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise UpstreamError(502, "the upstream's /v1/models reply is not an OpenAI model list", type="upstream_error", code="bad_upstream_reply") from None

    async def load_adapter(self, name: str, path: str, timeout_s: float) -> None:
        """Serve the LoRA adapter at ``path`` (a path on the server's machine) under ``name``
        (vLLM's runtime LoRA); vLLM's 400 "already been loaded" is the state wanted."""
        try:
            response = await self._client.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                                               timeout=timeout_s)
        except httpx.TimeoutException:
            raise UpstreamError(504, "the model server did not load the adapter in time", type="upstream_timeout", code="upstream_timeout") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, f"cannot reach the model server ({type(e).__name__})", type="upstream_unavailable", code="upstream_unreachable") from None
        if response.status_code == 400 and "already" in response.text.lower():
            return
        if response.status_code >= 400:
            try:
                why = _message(response.json())
            except ValueError:
                why = response.text[:300]
            raise UpstreamError(502, f"loading the adapter failed (HTTP {response.status_code}): {' '.join(why.split())}",
                                type="upstream_error", code="adapter_load_failed")

    async def complete(self, model: str, prompt_ids: list[int], params: SamplingParams, policy_version: int) -> Completion:
        """Sample one completion (non-streaming)."""
        body = self.body(model, prompt_ids, params, stream=False)
        response = await self._send(lambda: self._client.post("/v1/completions", json=body))
        try:
            data = response.json()
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
            finish = _FINISH.get(choice.get("finish_reason") or "", "error")
        except (ValueError, KeyError, IndexError, TypeError):
            raise _bad_reply("completion") from None
        if len(ids) != len(lps):
            raise _bad_reply("completion (token ids and logprobs differ in length)")
        return Completion(token_ids=ids, logprobs=lps, finish_reason=finish, policy_version=policy_version)

    async def open_stream(self, model: str, prompt_ids: list[int], params: SamplingParams, stack: AsyncExitStack) -> AsyncIterator[CompletionPiece]:
        """Start a streamed completion; errors before the first byte raise here (so the
        client gets a proper HTTP error), later ones from the returned iterator. The
        upstream response is closed when ``stack`` closes (closing it early aborts the
        request upstream)."""
        body = self.body(model, prompt_ids, params, stream=True)

        async def attempt() -> httpx.Response:
            request = self._client.build_request("POST", "/v1/completions", json=body)
            response = await self._client.send(request, stream=True)
            if response.status_code != 200:  # read the error body now, then let go of the stream
                await response.aread()
                await response.aclose()
            return response

        response = await self._send(attempt)
        stack.push_async_callback(response.aclose)
        return _pieces(response)

    # -- transport ------------------------------------------------------------------------

    async def _send(self, do: Any) -> httpx.Response:
        """Run ``do()`` with retries on connection failures and 502/503; map the rest."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    try:
                        response = await do()
                    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                        raise _Retryable(UpstreamError(502, f"cannot reach the model server ({type(e).__name__})", type="upstream_unavailable", code="upstream_unreachable")) from None
                    except (httpx.ReadError, httpx.RemoteProtocolError) as e:
                        # closed before any reply (typically a pooled connection the server shut as
                        # it was reused): nothing was answered or stored, so asking again is safe
                        raise _Retryable(UpstreamError(502, f"the connection to the model server failed ({type(e).__name__})", type="upstream_error", code="upstream_transport")) from None
                    if response.status_code in _RETRY_STATUS:
                        raise _Retryable(_status_error(response))
        except _Retryable as e:
            raise e.error from None
        except httpx.TimeoutException:
            raise UpstreamError(504, "the model server did not answer in time", type="upstream_timeout", code="upstream_timeout") from None
        except httpx.TransportError as e:
            raise UpstreamError(502, f"the connection to the model server failed ({type(e).__name__})", type="upstream_error", code="upstream_transport") from None
        if response.status_code >= 400:
            raise _status_error(response)
        return response


async def _pieces(response: httpx.Response) -> AsyncIterator[CompletionPiece]:
    """vLLM's SSE events -> pieces (the backend's own parser), until ``[DONE]``."""
    try:
        async for line in response.aiter_lines():
            try:
                piece = parse_stream_event(line)
            except BackendError as e:
                raise UpstreamError(502, str(e), type="upstream_error", code="bad_upstream_reply") from None
            if piece is STREAM_DONE:
                return
            if piece is not None:
                yield piece
    except httpx.TimeoutException:
        raise UpstreamError(504, "the model server stopped sending mid-stream", type="upstream_timeout", code="upstream_timeout") from None
    except httpx.TransportError as e:
        raise UpstreamError(502, f"the model server's stream broke ({type(e).__name__})", type="upstream_error", code="upstream_transport") from None
    raise UpstreamError(502, "the model server's stream ended without [DONE]", type="upstream_error", code="upstream_truncated")


def _bad_reply(what: str) -> UpstreamError:
    return UpstreamError(502, f"unexpected {what} from the model server (is it vLLM with return_token_ids support?)", type="upstream_error", code="bad_upstream_reply")


def _message(data: Any) -> str:
    """The human part of an upstream error body (vLLM: ``{"error": {"message": ...}}``)."""
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or "")[:500]
    return str(err)[:500]


def _status_error(response: httpx.Response) -> UpstreamError:
    """Map an upstream HTTP error to what the client should see.

    4xx about the request itself (e.g. a prompt longer than the model's context) is the
    client's to fix: 400 with the upstream's message. 401/403 mean the gateway's own
    upstream key is wrong, which is not the client's business: 502. 5xx: 502/503.
    """
    try:
        message = _message(response.json())
    except ValueError:
        message = response.text[:300]
    status = response.status_code
    if status in (401, 403):
        return UpstreamError(502, "the model server refused the gateway's credentials", type="upstream_error", code="upstream_auth")
    if status == 404:
        return UpstreamError(502, f"the model server does not serve the configured model: {message}", type="upstream_error", code="upstream_model_missing")
    if status < 500:
        return UpstreamError(400, f"the model server rejected the request: {message}", type="invalid_request_error", code="upstream_rejected")
    if status == 503:
        return UpstreamError(503, "the model server is unavailable", type="upstream_unavailable", code="upstream_unavailable")
    return UpstreamError(502, f"the model server failed (HTTP {status})", type="upstream_error", code="upstream_error")
