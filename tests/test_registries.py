"""The registries every fact comes from: metrics declared once, backends listed once."""

from __future__ import annotations

import statistics

import pytest

from ipsec_lab import backends, metrics, runner, scenario


def _run(backend: str, mbps: list[float], effort: list[float]) -> list[dict]:
    return [
        {
            "backend": backend, "configuration": "esp:aes128gcm16", "link": "lan", "flow": "f",
            "workload": "tcp", "repetition": i, "status": "done", "reason": None,
            "backend_version": "x",
            "results": [{
                "label": "tcp", "mbps": m, "seconds": 2.0, "payload_bytes": 1000,
                "effort_us_per_kb": e,
                "ipsec_effort_us_per_kb": 0.0 if backend == "none" else e / 2,
                "wire_up_bytes": 1100, "wire_down_bytes": 100, "retransmits": i,
            }],
        }
        for i, (m, e) in enumerate(zip(mbps, effort))
    ]  # fmt: skip


def test_the_summary_aggregates_each_metric_as_declared() -> None:
    runs = _run("none", [100, 120, 110], [2.0, 2.2, 2.4]) + _run("ours", [50, 40, 60], [4, 5, 6])
    rows = {r["backend"]: r for r in runner.summarize(runs)}
    ours, none = rows["ours"], rows["none"]
    assert (ours["mbps_median"], ours["mbps_min"], ours["mbps_max"]) == (50, 40, 60)
    assert ours["mbps_cv"] == pytest.approx(statistics.stdev([50, 40, 60]) / 50)
    assert ours["mbps_vs_none"] == pytest.approx(50 / 110)
    assert ours["effort_vs_none"] == pytest.approx(5 / 2.2)
    assert ours["ipsec_effort_median"] == 2.5
    # none's IPsec effort is zero: no IPsec processes, so no figure rather than 0
    assert none["ipsec_effort_median"] is None
    assert ours["wire_pct_of_payload"] == pytest.approx(120.0)
    assert ours["retransmits_median"] == 1
    # every declared summary key is in the row, and prints in every column
    for m in metrics.METRICS:
        for key in [*m.summary.values(), *([m.vs_none] if m.vs_none else [])]:
            assert key in ours, key
    cells = metrics.cells(ours)
    assert len(cells) == len(metrics.COLUMNS) and "50.0 Mbit/s" in cells


def test_a_figure_prints_with_its_unit_the_same_everywhere() -> None:
    """The live progress line, the summary's notes and its cells print one way."""
    mbps = metrics.BY_KEY["mbps"]
    assert [mbps.show(v) for v in (9.5, 95.04, 950.4)] == [
        "9.50 Mbit/s",
        "95.0 Mbit/s",
        "950 Mbit/s",
    ]
    assert mbps.show(None) == "—"
    assert metrics.BY_KEY["other_cpu_before"].show(0.5) == "0.50 CPUs"
    assert metrics.BY_KEY["effort_us_per_kb"].show(12.345) == "12.3 µs/kB"
    ours = next(r for r in runner.summarize(_run("ours", [9.0, 9.5, 9.9], [1, 1, 1])))
    assert metrics.cells(ours)[0] == mbps.show(9.5)


def test_csv_columns_are_the_identity_then_each_exported_metric() -> None:
    fields = metrics.CSV_FIELDS
    assert fields[: len(metrics.CSV_IDENTITY)] == metrics.CSV_IDENTITY
    assert [f for f in fields if f in metrics.BY_KEY] == [m.key for m in metrics.METRICS if m.csv]
    assert len(set(fields)) == len(fields)


def test_every_registered_backend_is_built_by_name_and_accepted_by_scenarios() -> None:
    assert scenario.BACKENDS == backends.NAMES
    for e in backends.REGISTRY:
        assert backends.make(e.name).name == e.name
    assert backends.IPSEC_NAMES == tuple(n for n in backends.NAMES if n != "none")
    with pytest.raises(ValueError, match="unknown backend 'nope' \\(known: none, "):
        backends.make("nope")
