"""The web page of a deployed agent's store: ``/dashboard`` on the gateway, ``seed-agents report``.

One self-contained HTML page (no script, no CDN, no external request: the machines that
run this often have no internet): the success curve per version as inline SVG, the
versions, the decisions with their evidence, the canary episodes behind the latest
decisions (which tasks each side passed, down to each episode's tool calls), the queues,
and the latest sessions with their calls, tool calls, rewards and skills (native
``<details>`` drill-down).

Everything shown from the store (user text, model output, tool results, task keys,
comments, skills, evidence) is untrusted: Jinja2 autoescapes every value, and a Content
Security Policy that allows no script at all is a second wall. The store holds text that
the gateway already redacted; the page shows no request headers, no token ids (only
their counts) and no session metadata beyond the runner's episode outcome.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from seed_agents.continual.canary import MAX_TEXT
from seed_agents.observe.curve import (
    Window,
    auto_window,
    format_duration,
    success_curves,
    totals,
    window_starts,
)
from seed_agents.observe.data import (
    QUEUES,
    CanaryView,
    Overview,
    SessionDetail,
    canary_views,
    evidence_summary,
    outcomes,
    read_overview,
    session_details,
)
from seed_agents.observe.status import utc
from seed_agents.store import TraceStore

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
"""No script, no external fetch: a payload that escaped the escaping still cannot run."""

MAX_CURVE_WINDOWS = 48
MAX_PAGE_SESSIONS = 500
"""The most sessions one page drills into (each costs a few store reads and page weight)."""


# -- the chart (pure geometry; the template only draws it) --------------------------------------


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    r: float
    window: Window


@dataclass(frozen=True)
class Series:
    version: int
    color: str
    points: list[Point]
    total: Window

    @property
    def path(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    window_s: int
    series: list[Series]
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    markers: list[tuple[float, str, bool]]  # x, label, whether the label goes left of the line (near the right edge)


def build_chart(ov: Overview, *, window_s: int | None = None, width: int = 900, height: int = 280) -> Chart | None:
    """Success rate per version per window as plot coordinates; None without outcomes.

    x is time (window centres), y the success rate; a point's area grows with its count
    (radius 2.5 + sqrt(n), capped), so thin windows look thin. Promotions and rollbacks
    inside the plotted span are vertical markers."""
    outs = outcomes(ov.points)
    if not outs:
        return None
    w = window_s or auto_window([o.at for o in outs], max_windows=MAX_CURVE_WINDOWS)
    curves = success_curves(outs, w)
    starts = window_starts(curves)
    t0, t1 = starts[0], starts[-1] + w
    left, right, top, bottom = 48, 16, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * plot_w

    def y(rate: float) -> float:
        return top + (1 - rate) * plot_h

    all_totals = totals(outs)
    series = [Series(version=v, color=PALETTE[v % len(PALETTE)], total=all_totals[v],
                     points=[Point(x(win.start + w / 2), y(win.rate), min(2.5 + math.sqrt(win.n), 9.0), win) for win in ws])
              for v, ws in curves.items()]
    step = max(1, math.ceil(len(starts) / 8))
    short = w < 86400
    x_ticks = [(x(s), utc(s, seconds=False)[11 if short else 0:]) for s in starts[::step]]
    y_ticks = [(y(r), f"{r:.0%}") for r in (0.0, 0.25, 0.5, 0.75, 1.0)]
    markers = [(x(d.created_at), f"{d.action} v{d.to_version}", x(d.created_at) > width - 120) for d in ov.decisions
               if d.action in ("promote", "rollback") and t0 <= d.created_at <= t1 and d.from_version != d.to_version]
    return Chart(width, height, left, right, top, bottom, w, series, x_ticks, y_ticks, markers)


# -- the page ----------------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["utc"] = lambda ts: "" if ts is None else utc(ts)
    env.filters["pretty"] = lambda obj: json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    env.filters["duration"] = format_duration
    return env


_TEMPLATE = _environment().from_string(
    resources.files("seed_agents.observe").joinpath("report.html.j2").read_text(encoding="utf-8"))


def render_report(ov: Overview, details: list[SessionDetail], *, store_label: str, window_s: int | None = None,
                  canary: list[CanaryView] | None = None) -> str:
    """The page as a string (pure: everything it shows comes in as arguments)."""
    promoted = ov.promoted()
    canary = canary or []
    return _TEMPLATE.render(
        canary=canary, canary_ids={c.decision.decision_id for c in canary}, max_text=MAX_TEXT,
        ov=ov, details=details, store_label=store_label, chart=build_chart(ov, window_s=window_s), csp=CSP,
        queues=[(k, ov.queues.get(k, 0), QUEUES.get(k, "")) for k in [*QUEUES, *sorted(set(ov.queues) - set(QUEUES))]],
        decisions=[(d, evidence_summary(d)) for d in reversed(ov.decisions)], promoted=promoted,
        n_sessions=len(ov.points), n_rewarded=sum(p.reward is not None for p in ov.points))


def build_report(store: TraceStore, *, store_label: str, sessions: int = 50, decisions: int = 50,
                 window_s: int | None = None) -> str:
    """Read ``store`` and render the page with its latest ``sessions`` sessions, newest first."""
    ov = read_overview(store, last_decisions=decisions)
    latest = [p.session_id for p in reversed(ov.points)][:sessions]
    return render_report(ov, session_details(store, latest), store_label=store_label, window_s=window_s,
                         canary=canary_views(store, ov.decisions))


def write_report(html: str, out: Path) -> None:
    """Write ``html`` to ``out`` atomically (a reader never sees half a page)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

