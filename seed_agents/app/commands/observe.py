"""``seed-agents status`` and ``seed-agents report``: watch a deployed agent from its trace store.

    seed-agents status [--store URL] [--decisions N] [--window 1h] [--windows N]
    seed-agents report [--store URL] --out report.html [--sessions N] [--window 1h]

``status`` prints one screen: versions with their state and traffic, the last decisions
with their evidence, success over time per version, queue lengths. ``report`` writes one
self-contained HTML page (no script, no network) with the success curve, the decisions,
and the latest sessions with their calls, tool calls, rewards and skills; the gateway
serves the same page at ``/dashboard``. Both only read the store (``seed_agents.observe``).
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from seed_agents.app.flags import config_command
from seed_agents.config import load_config

DEFAULT_STORE = "sqlite:///runs/traces.db"


class _StoreView(BaseModel):
    """What both commands read: the store, and the success curve's window."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(DEFAULT_STORE, description="Trace store URL (sqlite:///path/traces.db or postgresql://...).")
    window: str | None = Field(None, description="Success-curve window, e.g. 15m, 1h, 1d; unset: about 5 sessions per window.")

    @field_validator("window")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        from seed_agents.observe.curve import parse_duration

        if value is not None:
            parse_duration(value)  # a ValueError names the accepted forms
        return value

    @property
    def window_s(self) -> int | None:
        from seed_agents.observe.curve import parse_duration

        return None if self.window is None else parse_duration(self.window)


class StatusConfig(_StoreView):
    """`seed-agents status`: one screen on a deployed agent from its trace store: versions with their state
    and traffic, the last decisions with their evidence, success over time per version, queue lengths.
    It only reads the store."""

    decisions: int = Field(5, description="Show the last N decisions.")
    windows: int = Field(6, description="Show the last N windows of the success curve.")


class ReportConfig(_StoreView):
    """`seed-agents report`: write one self-contained HTML page (no script, no network) from the trace
    store: the success curve, the decisions, and the latest sessions with their calls, tool calls,
    rewards and skills (the gateway serves the same page at /dashboard). It only reads the store."""

    out: Path = Field(description="HTML file to write (replaced if it exists).")
    sessions: int = Field(50, description="Drill into the latest N sessions (at most 500).")
    decisions: int = Field(50, description="List the last N decisions.")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``status`` and ``report`` on ``sub``."""
    config_command(sub, "status", StatusConfig, cmd_status, yaml=False,
                   help="One screen on a deployed agent: versions, decisions, success over time, queues.")
    config_command(sub, "report", ReportConfig, cmd_report, yaml=False,
                   help="Write the trace store's HTML report (success curve, decisions, sessions).")


def cmd_status(args: argparse.Namespace) -> int:
    from seed_agents.observe.data import read_overview
    from seed_agents.observe.status import render_status

    cfg = load_config(StatusConfig, None, args.config_flags(args))
    with _open(cfg.store) as (store, label):
        ov = read_overview(store, last_decisions=max(cfg.decisions, 0))
    print(render_status(ov, store_label=label, window_s=cfg.window_s, max_windows=max(cfg.windows, 1),
                        width=shutil.get_terminal_size((120, 40)).columns))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from seed_agents.errors import ConfigError
    from seed_agents.observe.report import MAX_PAGE_SESSIONS, build_report, write_report

    cfg = load_config(ReportConfig, None, args.config_flags(args))
    if not 0 <= cfg.sessions <= MAX_PAGE_SESSIONS:
        raise ConfigError(f"--sessions must be between 0 and {MAX_PAGE_SESSIONS}, got {cfg.sessions}")
    out = Path(cfg.out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the HTML file to write, e.g. {out / 'report.html'}")
    with _open(cfg.store) as (store, label):
        html = build_report(store, store_label=label, sessions=cfg.sessions, decisions=max(cfg.decisions, 0),
                            window_s=cfg.window_s)
    write_report(html, out)
    print(f"wrote {out} ({len(html) // 1024} KiB)")
    return 0


@contextmanager
def _open(url: str) -> Iterator[tuple[Any, str]]:
    """The store at ``url`` and a label for it without its password. Never creates one (a
    typo must not leave an empty database behind); a store failure is one ConfigError line."""
    import sqlalchemy as sa

    from seed_agents.errors import ConfigError
    from seed_agents.store import StoreError, TraceStore

    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise ConfigError("cannot parse the --store URL (not echoed: it may hold a password): use "
                          "sqlite:///path/to/traces.db or postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not Path(parsed.database).exists():
        raise ConfigError(f"no trace store at {parsed.database}: pass --store with the URL the gateway or the "
                          "continual loop writes to")
    try:
        store = TraceStore.open(url)
    except StoreError as e:
        raise ConfigError(" ".join(str(e).split())) from None
    try:
        yield store, parsed.render_as_string(hide_password=True)
    except (StoreError, sa.exc.OperationalError) as e:
        raise ConfigError(f"reading the store failed: {' '.join(str(e).split())[:300]}") from None
    finally:
        store.close()
