"""How a URL sandbox goes back to its initial state before each replay episode.

Apart from ``seed_agents.tools.replay`` (which calls it) because it is the one part of the
replay config a user writes for their own API: an HTTP reset endpoint or a command.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from seed_agents.tools.openapi import EpisodeSignal
from seed_agents.types import FaultKind


class SandboxResetFailed(EpisodeSignal):
    """The sandbox could not be put back to its initial state before an episode. Playing
    on would let one episode see another's writes, so the episode ends as an
    infrastructure fault (``FaultKind.ENV``), recorded and never trained on."""

    kind = FaultKind.ENV


class SandboxReset(BaseModel):
    """How a URL sandbox goes back to its initial state before every episode: one HTTP
    request to the sandbox (``path``, sent with ``sandbox_auth``), or one command
    (``command``, an argv run without a shell: restore a database dump, restart a
    container). It must succeed (a 2xx answer, exit status 0) within ``timeout_s``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["POST", "PUT", "DELETE", "GET"] = Field("POST", description="HTTP method of the reset request.")
    path: str | None = Field(None, description="Path of the reset request, appended to sandbox_base_url (e.g. /reset).")
    body: Any = Field(None, description="JSON body of the reset request (none: no body).")
    command: tuple[str, ...] | None = Field(None, min_length=1, description="Instead of path: argv of a command that "
                                                                             "resets the sandbox (exit 0 = done).")
    timeout_s: float = Field(30.0, gt=0, description="Longest a reset may take before the episode is a fault.")

    @model_validator(mode="after")
    def _one_way(self) -> SandboxReset:
        if (self.path is None) == (self.command is None):
            raise ValueError("sandbox_reset needs exactly one of path (an HTTP request to the sandbox) or command")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"sandbox_reset.path must start with '/', got {self.path!r}")
        return self
