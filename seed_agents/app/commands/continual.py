"""``seed-agents continual`` and ``seed-agents versions``: run the loop; see and steer
which model version serves a deployed agent.

    seed-agents continual --config FILE [--cycles N | --once] [--store URL]
    seed-agents continual drill --config FILE [--drill.strength S]

    seed-agents versions list     [--store URL] [--model NAME]
    seed-agents versions promote N [--store URL] [--model NAME] [--reason TEXT]
    seed-agents versions rollback [--store URL] [--model NAME] [--reason TEXT]

``promote N`` is an operator's override of the gate, stored as a manual decision;
``rollback`` re-promotes the version the current one replaced and marks the current one
rejected. Both switch in one store transaction; a gateway that follows the registry
(config ``registry``) serves the new version within its refresh interval, and requests
already running finish on the version they started with. --model may be left out when
the store holds versions of one model name only.

``continual drill`` rehearses the gate on the live setup the loop's config describes: a
deliberately regressed candidate (the promoted adapter plus weight noise, see
``seed_agents.app.drill``) plays the real canary against the promoted version, the
decision is printed and stored as a drill with its canary episodes, and production stays
on the promoted version whatever the gate says. Exit 0 when the gate rejected the
regressed candidate, 1 when it would have promoted it or could not tell.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from seed_agents.app.continual_config import ContinualConfig
from seed_agents.app.flags import config_command
from seed_agents.config import load_config

DEFAULT_STORE = "sqlite:///runs/traces.db"
_SUMMARY_WIDTH = 100


class VersionsConfig(BaseModel):
    """`seed-agents versions list`: which store, and which model name in its registry."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(DEFAULT_STORE, description="Trace store URL (sqlite:///path/traces.db or postgresql://...).")
    model: str | None = Field(None, description="Model name in the registry; unset: the only one the store holds.")


class DrillSettings(BaseModel):
    """How the drill regresses its candidate (``seed_agents.app.drill``)."""

    model_config = ConfigDict(extra="forbid")

    strength: float = Field(1.0, gt=0, le=100, description=(
        "Noise added to every LoRA B matrix of the promoted adapter, per layer as a multiple of the base "
        "weight's norm (1: the model plays much worse)."))
    noise_seed: int = Field(0, description="Seed of the noise: the same seed and strength give the same candidate.")


class DrillConfig(ContinualConfig):
    """`seed-agents continual drill`: on the live setup of the loop's config, build a deliberately regressed
    candidate (the promoted version's weights plus noise), run the real canary and gate against the promoted
    version, print the decision and store it as a drill. The promoted version never changes."""

    drill: DrillSettings = Field(default_factory=DrillSettings, description="How the candidate is regressed.")


class VersionChangeConfig(VersionsConfig):
    """`seed-agents versions promote|rollback`: a switch of the served version, stored as a decision."""

    reason: str | None = Field(None, description="Why; stored with the decision.")


_CONFIG_HELP = "YAML file with ContinualConfig fields (seed_agents.app.continual_config); flags override it. Required."


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``continual`` (with ``drill``) and ``versions`` (with ``list``, ``promote``,
    ``rollback``) on ``sub``."""
    c = config_command(sub, "continual", ContinualConfig, cmd_continual,
                       help="The continual loop: train on rewarded sessions, gate, promote or reject.",
                       description=f"{ContinualConfig.__doc__}\n\nOne line per cycle. Safe to kill -9 and restart: an "
                                   "unfinished cycle is resumed from the state the store holds. `continual drill` "
                                   "rehearses the gate (see `seed-agents continual drill --help`).")
    # not required=True: argparse would then ask for it before `drill`, whose own --config it is
    c.add_argument("--config", metavar="YAML", help=_CONFIG_HELP)
    how_long = c.add_mutually_exclusive_group()
    how_long.add_argument("--cycles", type=int, metavar="N", help="Stop after N cycles (waiting for sessions between).")
    how_long.add_argument("--once", action="store_true", help="Run at most one cycle, then exit (0 also when none waits).")
    csub = c.add_subparsers(dest="continual_command", metavar="[drill]",
                            help="Optional: `drill` rehearses the gate instead of running the loop.")
    d = config_command(csub, "drill", DrillConfig, cmd_drill,
                       help="Rehearse the gate: a deliberately regressed candidate against the promoted version.")
    d.add_argument("--config", metavar="YAML", help=_CONFIG_HELP)

    p = sub.add_parser("versions", help="Model versions: list them, promote one (operator override), roll back.",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    vsub = p.add_subparsers(dest="versions_command", required=True, metavar="SUBCOMMAND")
    config_command(vsub, "list", VersionsConfig, cmd_list, yaml=False,
                   help="Every version: status, served name, created, last decision.")
    q = config_command(vsub, "promote", VersionChangeConfig, cmd_promote, yaml=False,
                       help="Promote version N now, without the gate (stored as a manual decision).")
    q.add_argument("version", type=int, metavar="N", help="The version number to serve.")
    config_command(vsub, "rollback", VersionChangeConfig, cmd_rollback, yaml=False,
                   help="Serve the version the current one replaced; the current one is rejected.")


def cmd_continual(args: argparse.Namespace) -> int:
    from seed_agents.config import ConfigError

    if args.cycles is not None and args.cycles < 1:
        raise ConfigError(f"--cycles must be >= 1, got {args.cycles}")
    cfg = load_config(ContinualConfig, _config_path(args), args.config_flags(args))
    check_continual(cfg)
    from seed_agents.app.continual import ContinualLoop

    loop = ContinualLoop(cfg, log=lambda line: print(line, flush=True))  # the spec, tools, reward and store
    try:
        loop.run(args.cycles, once=args.once)
    finally:
        loop.close()
    return 0


def cmd_drill(args: argparse.Namespace) -> int:
    """Build, evaluate and store the drill; print its block. 0: the gate rejected the
    regressed candidate; 1: it would have promoted it, or could not tell."""
    cfg = load_config(DrillConfig, _config_path(args), args.config_flags(args))
    check_continual(cfg)
    from seed_agents.app.drill import run_drill

    outcome = run_drill(cfg, strength=cfg.drill.strength, noise_seed=cfg.drill.noise_seed,
                        log=lambda line: print(line, flush=True))
    print(outcome.block(), flush=True)
    return 0 if outcome.caught else 1


def _config_path(args: argparse.Namespace) -> str:
    """``--config``: the loop's YAML (every command here runs on the setup it describes)."""
    from seed_agents.config import ConfigError

    if not args.config:
        raise ConfigError(f"--config is required: the continual loop's YAML (e.g. configs/continual_demo.yaml); "
                          f"see seed-agents continual{' drill' if args.continual_command else ''} --help")
    return args.config


TRAINING_STACK = ("torch", "transformers", "peft", "trl", "datasets")


def check_continual(cfg: ContinualConfig) -> None:
    """What the loop needs before its first replay (minutes of replays must not end in an
    import error or a missing key): the training stack imports, the tools' credentials
    are set, the base model is here and the vLLM server answers. ``ContinualLoop`` then
    checks the spec, the tool_choice, the reward's signature and the store. One
    ``UserError`` line per problem."""
    import importlib

    from seed_agents.errors import ConfigError
    from seed_agents.preflight import check_backend

    for module in TRAINING_STACK:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 -- a broken install raises anything at import time
            why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            raise ConfigError(f"the training stack does not import: `import {module}` failed ({why}); "
                              f"reinstall it (pip install -e '.[train]' or your lock file) before running the loop") from None
    auths = [("agent.tools.auth", cfg.agent.tools.auth), ("replay.sandbox_auth", cfg.replay.sandbox_auth)]
    for where, auth in auths:
        if auth is not None and auth.secret() is None:
            raise ConfigError(f"{where} reads the environment variable {auth.env}, which is not set: export it where "
                              f"the loop runs (keys are read from the environment, never from the config)")
    check_backend(cfg.backend, flag="backend.model")


def cmd_list(args: argparse.Namespace) -> int:
    def show(registry: Any, name: str) -> None:
        from seed_agents.continual.versions import served_name_of

        rows = [(f"v{v.version}", v.status, served_name_of(v), _when(v.created_at),
                 _cut(str((v.metadata.get("last_decision") or {}).get("summary", "")))) for v in registry.versions(name)]
        print(f"model {name!r}: {len(rows)} versions")
        print(_table(("VERSION", "STATUS", "SERVED AS", "CREATED", "LAST DECISION"), rows))

    return _with_registry(load_config(VersionsConfig, None, args.config_flags(args)), show)


def cmd_promote(args: argparse.Namespace) -> int:
    def promote(registry: Any, name: str) -> None:
        d = registry.promote_manually(name, args.version, reason=cfg.reason)
        print(f"{name}: v{d.to_version} promoted (was {_v(d.from_version)}); decision #{d.decision_id} stored")

    cfg = load_config(VersionChangeConfig, None, args.config_flags(args))
    return _with_registry(cfg, promote)


def cmd_rollback(args: argparse.Namespace) -> int:
    def rollback(registry: Any, name: str) -> None:
        d = registry.rollback(name, reason=cfg.reason)
        print(f"{name}: rolled back v{d.from_version} -> v{d.to_version} (v{d.from_version} is now rejected); "
              f"decision #{d.decision_id} stored")

    cfg = load_config(VersionChangeConfig, None, args.config_flags(args))
    return _with_registry(cfg, rollback)


def _with_registry(cfg: VersionsConfig, action: Callable[[Any, str], None]) -> int:
    """Open the store, pick the model name, run ``action``; every failure is one ConfigError line."""
    # Imported here: building the CLI parser must not load SQLAlchemy (and the error type's
    # module pulls in the runner; see seed_agents.store.export).
    from seed_agents.continual.versions import VersionRegistry
    from seed_agents.errors import ConfigError
    from seed_agents.store import StoreError, TraceStore

    try:
        with TraceStore.open(cfg.store) as store:
            registry = VersionRegistry(store)
            action(registry, _model_name(registry, cfg.model))
    except StoreError as e:
        raise ConfigError(" ".join(str(e).split())) from None
    return 0


def _model_name(registry: Any, wanted: str | None) -> str:
    from seed_agents.store import StoreError

    names = registry.names()
    if wanted is not None:
        if wanted not in names:
            known = ", ".join(names) or "none"
            raise StoreError(f"--model {wanted!r}: the store has no versions of it (models with versions: {known})")
        return wanted
    if len(names) == 1:
        return names[0]
    if not names:
        raise StoreError("the store holds no model versions yet (the continual loop records them)")
    raise StoreError(f"the store holds versions of several models ({', '.join(names)}): pass --model NAME")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY_WIDTH else text[: _SUMMARY_WIDTH - 3] + "..."


def _v(version: int | None) -> str:
    return "none" if version is None else f"v{version}"
