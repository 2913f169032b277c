"""How a URL sandbox goes back to its initial state before each replay episode.

Apart from ``seed_agents.tools.replay`` (which calls it) because it is the one part of the
replay config a user writes for their own API: an HTTP reset endpoint or a command.

A reset command runs as the loop runs: its environment is the loop's, every variable as it
is (the sandbox key's variable, and production's too: the command is the user's own, with
the loop's rights), its working directory the loop's, its standard input empty (a prompt
reads end of file instead of waiting out ``timeout_s``), and its output is read until it
closes. So a server the command (re)starts must be detached from that output: started in the
background with its output redirected (``setsid server > sandbox.log 2>&1 < /dev/null &``).
A server that keeps the command's output open fails the reset within ``DETACH_GRACE_S`` of
the command's exit with one line naming that fix, instead of hanging until ``timeout_s``
and leaving a server whose next log line goes to a pipe the loop has closed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
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
    request (``path``) or one command (``command``), done within ``timeout_s``.

    The request goes to the sandbox with ``sandbox_auth`` and must answer 2xx; the command
    is an argv run without a shell (restore a database dump, restart a container; how it
    runs: the module docstring) and must exit 0."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["POST", "PUT", "DELETE", "GET"] = Field("POST", description="HTTP method of the reset request.")
    path: str | None = Field(None, description="Path of the reset request, appended to sandbox_base_url (e.g. /reset).")
    body: Any = Field(None, description="JSON body of the reset request (none: no body).")
    command: tuple[str, ...] | None = Field(None, min_length=1, description=(
        "Instead of path: argv of a command that resets the sandbox (exit 0 = done), run without a shell;"
        " a server it starts must be detached (`setsid server > log 2>&1 < /dev/null &`)."))
    timeout_s: float = Field(30.0, gt=0, description="Longest a reset may take before the episode is a fault.")

    @model_validator(mode="after")
    def _one_way(self) -> SandboxReset:
        if (self.path is None) == (self.command is None):
            raise ValueError("sandbox_reset needs exactly one of path (an HTTP request to the sandbox) or command")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError(f"sandbox_reset.path must start with '/', got {self.path!r}")
        return self


DETACH_GRACE_S = 2.0
"""How long a reset command's output may stay open after the command exited before the
reset fails: only a process it started and left attached holds it longer."""
_POLL_S = 0.1


def run_reset_command(command: Sequence[str], timeout_s: float) -> None:
    """Run a ``sandbox_reset`` command (argv, no shell) as the module docstring says; raise
    ``SandboxResetFailed`` in one line when it cannot start, exits non-zero, leaves a process
    holding its output, or takes longer than ``timeout_s``."""
    what = f"`{' '.join(command)}`"
    try:
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise SandboxResetFailed(f"sandbox reset {what} failed: {type(e).__name__}: {e}") from e
    started, exited_at = time.monotonic(), None
    with proc:  # closes the pipes and reaps the command whichever way this ends
        while True:
            try:
                out, err = proc.communicate(timeout=_POLL_S)  # output read so far is kept across retries
                break
            except subprocess.TimeoutExpired:
                now = time.monotonic()
                if proc.poll() is None:
                    if now - started >= timeout_s:
                        proc.kill()
                        raise SandboxResetFailed(f"sandbox reset {what} did not finish within {timeout_s:g} s") from None
                    continue
                exited_at = exited_at if exited_at is not None else now
                if now - exited_at >= DETACH_GRACE_S or now - started >= timeout_s:
                    raise SandboxResetFailed(
                        f"sandbox reset {what} exited with status {proc.returncode}, but a process it started still "
                        f"holds its output: start a server detached, output redirected "
                        f"(`setsid server > sandbox.log 2>&1 < /dev/null &`)") from None
    if proc.returncode != 0:
        tail = " ".join((err or out).split())[-300:]
        raise SandboxResetFailed(f"sandbox reset {what} exited with status {proc.returncode}: {tail}")
