"""Who writes stage-1 skills: a stronger model, the policy itself, or an offline stand-in.

Stage 1 teaches the policy to be a competent hindsight analyzer by SFT on skills that a
*stronger* analyzer wrote about the policy's own episodes. Every analyzer reads the same
prompt the policy sees during training (``seed_agents.skills.build_analyzer_messages``)
and answers with ``{"episode_summary": ..., "episode_skill": ...}``:

- ``OpenAIChatAnalyzer``: any OpenAI-compatible ``/v1/chat/completions`` endpoint (OpenAI,
  a vLLM server, ...), concurrent, rate-limited and retried; the API key is read from an
  environment variable at request time and never stored, logged or echoed.
- ``LangChainAnalyzer``: any LangChain chat model, given as an import spec.
- ``PolicyAnalyzer``: a ``SeedChatModel`` over our backends (the base or SFT policy,
  greedy), recorded with ``capture(purpose="analyzer")`` exactly like the hindsight node.
- an env suite's offline analyzer (``EnvSuite.offline_analyzer()``, e.g.
  ``tools.textworld_analyzer``): deterministic, no model. It is the *stand-in* for a
  stronger analyzer where no endpoint is reachable (tests, CI, air-gapped demos,
  automatic stage 1): it writes skills from the episode's structured record
  (``seed_agents.envs.EpisodeRecord``), never from hidden game data.

Requests are retried by the one HTTP policy (``seed_agents.http.RetryPolicy``).

An analyzer never raises for a failed request: the reply carries ``error`` instead, and
the collector keeps such episodes for the next run.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import TYPE_CHECKING, Any, Literal

import httpx
from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seed_agents.config.core import BackendConfig
from seed_agents.http import RetryableResponse, RetryPolicy, retryable_status
from seed_agents.redact import redact
from seed_agents.skills import Analyzer, AnalyzerReply, RuleBasedAnalyzer, count_of, fit_words
from seed_agents.types import EpisodeRecord, SkillOpening

if TYPE_CHECKING:
    from seed_agents.envs import EnvSuite

# The contract lives beside the skills (seed_agents.skills); named here for the concrete analyzers' users.
__all__ = ["Analyzer", "AnalyzerConfig", "AnalyzerReply", "LangChainAnalyzer", "OpenAIChatAnalyzer", "PolicyAnalyzer",
           "RuleBasedAnalyzer", "count_of", "fit_words", "make_analyzer"]


class AnalyzerConfig(BaseModel):
    """Which analyzer writes the stage-1 skills, and how hard it may be pushed."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, description="Name written into each SkillExample.analyzer and shown by `skills eval` (default: the kind and model, e.g. 'openai:gpt-4o-mini').")
    kind: Literal["rule_based", "openai", "langchain", "policy"] = Field("rule_based", description=(
        "rule_based: the env suite's offline analyzer (e.g. TextWorld's); openai: an OpenAI-compatible "
        "endpoint; langchain: a LangChain chat model; policy: our own backends."))
    base_url: str = Field("https://api.openai.com/v1", description="openai: endpoint URL, with or without /v1 (a vLLM server: http://127.0.0.1:8000).")
    model: str | None = Field(None, description="openai: model name sent in requests; policy: a model folder/alias to load locally (when `backend` is unset).")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: NAME of the environment variable holding the API key (unset variable: no auth header, fine for a local vLLM). The key itself never goes in a config.")
    spec: str | None = Field(None, description="langchain: import path 'pkg.module:factory_or_class' of a chat model.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="langchain: keyword arguments for `spec`.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="openai: extra request fields (e.g. response_format, seed).")
    backend: BackendConfig | None = Field(None, description="policy: the backend to analyze with (default: `model` loaded locally, else the collect run's policy backend).")
    max_concurrency: int = Field(8, ge=1, le=1024, description="Requests in flight at once.")
    requests_per_minute: float | None = Field(None, gt=0, description="Request starts are spaced to at most this rate (retries included); unset: no limit.")
    max_retries: int = Field(4, ge=0, le=20, description="Retries on connection errors, timeouts, 429 and 5xx (other 4xx are not retried).")
    backoff_s: float = Field(1.0, ge=0, description="First retry delay; doubles per retry, with jitter.")
    max_backoff_s: float = Field(60.0, ge=0, description="Cap on one retry delay, Retry-After included.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_tokens: int = Field(512, ge=1, le=32768, description="Analyzer completion budget (paper: 512).")
    temperature: float = Field(0.0, ge=0, le=2.0, description="Analyzer sampling temperature (0: greedy).")
    price_per_mtok_prompt: float = Field(0.0, ge=0, description="USD per 1M prompt tokens, for the cost report (0: unpriced).")
    price_per_mtok_completion: float = Field(0.0, ge=0, description="USD per 1M completion tokens, for the cost report.")

    @model_validator(mode="after")
    def _required(self) -> AnalyzerConfig:
        if self.kind == "openai" and not self.model:
            raise ValueError("analyzer.model is required for kind openai (the model name the endpoint serves)")
        if self.kind == "langchain" and not self.spec:
            raise ValueError("analyzer.spec is required for kind langchain ('pkg.module:ChatModelClass')")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            raise ValueError("analyzer.api_key_env must be the NAME of an environment variable, not a key")
        return self

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_per_mtok_prompt + completion_tokens * self.price_per_mtok_completion) / 1e6


