"""``seed-agents serve``: start a vLLM server ready for hot reload (dev mode, LoRA).

The flags are ``ServeConfig``'s fields; the server itself is ``seed_agents.serve.VLLMServer``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.app.flags import config_command
from seed_agents.config import load_config


class ServeConfig(BaseModel):
    """`seed-agents serve`: start a vLLM server for a model, ready for hot reload (dev mode, LoRA),
    and keep it running until interrupted."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("smollm2-135m", description="Alias, local folder or hub id to serve (also its served name).")
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    vllm_python: str | None = Field(None, description="Python of the venv with vLLM; unset: $SEED_AGENTS_VLLM_PYTHON, else .venv-vllm.")
    work_dir: Path | None = Field(None, description="Folder for vLLM caches and the log; unset: a new temporary folder.")
    max_model_len: int = Field(4096, ge=1, description="Context length vLLM allocates for.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for the server to answer /health.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``serve`` on ``sub``."""
    config_command(sub, "serve", ServeConfig, cmd_serve, yaml=False,
                   help="Start a vLLM server ready for hot reload (dev mode, LoRA).",
                   shortcuts={"startup-timeout-s": "startup-timeout"})


def cmd_serve(args: argparse.Namespace) -> int:
    from seed_agents.models import resolve_model
    from seed_agents.serve import VLLMServer

    cfg = load_config(ServeConfig, None, args.config_flags(args))
    path = resolve_model(cfg.model)
    server = VLLMServer(path, served_model_name=cfg.model, port=cfg.port, host=cfg.host, python=cfg.vllm_python,
                        work_dir=cfg.work_dir, max_model_len=cfg.max_model_len)
    server.start()
    print(f"starting vLLM for {cfg.model} ({path}); log: {server.log_path}", flush=True)
    try:
        server.wait_ready(cfg.startup_timeout_s)
        print(f"vLLM ready at {server.url}  (seed-agents eval --backend vllm --base-url {server.url} --model {cfg.model})",
              flush=True)
        while server.process.poll() is None:
            time.sleep(1.0)
        print(f"vLLM exited with code {server.process.returncode}; see {server.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
