"""``seed-agents gateway``: capture every LLM call of a deployed agent, token-exactly.

The app lives in ``seed_agents.gateway.app`` (``build_app``, see its docstring for the
HTTP surface); this module only registers the command, so building the CLI parser stays
cheap (FastAPI, SQLAlchemy and the tokenizer load when the command runs).

    seed-agents gateway --upstream http://127.0.0.1:8000 --model smollm2-135m \\
        --store sqlite:///runs/traces.db --port 8080 [--config gateway.yaml]

Then point any OpenAI client at ``http://127.0.0.1:8080/v1``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from seed_agents.config import ConfigError

# CLI flag -> GatewayConfig field; flags left unset keep the YAML's (or the default) value.
_FLAGS = {"upstream": "upstream", "model": "model", "store": "store", "port": "port", "host": "host", "tokenizer": "tokenizer"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gateway`` on ``sub`` (the lead's ``seed_agents/cli.py`` calls this)."""
    p = sub.add_parser("gateway", help="OpenAI-compatible capture gateway in front of a vLLM server; stores every call.",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", help="vLLM server URL, e.g. http://127.0.0.1:8000.")
    p.add_argument("--model", help="Model name clients request and the upstream serves; also the tokenizer unless --tokenizer.")
    p.add_argument("--store", help="Trace store URL (default sqlite:///runs/traces.db; or postgresql://...).")
    p.add_argument("--port", type=int, help="Port to listen on (default 8080).")
    p.add_argument("--host", help="Interface to listen on (default 127.0.0.1).")
    p.add_argument("--tokenizer", help="Tokenizer folder/alias/hub id if it differs from --model.")
    p.add_argument("--config", help="YAML with GatewayConfig fields (keys, redaction, verifiers, judge); flags override it.")
    p.set_defaults(func=cmd_gateway)


def load_gateway_config(path: str | None, overrides: dict[str, Any]) -> Any:
    """YAML (optional) + flags -> ``GatewayConfig``, or one ``ConfigError``.

    Unlike ``seed_agents.config.load_config`` the message never quotes the rejected
    values: a gateway config may hold keys.
    """
    import yaml
    from pydantic import ValidationError

    from seed_agents.gateway.config import GatewayConfig

    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read {path}: {e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(x) for x in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"invalid gateway config ({path or 'flags'}):\n" + "\n".join(lines)) from None


def cmd_gateway(args: argparse.Namespace) -> int:
    import logging

    import uvicorn
    from sqlalchemy.engine import make_url

    from seed_agents.gateway.app import build_app
    from seed_agents.gateway.upstream import Upstream
    from seed_agents.models import load_tokenizer
    from seed_agents.store import StoreError, TraceStore

    cfg = load_gateway_config(args.config, {flag: getattr(args, flag) for flag in _FLAGS})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream request is noise
    try:
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"cannot load the tokenizer {cfg.tokenizer or cfg.model!r} (pass --tokenizer PATH): {str(e).splitlines()[0]}") from None
    try:
        store = TraceStore.open(cfg.store)
    except StoreError as e:
        raise ConfigError(str(e)) from None
    upstream = Upstream.from_env(cfg.upstream, cfg.served_upstream_model, cfg.upstream_api_key_env,
                                 policy_version=cfg.policy_version, timeout_s=cfg.upstream_timeout_s,
                                 retries=cfg.upstream_retries, max_connections=cfg.upstream_max_connections)
    try:
        try:
            app = build_app(cfg, store, upstream, tokenizer=tokenizer)
        except ValueError as e:  # e.g. a verifier path that does not import
            raise ConfigError(str(e)) from None
        where = make_url(cfg.store).render_as_string(hide_password=True)
        print(f"gateway for {cfg.model!r} -> {upstream.base_url} (model {upstream.model!r}); store {where}; "
              f"OpenAI base URL http://{cfg.host}:{cfg.port}/v1", flush=True)
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info", access_log=False)
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m seed_agents.gateway ...``: the command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="seed-agents")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["gateway", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"seed-agents gateway: error: {e}", file=sys.stderr)
        return 2
