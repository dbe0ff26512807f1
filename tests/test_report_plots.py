"""The report's plots and tables say what they draw: a log axis labelled only at powers of
10 (its caption says each labelled gridline is 10x the one below), a small value on it not
read as none, notes shared by many rows written once under the table, and the peers
view of a campaign that measured several tunnels."""

from __future__ import annotations

import itertools
import math
from typing import Any

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


def test_the_peers_view_puts_each_tunnel_on_one_row_with_where_it_ran() -> None:
    """Two tunnels or more: one row each (none first), every measurement side by side, the
    CPU per GiB of the first bulk one — the kernel's tunnel has no process of its own —
    its version, and where it ran (a VM under TCG: not a speed figure). One tunnel: no
    view."""
    from ipsec_lab.campaign_report import peers, where_ran

    def row(b: str, m: str, **kw: Any) -> dict[str, Any]:
        base = {"backend": b, "configuration": "wireguard" if "wire" in b else "none",
                "link": "unshaped", "flow": "client-server", "measurement": m, "n": 1,
                "mbps_median": 100.0, "mbps_vs_none": 0.5, "effort_median": 10.0,
                "ipsec_effort_median": None, "transfer": False}  # fmt: skip
        return {**base, **kw}

    summary = [
        row("wireguard", "tcp", mbps_median=900.0),
        row("none", "tcp", mbps_median=1800.0, mbps_vs_none=1.0, effort_median=2.0),
        row("wireguard-go", "tcp", ipsec_effort_median=5.0),
        row("wireguard-go", "rfc2544-64", note="generator-bound: trafgen sent at most"),
        row("wireguard-go", "latency-50%", rtt_p50_us_median=800.0, rtt_p99_us_median=2900.0),
    ]
    runs = [{"backend": b, "status": "done", "backend_version": f"{b} 1"}
            for b in ("none", "wireguard", "wireguard-go")]  # fmt: skip
    env = {"vm": "tcg, kernel 6.1.0-57-amd64 (emulated: no vmx)", "kernel": "6.1.0-57-amd64"}
    (t,) = peers(summary, runs, env)
    assert t.title == "Peers side by side (unshaped, client-server)"
    assert t.columns == ["backend", "configuration", "tcp", "rfc2544-64", "latency-50%",
                         "CPU s/GiB (tcp)", "tunnel's own s/GiB", "version", "ran on"]  # fmt: skip
    place = "VM (tcg, kernel 6.1.0-57-amd64 (emulated: no vmx)); emulated: not a speed figure"
    assert t.rows == [
        ["none", "none", "1800 Mbit/s (1.00x)", "—", "—", "2.1", "—", "none 1", place],
        ["wireguard", "wireguard", "900 Mbit/s (0.50x)", "—", "—", "10.5", "the kernel's",
         "wireguard 1", place],
        ["wireguard-go", "wireguard", "100 Mbit/s (0.50x)",
         "100 Mbit/s (0.50x), generator-bound", "800 / 2.9e+03 µs", "10.5", "5.24",
         "wireguard-go 1", place],
    ]  # fmt: skip
    assert where_ran({"vm": "kvm, kernel 6.1"}) == "VM (kvm, kernel 6.1)"
    assert where_ran({"vm": None, "kernel": "6.18.44"}) == "host, Linux 6.18.44"
    hosts = {"gwA": {"kernel": "6.1.0-57-amd64"}, "gwB": {"kernel": "6.12.1"}}
    assert where_ran({"kernel": "6.18.44", "hosts": hosts}) == (
        "real hosts, Linux 6.1.0-57-amd64, 6.12.1"  # theirs, not the lab machine's
    )
    # a DUT the lab does not configure has no CPU figure of its own: not "the kernel's"
    ext = [*summary, row("external", "tcp", configuration="esp:aes128gcm16")]
    (t,) = peers(ext, runs, {})
    assert t.rows[-1][:2] == ["external", "esp:aes128gcm16"] and t.rows[-1][6] == "—"
    one = [r for r in summary if r["backend"] != "wireguard"]
    assert peers(one, runs, env) == []
