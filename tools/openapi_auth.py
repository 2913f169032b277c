"""Credentials of the OpenAPI tools: named by environment variable, read per request.

Apart from ``seed_agents.tools.openapi`` because the replay transport's sandbox uses the
same config (``ReplayConfig.sandbox_auth``) and nothing else of the tools.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field


class Refused(Exception):
    """A request the guards stopped, or that cannot be built; the message is for the model."""


class AuthConfig(BaseModel):
    """Credentials for the API, by environment variable name only."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["bearer", "header"] = Field(description="bearer: 'Authorization: Bearer <value>'; header: '<header>: <value>'.")
    env: str = Field(min_length=1, description="Environment variable holding the credential; read per request, never stored.")
    header: str = Field("X-Api-Key", min_length=1, description="Header name for kind='header'.")

    def secret(self) -> str | None:
        """The credential now (None when the variable is unset or empty)."""
        return os.environ.get(self.env) or None

    @property
    def header_name(self) -> str:
        return "Authorization" if self.kind == "bearer" else self.header

    def headers(self) -> dict[str, str]:
        """The header to send; raises ``Refused`` (a tool message) when the variable is unset."""
        value = self.secret()
        if value is None:
            raise Refused(f"the API needs credentials, but the environment variable {self.env} is not set")
        return {self.header_name: f"Bearer {value}" if self.kind == "bearer" else value}


class EnvAuth(httpx.Auth):
    """Sets the credential on each outgoing request, read from the environment just then."""

    def __init__(self, config: AuthConfig) -> None:
        self._config = config

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        request.headers.update(self._config.headers())
        yield request