# -- pacing: concurrency bound, request spacing, backoff --------------------------------


class _Pacer:
    """A concurrency bound plus request spacing (``requests_per_minute``) for one event
    loop; recreated when the analyzer is used from another loop."""

    def __init__(self, max_concurrency: int, requests_per_minute: float | None) -> None:
        self.interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self.slots = asyncio.Semaphore(max_concurrency)
        self._lock = asyncio.Lock()
        self._next = 0.0

    async def wait_turn(self) -> None:
        """Sleep until this request may start: starts are ``interval`` apart."""
        if not self.interval:
            return
        async with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


class _Paced(Analyzer):
    """Per-loop pacing and the retry policy shared by the LLM analyzers."""

    def __init__(self, max_concurrency: int, requests_per_minute: float | None, backoff_s: float,
                 max_backoff_s: float) -> None:
        self.max_concurrency = max_concurrency
        self.requests_per_minute = requests_per_minute
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._pacer_state: tuple[asyncio.AbstractEventLoop, _Pacer] | None = None

    def _pacer(self) -> _Pacer:
        loop = asyncio.get_running_loop()
        if self._pacer_state is None or self._pacer_state[0] is not loop:  # asyncio primitives may not cross loops
            self._pacer_state = (loop, _Pacer(self.max_concurrency, self.requests_per_minute))
        return self._pacer_state[1]

    def _policy(self, max_retries: int) -> RetryPolicy:
        return RetryPolicy(max_retries=max_retries, backoff_s=self.backoff_s, max_backoff_s=self.max_backoff_s)


# -- OpenAI-compatible endpoints ------------------------------------------------------------


class _Fatal(Exception):
    """A request that must not be retried (another 4xx, a reply that is no chat completion)."""


