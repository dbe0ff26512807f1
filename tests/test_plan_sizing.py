"""`plan` follows the packet mix: per-packet and per-byte costs fitted to a campaign that
measured more than one size (study 2's two terms), a range (or a refusal) from one that
measured one, and the fit itself checked by hand and against numpy's least squares."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab.model.sizing import CostPoint, fit_costs, point_of
from ipsec_lab.model.throughput import FitError
from ipsec_lab.store import RunKey, Store

IMIX_MEAN = (7 * 40 + 4 * 576 + 1500) / 12  # 340.33 B


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cli(*args, check=check)


def _effort(us_one_gateway: float, size: int) -> float:
    """The row's µs/kB (both gateways, per kB of UDP payload) for a cost per packet."""
    return us_one_gateway * 2 * 1024 / (size - 28)


def _campaign(lab: Path, sizes: dict[int, float], tcp: bool = False) -> int:
    """A campaign of ours esp:aes128gcm16 with rfc2544 rows at `sizes` (size: µs per packet,
    a gateway's: the two's mean), two repetitions each."""
    store = Store(lab / "results.sqlite")
    cid = store.new_campaign("sizing", "sizing.toml", 'backends = ["ours"]\n', {})
    for rep in (1, 2):
        rows = [(f"sizes-{s}", {"size": s, "mbps": 50.0, "payload_bytes": 1e6, "seconds": 2.0,
                                "ipsec_effort_us_per_kb": _effort(us, s)})
                for s, us in sizes.items()]  # fmt: skip
        store.record(cid, RunKey("ours", "esp:aes128gcm16", "unshaped", "sizes", "c-s", rep),
                     "done", 0.0, results=rows)  # fmt: skip
        if tcp:
            store.record(cid, RunKey("ours", "esp:aes128gcm16", "unshaped", "tcp", "c-s", rep),
                         "done", 0.0, results=[("tcp", {"mbps": 900.0, "payload_bytes": 9e8,
                         "data": "iperf", "ipsec_effort_us_per_kb": 3.0})])  # fmt: skip
    store.close()
    return cid


def test_the_fit_matches_the_hand_arithmetic_and_numpy() -> None:
    pts = [CostPoint(100, 2.0, "a"), CostPoint(200, 3.0, "b"), CostPoint(300, 5.0, "c")]
    f = fit_costs(pts)
    # by hand: mean x 200, mean y 10/3, Sxx 20000, Sxy 300: b 0.015, a 1/3; residuals
    # 1/6, -1/3, 1/6: s^2 = 1/6; var(b) = s^2/Sxx, var(a) = s^2 (1/3 + 200^2/Sxx)
    assert f.us_per_byte == pytest.approx(0.015)
    assert f.us_per_packet == pytest.approx(1 / 3)
    assert f.var_byte == pytest.approx((1 / 6) / 20000)
    assert f.var_packet == pytest.approx((1 / 6) * (1 / 3 + 2))
    import numpy as np

    # numpy's least squares, covariance scaled by the residuals over n - 2 degrees of freedom
    (slope, icpt), cov = np.polyfit([100, 200, 300], [2.0, 3.0, 5.0], 1, cov=True)
    assert (f.us_per_byte, f.us_per_packet) == pytest.approx((slope, icpt))
    assert (f.var_byte, f.var_packet, f.cov) == pytest.approx((cov[0][0], cov[1][1], cov[0][1]))
    # the cost at a size and its standard error (from the covariance)
    se = f.us_se(250)
    assert se is not None and 0 < se < math.sqrt(f.var_packet or 0)


@pytest.mark.parametrize(
    "sizes, why",
    [([64], "one packet size measured (64 B)"), ([500, 600], "too close"), ([], "no measurement")],
)
def test_the_fit_refuses_what_cannot_separate_the_terms(sizes: list[int], why: str) -> None:
    with pytest.raises(FitError, match=why.replace("(", r"\(").replace(")", r"\)")):
        fit_costs([CostPoint(s, 10.0, "x") for s in sizes])


