"""``seed-agents status``: one screen on a deployed agent's trace store.

Versions with their state and their traffic, the last decisions with the evidence each
rests on (and how alike the candidate and the version it was compared with played),
success over time per version in fixed windows, queue lengths, and every gateway that
reports to the store (what it serves, its replicas in and out of rotation, its spool). Rendering is a pure
function of an ``Overview`` (``data.read_overview``), so tests check the text without a
terminal. Times are UTC, like the window boundaries (multiples of the window
length since the epoch).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

from seed_agents.observe.curve import (
    auto_window,
    format_duration,
    last_windows,
    rates_by_window,
    success_curves,
    totals,
    window_starts,
)
from seed_agents.observe.data import QUEUES, Overview, evidence_summary, outcomes, sameness_summary
from seed_agents.store.gateways import SILENT_AFTER_S


def utc(ts: float, *, seconds: bool = True) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def _cut(text: str, width: int, indent: str = "") -> str:
    """``text`` on one line after ``indent``, cut to ``width`` characters in all."""
    text = indent + " ".join(text.split())
    return text if len(text) <= width else text[: max(width - 3, len(indent))] + "..."


def _v(version: int | None) -> str:
    return "none" if version is None else f"v{version}"


def _rate(successes: int, n: int) -> str:
    return f"{successes / n:.0%} ({successes}/{n})" if n else "-"


def render_status(ov: Overview, *, store_label: str, window_s: int | None = None, max_windows: int = 6,
                  width: int = 120) -> str:
    """The status screen as text. ``window_s`` None picks one (``curve.auto_window``, at
    most 12 windows over the whole history); the last ``max_windows`` of them are shown."""
    lines = [f"seed-agents status  {store_label}  at {utc(ov.taken_at)} UTC", ""]
    outs = outcomes(ov.points)
    per_version = totals(outs)
    sessions_by_version = Counter(p.version for p in ov.points if p.version is not None)

    # -- versions
    names = sorted({v.name for v in ov.versions})
    lines.append(f"VERSIONS ({len(ov.versions)}; model {', '.join(names) or 'none'})")
    if not ov.versions:
        lines.append("  none recorded yet (the continual loop or `seed-agents versions` records them)")
    else:
        rows = []
        for v in ov.versions:
            t = per_version.get(v.version)
            served = str(v.metadata.get("served_name") or f"{v.name}-v{v.version}")
            rows.append((v.name, f"v{v.version}", v.status.upper() if v.status == "promoted" else v.status, served,
                         utc(v.created_at, seconds=False), str(sessions_by_version.get(v.version, 0)),
                         _rate(t.successes, t.n) if t else "-"))
        lines += _table(("MODEL", "VERSION", "STATUS", "SERVED AS", "CREATED", "SESSIONS", "SUCCESS"), rows)
        if len(names) > 1:
            lines.append("  (sessions and success are per stamped policy version, which model names share)")
    unknown = sorted(set(per_version) - {v.version for v in ov.versions})
    if unknown:
        lines.append(f"  traffic also stamped with unregistered versions: {', '.join(f'v{v}' for v in unknown)}")
    lines.append("")

    # -- decisions
    lines.append(f"DECISIONS (last {len(ov.decisions)})")
    if not ov.decisions:
        lines.append("  none yet")
    for d in reversed(ov.decisions):  # newest first
        moved = (f"{_v(d.from_version)} -> {_v(d.to_version)}" if d.from_version != d.to_version
                 else f"{_v(d.to_version)} stays")
        head = f"#{d.decision_id} {utc(d.created_at)} {d.name} {d.action.upper()} v{d.version} by {d.actor} ({moved})"
        lines.append(_cut(head, width, "  "))
        lines.append(_cut(d.summary, width, "      "))
        lines.append(_cut(f"evidence: {evidence_summary(d)}", width, "      "))
        same = sameness_summary(d)
        if same:
            lines.append(_cut(f"sameness: {same}", width, "      "))
    lines.append("")

    # -- success over time
    if not outs:
        lines.append("SUCCESS OVER TIME: no rewarded sessions yet")
    else:
        w = window_s or auto_window([o.at for o in outs], max_windows=12)
        curves = last_windows(success_curves(outs, w), max_windows)
        starts = window_starts(curves)
        short = w < 86400
        lines.append(f"SUCCESS OVER TIME (window {format_duration(w)}, last {len(starts)}; success % (successes/n); "
                     f"column = window start, UTC)")
        cells = rates_by_window(curves, starts)
        rows = [(f"v{v}", *[_rate(c.successes, c.n) if c else "." for c in cs]) for v, cs in cells.items() if any(cs)]
        header = ("VERSION", *[utc(s, seconds=False)[5 if short else 0:] for s in starts])
        lines += _table(header, rows)
    lines.append("")

    # -- queues
    lines.append("QUEUES")
    lines += _table(("QUEUE", "LENGTH", "WHAT"), [(k, str(ov.queues.get(k, 0)), QUEUES.get(k, "")) for k in
                                                   [*QUEUES, *sorted(set(ov.queues) - set(QUEUES))]])
    lines.append("")
    lines += _gateways(ov, width)
    return "\n".join(lines)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def _gateways(ov: Overview, width: int) -> list[str]:
    """Every gateway that reports to this store: what it serves, its replicas, its spool."""
    lines = [f"GATEWAYS ({len(ov.gateways)})"]
    if not ov.gateways:
        return [*lines, "  none has reported yet (a running gateway reports every few seconds)"]
    rows, notes = [], []
    for g in ov.gateways:
        state = g.state
        age = ov.taken_at - g.seen_at
        seen = "stopped" if state.get("stopped") else f"{_age(age)} ago" + (" SILENT" if age > SILENT_AFTER_S else "")
        replicas = state.get("replicas") or []
        live = sum(bool(r.get("in_rotation")) for r in replicas)
        counters = state.get("counters") or {}
        rows.append((g.name, g.url, seen, f"{state.get('upstream_model', '?')} v{state.get('policy_version', '?')}",
                     f"{live}/{len(replicas)} in rotation", str(state.get("spool_depth", 0)),
                     str(counters.get("calls_stored", 0))))
        notes += [_cut(f"{g.name}: {r.get('url')} out of rotation: {r.get('reason')}", width, "    ")
                  for r in replicas if not r.get("in_rotation")]
    return [*lines, *_table(("GATEWAY", "URL", "SEEN", "SERVING", "REPLICAS", "SPOOL", "CALLS"), rows), *notes]
