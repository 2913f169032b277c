"""A vLLM server a command starts for itself: ``backend.kind: vllm`` with no ``base_url``.

Why: users deploy vLLM, so a run should sample from the engine they deploy without first
starting one by hand. The command owns the server as ``seed-agents serve`` does: started
after the run's checks, stopped when the command ends (its whole process group, the engine's
children included), and killed by its watchdog if the command dies without stopping it. The
server serves the run's starting weights under the configured model name, with LoRA enabled
when the trainer trains an adapter (the sync loads each update as a new adapter).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

from seed_agents.config import BackendConfig
from seed_agents.errors import ConfigError

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""

STARTUP_TIMEOUT_S = 900.0
"""Generous: a 2-core machine compiles the model's graphs on the first start (minutes)."""


def owns_server(backend: BackendConfig) -> bool:
    """Whether the command must start the server itself: vLLM is asked for and no URL given."""
    return backend.kind == "vllm" and backend.base_url is None


def max_lora_rank(lora_r: int | None) -> int:
    """The smallest rank vLLM accepts that holds the trainer's adapter (16 without one)."""
    need = max(lora_r or 0, 16)
    for rank in LORA_RANKS:
        if rank >= need:
            return rank
    raise ConfigError(f"--trainer.lora-r {lora_r} is above the largest LoRA rank vLLM serves ({LORA_RANKS[-1]})")


@contextlib.contextmanager
def served(backend: BackendConfig, weights: str, *, lora_r: int | None = None) -> Iterator[BackendConfig]:
    """``backend`` as given, or, where the command owns the server, the config with the URL
    of a server started here for ``weights`` (a local folder) and stopped on leaving."""
    if not owns_server(backend):
        yield backend
        return
    from seed_agents.serve import VLLMServer

    server = VLLMServer(weights, served_model_name=backend.model, max_lora_rank=max_lora_rank(lora_r),
                        enable_lora=True)
    print(f"starting a vLLM server for {backend.model} ({weights}); log {server.log_path}", flush=True)
    server.start()
    ended_well = False
    try:
        server.wait_ready(STARTUP_TIMEOUT_S)
        print(f"vLLM ready at {server.url} ({server.startup_s:.0f} s); it stops when this command ends", flush=True)
        yield backend.model_copy(update={"base_url": server.url})
        ended_well = True
    finally:
        server.stop()
        if ended_well:  # its temporary folder (log, caches); kept after a failure, for the log an error names
            shutil.rmtree(server.work_dir, ignore_errors=True)
