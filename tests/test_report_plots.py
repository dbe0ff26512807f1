"""The report's plots and tables say what they draw: a log axis labelled only at powers of
10 (its caption says each labelled gridline is 10x the one below), a small value on it not
read as none, and notes shared by many rows written once under the table."""

from __future__ import annotations

import itertools
import math

import pytest

from ipsec_lab.campaign_report import footnoted
from ipsec_lab.report import bar_heights, log_ticks
from ipsec_lab.studies import Plot


@pytest.mark.parametrize(
    "values",
    [[350.0, 4200.0, 2100.0, 3100.0], [1.18, 12.8], [9.6, 13077.0], [2000.0, 2500.0, 45000.0]],
)
def test_a_log_axis_is_labelled_at_each_power_of_10_only(values: list[float]) -> None:
    p = Plot("bars", "t", "link", "Mbit/s — log scale", [f"l{i}" for i in range(len(values))],
             {"ours": values}, logy=True)  # fmt: skip
    ticks = log_ticks(p)
    assert len(ticks) >= 2, ticks
    for v, _label in ticks:
        assert math.log10(v) == pytest.approx(round(math.log10(v))), ticks  # a power of 10
    for (a, _), (b, _) in itertools.pairwise(ticks):
        assert b / a == pytest.approx(10.0), ticks  # "each labelled gridline 10x"
    # the smallest value's bar is visible beside the largest (1.18 beside 12.8)
    heights = bar_heights(p)
    assert min(heights.values()) >= 0.1 * max(heights.values()), heights


def test_notes_shared_by_rows_are_written_once_under_the_table() -> None:
    busy = "BUSY machine in 2 of 2 runs: other processes used up to 0.9 CPUs just before"
    rows = [["ours", 2, f"{busy}; NDR 16 Mbit/s"], ["none", 2, busy], ["x", 0, "FAILED: boom"],
            ["y", 1, ""]]  # fmt: skip
    out, notes = footnoted(rows)
    assert notes == [busy, "NDR 16 Mbit/s"]
    assert [r[-1] for r in out] == ["[1] [2]", "[1]", "FAILED: boom", ""]
