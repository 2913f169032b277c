"""The gateway's configuration: one pydantic model per concern, composed.

Secrets never live in these models as plain values: the upstream's key and the role keys
are read from environment variables whose NAMES are configured here (role keys may also be
given inline as ``SecretStr``, which prints as ``**********``), so a dumped or logged
config cannot leak them.
"""

from __future__ import annotations

import re
import socket
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from seed_agents.config.core import check_env_name  # configs name where a secret lives

#: Common API-key shapes. Each is a Python regex; a match is replaced by ``[REDACTED]``.
DEFAULT_SECRET_PATTERNS: tuple[str, ...] = (
    r"sk-[A-Za-z0-9_-]{16,}",  # OpenAI / Anthropic style secret keys
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{16,}",  # HTTP bearer tokens pasted into text
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"(?i:aws_secret_access_key)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}",  # AWS secret keys
    r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",  # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{22,}\b",  # GitHub fine-grained tokens
    r"\bxox[abprs]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"\bAIza[0-9A-Za-z_-]{35}\b",  # Google API keys
    r"\bhf_[A-Za-z0-9]{30,}\b",  # Hugging Face tokens
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",  # PEM keys
    r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@",  # credentials in URLs (scheme://user:password@)
)


class SecurityConfig(BaseModel):
    """Who may call what, what is scrubbed from stored text, and how big a request may be.

    Roles: ``client`` may chat (``/v1/chat/completions``, ``/v1/models``); ``feedback`` may
    post ``user`` rewards, end sessions and run the judge; ``verifier`` (an outside checker)
    may post ``verifier`` rewards; ``admin`` may do everything, including rewards of any
    source, export and policy-version switches. A reward's source is what the key's role
    allows, never the request body's say alone (``seed_agents.gateway.feedback``). With no key configured for any role the gateway
    is open (meant for loopback use) and says so once in the log. Once any key is set, a
    role with no keys of its own is reachable with an admin key only.
    """

    model_config = ConfigDict(extra="forbid")

    client_keys: list[SecretStr] = Field(default_factory=list, description="Inline client keys (prefer client_keys_env).")
    feedback_keys: list[SecretStr] = Field(default_factory=list, description="Inline feedback keys (prefer feedback_keys_env).")
    verifier_keys: list[SecretStr] = Field(default_factory=list, description="Inline verifier keys (prefer verifier_keys_env).")
    admin_keys: list[SecretStr] = Field(default_factory=list, description="Inline admin keys (prefer admin_keys_env).")
    client_keys_env: str = Field("SEED_GATEWAY_CLIENT_KEYS", description="NAME of an env var holding comma-separated client keys.")
    feedback_keys_env: str = Field("SEED_GATEWAY_FEEDBACK_KEYS", description="NAME of an env var holding comma-separated feedback keys.")
    verifier_keys_env: str = Field("SEED_GATEWAY_VERIFIER_KEYS",
                                   description="NAME of an env var holding comma-separated verifier keys (rewards with source 'verifier').")
    admin_keys_env: str = Field("SEED_GATEWAY_ADMIN_KEYS", description="NAME of an env var holding comma-separated admin keys.")
    secret_patterns: list[str] = Field(default_factory=lambda: list(DEFAULT_SECRET_PATTERNS),
                                       description="Regexes whose matches are replaced by [REDACTED] in every stored text and log line.")
    extra_secret_patterns: list[str] = Field(default_factory=list, description="Regexes added to secret_patterns (keeps the defaults).")
    redact_env: list[str] = Field(default_factory=list,
                                  description="NAMES of env vars whose VALUES are redacted like secret patterns (values under 6 characters are skipped).")
    max_request_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted; larger ones get HTTP 413.")

    @field_validator("client_keys_env", "feedback_keys_env", "verifier_keys_env", "admin_keys_env")
    @classmethod
    def _env_name(cls, v: str) -> str:
        return check_env_name(v)

    @field_validator("redact_env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        return [check_env_name(n) for n in v]

    @field_validator("secret_patterns", "extra_secret_patterns")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"secret pattern {p!r} is not a valid regex: {e}") from None
        return v


DEFAULT_INSTRUCTIONS = (
    "You compare several attempts by an AI agent at the same task. Read every attempt, then "
    "score each one from 0.0 (worst) to 1.0 (best) RELATIVE TO THE OTHERS: the best attempt "
    "should score near 1.0, the worst near 0.0, equally good attempts the same. Judge whether "
    "the agent achieved what the user asked, how correctly it used tools, and how efficiently. "
    'Reply with JSON only: {"scores": {"A": <float>, "B": <float>, ...}, "reason": "<one sentence>"}'
)


