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
- ``RuleBasedTextWorldAnalyzer``: deterministic and offline. It is the *stand-in* for a
  stronger analyzer where no endpoint is reachable (tests, CI, air-gapped demos): it
  derives workflows and avoidance rules from what the agent saw and did in the episode,
  never from hidden game data such as the walkthrough.

An analyzer never raises for a failed request: the reply carries ``error`` instead, and
the collector keeps such episodes for the next run.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import httpx
from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from seed_agents.config import BackendConfig
from seed_agents.redact import redact
from seed_agents.skills import CONTROL_MARKERS, parse_skill

Step = tuple[str, str]
"""(observation, response) of one policy call, as ``seed_agents.skills.episode_steps`` gives."""


class AnalyzerReply(BaseModel):
    """One analyzer answer. ``error`` set means no usable reply (the request failed)."""

    text: str = Field("", description="The raw reply (the SFT target when it parses).")
    prompt_tokens: int = Field(0, ge=0, description="As reported by the endpoint; 0 when unknown.")
    completion_tokens: int = Field(0, ge=0, description="As reported by the endpoint; 0 when unknown.")
    latency_s: float = Field(0.0, ge=0, description="Wall time of the request, retries included.")
    cost_usd: float = Field(0.0, ge=0, description="From the configured prices per 1M tokens; 0 when unpriced.")
    attempts: int = Field(1, ge=0, description="Requests sent for this reply (1 + retries).")
    error: str | None = Field(None, description="Why there is no reply; None on success.")


@runtime_checkable
class Analyzer(Protocol):
    """Writes one skill JSON per episode.

    LLM analyzers read ``messages`` (the analyzer prompt); the rule-based one reads the
    structured ``steps``, ``success`` and ``task_text`` the prompt was built from.
    """

    name: str

    async def analyze(self, messages: list[BaseMessage], *, steps: Sequence[Step], success: bool,
                      task_text: str) -> AnalyzerReply: ...

    async def aclose(self) -> None: ...


