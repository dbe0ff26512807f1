"""Latency figures without namespaces: percentiles, the HDR-style histogram they can be
recomputed from, and what irtt's own JSON (a real irtt run on loopback) becomes."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from ipsec_lab import scenario
from ipsec_lab.traffic import latency
from netutil import poll_until


def test_nearest_rank_percentiles() -> None:
    xs = list(range(1, 1001))  # 1..1000
    assert latency.percentile(xs, 50) == 500
    assert latency.percentile(xs, 99) == 990
    assert latency.percentile(xs, 99.9) == 999
    assert latency.percentile(xs, 100) == 1000
    assert latency.percentile([7.0], 99.9) == 7.0
    with pytest.raises(ValueError):
        latency.percentile([], 50)


def test_the_histogram_gives_back_every_percentile_within_its_resolution() -> None:
    rng = random.Random(7)
    # a long-tailed RTT: 80 µs typical, a few ms now and then, some under a µs
    xs = [rng.lognormvariate(11.3, 0.4) for _ in range(20_000)]
    xs += [rng.uniform(2e6, 9e6) for _ in range(40)] + [300.0, 999.0]
    h = latency.histogram(xs)
    assert sum(c for _, c in h) == len(xs)
    assert [k for k, _ in h] == sorted({k for k, _ in h})
    s = sorted(xs)
    for p in (50, 90, 99, 99.9, 100):
        exact = latency.percentile(s, p)
        back = latency.histogram_percentile(h, p)
        if exact >= latency.HIST_FLOOR_NS:  # log buckets 1 % wide: within 0.5 %
            assert back == pytest.approx(exact, rel=0.005), p
    assert latency.histogram_percentile(h, 0.001) < latency.HIST_FLOOR_NS


def test_bucket_edges() -> None:
    assert latency.bucket(0) == 0 and latency.bucket(999.9) == 0
    assert latency.bucket(1000) == 1
    for k in (1, 2, 50, 700):
        lo, hi = latency.bucket_bounds(k)
        assert latency.bucket(lo * 1.000001) == k and latency.bucket(hi * 1.000001) == k + 1
        assert hi == pytest.approx(lo * 1.01)


@pytest.mark.quiet  # probes every 2 ms: this machine's latencies
def test_irtt_s_own_json_becomes_a_row(tmp_path: Path) -> None:
    """A real irtt server and client on loopback: every probe accounted for, the
    percentiles in order, the histogram holding every answered probe, one-way delays
    only where one clock stamps both ends."""
    assert shutil.which("irtt"), "irtt (Debian irtt) is not installed: make deps"
    srv = subprocess.Popen(["irtt", "server", "-b", "127.0.0.1:21121", "-i", "0", "-d", "0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # bound: 127.0.0.1:21121 in the kernel's UDP table (hex, address little-endian)
        poll_until("irtt's server to bind",
                   lambda: "0100007F:5281 " in Path("/proc/net/udp").read_text())  # fmt: skip
        p = subprocess.run(["irtt", "client", "-i", "2ms", "-d", "1s", "-Q", "-o", "-",
                            "--wait=500ms", "127.0.0.1:21121"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        srv.terminate()
        srv.wait(5)
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    row = latency.probes_row(data, same_clock=True)
    assert row["probes_sent"] == len(data["round_trips"]) > 100
    answered = row["probes_sent"] - row["probes_lost"]
    assert sum(c for _, c in row["histogram"]) == answered
    assert row["probe_interval_ms"] == 2.0
    keys = ["rtt_min_us", "rtt_p50_us", "rtt_p90_us", "rtt_p99_us", "rtt_p99_9_us", "rtt_max_us"]
    vals = [row[k] for k in keys]
    assert vals == sorted(vals) and vals[0] > 0
    # irtt's own median of the same round trips, in ns (it averages the middle two)
    assert row["rtt_p50_us"] == pytest.approx(data["stats"]["rtt"]["median"] / 1e3, rel=0.2)
    assert row["one_way_up_p50_us"] > 0 and row["one_way_down_p50_us"] > 0
    # the mean change between successive probes is irtt's own IPDV mean (RFC 5481)
    assert row["jitter_us"] == pytest.approx(data["stats"]["ipdv_round_trip"]["mean"] / 1e3,
                                             rel=0.01)  # fmt: skip
    two = latency.probes_row(data, same_clock=False)
    assert "one_way_up_p50_us" not in two and "not kept" in two["one_way_clock"]


def test_a_latency_workload_reads_with_its_defaults_and_checks_its_keys() -> None:
    w = scenario.parse("[[workloads]]\nkind = 'latency'", "l.toml").workloads[0]
    assert (w.loads, w.background, w.probe_interval_ms) == ((0, 10, 50, 90), "udp", 1.0)
    w = scenario.parse(
        "[[workloads]]\nkind = 'latency'\nloads = [0, 50]\nbackground = 'tcp'\nsize = 64",
        "l.toml",
    ).workloads[0]
    assert (w.loads, w.background, w.size) == ((0.0, 50.0), "tcp", 64)
    for text, key, words in (
        ("loads = [120]", "workloads[0].loads", "outside"),
        ("loads = []", "workloads[0].loads", "non-empty"),
        ("loads = [10, 10]", "workloads[0].loads", "twice"),
        ("background = 'ping'", "workloads[0].background", "udp, tcp"),
        ("rate_mbit = 5", "workloads[0].rate_mbit", "latency workload takes"),
    ):
        with pytest.raises(scenario.ScenarioError) as e:
            scenario.parse(f"[[workloads]]\nkind = 'latency'\n{text}", "l.toml")
        assert e.value.key == key and words in str(e.value), str(e.value)
