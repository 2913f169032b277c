"""``seed-agents status`` and ``seed-agents report``: watch a deployed agent from its trace store.

    seed-agents status [--store URL] [--decisions N] [--window 1h] [--windows N]
    seed-agents report [--store URL] --out report.html [--sessions N] [--window 1h]

``status`` prints one screen: versions with their state and traffic, the last decisions
with their evidence, success over time per version, queue lengths. ``report`` writes one
self-contained HTML page (no script, no network) with the success curve, the decisions,
and the latest sessions with their calls, tool calls, rewards and skills; the gateway
serves the same page at ``/dashboard``. Both only read the store.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_STORE = "sqlite:///runs/traces.db"


def _window(text: str) -> int:
    from seed_agents.observe.curve import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``status`` and ``report`` on ``sub``."""
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--store", default=DEFAULT_STORE, help=f"Trace store URL (default {DEFAULT_STORE}; or postgresql://...).")
        p.add_argument("--window", type=_window, metavar="DURATION",
                       help="Success-curve window, e.g. 15m, 1h, 1d (default: about 5 sessions per window).")

    p = sub.add_parser("status", help="One screen on a deployed agent: versions, decisions, success over time, queues.",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.add_argument("--decisions", type=int, default=5, metavar="N", help="Show the last N decisions (default 5).")
    p.add_argument("--windows", type=int, default=6, metavar="N", help="Show the last N windows of the curve (default 6).")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("report", help="Write the trace store's HTML report (success curve, decisions, sessions).",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.add_argument("--out", required=True, help="HTML file to write (replaced if it exists).")
    p.add_argument("--sessions", type=int, default=50, metavar="N", help="Drill into the latest N sessions (default 50).")
    p.add_argument("--decisions", type=int, default=50, metavar="N", help="List the last N decisions (default 50).")
    p.set_defaults(func=cmd_report)


def cmd_status(args: argparse.Namespace) -> int:
    from seed_agents.observe.data import read_overview
    from seed_agents.observe.status import render_status

    with _open(args.store) as (store, label):
        ov = read_overview(store, last_decisions=max(args.decisions, 0))
    print(render_status(ov, store_label=label, window_s=args.window, max_windows=max(args.windows, 1),
                        width=shutil.get_terminal_size((120, 40)).columns))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from seed_agents.config import ConfigError
    from seed_agents.observe.report import MAX_PAGE_SESSIONS, build_report, write_report

    if not 0 <= args.sessions <= MAX_PAGE_SESSIONS:
        raise ConfigError(f"--sessions must be between 0 and {MAX_PAGE_SESSIONS}, got {args.sessions}")
    out = Path(args.out)
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; name the HTML file to write, e.g. {out / 'report.html'}")
    with _open(args.store) as (store, label):
        html = build_report(store, store_label=label, sessions=args.sessions, decisions=max(args.decisions, 0),
                            window_s=args.window)
    write_report(html, out)
    print(f"wrote {out} ({len(html) // 1024} KiB)")
    return 0


@contextmanager
def _open(url: str) -> Iterator[tuple[Any, str]]:
    """The store at ``url`` and a label for it without its password. Never creates one (a
    typo must not leave an empty database behind); a store failure is one ConfigError line."""
    import sqlalchemy as sa

    from seed_agents.config import ConfigError
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
