"""A backend that talks to a running vLLM server over HTTP.

Prompts go out as token ids (``/v1/completions`` with ``"prompt": [ids]``) and the
sampled ids come back as ids (``return_token_ids``), so no text is ever re-tokenized
between the chat template and the trainer. ``logprobs: 0`` returns the log-prob of the
sampled token only; the server runs with ``--logprobs-mode raw_logprobs`` (vLLM's
default), so these are log-softmax values at T=1 whatever the sampling temperature.

Request fields used (vLLM 0.32, ``vllm/entrypoints/openai/completion/protocol.py``):
``prompt``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs``,
``prompt_logprobs``, ``stop_token_ids``, ``return_token_ids``, ``skip_special_tokens``,
``structured_outputs.structural_tag`` (constrained decoding, ``seed_agents.backends.grammar``).
Response: ``choices[0].token_ids``, ``choices[0].logprobs.token_logprobs``,
``choices[0].finish_reason`` and, for scoring, ``choices[0].prompt_logprobs`` (a list
with ``None`` first, then ``{"<token id>": {"logprob": ..., "rank": ...}}`` per token).

Streaming sends the same request with ``stream: true``: vLLM answers with server-sent
events, one per engine step, whose ``choices[0]`` holds the step's new ``token_ids`` and
their ``logprobs.token_logprobs`` (the last one the ``finish_reason``), then
``data: [DONE]``. Retries (``seed_agents.http.RetryPolicy``: connection errors, 408, 429
and 5xx, jittered backoff, Retry-After honoured) and the circuit breaker cover opening
the stream (before the first byte); a stream that breaks later raises, because the
tokens already handed out cannot be taken back. Closing the stream early closes the HTTP
response, and vLLM aborts a request whose client has gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from seed_agents.backends.base import BackendError, BackendUnavailable, CompletionPiece
from seed_agents.backends.vllm_admin import VLLMAdmin
from seed_agents.http import RetryableResponse, RetryPolicy, retryable_status
from seed_agents.redact import redact
from seed_agents.types import Completion, FinishReason, SamplingParams

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length"}


class VLLMBackend:
    """``Backend`` over a vLLM OpenAI-compatible server.

    Safe to share between threads (sync calls) and between tasks of any number of
    event loops (async calls): each loop gets its own ``httpx.AsyncClient`` and
    ``asyncio.Semaphore``, because neither may cross loops.

    ``model`` is the served model name (or LoRA adapter name) put in every request;
    weight sync may change it together with ``policy_version``.

    Circuit breaker: once a request has exhausted its retries without reaching the server,
    every request for the next ``breaker_cooldown_s`` fails at once with the same
    ``BackendUnavailable`` (naming the URL) instead of retrying a dead server again; the
    first request after the cool-down tries for real, and a success closes the breaker.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_concurrency: int = 32,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        policy_version: int = 0,
        breaker_cooldown_s: float = 30.0,
        api_key: str | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        self.base_url = _normalize_base_url(base_url)
        self.model = model
        self.policy_version = policy_version
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self.breaker_cooldown_s = breaker_cooldown_s
        self._open_until = 0.0  # monotonic time until which the breaker is open
        self._open_error = ""
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._api_key = api_key or None  # sent as a bearer token; never in repr or errors
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()
        self._sync_slots = threading.BoundedSemaphore(max_concurrency)
        self._loop_state: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]
        ] = weakref.WeakKeyDictionary()

    # -- protocol -------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        started = time.perf_counter()
        version = self.policy_version  # the weights that will serve this request
        data = self._post("/v1/completions", self._generate_body(prompt_ids, params))
        return _parse_completion(data, version, time.perf_counter() - started)

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        started = time.perf_counter()
        version = self.policy_version
        data = await self._apost("/v1/completions", self._generate_body(prompt_ids, params))
        return _parse_completion(data, version, time.perf_counter() - started)

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[CompletionPiece]:
        """One piece per server-sent event; closing the iterator aborts the request."""
        version = self.policy_version
        body = completion_body(self.model, prompt_ids, params, stream=True)
        with self._sync_slots:
            response = self._open_stream(body)
            try:
                done = False
                for line in response.iter_lines():
                    piece = parse_stream_event(line, version)
                    if piece is STREAM_DONE:
                        done = True
                        break
                    if piece is not None:
                        yield piece
            except httpx.TransportError as exc:
                raise BackendError(f"the stream from {self.base_url} broke: {type(exc).__name__}: {exc}") from exc
            finally:
                response.close()
        if not done:
            raise BackendError(f"the stream from {self.base_url} ended without [DONE]")

    async def astream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionPiece]:
        """Async ``stream``; ``aclose()`` aborts the request."""
        version = self.policy_version
        body = completion_body(self.model, prompt_ids, params, stream=True)
        _, slots = self._async_state()
        async with slots:
            response = await self._aopen_stream(body)
            try:
                done = False
                async for line in response.aiter_lines():
                    piece = parse_stream_event(line, version)
                    if piece is STREAM_DONE:
                        done = True
                        break
                    if piece is not None:
                        yield piece
            except httpx.TransportError as exc:
                raise BackendError(f"the stream from {self.base_url} broke: {type(exc).__name__}: {exc}") from exc
            finally:
                await response.aclose()
        if not done:
            raise BackendError(f"the stream from {self.base_url} ended without [DONE]")

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Raw log-prob of each completion token given the prompt; nothing is sampled."""
        if not completion_ids:
            return []
        data = self._post("/v1/completions", self._score_body(prompt_ids, completion_ids))
        return _parse_prompt_logprobs(data, prompt_ids, completion_ids)

    async def ascore(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Raw log-prob of each completion token given the prompt; nothing is sampled."""
        if not completion_ids:
            return []
        data = await self._apost("/v1/completions", self._score_body(prompt_ids, completion_ids))
        return _parse_prompt_logprobs(data, prompt_ids, completion_ids)

    def health(self, timeout_s: float = 5.0) -> bool:
        """True if the server answers ``/health`` with 200 right now (no retries)."""
        return self.admin().health(timeout_s)

    def admin(self, timeout_s: float = 300.0) -> VLLMAdmin:
        """The server's admin routes (weight reload, LoRA), with this backend's API key."""
        return VLLMAdmin(self.base_url, timeout_s=timeout_s, api_key=self._api_key)

    def close(self) -> None:
        """Release connections: the sync client and every async client whose loop can
        still run its ``aclose``. Not final: a later call opens fresh clients."""
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        with self._client_lock:
            states, self._loop_state = list(self._loop_state.items()), weakref.WeakKeyDictionary()
        for loop, (aclient, _) in states:
            if loop.is_closed():
                continue  # its connections died with the loop
            if loop.is_running():
                loop.call_soon_threadsafe(lambda c=aclient: asyncio.ensure_future(c.aclose()))
                continue
            with contextlib.suppress(RuntimeError):  # e.g. the loop belongs to another thread
                loop.run_until_complete(aclient.aclose())

    async def aclose(self) -> None:
        """Close this event loop's async client (and the sync one)."""
        with self._client_lock:
            state = self._loop_state.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state[0].aclose()
        self.close()

    def __repr__(self) -> str:
        return f"VLLMBackend({self.base_url!r}, model={self.model!r}, policy_version={self.policy_version})"

    # -- request bodies ---------------------------------------------------------------

    def _generate_body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        return completion_body(self.model, prompt_ids, params)

    def _score_body(self, prompt_ids: list[int], completion_ids: list[int]) -> dict[str, Any]:
        if not prompt_ids:
            raise ValueError("prompt_ids must hold at least one token (the first token has no logprob)")
        return {
            "model": self.model,
            "prompt": list(prompt_ids) + list(completion_ids),
            "max_tokens": 1,  # vLLM must generate something; one greedy token is cheapest
            "temperature": 0.0,
            "prompt_logprobs": 0,  # the logprob of each given token, no top-k extras
            "return_token_ids": True,
        }

    # -- transport with retries ---------------------------------------------------------

    def _sync_client(self) -> httpx.Client:
        with self._client_lock:
            if self._client is None:
                self._client = httpx.Client(base_url=self.base_url, timeout=self._timeout, headers=self._headers)
            return self._client

    def _async_state(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._client_lock:
            state = self._loop_state.get(loop)
            if state is None:
                n = self.max_concurrency
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
                client = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout, limits=limits,
                                           headers=self._headers)
                state = (client, asyncio.Semaphore(n))
                self._loop_state[loop] = state
            return state

    def _check_breaker(self) -> None:
        remaining = self._open_until - time.monotonic()
        if remaining > 0:
            raise BackendUnavailable(f"{self._open_error} [not retried for {remaining:.0f} s more: circuit open]")

    def _trip(self, error: BackendError) -> BackendError:
        if isinstance(error, BackendUnavailable):
            self._open_error = str(error)
            self._open_until = time.monotonic() + self.breaker_cooldown_s
        return error

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check_breaker()
        client = self._sync_client()

        def attempt() -> httpx.Response:
            return _retryable(client.post(path, json=body))

        with self._sync_slots:
            try:
                response = self._retry.retrying()(attempt)
            except (httpx.TransportError, _ServerError) as exc:
                raise self._trip(self._give_up(path, exc)) from None
        self._open_until = 0.0
        return self._handle(response)

    async def _apost(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._check_breaker()
        client, slots = self._async_state()

        async def attempt() -> httpx.Response:
            return _retryable(await client.post(path, json=body))

        async with slots:
            try:
                response = await self._retry.aretrying()(attempt)
            except (httpx.TransportError, _ServerError) as exc:
                raise self._trip(self._give_up(path, exc)) from None
        self._open_until = 0.0
        return self._handle(response)

    def _open_stream(self, body: Mapping[str, Any]) -> httpx.Response:
        """``_post`` for a streamed answer: the same retries and breaker, up to the first byte."""
        self._check_breaker()
        client = self._sync_client()

        def attempt() -> httpx.Response:
            response = client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
            if response.status_code != 200:
                response.read()
                response.close()
                _retryable(response)
                self._handle(response)  # raises: the server rejected the request
            return response

        try:
            response = self._retry.retrying()(attempt)
        except (httpx.TransportError, _ServerError) as exc:
            raise self._trip(self._give_up("/v1/completions", exc)) from None
        self._open_until = 0.0
        return response

    async def _aopen_stream(self, body: Mapping[str, Any]) -> httpx.Response:
        """``_apost`` for a streamed answer (the caller holds this loop's slot)."""
        self._check_breaker()
        client, _ = self._async_state()

        async def attempt() -> httpx.Response:
            response = await client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
            if response.status_code != 200:
                await response.aread()
                await response.aclose()
                _retryable(response)
                self._handle(response)  # raises: the server rejected the request
            return response

        try:
            response = await self._retry.aretrying()(attempt)
        except (httpx.TransportError, _ServerError) as exc:
            raise self._trip(self._give_up("/v1/completions", exc)) from None
        self._open_until = 0.0
        return response

    def _handle(self, response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            raise BackendError(
                f"vLLM server at {self.base_url} rejected the request "
                f"(HTTP {response.status_code}): {_error_message(response)}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise BackendError(f"vLLM server at {self.base_url} sent invalid JSON: "
                               f"{redact(response.text, max_chars=200)!r}") from exc

    def _give_up(self, path: str, error: BaseException | None) -> BackendError:
        tries = self.max_retries + 1
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
            return BackendUnavailable(
                f"cannot reach the vLLM server at {self.base_url} ({type(error).__name__}: {error}; "
                f"{tries} attempts). Is it running? Start one with `seed-agents serve`, "
                f"or pass the right URL."
            )
        if isinstance(error, _ServerError):
            return BackendError(
                f"vLLM server at {self.base_url}{path} failed {tries} times; last answer "
                f"HTTP {error.status_code}: {error.message}"
            )
        return BackendError(f"request to {self.base_url}{path} failed {tries} times: {type(error).__name__}: {error}")


def completion_body(model: str, prompt_ids: list[int], params: SamplingParams, *, stream: bool = False) -> dict[str, Any]:
    """The ``/v1/completions`` request for one sampled completion of ``prompt_ids``: token
    ids in, token ids and each sampled token's raw logprob out (the backend and the
    capture gateway both send exactly this)."""
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 0,  # only the sampled token's logprob
        "return_token_ids": True,
        "skip_special_tokens": False,  # the text should show <|im_end|> etc. as sampled
    }
    if stream:
        body["stream"] = True
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.structural_tag is not None:
        # vLLM masks the logits with the grammar before sampling and before computing the
        # logprobs it returns, so those are the masked distribution's (as the local backend's).
        body["structured_outputs"] = {"structural_tag": params.structural_tag}
    return body


class _ServerError(RetryableResponse):
    """A 408, 429 or 5xx answer (``seed_agents.http.retryable_status``), kept so the final
    error can quote the server."""


def _retryable(response: httpx.Response) -> httpx.Response:
    """``response``, unless its status is worth a retry: then ``_ServerError`` (retried)."""
    if retryable_status(response.status_code):
        raise _ServerError.of(response, _error_message(response))
    return response


def _normalize_base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def _error_message(response: httpx.Response) -> str:
    """The human part of an error answer: vLLM sends ``{"error": {"message": ...}}``."""
    try:
        data = response.json()
    except ValueError:
        return redact(response.text, max_chars=500) or response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and "message" in err:
            return redact(str(err["message"]), max_chars=2000)
        if isinstance(err, str):
            return redact(err, max_chars=2000)
        if "detail" in data:
            return redact(str(data["detail"]), max_chars=2000)
    return redact(str(data), max_chars=500)


def _parse_completion(data: dict[str, Any], policy_version: int, latency_s: float) -> Completion:
    try:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendError(
            f"unexpected completion response (is the server vLLM with return_token_ids support?): "
            f"{redact(str(data), max_chars=300)}"
        ) from exc
    if len(token_ids) != len(logprobs):
        raise BackendError(f"server returned {len(token_ids)} token ids but {len(logprobs)} logprobs")
    return Completion(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=_FINISH_REASONS.get(choice.get("finish_reason") or "", "error"),
        policy_version=policy_version,
        latency_s=latency_s,
    )


STREAM_DONE = CompletionPiece()  # sentinel: the server sent ``data: [DONE]``


def parse_stream_event(line: str, policy_version: int = 0) -> CompletionPiece | None:
    """One line of vLLM's event stream -> its new tokens; None for lines without data
    (and events without tokens or a finish reason), ``STREAM_DONE`` at the end."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == "[DONE]":
        return STREAM_DONE
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise BackendError(f"the server sent a stream event that is not JSON: {redact(payload, max_chars=200)!r}") from exc
    if isinstance(data, dict) and "error" in data:
        raise BackendError(f"the server failed mid-stream: {redact(str(data['error']), max_chars=500)}")
    if not data.get("choices"):
        return None  # e.g. a usage-only event
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        reason = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendError(f"unexpected stream event: {redact(payload, max_chars=300)}") from exc
    if len(ids) != len(logprobs):
        raise BackendError(f"stream event with {len(ids)} token ids but {len(logprobs)} logprobs")
    if not ids and reason is None:
        return None
    finish = None if reason is None else _FINISH_REASONS.get(reason, "error")
    return CompletionPiece(ids, logprobs, finish, policy_version)


def _parse_prompt_logprobs(
    data: dict[str, Any], prompt_ids: list[int], completion_ids: list[int]
) -> list[float]:
    try:
        entries = data["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendError(f"response has no prompt_logprobs: {str(data)[:300]}") from exc
    n_prompt = len(prompt_ids)
    if entries is None or len(entries) != n_prompt + len(completion_ids):
        raise BackendError(
            f"expected {n_prompt + len(completion_ids)} prompt_logprobs entries, got "
            f"{None if entries is None else len(entries)}"
        )
    out: list[float] = []
    for token_id, entry in zip(completion_ids, entries[n_prompt:], strict=True):
        # JSON object keys are strings; the given token is always among them.
        item = (entry or {}).get(str(token_id))
        if item is None:
            raise BackendError(f"prompt_logprobs lack token {token_id}: {str(entry)[:200]}")
        out.append(float(item["logprob"]))
    return out
