"""Success over time per version: windows, rates and window choice, against hand-made numbers."""

from __future__ import annotations

import pytest

from seed_agents.observe.curve import (
    Outcome,
    Window,
    auto_window,
    format_duration,
    last_windows,
    parse_duration,
    pick_window,
    rates_by_window,
    success_curves,
    totals,
    window_start,
)

H = 3600.0


def test_windows_are_aligned_and_counted_per_version():
    outs = [Outcome(0, 10 * H + 5, 1.0), Outcome(0, 10 * H + 3000, 0.0), Outcome(0, 11 * H, 1.0),
            Outcome(1, 11 * H + 10, 0.5), Outcome(1, 11 * H + 20, 1.0), Outcome(1, 12 * H - 1, 2.0)]
    curves = success_curves(outs, H)
    assert curves == {
        0: [Window(10 * H, 2, 1, 1.0), Window(11 * H, 1, 1, 1.0)],
        1: [Window(11 * H, 3, 2, 3.5)],  # reward 0.5 is not a success; 2.0 is (>= 1)
    }
    assert curves[1][0].rate == pytest.approx(2 / 3) and curves[1][0].mean_reward == pytest.approx(3.5 / 3)
    assert window_start(11 * H - 0.001, H) == 10 * H


def test_totals_and_table_columns():
    outs = [Outcome(2, 5.0, 1.0), Outcome(1, 1.0, 0.0), Outcome(2, 3.0, 0.0)]
    assert totals(outs) == {1: Window(1.0, 1, 0, 0.0), 2: Window(3.0, 2, 1, 1.0)}
    curves = {0: [Window(0, 1, 1, 1), Window(2 * H, 1, 0, 0)], 1: [Window(H, 4, 2, 2), Window(2 * H, 2, 2, 2)]}
    cut = last_windows(curves, 2)
    assert cut == {0: [Window(2 * H, 1, 0, 0)], 1: [Window(H, 4, 2, 2), Window(2 * H, 2, 2, 2)]}
    assert rates_by_window(cut, [H, 2 * H]) == {0: [None, Window(2 * H, 1, 0, 0)], 1: [Window(H, 4, 2, 2), Window(2 * H, 2, 2, 2)]}


def test_window_choice():
    assert pick_window(0, 59 * 60, 60) == 60  # 59 minutes fit in 60 one-minute windows
    assert pick_window(0, 60 * 60, 60) == 300  # 61 one-minute windows do not
    assert pick_window(0, 10 * 365 * 86400, 4) == 30 * 86400  # nothing fits: the longest
    times = [i * 600.0 for i in range(36)]  # 36 outcomes over 6 hours: about 5 per window -> 7 windows
    assert auto_window(times) == H
    assert auto_window(times, min_per_window=1) == 900
    with pytest.raises(ValueError):
        pick_window(0, 1, 0)


def test_durations():
    assert [parse_duration(t) for t in ("90s", "15m", "1h", "2d", "1w")] == [90, 900, 3600, 172800, 604800]
    for bad in ("", "h", "0m", "-1h", "1.5h", "7x"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
    assert [format_duration(s) for s in (60, 3600, 86400, 90, 21600)] == ["1m", "1h", "1d", "90s", "6h"]
