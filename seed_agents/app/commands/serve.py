"""``seed-agents serve``: start a vLLM server ready for hot reload (dev mode, LoRA).

The flags are ``ServeConfig``'s fields; the server itself is ``seed_agents.serve.VLLMServer``.
``serve`` owns vLLM's processes: SIGTERM or SIGINT stops all of them (and a SIGKILLed
``serve`` takes them along, through the server's watchdog). Off loopback it demands an API
key, read from an environment variable, which then guards every route but ``/health``.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from seed_agents.app.flags import config_command
from seed_agents.config import load_config
from seed_agents.config.core import check_env_name
from seed_agents.errors import ConfigError
from seed_agents.shadowing import shadowing_name
from seed_agents.vllm_ext import API_KEY_ENV


class ServeConfig(BaseModel):
    """`seed-agents serve`: start a vLLM server for a model, ready for hot reload (dev mode, LoRA),
    and keep it running until interrupted."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("smollm2-135m", description="Alias, local folder or hub id to serve (also its served name).")
    host: str = Field("127.0.0.1", description="Interface to listen on. Anything but loopback needs an API key (see api_key_env): dev mode lets any caller replace the weights.")
    port: int = Field(8000, ge=0, le=65535, description="Port to listen on.")
    api_key_env: str = Field(API_KEY_ENV, description=(
        "Environment variable holding the API key; when set, every route but /health demands "
        "`Authorization: Bearer <key>`. The key itself is never a flag nor written anywhere."))
    vllm_python: str | None = Field(None, description="Python of the venv with vLLM; unset: $SEED_AGENTS_VLLM_PYTHON, else .venv-vllm.")
    work_dir: Path | None = Field(None, description="Folder for vLLM caches and the log; unset: a new temporary folder. "
                                  "Not one named like a package (vllm, torch, ...) in the working directory or on "
                                  "PYTHONPATH: commands run from there would import it.")
    max_model_len: int = Field(4096, ge=1, description="Context length vLLM allocates for.")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for the server to answer /health.")
    stop_grace_s: float = Field(30.0, gt=0, description="On SIGTERM/SIGINT (or when serve itself dies), seconds vLLM gets to exit before all its processes are killed.")

    _env_name = field_validator("api_key_env")(classmethod(lambda cls, name: check_env_name(name)))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``serve`` on ``sub``."""
    config_command(sub, "serve", ServeConfig, cmd_serve, yaml=False,
                   help="Start a vLLM server ready for hot reload (dev mode, LoRA).",
                   shortcuts={"startup-timeout-s": "startup-timeout"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # any other name may resolve to a reachable interface
        return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops serve the way Ctrl-C does: through server.stop()


def cmd_serve(args: argparse.Namespace) -> int:
    from seed_agents.models import resolve_model
    from seed_agents.serve import VLLMServer

    cfg = load_config(ServeConfig, None, args.config_flags(args))
    api_key = os.environ.get(cfg.api_key_env) or None
    if api_key is None and not is_loopback(cfg.host):
        raise ConfigError(f"refusing to serve on --host {cfg.host} without an API key: vLLM's dev mode lets any caller "
                          f"replace the weights. Set ${cfg.api_key_env} (or name another variable with "
                          f"--api-key-env), or serve on 127.0.0.1")
    if cfg.work_dir is not None and (name := shadowing_name(cfg.work_dir)):
        folder = Path(cfg.work_dir).resolve()
        raise ConfigError(f"--work-dir {cfg.work_dir} would be imported as the {name} package by any command run from "
                          f"{folder.parent} or with it on PYTHONPATH; choose a folder named otherwise, e.g. "
                          f"{folder.with_name(name + '-work')}")
    path = resolve_model(cfg.model)
    server = VLLMServer(path, served_model_name=cfg.model, port=cfg.port, host=cfg.host, python=cfg.vllm_python,
                        work_dir=cfg.work_dir, max_model_len=cfg.max_model_len, stop_grace_s=cfg.stop_grace_s,
                        api_key=api_key)
    signal.signal(signal.SIGTERM, _interrupt)
    server.start()
    auth = f"; every route but /health needs the key in ${cfg.api_key_env}" if api_key else ""
    print(f"starting vLLM for {cfg.model} ({path}); log: {server.log_path}{auth}", flush=True)
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