class JudgeConfig(BaseModel):
    """Where the judge model is and how much of each session it reads."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="OpenAI-compatible endpoint, with or without /v1.")
    model: str = Field(description="Judge model name sent in requests.")
    api_key_env: str = Field("OPENAI_API_KEY", description="NAME of the env var holding the judge endpoint's key (unset: a dummy key, fine for a local server).")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Judge sampling temperature.")
    max_retries: int = Field(3, ge=0, le=10, description="SDK retries on connection errors, 429 and 5xx.")
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout.")
    max_session_chars: int = Field(6000, ge=200, description="Transcript characters shown per session (head and tail kept).")
    min_group_size: int = Field(2, ge=2, description="Fewer candidate sessions than this: nothing is judged.")
    max_group_size: int = Field(16, ge=2, le=26, description="At most this many sessions per judge call (oldest first).")
    auto_group_size: int | None = Field(None, ge=2, description="When set, ending a session judges its task key once this many ended, unjudged sessions share it.")
    instructions: str = Field(DEFAULT_INSTRUCTIONS, description="The judge's system prompt; must ask for the JSON reply format above.")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str) -> str:
        return check_env_name(v)


class RegistryConfig(BaseModel):
    """Serve whatever version of a model name the store's version registry has promoted.

    The upstream model and the stamped policy version then follow ``seed-agents versions``
    and the continual loop's promotions (see ``seed_agents.gateway.policy``), and
    ``PUT /v1/admin/policy`` is refused so that one place decides what serves.
    """

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, description="Registry name whose promoted version serves; default: the gateway's model.")
    refresh_s: float = Field(5.0, ge=0.0, le=3600.0, description="Re-read the promoted version at most this often (0: before every request); a switch reaches users at most this late.")


class StoreOutageConfig(BaseModel):
    """What chat calls get while the trace store cannot be written (``seed_agents.gateway.spool``).

    ``spool`` (the default) keeps users answered: a call the store cannot take for a reason
    that waiting cures (server down, disk read-only or full, a lock held too long) is
    committed to a local durable spool and written to the store, in order and exactly once,
    when the store is back; a restarted gateway flushes what an earlier one left. The
    default favours the users because the call is not lost, only late. ``refuse`` answers
    such calls with 503 ``store_error`` and records nothing: for a deployment that must never
    answer a call the store does not hold yet. Either way feedback routes (rewards, session
    end, metadata) answer 503 while the store is down: OpenAI-style clients retry them.
    """

    model_config = ConfigDict(extra="forbid")

    on_failure: Literal["spool", "refuse"] = Field(
        "spool", description="spool: answer and keep the call in a local durable spool until the store is back; "
                             "refuse: HTTP 503, nothing recorded.")
    spool_path: str | None = Field(None, description=(
        "The spool's SQLite file (mode 0600, one gateway per file); default: traces.db.NAME.spool beside "
        "a SQLite store, else runs/gateway-spool-NAME.sqlite. Best on another disk than the store."))
    max_spool_mb: float = Field(1024.0, gt=0, description="Largest spool (MB of spooled calls); beyond it new calls get HTTP 503 "
                                "spool_unavailable until the store takes some.")
    retry_max_s: float = Field(10.0, gt=0, le=3600, description="Longest wait between flush attempts while the store stays down "
                               "(jittered exponential backoff from 0.1 s): a recovered store is used at most this late.")


class ReplicasConfig(BaseModel):
    """How requests are spread over several upstream replicas and when one leaves or rejoins
    the rotation (``seed_agents.gateway.replicas``)."""

    model_config = ConfigDict(extra="forbid")

    pick: Literal["least_busy", "round_robin"] = Field(
        "least_busy", description="least_busy: the replica with the fewest requests in flight from this gateway (ties in "
                                  "turn); round_robin: strictly in turn.")
    health_s: float = Field(5.0, gt=0, le=3600, description="Ask every replica this often whether it answers and serves the "
                                                            "current version; one that does rejoins the rotation.")
    probe_timeout_s: float = Field(5.0, gt=0, le=300, description="A replica that does not list its models within this is "
                                                                  "out of rotation.")
    load_adapters: bool = Field(True, description=(
        "Load the promoted version's LoRA adapter (its registry path) into a replica that answers without"
        " it, e.g. after a restart. false: such a replica stays out until loaded."))
    load_timeout_s: float = Field(120.0, gt=0, le=3600, description="Longest wait for a replica to load an adapter.")


def _urls(value: object) -> object:
    """One URL, several separated by commas, or a list: a list of base URLs."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [u.strip() for item in value for u in (item.split(",") if isinstance(item, str) else [item]) if u.strip()]
    return value


