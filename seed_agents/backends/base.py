"""The backend protocol: token ids in, token ids and logprobs out.

A backend never sees text. ``SeedChatModel`` renders the chat template to token ids on
the client side, so the ids a trainer later reads are exactly the ids the model saw.
Every backend passes the same conformance suite (``tests/conformance.py``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from seed_agents.types import Completion, SamplingParams


class BackendError(RuntimeError):
    """A backend could not serve a request (after its retries)."""


class BackendUnavailable(BackendError):
    """The server cannot be reached at all: not started, wrong URL, or down."""


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
