"""A soak's verdict and its plots without namespaces: the interval that first lost more
than the tolerance, the resident memory's growth per hour, and the report's series."""

from __future__ import annotations

import pytest

from ipsec_lab import campaign_report, scenario
from ipsec_lab.traffic.soak import judge, slope_per_hour


def _series(losses: list[float], rss: list[int]) -> list[dict[str, float]]:
    return [{"index": i, "t_s": 10.0 * (i + 1), "seconds": 10.0, "loss_pct": loss,
             "mbps": 20.0, "sent_packets": 1000, "received_packets": 1000,
             "ipsec_rss_bytes": r} for i, (loss, r) in enumerate(zip(losses, rss))]  # fmt: skip


def test_the_first_interval_beyond_the_tolerance_is_named() -> None:
    v = judge(_series([0, 0, 0.3, 0, 2.0], [10] * 5), tolerance_pct=0.1)
    assert not v["held"] and v["first_failed_interval"] == 2 and v["failed_intervals"] == 2
    assert v["first_failed_at_s"] == 30.0
    assert judge(_series([0, 0.05, 0.1], [10] * 3), tolerance_pct=0.1)["held"]
    assert not judge([], 0.0)["held"]  # nothing measured holds nothing


def test_memory_growth_per_hour_is_the_least_squares_slope() -> None:
    # 1 MiB more every 10 s: 360 MiB an hour, whatever the noise around the line
    rss = [100 * 2**20 + i * 2**20 + (3000 if i % 2 else -3000) for i in range(30)]
    v = judge(_series([0] * 30, rss), 0.0)
    assert v["rss_growth_bytes_per_hour"] == pytest.approx(360 * 2**20, rel=0.001)
    assert v["rss_first_bytes"] == rss[0] and v["rss_last_bytes"] == rss[-1]
    assert slope_per_hour([(0.0, 5.0)]) is None
    assert slope_per_hour([(0.0, 5.0), (3600.0, 5.0)]) == 0.0


def test_the_report_draws_each_soak_s_series() -> None:
    row = {"label": "soak", "offered_mbps": 20.0, "loss_tolerance_pct": 0.1,
           "series": _series([0, 0, 1.5], [2**20, 2**20, 2 * 2**20])}  # fmt: skip
    # beside it a rekey row, whose series is of rekeys (no rate, no loss per interval)
    rekeyed = {"label": "rekey", "offered_mbps": 20.0, "lost_packets": 0,
               "series": [{"index": 0, "t_s": 5.0, "rekey_seconds": 1.2, "spis": [],
                           "sent_packets": 100, "missing_packets": 0}]}  # fmt: skip
    runs = [{"status": "done", "backend": "ours", "backend_label": "ours",
             "configuration": "esp:aes128gcm16", "link": "unshaped", "repetition": 1,
             "results": [row, rekeyed]}]  # fmt: skip
    an = campaign_report.Analysis("x", "x", "x")
    campaign_report._soak_plots(an, runs, 7)
    by = {p.title: p for p in an.plots}
    loss = by["Soak: loss per interval"]
    (xs, ys) = loss.lines["ours esp:aes128gcm16 (unshaped, #1)"]
    assert ys == [0, 0, 1.5] and xs == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    assert loss.hlines == {"tolerance (0.1 %)": 0.1}
    assert list(loss.lines) == ["ours esp:aes128gcm16 (unshaped, #1)"]  # the soak alone
    assert by["Soak: the IPsec processes' resident memory"].lines[
        "ours esp:aes128gcm16 (unshaped, #1)"][1] == [1.0, 1.0, 2.0]  # fmt: skip


def test_a_soak_reads_with_its_defaults_and_checks_its_keys() -> None:
    w = scenario.parse("[[workloads]]\nkind = 'soak'", "s.toml").workloads[0]
    assert (w.minutes, w.load_pct, w.interval_s, w.probe_interval_ms) == (30, 50, 10, 10)
    w = scenario.parse("[[workloads]]\nkind = 'soak'\nrate_mbit = '200M'", "s.toml").workloads[0]
    assert w.load_pct is None and w.rate_mbit == 200
    for text, key, words in (
        ("rate_mbit = 10\nload_pct = 20", "workloads[0].load_pct", "not both"),
        ("minutes = 0.1\ninterval_s = 30", "workloads[0].interval_s", "longer than the soak"),
        ("load_pct = 0", "workloads[0].load_pct", "outside"),
        ("seconds = 5", "workloads[0].seconds", "soak workload takes"),
    ):
        with pytest.raises(scenario.ScenarioError) as e:
            scenario.parse(f"[[workloads]]\nkind = 'soak'\n{text}", "s.toml")
        assert e.value.key == key and words in str(e.value), str(e.value)