class AnalyzerConfig(BaseModel):
    """Which analyzer writes the stage-1 skills, and how hard it may be pushed."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, description="Name written into each SkillExample.analyzer and shown by `skills eval` (default: the kind and model, e.g. 'openai:gpt-4o-mini').")
    kind: Literal["rule_based", "openai", "langchain", "policy"] = Field("rule_based", description="rule_based: the offline TextWorld stand-in; openai: an OpenAI-compatible endpoint; langchain: a LangChain chat model; policy: our own backends (base or SFT policy).")
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


class _Paced:
    """Per-loop pacing and the retry delay shared by the LLM analyzers."""

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

    def _delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Exponential backoff with jitter (half to full delay); Retry-After wins when given."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_backoff_s)
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)


# -- OpenAI-compatible endpoints ------------------------------------------------------------


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Fatal(Exception):
    pass


class OpenAIChatAnalyzer(_Paced):
    """``POST {base_url}/v1/chat/completions`` with httpx.

    Retries (exponential backoff with jitter, Retry-After honoured) on connection errors,
    timeouts, 408, 429 and 5xx; any other 4xx fails at once with the server's message. The API
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

    async def analyze(self, messages: list[BaseMessage], *, steps: Sequence[Step] = (), success: bool = False,
                      task_text: str = "") -> AnalyzerReply:
        from seed_agents.chat_model import to_chat_dicts

        body = {"model": self.model, "messages": to_chat_dicts(messages), "temperature": self.temperature,
                "max_tokens": self.max_tokens, **self.extra_body}
        pacer, t0 = self._pacer(), time.perf_counter()
        attempts, last = 0, ""
        async with pacer.slots:
            for attempt in range(self.max_retries + 1):
                await pacer.wait_turn()
                attempts += 1
                try:
                    data = await self._post(body)
                except _Retryable as e:
                    last = str(e)
                    if attempt < self.max_retries:
                        await asyncio.sleep(self._delay(attempt + 1, e.retry_after))
                    continue
                except _Fatal as e:
                    last = str(e)
                    break
                return self._reply(data, attempts, time.perf_counter() - t0)
        tries = f"after {attempts} attempt{'s' * (attempts > 1)}"
        return AnalyzerReply(error=self._redact(f"{self.name} at {self.base_url} failed {tries}: {last}"),
                             attempts=attempts, latency_s=time.perf_counter() - t0)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        key = os.environ.get(self.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            response = await self._client().post("/v1/chat/completions", json=body, headers=headers)
        except httpx.TransportError as e:  # connect errors and timeouts
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        status = response.status_code
        if status in (408, 429) or status >= 500:
            raise _Retryable(f"HTTP {status}: {self._redact(_error_message(response), ERROR_CHARS)}", _retry_after(response))
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


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


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

    async def analyze(self, messages: list[BaseMessage], *, steps: Sequence[Step] = (), success: bool = False,
                      task_text: str = "") -> AnalyzerReply:
        return await _invoke_paced(self, self.model, messages, self.max_retries, self.prices)

    async def aclose(self) -> None:
        pass


async def _invoke_paced(paced: _Paced, model: Any, messages: list[BaseMessage], max_retries: int,
                        prices: tuple[float, float]) -> AnalyzerReply:
    pacer, t0 = paced._pacer(), time.perf_counter()
    last = ""
    attempts = 0
    async with pacer.slots:
        for attempt in range(max_retries + 1):
            await pacer.wait_turn()
            attempts += 1
            try:
                reply = await model.ainvoke(messages)
            except Exception as e:  # noqa: BLE001 - provider errors are data here
                last = redact(f"{type(e).__name__}: {e}")  # a provider may quote its credentials
                if isinstance(e, TypeError | NotImplementedError):  # a programming error: retrying cannot help
                    break
                if attempt < max_retries:
                    await asyncio.sleep(paced._delay(attempt + 1))
                continue
            usage = getattr(reply, "usage_metadata", None) or {}
            p, c = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
            text = reply.content if isinstance(reply.content, str) else str(reply.content)
            return AnalyzerReply(text=text, prompt_tokens=p, completion_tokens=c, attempts=attempts,
                                 latency_s=time.perf_counter() - t0, cost_usd=(p * prices[0] + c * prices[1]) / 1e6)
    return AnalyzerReply(error=f"failed after {attempts} attempts: {last}", attempts=attempts,
                         latency_s=time.perf_counter() - t0)


# -- the policy (or any SeedChatModel) as analyzer --------------------------------------------


class PolicyAnalyzer(_Paced):
    """A ``SeedChatModel`` over our backends: the base or SFT policy writing its own skills.

    Same call as ``graphs.hindsight.write_skill``: greedy by default, under
    ``capture(purpose="analyzer")``, so an enclosing capture scope records the call with
    its token ids. Backend errors are not retried here (backends retry themselves).
    """

    def __init__(self, llm: Any, *, max_tokens: int = 512, temperature: float = 0.0, max_concurrency: int = 8,
                 name: str | None = None, close_backend: bool = False) -> None:
        super().__init__(max_concurrency, None, 0.0, 0.0)
        self.llm = llm
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.name = name or f"policy:{getattr(llm, 'model_name', 'seed-agents')}"
        self.close_backend = close_backend

    async def analyze(self, messages: list[BaseMessage], *, steps: Sequence[Step] = (), success: bool = False,
                      task_text: str = "") -> AnalyzerReply:
        from seed_agents.capture import capture

        with capture(purpose="analyzer"):
            return await _invoke_paced(self, self.llm.bind(temperature=self.temperature, max_tokens=self.max_tokens),
                                       messages, 0, (0.0, 0.0))

    async def aclose(self) -> None:
        if self.close_backend:
            self.llm.backend.close()


# -- the offline stand-in: rule-based analysis of a TextWorld-style episode ---------------


INVALID_CUES = ("not a valid action", "invalid action", "invalid command")
"""Observation text that marks the previous command as rejected (TextWorld's
``INVALID_ACTION_TEXT`` is "That is not a valid action. ...")."""
PROGRESS_CUES = ("score has just gone up", "your score has gone up")
INFO_VERBS = ("look", "examine", "inventory", "l", "x", "i")
_SUGGEST_VERBS = {"take": 0, "unlock": 1, "open": 2, "insert": 3, "put": 3, "eat": 4, "drink": 4, "cook": 4, "go": 5}
_GOAL_VERBS = frozenset(
    "take lift pick pick-up grab get recover retrieve find fetch collect bring put place insert drop open unlock "
    "close go venture travel head move walk trip enter leave eat drink cook make prepare reach climb".split()
)
_STOPWORDS = frozenset(
    "a an the to of in on into onto from with at by for and or then it its this that you your is are be "
    "up out off over under inside floor room".split()
)
_FILLER = re.compile(
    r"^(?:okay|ok|alright|and|then|so|now|next|please|finally|lastly|after that|first(?: of all| step| off| thing)?|"
    r"once (?:that's|you've|you have)[^,]*|here is[^,]*|your (?:\w+ )?(?:task|objective|goal|mission)(?: for today)? is to|"
    r"(?:you )?(?:have|need|want|are going) to|you must|you should|try to|attempt to|make sure (?:that )?you|"
    r"why not|can you|could you|be sure to)\b[,:]?\s*",
    re.IGNORECASE,
)
_PREFIX = re.compile(r"^(?:>|action\s*:|command\s*:)\s*", re.IGNORECASE)
_WORD_BUDGET = 110  # under parse_skill's default max of 120 words


class RuleBasedTextWorldAnalyzer:
    """Offline, deterministic stand-in for a stronger analyzer (tuned for TextWorld).

    Reads only what the agent saw and did: the objective (first paragraph of the first
    observation), the numbered "Valid commands" lists it was shown, its replies, the
    env's "not a valid action" feedback, score cues, and the episode outcome. Success ->
    a workflow (the commands that worked, in order); failure -> corrective rules (the
    listed command that matches the objective's nouns but was never tried, the answer
    format after invalid commands, no repeats, no idle looking), which never quote the
    failed commands. Runs on any env-agent episode; without command lists it falls back
    to the replies' first lines. The reply is the JSON ``parse_skill`` accepts.
    """

    name = "rule-based-textworld"

    async def analyze(self, messages: list[BaseMessage] | None = None, *, steps: Sequence[Step], success: bool,
                      task_text: str = "") -> AnalyzerReply:
        t0 = time.perf_counter()
        return AnalyzerReply(text=self.write(steps, success, task_text), latency_s=time.perf_counter() - t0)

    async def aclose(self) -> None:
        pass

    def write(self, steps: Sequence[Step], success: bool, task_text: str = "") -> str:
        """The skill JSON for one episode (pure and deterministic)."""
        ep = _read_episode(steps, task_text)
        summary, skill = (_workflow(ep) if success else _avoidance(ep))
        if parse_skill(json.dumps({"episode_summary": summary, "episode_skill": skill}))[2] is not None:
            skill = "Each turn, copy exactly one command from the numbered list that moves you toward the objective."
        return json.dumps({"episode_summary": summary, "episode_skill": skill}, ensure_ascii=False)


class _Turn:
    def __init__(self, text: str, listed: list[str], reply: str) -> None:
        self.text, self.listed, self.reply = text, listed, reply
        self.command = _to_command(reply, listed)
        self.valid = (not listed or self.command.lower() in {c.lower() for c in listed}) and bool(self.command)
        self.scored = False


class _Episode:
    def __init__(self, turns: list[_Turn], objective: str) -> None:
        self.turns, self.objective = turns, objective
        self.goal = _goal(objective)


def _split_turn(observation: str) -> tuple[str, list[str]]:
    """(situation text, listed commands) from an env-agent turn (chat or window layout)."""
    text = observation
    if "Current observation:" in text:
        text = text.rsplit("Current observation:", 1)[1]
    listed: list[str] = []
    head, sep, tail = text.partition("Valid commands:")
    if sep:
        for line in tail.strip().splitlines():
            m = re.match(r"^\s*\d+[.)]\s+(.+?)\s*$", line)
            if m:
                listed.append(m.group(1))
            elif line.strip():
                break
        text = head
    text = re.sub(r"\s*Your command:\s*$", "", text.strip())
    return text.strip(), listed


def _to_command(reply: str, listed: list[str]) -> str:
    """The command a reply names (the env agent's parse rules), else its first line."""
    line = next((ln for ln in reply.strip().splitlines() if ln.strip()), "").strip()
    cleaned = _PREFIX.sub("", line).strip().strip("`\"'").rstrip(".!").strip()
    lookup = {c.lower(): c for c in listed}
    if cleaned.lower() in lookup:
        return lookup[cleaned.lower()]
    m = re.fullmatch(r"(\d+)[.)]?(?:\s+(.*))?", cleaned)
    if m and listed:
        rest = (m.group(2) or "").strip().lower()
        if rest in lookup:
            return lookup[rest]
        if not rest and 0 <= int(m.group(1)) - 1 < len(listed):
            return listed[int(m.group(1)) - 1]
    return cleaned


def _read_episode(steps: Sequence[Step], task_text: str) -> _Episode:
    turns = [_Turn(*_split_turn(obs), reply) for obs, reply in steps]
    for prev, nxt in zip(turns, turns[1:], strict=False):
        low = nxt.text.lower()
        if any(cue in low for cue in INVALID_CUES):
            prev.valid = False
        if any(cue in low for cue in PROGRESS_CUES):
            prev.scored = True
    first = _split_turn(task_text)[0] if task_text.strip() else (turns[0].text if turns else "")
    objective = re.split(r"\n\s*\n", first.strip(), maxsplit=1)[0].strip() if first.strip() else ""
    return _Episode(turns, objective)


def _goal(objective: str) -> str:
    """The objective's imperative parts, filler stripped: 'travel north, then lift the passkey ...'."""
    parts = []
    for sentence in re.split(r"(?<=[.!?])\s+", objective.replace("\n", " ")):
        if "textworld" in sentence.lower() or sentence.rstrip().endswith("?"):
            continue
        s = sentence.strip().rstrip(".!").strip()
        for _ in range(8):
            stripped = _FILLER.sub("", s, count=1).strip()
            if stripped == s:
                break
            s = stripped
        words = re.findall(r"[a-z][a-z-]*", s.lower())
        if words and (words[0] in _GOAL_VERBS or (len(words) > 1 and words[0] == "to" and words[1] in _GOAL_VERBS)):
            parts.append(s[0].lower() + s[1:])
    goal = ", then ".join(parts)
    if not goal or len(goal.split()) > 30:
        goal = parts[-1] if parts else objective.strip().split("\n")[0]
    words = goal.split()
    return " ".join(words[:30]).rstrip(",;:") if words else "complete the task"


def _quote(command: str, limit: int = 40) -> str:
    """A command safe to quote inside a skill: one line, no control tokens, clipped."""
    text = " ".join(command.split())
    for marker in CONTROL_MARKERS:
        text = text.replace(marker, " ")
    text = " ".join(text.replace("'", "").replace("<", " ").replace(">", " ").split())
    text = text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
    return f"'{text}'" if text else "an empty reply"


def _steps(n: int) -> str:
    return f"{n} step{'s' * (n != 1)}"


def _fit(sentences: list[str], budget: int = _WORD_BUDGET) -> str:
    out: list[str] = []
    for s in sentences:
        if len(" ".join([*out, s]).split()) > budget:
            break
        out.append(s)
    return " ".join(out or sentences[:1])


def _workflow(ep: _Episode) -> tuple[str, str]:
    valid = [t.command for t in ep.turns if t.valid]
    plan = [c for c in valid if c.split()[0].lower() not in INFO_VERBS] or valid
    plan = [c for i, c in enumerate(plan) if i == 0 or c.lower() != plan[i - 1].lower()]  # collapse repeats
    n_invalid = sum(not t.valid for t in ep.turns)
    if len(plan) > 8:
        plan = plan[-8:]  # the end of a long run is what won it
        order = "..., then " + ", then ".join(_quote(c) for c in plan)
    else:
        order = ", then ".join(_quote(c) for c in plan) or "the listed commands"
    first = f"To {ep.goal}, use {order}."
    rule = "Copy each command exactly from the numbered list" + (
        " and never type a command that is not listed." if n_invalid else ", one per turn.")
    skill = _fit([first, rule])
    if len(skill.split()) > _WORD_BUDGET:  # a very long goal: drop it, keep the order
        skill = _fit([f"Use {order}.", rule])
    # short: the skill is what gets injected, and a policy that learns to write long
    # summaries runs out of its analyzer budget before the skill
    summary = (f"The agent succeeded in {_steps(len(ep.turns))}"
               + (f" with {n_invalid} invalid command{'s' * (n_invalid != 1)}" if n_invalid else "") + ".")
    return summary, skill


def _avoidance(ep: _Episode) -> tuple[str, str]:
    """Rules for a failed episode, phrased as what to do next time.

    A failed command is never quoted: measured with ``skills eval``, a 135M policy takes
    a quoted bad command as a cue and the skill then made the failed actions *more*
    likely. So each rule names the fix (the listed command the objective points at, the
    format to answer in, the habit to drop) and only successful commands are quoted.
    """
    turns = ep.turns
    rules: list[str] = []
    suggestion = _suggestion(ep)
    if suggestion:
        rules.append(suggestion)
    n_invalid = sum(not t.valid for t in turns)
    if n_invalid:
        rules.append("Answer with exactly one command copied from the numbered list, nothing else: "
                     "no description, no number, no extra words.")
    counts = Counter(t.command.lower() for t in turns if t.valid and not t.scored)
    repeated = [c for c, n in counts.items() if n >= 2]
    if repeated:
        rules.append("Never send the same command twice in a row; when a command gave no progress, "
                     "pick a listed command you have not tried yet.")
    info = [t for t in turns if t.valid and t.command.split()[0].lower() in INFO_VERBS]
    if info and len(rules) < 3:
        rules.append("Act on the objective from the first turn instead of looking around or examining things.")
    scored = [t.command for t in turns if t.scored]
    if scored and len(rules) < 3:
        rules.append(f"{_quote(scored[0])} made progress, so do it early and then continue toward the objective.")
    if not rules:
        rules.append(f"Do not stop short: each turn, choose the listed command that moves toward the objective ({ep.goal}).")
    skill = _fit(rules[:3])
    facts = [f"{n_invalid} invalid command{'s' * (n_invalid != 1)}"] if n_invalid else []
    if repeated:
        facts.append("repeated commands without progress")
    if scored:
        facts.append("made some progress")
    summary = f"The agent failed in {_steps(len(turns))}" + (": " + ", ".join(facts) if facts else "") + "."
    return summary, skill


def _suggestion(ep: _Episode) -> str | None:
    """A listed command whose objects the objective names, that the agent never tried."""
    nouns = [w for w in re.findall(r"[a-z][a-z-]*", ep.goal.lower()) if w not in _STOPWORDS and w not in _GOAL_VERBS]
    if not nouns:
        return None
    tried = {t.command.lower() for t in ep.turns}
    best: tuple[tuple[int, int, int], str, str] | None = None
    seen: list[str] = list(dict.fromkeys(c for t in reversed(ep.turns) for c in t.listed))  # newest lists first
    for rank, command in enumerate(seen):
        words = command.lower().split()
        if not words or words[0] not in _SUGGEST_VERBS or command.lower() in tried:
            continue
        hits = [n for n in nouns if n in words[1:]]
        if not hits:
            continue
        key = (-len(hits), _SUGGEST_VERBS[words[0]], rank)
        if best is None or key < best[0]:
            best = (key, command, hits[0])
    if best is None:
        return None
    return f"The objective mentions {best[2]}: send {_quote(best[1])} as soon as it is listed."


# -- construction from a config -------------------------------------------------------------


def make_analyzer(cfg: AnalyzerConfig, *, llm: Any = None) -> Analyzer:
    """Build the configured analyzer, named ``cfg.name`` when given. ``llm``: the
    ``SeedChatModel`` a ``policy`` analyzer uses when the config names no backend or model
    (e.g. the collect run's policy)."""
    analyzer = _make_analyzer(cfg, llm=llm)
    if cfg.name:
        analyzer.name = cfg.name
    return analyzer


def _make_analyzer(cfg: AnalyzerConfig, *, llm: Any = None) -> Analyzer:
    if cfg.kind == "rule_based":
        return RuleBasedTextWorldAnalyzer()
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
                              max_concurrency=cfg.max_concurrency)
    from seed_agents.backends import make_backend
    from seed_agents.chat_model import SeedChatModel

    backend, tokenizer = make_backend(backend_cfg)
    chat = SeedChatModel(backend=backend, tokenizer=tokenizer, model_name=backend_cfg.model, purpose="analyzer")
    return PolicyAnalyzer(chat, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                          max_concurrency=cfg.max_concurrency, close_backend=True)
