"""The local backend's engine options: switches that compute the same tokens a simpler, slower
way (every prompt whole, one shared prefix a batch, transformers' own KV cache,
``generate`` running every row to the longest).

They are not in the user config (``BackendConfig``): the local backend is the reference engine
(tests, bit-reproducible seeded runs, machines without vLLM), and a user needs only its
defaults. They stay for the benchmarks that time the simpler way against the default and for
the tests that check both sample the same tokens. A benchmark that builds a ``LocalBackend``
passes ``LocalEngineOptions(...).backend_kwargs()`` (or the backend's own arguments); one that
runs ``seed-agents train`` as a child process sets ``SEED_AGENTS_BENCH_LOCAL_ENGINE`` to these
fields as JSON (``as_env``), which every local backend a command builds reads (``from_env``,
through ``seed_agents.backends.local_kwargs``), stage 1's included.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from seed_agents.errors import ConfigError

__all__ = ["ENGINE_ENV", "LocalEngineOptions"]

ENGINE_ENV = "SEED_AGENTS_BENCH_LOCAL_ENGINE"


class LocalEngineOptions(BaseModel):
    """How the local backend computes; the defaults are the only path a command takes unless a
    benchmark sets ``SEED_AGENTS_BENCH_LOCAL_ENGINE``. Every choice samples the same tokens up to
    float rounding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reuse_kv: bool = Field(True, description="Compute a batch's common prompt prefix once and let an episode's next turn read its last prompt's keys and values (seed_agents.backends.prefix, turn_cache); false: every prompt whole.")
    prefix_groups: bool = Field(True, description="With reuse_kv: one prefix for each group of prompts that share more than the whole batch (one task's hindsight prompts); false: one prefix a batch.")
    kv_cache: Literal["dynamic", "static", "concat"] = Field("dynamic", description="dynamic: keys and values grow in place (seed_agents.backends.growing_cache); concat: transformers' own cache, copied at every token (the same numbers bit for bit); static: buffers sized for the whole generation, attention over all of it, masked.")
    drop_finished: bool = Field(True, description="A row that has sampled its stop token leaves the decode's forward (seed_agents.backends.decode); false: transformers' generate, every row until the longest ends.")

    def backend_kwargs(self) -> dict[str, Any]:
        """``LocalBackend`` arguments for these options."""
        return {"kv_cache": self.kv_cache, "prefix_groups": self.prefix_groups, "drop_finished": self.drop_finished,
                **({} if self.reuse_kv else {"share_prefix": False, "turn_cache_bytes": 0})}

    def changed(self) -> dict[str, Any]:
        """The options not at their default (what a run prints and stage 1's cache key names)."""
        return self.model_dump(exclude_defaults=True)

    def as_env(self) -> dict[str, str]:
        """The environment variable that gives a child command's local backends these options
        (set for the defaults too, so a child never inherits another's)."""
        return {ENGINE_ENV: json.dumps(self.changed(), sort_keys=True)}

    @classmethod
    def from_env(cls) -> LocalEngineOptions:
        """The options ``SEED_AGENTS_BENCH_LOCAL_ENGINE`` asks for; the defaults where it is unset or empty."""
        raw = os.environ.get(ENGINE_ENV, "").strip()
        if not raw:
            return cls()
        try:
            return cls.model_validate_json(raw)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'value'}: {e['msg']}" for e in err.errors())
            raise ConfigError(f"{ENGINE_ENV}: {problems}; give a JSON object of {', '.join(cls.model_fields)} "
                              f"(docs/benchmarks.md) or unset it") from None