class GatewayConfig(BaseModel):
    """Everything ``seed-agents gateway`` needs besides the store and the upstream object.

    ``model`` is the name clients put in requests and ``/v1/models`` lists; requests are
    forwarded to ``upstream_model`` (default: the same name), which an admin may switch
    at run time together with ``policy_version`` (e.g. to a newly promoted LoRA adapter),
    or which ``registry`` keeps on the store's promoted version. With several ``upstream``
    replicas every one must serve that name before it is switched to (``replicas``).
    """

    model_config = ConfigDict(extra="forbid")

    upstream: list[str] = Field(min_length=1, description="Base URL of the vLLM server (with or without /v1), or of several "
                                "replicas serving the same model (a list, or URLs separated by commas).")
    name: str | None = Field(None, min_length=1, max_length=128, description="This gateway's name among those on one store "
                             "(its row in `seed-agents status`, its default spool file); default: host name and port.")
    model: str = Field(min_length=1, description="Model name clients request; unknown names get HTTP 404.")
    upstream_model: str | None = Field(None, description="Model name sent upstream (vLLM's served name or LoRA adapter); default: model.")
    tokenizer: str | None = Field(None, description="Tokenizer folder/alias/hub id whose chat template renders prompts; default: model.")
    upstream_api_key_env: str | None = Field(None, description="NAME of the env var holding the upstream's API key; sent upstream only.")
    store: str = Field("sqlite:///runs/traces.db", description="Trace store URL (sqlite:///path or postgresql://...).")
    host: str = Field("127.0.0.1", description="Interface to listen on; loopback by default.")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on.")
    policy_version: int = Field(0, ge=0, description="Version stamped on calls until an admin switches it.")
    tool_format: Literal["auto", "native", "hermes"] = Field(
        "auto", description="How tools reach the template: native (the template renders them), hermes (we do), auto (look at the template).")
    default_max_tokens: int = Field(512, ge=1, le=32768, description="Completion budget when a request names none.")
    max_tokens_limit: int = Field(4096, ge=1, le=32768, description="Largest max_tokens a request may ask for (HTTP 400 beyond).")
    upstream_timeout_s: float = Field(300.0, gt=0, description="Per-request timeout towards the upstream (non-streaming: whole reply; streaming: between chunks).")
    upstream_retries: int = Field(2, ge=0, le=10, description="Retries when the upstream cannot be reached or answers 502/503 before sending anything.")
    upstream_max_connections: int = Field(256, ge=1, description="Connection pool size towards the upstream.")
    max_in_flight: int = Field(256, ge=1, description="Requests in progress at once (streams included); beyond it HTTP 503 with Retry-After.")
    keep_alive_s: float = Field(75.0, gt=0, le=3600, description="Seconds an idle client connection stays open; longer than clients' "
                                "pool expiry (httpx: 5 s) so a pooled connection is never closed under a request.")
    verifiers: list[str] = Field(default_factory=list, description="'pkg.mod:fn' callables run on session end: fn(session, calls) -> float | None.")
    judge: JudgeConfig | None = Field(None, description="LLM judge that scores ended sessions of one task key against each other.")
    registry: RegistryConfig | None = Field(None, description="Follow the store's promoted model version instead of upstream_model/policy_version.")
    replicas: ReplicasConfig = Field(default_factory=ReplicasConfig, description="Picking among several upstream replicas, "
                                     "and their health checks.")
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    store_outage: StoreOutageConfig = Field(default_factory=StoreOutageConfig,
                                            description="Spool (default) or refuse chat calls while the trace store is down.")

    @field_validator("upstream", mode="before")
    @classmethod
    def _upstream_list(cls, v: object) -> object:
        return _urls(v)

    @field_validator("upstream")
    @classmethod
    def _upstream_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            parsed = urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(f"upstream {url!r} is not an http(s)://host[:port] URL")
            try:
                parsed.port  # noqa: B018 - raises on a port that is not a number
            except ValueError:
                raise ValueError(f"upstream {url!r} has an invalid port") from None
        if len({u.rstrip("/").removesuffix("/v1") for u in v}) != len(v):
            raise ValueError("upstream lists the same replica twice")
        return v

    @field_validator("upstream_api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        return None if v is None else check_env_name(v)

    @property
    def served_upstream_model(self) -> str:
        return self.upstream_model or self.model

    @property
    def gateway_name(self) -> str:
        """``name``, else ``<host name>:<port>``: stable across restarts, so a restarted
        gateway finds its own spool."""
        return self.name or f"{socket.gethostname()}:{self.port}"
