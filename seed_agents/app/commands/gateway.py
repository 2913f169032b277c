"""``seed-agents gateway``: capture every LLM call of a deployed agent, token-exactly.

    seed-agents gateway --upstream http://127.0.0.1:8000 --model smollm2-135m \\
        --store sqlite:///runs/traces.db --port 8080 [--config gateway.yaml]
    seed-agents gateway --upstream http://10.0.0.5:8000 http://10.0.0.6:8000 --name gw-1 ...   # replicas

Then point any OpenAI client at ``http://127.0.0.1:8080/v1``. The flags are
``GatewayConfig``'s fields; the app is ``seed_agents.gateway.app.build_app`` (FastAPI,
SQLAlchemy and the tokenizer load when the command runs, not when the CLI is built).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from seed_agents.app.flags import config_command
from seed_agents.errors import ConfigError
from seed_agents.gateway.config import GatewayConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gateway`` on ``sub``."""
    config_command(sub, "gateway", GatewayConfig, cmd_gateway,
                   help="OpenAI-compatible capture gateway in front of a vLLM server; stores every call.",
                   description=f"{__doc__}\n{GatewayConfig.__doc__}\nKeys, redaction, verifiers and the judge are best "
                               "set in the --config YAML.")


def load_gateway_config(path: str | None, overrides: dict[str, Any]) -> GatewayConfig:
    """Defaults < YAML (optional) < flags (nested or dotted keys; None: not given) ->
    ``GatewayConfig``, or one ``ConfigError``.

    Unlike ``seed_agents.config.load_config`` the message never quotes the rejected
    values: a gateway config may hold keys.
    """
    import yaml
    from pydantic import ValidationError

    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    for key, value in overrides.items():
        _merge(raw, key.split("."), value)
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"{'.'.join(str(x) for x in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"invalid gateway config ({path or 'flags'}): " + "; ".join(lines)) from None


def _merge(into: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set ``value`` at ``keys`` in ``into``, section by section (None: not given)."""
    if value is None:
        return
    head, *rest = keys
    if isinstance(value, dict) and not rest:
        if not isinstance(into.get(head), dict):
            into[head] = {}
        for key, item in value.items():
            _merge(into[head], [key], item)
    elif rest:
        if not isinstance(into.get(head), dict):
            into[head] = {}
        _merge(into[head], rest, value)
    else:
        into[head] = value


def cmd_gateway(args: argparse.Namespace) -> int:
    import logging

    import uvicorn
    from sqlalchemy.engine import make_url

    from seed_agents.gateway.app import build_app
    from seed_agents.gateway.replicas import ReplicaSet
    from seed_agents.gateway.upstream import Upstream
    from seed_agents.redact import redact
    from seed_agents.models import load_tokenizer
    from seed_agents.store import StoreError, TraceStore

    cfg = load_gateway_config(args.config, args.config_flags(args))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    try:
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"cannot load the tokenizer {cfg.tokenizer or cfg.model!r} (pass --tokenizer PATH): "
                          f"{str(e).splitlines()[0]}") from None
    try:
        store = TraceStore.open(cfg.store)
    except StoreError as e:
        raise ConfigError(str(e)) from None
    upstream = ReplicaSet([Upstream.from_env(url, cfg.served_upstream_model, cfg.upstream_api_key_env,
                                             policy_version=cfg.policy_version, timeout_s=cfg.upstream_timeout_s,
                                             retries=cfg.upstream_retries, max_connections=cfg.upstream_max_connections)
                           for url in cfg.upstream],
                          pick=cfg.replicas.pick, probe_timeout_s=cfg.replicas.probe_timeout_s,
                          load_timeout_s=cfg.replicas.load_timeout_s, load_adapters=cfg.replicas.load_adapters)
    try:
        try:
            # every replica is asked at start: one that does not answer starts out of rotation, with one log line
            app = build_app(cfg, store, upstream, tokenizer=tokenizer, check_replicas=True)
        except ValueError as e:  # e.g. a verifier path that does not import
            raise ConfigError(str(e)) from None
        where = make_url(cfg.store).render_as_string(hide_password=True)
        replicas = ", ".join(redact(r.url) for r in upstream.replicas)
        print(f"gateway {cfg.gateway_name!r} for {cfg.model!r} -> {replicas} (model {upstream.model!r}); store {where}; "
              f"OpenAI base URL http://{cfg.host}:{cfg.port}/v1", flush=True)
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info", access_log=False,
                    timeout_keep_alive=cfg.keep_alive_s)  # see GatewayConfig.keep_alive_s
    finally:
        store.close()
    return 0