class OpenAIChatAnalyzer(_Paced):
    """``POST {base_url}/v1/chat/completions`` with httpx.

    Retries by ``seed_agents.http.RetryPolicy`` (jittered exponential backoff, Retry-After
    honoured) on connection errors, timeouts, 408, 429 and 5xx; any other 4xx fails at once with the server's message. The API
    key is read from ``os.environ[api_key_env]`` for each request and sent only as the
    ``Authorization: Bearer`` header; it is never stored on the object, and any error text
    that would quote it is redacted.
    """

    def __init__(self, base_url: str, model: str, *, api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.0,
                 max_tokens: int = 512, max_concurrency: int = 8, requests_per_minute: float | None = None,
                 max_retries: int = 4, backoff_s: float = 1.0, max_backoff_s: float = 60.0, timeout_s: float = 120.0,
                 extra_body: dict[str, Any] | None = None, price_per_mtok_prompt: float = 0.0,
                 price_per_mtok_completion: float = 0.0) -> None:
        super().__init__(max_concurrency, requests_per_minute, backoff_s, max_backoff_s)
        url = base_url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        self.model = model
        self.name = f"openai:{model}"
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.extra_body = dict(extra_body or {})
        self.prices = (price_per_mtok_prompt, price_per_mtok_completion)
        self._client_state: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None

    def __repr__(self) -> str:
        return f"OpenAIChatAnalyzer({self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client_state is None or self._client_state[0] is not loop:  # a client may not cross loops
            n = self.max_concurrency
            client = httpx.AsyncClient(base_url=self.base_url,
                                       limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                                       timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)))
            self._client_state = (loop, client)
        return self._client_state[1]

    def _redact(self, text: str, max_chars: int | None = None) -> str:
        """The key (and anything shaped like a credential) masked, *then* cut to ``max_chars``."""
        return redact(text, [os.environ.get(self.api_key_env)], max_chars=max_chars)

    async def analyze(self, messages: list[BaseMessage], episode: EpisodeRecord | None = None) -> AnalyzerReply:
        from seed_agents.chat_model import to_chat_dicts

        body = {"model": self.model, "messages": to_chat_dicts(messages), "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_body}
        pacer, t0 = self._pacer(), time.perf_counter()
        attempts = 0

        async def attempt() -> dict[str, Any]:
            nonlocal attempts
            await pacer.wait_turn()  # retries are paced like first tries
            attempts += 1
            return await self._post(body)

        async with pacer.slots:
            try:
                data = await self._policy(self.max_retries).aretrying()(attempt)
            except (httpx.TransportError, RetryableResponse, _Fatal) as e:
                last = f"{type(e).__name__}: {e}" if isinstance(e, httpx.TransportError) else str(e)
                tries = f"after {attempts} attempt{'s' * (attempts > 1)}"
                return AnalyzerReply(error=self._redact(f"{self.name} at {self.base_url} failed {tries}: {last}"),
                                     attempts=attempts, latency_s=time.perf_counter() - t0)
        return self._reply(data, attempts, time.perf_counter() - t0)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        key = os.environ.get(self.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = await self._client().post("/v1/chat/completions", json=body, headers=headers)  # transport errors: retried
        status = response.status_code
        if retryable_status(status):
            raise RetryableResponse.of(response, self._redact(_error_message(response), ERROR_CHARS))
        if status >= 400:
            raise _Fatal(f"HTTP {status} (not retried): {self._redact(_error_message(response), ERROR_CHARS)}")
        try:
            data = response.json()
            data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            shown = repr(self._redact(response.text))[:ERROR_CHARS]  # redacted before the cut
            raise _Fatal(f"unexpected response (not an OpenAI chat completion): {shown}") from None
        return data

    def _reply(self, data: dict[str, Any], attempts: int, latency_s: float) -> AnalyzerReply:
        usage = data.get("usage") or {}
        p, c = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        return AnalyzerReply(text=str(data["choices"][0]["message"].get("content") or ""), prompt_tokens=p,
                             completion_tokens=c, latency_s=latency_s, attempts=attempts,
                             cost_usd=(p * self.prices[0] + c * self.prices[1]) / 1e6)

    async def aclose(self) -> None:
        state, self._client_state = self._client_state, None
        if state is not None and state[0] is asyncio.get_running_loop():
            await state[1].aclose()  # a client of a finished loop died with it


ERROR_CHARS = 300
"""Server error text kept in an error message; cut only after redaction (``redact``)."""


def _error_message(response: httpx.Response) -> str:
    """The server's own error text, whole: the caller redacts, then truncates."""
    try:
        data = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict) and "message" in err:
        return str(err["message"])
    return str(err)


# -- any LangChain chat model ---------------------------------------------------------------


class LangChainAnalyzer(_Paced):
    """A LangChain chat model (``ainvoke``), paced and retried like the OpenAI client.

    Every exception but ``TypeError`` is retried: LangChain providers raise their own types. Usage comes
    from the reply's ``usage_metadata`` when the provider reports it.
    """

    def __init__(self, model: Any, *, name: str, max_concurrency: int = 8, requests_per_minute: float | None = None,
                 max_retries: int = 4, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 price_per_mtok_prompt: float = 0.0, price_per_mtok_completion: float = 0.0) -> None:
        super().__init__(max_concurrency, requests_per_minute, backoff_s, max_backoff_s)
        self.model = model
        self.name = name
        self.max_retries = max_retries
        self.prices = (price_per_mtok_prompt, price_per_mtok_completion)

    @classmethod
    def from_spec(cls, spec: str, kwargs: dict[str, Any] | None = None, **options: Any) -> LangChainAnalyzer:
        from seed_agents.imports import load_object

        obj = load_object(spec)
        is_factory = isinstance(obj, type) or (callable(obj) and not hasattr(obj, "ainvoke"))
        model = obj(**(kwargs or {})) if is_factory else obj
        if not hasattr(model, "ainvoke"):
            raise ValueError(f"{spec!r} did not give a LangChain chat model (no ainvoke): {type(model).__name__}")
        return cls(model, name=f"langchain:{spec}", **options)

    async def analyze(self, messages: list[BaseMessage], episode: EpisodeRecord | None = None) -> AnalyzerReply:
        return await _invoke_paced(self, self.model, messages, self.max_retries, self.prices)


def _provider_error_retryable(error: BaseException) -> bool:
    """LangChain providers raise their own types: retry all but programming errors."""
    return not isinstance(error, TypeError | NotImplementedError)


async def _invoke_paced(paced: _Paced, model: Any, messages: list[BaseMessage], max_retries: int,
                        prices: tuple[float, float]) -> AnalyzerReply:
    pacer, t0 = paced._pacer(), time.perf_counter()
    attempts = 0

    async def attempt() -> Any:
        nonlocal attempts
        await pacer.wait_turn()
        attempts += 1
        return await model.ainvoke(messages)

    async with pacer.slots:
        try:
            reply = await paced._policy(max_retries).aretrying(_provider_error_retryable)(attempt)
        except Exception as e:  # noqa: BLE001 - provider errors are data here
            last = redact(f"{type(e).__name__}: {e}")  # a provider may quote its credentials
            return AnalyzerReply(error=f"failed after {attempts} attempts: {last}", attempts=attempts,
                                 latency_s=time.perf_counter() - t0)
    usage = getattr(reply, "usage_metadata", None) or {}
    p, c = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    text = reply.content if isinstance(reply.content, str) else str(reply.content)
    return AnalyzerReply(text=text, prompt_tokens=p, completion_tokens=c, attempts=attempts,
                         latency_s=time.perf_counter() - t0, cost_usd=(p * prices[0] + c * prices[1]) / 1e6)


# -- the policy (or any SeedChatModel) as analyzer --------------------------------------------


class PolicyAnalyzer(_Paced):
    """A ``SeedChatModel`` over our backends: the base or SFT policy writing its own skills.

    Same call as ``graphs.hindsight.write_skill``: greedy by default, under
    ``capture(purpose="analyzer")``, so an enclosing capture scope records the call with
    its token ids. Backend errors are not retried here (backends retry themselves).
    ``constrained`` (default): decode under ``backends.grammar.skill_tag``, so every reply
    parses (``write_skill`` does the same for a bare ``SeedChatModel``). The grammar takes
    the word limits the replies are parsed with and, with ``opening="call"``, opens the
    skill with "Call <tool> with" and a tool the episode offered (``EpisodeRecord.tools``),
    as training does: stage 1 then teaches the skill form training will ask for.
    """

    def __init__(self, llm: Any, *, max_tokens: int = 512, temperature: float = 0.0, max_concurrency: int = 8,
                 name: str | None = None, close_backend: bool = False, constrained: bool = True,
                 min_words: int = 5, max_words: int = 120, opening: SkillOpening = "words") -> None:
        super().__init__(max_concurrency, None, 0.0, 0.0)
        self.llm = llm
        self.constrained = constrained
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.min_words, self.max_words, self.opening = min_words, max_words, opening
        self.name = name or f"policy:{getattr(llm, 'model_name', 'seed-agents')}"
        self.close_backend = close_backend

    async def analyze(self, messages: list[BaseMessage], episode: EpisodeRecord | None = None) -> AnalyzerReply:
        from seed_agents.backends.grammar import skill_tag
        from seed_agents.capture import capture
        from seed_agents.chat_model import SeedChatModel

        bound: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.constrained and isinstance(self.llm, SeedChatModel):  # other chat models take no grammar
            names = episode.tools if episode is not None and self.opening == "call" else []
            bound["structural_tag"] = skill_tag(min_words=self.min_words, max_words=self.max_words,
                                                max_tokens=self.max_tokens, call_names=names)
        with capture(purpose="analyzer"):
            return await _invoke_paced(self, self.llm.bind(**bound), messages, 0, (0.0, 0.0))

    async def aclose(self) -> None:
        if self.close_backend:
            self.llm.backend.close()


# -- construction from a config -------------------------------------------------------------


def make_analyzer(cfg: AnalyzerConfig, *, llm: Any = None, suite: EnvSuite | None = None,
                  min_words: int = 5, max_words: int = 120, opening: SkillOpening = "words") -> Analyzer:
    """Build the configured analyzer, named ``cfg.name`` when given. ``llm``: the
    ``SeedChatModel`` a ``policy`` analyzer uses when the config names no backend or model
    (e.g. the collect run's policy); ``suite``: the env suite whose offline analyzer
    ``rule_based`` means. ``min_words``, ``max_words``, ``opening``: the skill form a
    ``policy`` analyzer's grammar enforces (the others are asked by the prompt alone).
    Raises ``ValueError`` when one of them is needed and missing."""
    analyzer = _make_analyzer(cfg, llm=llm, suite=suite, min_words=min_words, max_words=max_words, opening=opening)
    if cfg.name:
        analyzer.name = cfg.name
    return analyzer


def _make_analyzer(cfg: AnalyzerConfig, *, llm: Any, suite: EnvSuite | None, min_words: int, max_words: int,
                   opening: SkillOpening) -> Analyzer:
    if cfg.kind == "rule_based":
        offline = suite.offline_analyzer() if suite is not None else None
        if offline is None:
            what = f"the env {suite.name!r}" if suite is not None else "no env suite"
            raise ValueError(f"kind rule_based needs an env suite with an offline analyzer and {what} offers none; "
                             f"use kind openai, langchain or policy")
        return offline
    pacing = {"max_concurrency": cfg.max_concurrency, "requests_per_minute": cfg.requests_per_minute,
              "max_retries": cfg.max_retries, "backoff_s": cfg.backoff_s, "max_backoff_s": cfg.max_backoff_s,
              "price_per_mtok_prompt": cfg.price_per_mtok_prompt,
              "price_per_mtok_completion": cfg.price_per_mtok_completion}
    if cfg.kind == "openai":
        assert cfg.model is not None
        return OpenAIChatAnalyzer(cfg.base_url, cfg.model, api_key_env=cfg.api_key_env, temperature=cfg.temperature,
                                  max_tokens=cfg.max_tokens, timeout_s=cfg.timeout_s, extra_body=cfg.extra_body, **pacing)
    if cfg.kind == "langchain":
        assert cfg.spec is not None
        return LangChainAnalyzer.from_spec(cfg.spec, cfg.kwargs, **pacing)
    backend_cfg = cfg.backend or (BackendConfig(kind="local", model=cfg.model) if cfg.model else None)
    if backend_cfg is None:
        if llm is None:
            raise ValueError("a policy analyzer needs analyzer.backend, analyzer.model or a chat model")
        return PolicyAnalyzer(llm, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                              max_concurrency=cfg.max_concurrency, min_words=min_words, max_words=max_words,
                              opening=opening)
    from seed_agents.backends import make_backend
    from seed_agents.chat_model import SeedChatModel

    backend, tokenizer = make_backend(backend_cfg)
    chat = SeedChatModel(backend=backend, tokenizer=tokenizer, model_name=backend_cfg.model, purpose="analyzer")
    return PolicyAnalyzer(chat, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                          max_concurrency=cfg.max_concurrency, close_backend=True, min_words=min_words,
                          max_words=max_words, opening=opening)
