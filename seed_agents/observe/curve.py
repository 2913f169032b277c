"""Success over time per model version: fixed time windows, pure functions.

A deployment's question is "did the promoted version get better, and is it still good?",
so outcomes are bucketed by the time their session started into windows aligned on
multiples of the window length since the Unix epoch (the same window boundaries in every
run and every view), one series per version. Each window keeps its count next to its
rate: a 100% from 2 sessions and a 100% from 200 must not read alike.

Success is the store's own definition (``TraceStore.to_trajectory``): the session's
reward, as its ``RewardPolicy`` picks it, is at least ``SUCCESS_AT``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SUCCESS_AT = 1.0
"""A session succeeded when its reward is at least this (as ``TraceStore.to_trajectory``)."""

NICE_WINDOWS_S: tuple[int, ...] = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)
"""Window lengths ``pick_window`` chooses from: 1 min, 5 min, 15 min, 1 h, 6 h, 1 d, 1 w, 30 d."""


@dataclass(frozen=True)
class Outcome:
    """One rewarded session: which version served it, when it started, what it scored."""

    version: int
    at: float
    reward: float

    @property
    def success(self) -> bool:
        return self.reward >= SUCCESS_AT


@dataclass(frozen=True)
class Window:
    """The outcomes of one version in ``[start, start + length)``."""

    start: float
    n: int
    successes: int
    reward_sum: float

    @property
    def rate(self) -> float:
        """Share of successes (0.0 for an empty window, which views do not draw)."""
        return self.successes / self.n if self.n else 0.0

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.n if self.n else 0.0


def window_start(at: float, window_s: float) -> float:
    """The start of the window holding ``at`` (aligned on multiples of ``window_s``)."""
    return math.floor(at / window_s) * window_s


def pick_window(first: float, last: float, max_windows: int) -> int:
    """The shortest of ``NICE_WINDOWS_S`` that covers ``[first, last]`` in at most
    ``max_windows`` aligned windows (the longest one when none does)."""
    if max_windows < 1:
        raise ValueError(f"max_windows must be >= 1, got {max_windows}")
    for w in NICE_WINDOWS_S:
        if window_start(last, w) - window_start(first, w) < max_windows * w:
            return w
    return NICE_WINDOWS_S[-1]


def auto_window(times: Sequence[float], *, min_per_window: int = 5, max_windows: int = 48) -> int:
    """A window for outcomes at ``times``: about ``min_per_window`` outcomes per window on
    average (a rate from 1 or 2 sessions is noise), and at most ``max_windows`` windows."""
    if not times:
        return NICE_WINDOWS_S[0]
    return pick_window(min(times), max(times), max(1, min(max_windows, len(times) // min_per_window)))


def success_curves(outcomes: Iterable[Outcome], window_s: float) -> dict[int, list[Window]]:
    """Per version, its non-empty windows in time order."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    acc: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))
    for o in outcomes:
        cell = acc[o.version][window_start(o.at, window_s)]
        cell[0] += 1
        cell[1] += o.success
        cell[2] += o.reward
    return {v: [Window(start, int(c[0]), int(c[1]), c[2]) for start, c in sorted(cells.items())]
            for v, cells in sorted(acc.items())}


def totals(outcomes: Iterable[Outcome]) -> dict[int, Window]:
    """Per version, all its outcomes as one window (``start`` = its first outcome)."""
    out: dict[int, Window] = {}
    for o in sorted(outcomes, key=lambda o: o.at):
        w = out.get(o.version)
        out[o.version] = (Window(o.at, 1, int(o.success), o.reward) if w is None
                          else Window(w.start, w.n + 1, w.successes + o.success, w.reward_sum + o.reward))
    return dict(sorted(out.items()))


def window_starts(curves: dict[int, list[Window]]) -> list[float]:
    """Every window start any version has, in time order (the columns of a table)."""
    return sorted({w.start for ws in curves.values() for w in ws})


def last_windows(curves: dict[int, list[Window]], k: int) -> dict[int, list[Window]]:
    """The same curves cut to the last ``k`` window starts of all versions together."""
    keep = set(window_starts(curves)[-k:]) if k > 0 else set()
    return {v: [w for w in ws if w.start in keep] for v, ws in curves.items()}


def format_duration(seconds: float) -> str:
    """60 -> '1m', 3600 -> '1h', 86400 -> '1d', 90 -> '90s'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_duration(text: str) -> int:
    """'90s', '15m', '1h', '2d', '1w' -> seconds; ValueError (naming the forms) otherwise."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    text = text.strip().lower()
    if len(text) >= 2 and text[-1] in units and text[:-1].isdigit() and int(text[:-1]) > 0:
        return int(text[:-1]) * units[text[-1]]
    raise ValueError(f"{text!r} is not a duration: use a positive whole number and a unit, e.g. 90s, 15m, 1h, 1d, 1w")


def rates_by_window(curves: dict[int, list[Window]], starts: Sequence[float]) -> dict[int, list[Window | None]]:
    """Per version, its window at each of ``starts`` (None where it had no outcome)."""
    out: dict[int, list[Window | None]] = {}
    for v, ws in curves.items():
        by_start = {w.start: w for w in ws}
        out[v] = [by_start.get(s) for s in starts]
    return out
