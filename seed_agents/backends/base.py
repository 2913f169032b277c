"""The backend protocol: token ids in, token ids and logprobs out.

A backend never sees text. ``SeedChatModel`` renders the chat template to token ids on
the client side, so the ids a trainer later reads are exactly the ids the model saw.
Every backend passes the same conformance suite (``tests/conformance.py``).

Streaming is part of the protocol: ``stream``/``astream`` yield ``CompletionPiece``s as
tokens are sampled; the pieces of one stream concatenate to exactly the ``Completion``
that ``generate`` returns for the same request (same ids and logprobs, the last piece
carries the finish reason). Closing the iterator early stops the generation (the local
backend at the next token, vLLM by aborting the request).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from seed_agents.errors import BackendError
from seed_agents.types import Completion, FinishReason, SamplingParams


class BackendUnavailable(BackendError):
    """The server cannot be reached at all: not started, wrong URL, or down."""


@dataclass
class CompletionPiece:
    """Newly sampled tokens of a streamed completion (possibly none).

    ``finish_reason`` is set on the last piece only. ``policy_version`` is the version
    that serves the whole request (read when it started), the same on every piece.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    policy_version: int = 0

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


def as_piece(completion: Completion) -> CompletionPiece:
    """A finished completion as the single, last piece of a stream."""
    return CompletionPiece(list(completion.token_ids), list(completion.logprobs),
                           completion.finish_reason, completion.policy_version)


def join_pieces(pieces: Iterable[CompletionPiece], latency_s: float = 0.0) -> Completion:
    """The ``Completion`` a finished stream adds up to; a stream without a last piece
    (no finish reason) is an error, never a shorter completion."""
    ids: list[int] = []
    logprobs: list[float] = []
    finish: FinishReason | None = None
    version = 0
    for p in pieces:
        ids += p.token_ids
        logprobs += p.logprobs
        version = p.policy_version
        finish = p.finish_reason or finish
    if finish is None:
        raise BackendError("the stream ended without a finish reason")
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=version,
                      latency_s=latency_s)


@runtime_checkable
class Backend(Protocol):
    """What ``SeedChatModel`` and the trainers need from a model server.

    ``policy_version`` is the version of the weights that will sample the *next*
    request; weight sync bumps it only after the new weights are live.
    """

    policy_version: int

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...

    async def agenerate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...

    async def ascore(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Raw (T=1) log-prob of each completion token given the prompt; no sampling."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class StreamingBackend(Backend, Protocol):
    """A backend that hands out tokens as they are sampled (both built-in backends are).

    ``SeedChatModel`` streams through any ``Backend``; one that is not a
    ``StreamingBackend`` (e.g. a test fake) is streamed as one piece when it finishes.
    """

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[CompletionPiece]:
        """Pieces as they are sampled; closing the iterator stops the generation."""
        ...

    def astream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionPiece]:
        """Async ``stream`` (an async generator); ``aclose()`` stops the generation."""
        ...


@runtime_checkable
class ServedBackend(Backend, Protocol):
    """A backend in front of a separate server (vLLM) that can be asked whether it is up,
    so a command fails with one line before loading anything else. In-process backends
    (local transformers, test fakes) are always up and are not ``ServedBackend``s."""

    base_url: str

    def health(self, timeout_s: float = 5.0) -> bool:
        """True if the server answers its health check right now (no retries)."""
        ...
