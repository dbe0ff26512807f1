"""TCP through an impaired link (netem on both gateways' outer ends: 1 % loss, 5 %
reordering, 1 % duplication, 2 ms delay), run INSIDE the micro-VM by tests/test_vm_root.py
(the host's kernel has no netem): through ours, the file arrives whole and ours counts the
duplicated packets as replay drops and drops nothing else (reordering stays inside the
window, RFC 4303 §3.4.3); through the kernel's xfrm, the file arrives whole too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours
from ipsec_lab.backends.xfrm import Xfrm
from ipsec_lab.testbed import Link, topology
from ipsec_lab.testbed.build import Testbed

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from interop import CLIENT, SERVER, counters  # noqa: E402

from netutil import transfer  # noqa: E402

IMPAIRED = Link("impaired", delay_ms=2, loss_pct=1, reorder_pct=5, duplicate_pct=1)


def data(tmp: Path) -> Path:
    p = tmp / "file.bin"
    p.write_bytes(b"".join(b"line %08d of the impaired transfer\n" % i for i in range(60_000)))
    return p


def test_ours_through_loss_reordering_and_duplication(tmp_path: Path) -> None:
    f = data(tmp_path)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.shape(IMPAIRED)
        gw = Ours()
        gw.start(tb, "esp:aes128gcm16")
        try:
            transfer(tb, CLIENT, SERVER, f)
            transfer(tb, SERVER, CLIENT, f)
            a, b = counters(gw.sockets["gwA"]), counters(gw.sockets["gwB"])
        finally:
            gw.stop(tb)
    replays = 0
    for st in (a, b):
        (inb,) = st["inbound"]["sas"]
        (out,) = st["outbound"]["sas"]
        assert out["drops"] == {} and out["packets"] > 1000
        assert set(inb["drops"]) <= {"replay"}, inb["drops"]  # nothing but duplicates
        replays += inb["drops"].get("replay", 0)
    assert replays > 0, "netem duplicated packets: ours must have refused them as replays"


@pytest.mark.parametrize("configuration", ["esp:aes128gcm16", "ah:sha256+esp:aes128"])
def test_the_kernels_ipsec_through_the_same_link(tmp_path: Path, configuration: str) -> None:
    f = data(tmp_path)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.shape(IMPAIRED)
        x = Xfrm()
        x.start(tb, configuration)
        try:
            transfer(tb, CLIENT, SERVER, f)
            st = tb.run("gwB", ["ip", "-s", "xfrm", "state"])
        finally:
            x.stop(tb)
    assert "replay-window 32" in st


def test_latency_percentiles_land_on_a_known_delay(tmp_path: Path) -> None:
    """netem delays the gateways' link 10 ms each way: every probe's RTT is at least
    20 ms and its one-way delay each way at least 10 ms, at no load and beside trafgen's
    background at half of a 10 Mbit/s PDR (the kernel here has netem; the host's not)."""
    from ipsec_lab.traffic import latency
    from ipsec_lab.traffic.workload import Workload

    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.shape(Link("delayed", delay_ms=10))
        w = Workload("latency", size=512, loads=(0.0, 50.0), seconds=2, probe_interval_ms=5)
        rows = latency.latency(tb, tb.topo.flows[0], w, lambda _, f: f(), 0,
                               pdr=lambda size: (10.0, "given"))  # fmt: skip
    assert [r["load_pct"] for r in rows] == [0.0, 50.0]
    for r in rows:
        assert r["probes_sent"] > 200 and r["probe_loss_pct"] < 5, r
        assert r["rtt_min_us"] >= 20_000, r
        assert r["one_way_up_min_us"] >= 10_000 and r["one_way_down_min_us"] >= 10_000, r
        # the median lands on the delay: emulation (TCG) adds milliseconds, not tens
        assert r["rtt_p50_us"] < 20_000 + 10_000, r
        # and the histogram gives it back within its 1 % buckets
        back = latency.histogram_percentile(r["histogram"], 50) / 1e3
        assert back == pytest.approx(r["rtt_p50_us"], rel=0.01)
    assert rows[1]["background_mbps"] == pytest.approx(5.0, rel=0.1)
    assert rows[1]["generator"] == "udp-gso"