def test_points_of_rows_by_workload() -> None:
    udp = point_of({"size": 128, "ipsec_effort_us_per_kb": _effort(10.0, 128)})
    assert udp is not None and udp.size == 128 and udp.us == pytest.approx(10.0)
    # an IMIX row: a point at its delivered mean size (payload per packet + 28)
    imix = point_of({"mix": "simple IMIX", "sent_packets": 1200, "lost_packets": 0,
                     "payload_bytes": 1200 * (IMIX_MEAN - 28),
                     "ipsec_effort_us_per_kb": 20.0})  # fmt: skip
    assert imix is not None and imix.size == pytest.approx(IMIX_MEAN) and imix.mix
    assert imix.us == pytest.approx(20.0 * (IMIX_MEAN - 28) / 1024 / 2)
    # bulk TCP (GSO batches), latency (light load), soak, an application: not points
    for row in ({"data": "text"}, {"load_pct": 50, "size": 64}, {"held": True, "size": 64},
                {"file_bytes": 10, "size": 64}):  # fmt: skip
        assert point_of({"ipsec_effort_us_per_kb": 5.0, **row}) is None, row
    assert point_of({"size": 64}) is None  # no IPsec CPU metered
    assert point_of({"size": 64, "ipsec_effort_us_per_kb": 0}) is None


def test_a_two_size_campaign_plans_imix_from_both_terms(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    # a gateway: 10 µs per packet at 128 B, 20 at 1128: 0.01 µs per byte, 8.72 per packet
    cid = _campaign(lab, {128: 10.0, 1128: 20.0})
    doc = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz", "1000",
                          "--target-mbps", "1G", "--max-load", "1", "--mix", "imix",
                          "--json").stdout)  # fmt: skip
    # by hand: at IMIX's mean 340.33 B a packet costs 8.72 + 3.4033 = 12.1233 µs = 12,123
    # cycles at 1000 MHz; one core 340.33 x 8 / 12.1233 = 224.6 Mbit/s; 1 Gbit/s is
    # 367,290 packets/s x 12.1233 µs = 4.45 cores: 5
    assert doc["binding"].startswith("the model")
    assert doc["cycles_per_packet"] == pytest.approx(8720)
    assert doc["cycles_per_byte"] == pytest.approx(10.0)
    assert doc["per_core_mbps"] == pytest.approx(IMIX_MEAN * 8 / 12.12333, rel=1e-4)
    assert doc["cores"] == 5
    assert doc["fit"]["us_per_packet_se"] == pytest.approx(0, abs=1e-9)  # 4 points on a line
    # at a size it measured, the measurement itself is a source beside the model's
    at = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz", "1000",
                         "--size", "128", "--json").stdout)  # fmt: skip
    names = [s["name"] for s in at["sources"]]
    assert names[0] == "the gateways measured" and names[1].startswith("the model")
    assert at["sources"][0]["cycles_per_packet_at_mix"] == pytest.approx(10_000)


def test_one_size_gives_the_range_it_allows_and_tcp_alone_is_refused(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    cid = _campaign(lab, {128: 10.0}, tcp=True)
    doc = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz", "1000",
                          "--target-mbps", "1G", "--max-load", "1", "--mix", "imix",
                          "--json").stdout)  # fmt: skip
    # all per packet: 10 µs a packet, 272 Mbit/s a core, 4 cores; all per byte: 10 / 128 x
    # 340.33 = 26.6 µs, 102 Mbit/s, 10 cores. The two-size answer above (5) lies within.
    assert doc["cores_range"] == [4, 10] and doc["cores"] == 10
    assert doc["per_core_mbps"] == pytest.approx(IMIX_MEAN * 8 / (10 / 128 * IMIX_MEAN))
    assert "scenarios/sizing.toml" in doc["costs_are"]
    text = _cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz", "1000",
                "--target-mbps", "1G", "--max-load", "1", "--mix", "imix").stdout  # fmt: skip
    assert "needs 4-10 cores" in text.replace("\n", " ")
    # bulk TCP alone: no per-packet cost, so no mix
    only_tcp = tmp_path / "tcp"
    store = Store(only_tcp / "results.sqlite")
    tid = store.new_campaign("tcp", "t.toml", "", {})
    store.record(tid, RunKey("ours", "esp:aes128gcm16", "unshaped", "tcp", "c-s", 1), "done",
                 0.0, results=[("tcp", {"mbps": 900.0, "seconds": 8.0, "payload_bytes": 9e8,
                                        "ipsec_effort_us_per_kb": 3.0})])  # fmt: skip
    store.close()
    p = _cli("plan", "--campaign", str(tid), "--lab", str(only_tcp), "--mix", "imix", check=False)
    assert p.returncode == 2 and "bulk TCP only" in p.stderr and "sizing.toml" in p.stderr
    p = _cli("plan", "--campaign", str(tid), "--lab", str(only_tcp), "--size", "64", check=False)
    assert p.returncode == 2 and "GSO" in p.stderr


@pytest.mark.quiet  # fits the engine's times: a busy machine may leave none to fit
def test_campaign_and_engine_side_by_side_name_the_binding_one(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    cid = _campaign(lab, {128: 10.0, 1128: 20.0})
    p = _cli("plan", "--campaign", str(cid), "--lab", str(lab), "--bench", "aes128gcm16",
             "--budget-ms", "5", "--trials", "1", "--target-mbps", "1G",
             "--mix", "imix")  # fmt: skip
    first = p.stdout.splitlines()[0]
    assert "binding: the model (t_fix + per byte, fitted)" in first, first
    assert "the engine alone" in p.stdout and "sources side by side" in p.stdout
    assert "core(s)" not in p.stdout and "measurement(s)" not in p.stdout


def test_a_fit_below_zero_plans_without_a_crash_and_says_so(tmp_path: Path) -> None:
    """Noisy points whose per-byte term fits below 0 (taken as 0): the standard-error
    band's low end would cost nothing — it is left open, not divided by."""
    lab = tmp_path / "lab"
    store = Store(lab / "results.sqlite")
    cid = store.new_campaign("noisy", "n.toml", "", {})
    for rep, (size, us) in enumerate(((64, 0.01), (64, 10.0), (1400, 0.01)), 1):
        row = {"size": size, "mbps": 1.0, "payload_bytes": 1e5,
               "ipsec_effort_us_per_kb": _effort(us, size)}  # fmt: skip
        store.record(cid, RunKey("ours", "esp:aes128gcm16", "unshaped", "sizes", "c-s", rep),
                     "done", 0.0, results=[(f"sizes-{size}", row)])  # fmt: skip
    store.close()
    p = _cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz", "1000",
             "--size", "1500", "--target-mbps", "1G", "--json")  # fmt: skip
    doc = json.loads(p.stdout)
    assert doc["cores"] >= 1 and "below 0" in doc["sources"][0]["detail"]
    assert "extrapolated: 1500-1500 B asked, 64-1400 B measured" in doc["sources"][0]["detail"]


def test_imix_rows_alone_give_a_range_and_the_mix_they_measured(tmp_path: Path) -> None:
    """Two IMIX repetitions whose delivered means differ a little (loss) are one size: the
    mix itself is planned from them as measured, any other size as a range."""
    lab = tmp_path / "lab"
    store = Store(lab / "results.sqlite")
    cid = store.new_campaign("imix", "i.toml", "", {})
    for rep, lost in ((1, 0), (2, 12)):
        got = 1200 - lost
        row = {"mix": "simple IMIX 7:4:1 of 40/576/1500 B", "sent_packets": 1200,
               "lost_packets": lost, "payload_bytes": got * (IMIX_MEAN - 28 + rep),
               "ipsec_effort_us_per_kb": 30.0, "mbps": 10.0}  # fmt: skip
        store.record(cid, RunKey("ours", "esp:aes128gcm16", "unshaped", "imix", "c-s", rep),
                     "done", 0.0, results=[("imix", row)])  # fmt: skip
    store.close()
    at = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz",
                         "1000", "--mix", "imix", "--json").stdout)  # fmt: skip
    assert at["binding"] == "the gateways measured" and at["cores_range"] is None
    other = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz",
                            "1000", "--size", "1400", "--target-mbps", "1G",
                            "--json").stdout)  # fmt: skip
    lo, hi = other["cores_range"]
    assert other["binding"].endswith("a range)") and lo < hi
