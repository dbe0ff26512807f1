"""Rekey under load, for real (issue 44 item 4): ipsec-gw's SAs rolled over to fresh SPIs
and keys while udp-gso streams through the line testbed, the wire captured between the
gateways. Needs root (CI runs as root); each test leaves no namespace behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipsec_lab.backends import ours_rekey
from ipsec_lab.backends.ours import Ours, stats
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.placement import choose
from ipsec_lab.traffic import Meters, rekey
from ipsec_lab.traffic.workload import Workload
from netutil import capture, ip_packets

pytestmark = pytest.mark.root

GW_A, GW_B = "192.0.2.1", "192.0.2.2"  # the line testbed's gateways' outer addresses
ESP, UDP, NAT_T = 50, 17, 4500


def _plain(label: str, fn: Any) -> dict[str, Any]:
    return fn()  # type: ignore[no-any-return]


def _rekeyed(tmp_path: Path, udp: bool) -> tuple[dict[str, Any], Path, dict[str, Any]]:
    """(the rekey row, the capture of gwA's outer link, gwB's counters at the end): 20
    Mbit/s of 1024-B packets for 4.5 s, a rekey every 1.5 s (after a 4.5-s control stream)."""
    with Testbed(topology("line"), tmp_path / "run", placement=choose("auto")) as tb:
        gw = Ours(udp_encap=udp)
        gw.start(tb, "esp:aes128gcm16")
        try:
            w = Workload("rekey", size=1024, rate_mbit=20.0, load_pct=None, minutes=0.075,
                         rekey_s=1.5, generator="udp-gso")  # fmt: skip
            with capture(tb, "gwA", "wan", "wan") as pcap:
                (row,) = rekey.rekey(tb, tb.topo.flows[0], w, Meters(_plain, None), 0,
                                     lambda dry: gw.rekey(tb, dry))  # fmt: skip
            b = stats(gw.sockets["gwB"])
        finally:
            gw.stop(tb)
    return row, pcap, b


def _esp_seen(pcap: Path, udp: bool) -> list[tuple[int, int]]:
    """(SPI, sequence number) of every packet gwA sent gwB, in wire order; asserting
    that everything on the link is ESP between the two gateways (nothing in clear)."""
    out = []
    for src, dst, proto, payload in ip_packets(pcap):
        assert {src, dst} == {GW_A, GW_B}, f"a packet {src} -> {dst} on the outer link"
        if udp:
            assert proto == UDP and int.from_bytes(payload[2:4], "big") == NAT_T, proto
            payload = payload[8:]
        else:
            assert proto == ESP, f"protocol {proto} between the gateways: not ESP"
        if src == GW_A:
            out.append((int.from_bytes(payload[0:4], "big"), int.from_bytes(payload[4:8], "big")))
    return out


@pytest.mark.parametrize("udp", [False, True], ids=["ours", "ours-udp"])
def test_a_rekey_under_load_loses_nothing_and_each_sa_has_its_own_spi(
    tmp_path: Path, udp: bool
) -> None:
    """Made before it breaks, three rekeys lose no packet (the stream's exact count:
    blocked time 0 at the row's resolution) and gwB dropped nothing, for no reason, in
    any SA — those the rekeys took away included. On the wire: only ESP between
    the gateways; gwA's traffic under four SPIs — the first SA's, then each rekey's new
    one, as the row names them — each in one unbroken run (no going back to an old SA),
    its sequence numbers 1, 2, 3, … with none repeated (one SA's, from its own start)."""
    row, pcap, b = _rekeyed(tmp_path, udp)
    assert row["rekeys"] == 3 and len(row["series"]) == 3, row
    assert row["control_lost_packets"] == 0, row
    assert row["lost_packets"] == 0 and row["blocked_ms_per_rekey"] == 0, row
    assert row["received_packets"] > 0.9 * 20e6 / 8 / 1024 * 4.5, row
    assert row["blocked_resolution_ms"] == pytest.approx(1e3 / row["offered_pps"])
    inbound = b["inbound"]
    assert inbound["drops"] == {} and inbound["removed_sas"]["drops"] == {}, inbound
    assert all(sa["drops"] == {} for sa in inbound["sas"]), inbound["sas"]
    assert inbound["removed_sas"]["sas"] == 3 and inbound["removed_sas"]["packets"] > 0
    seen = _esp_seen(pcap, udp)
    runs: list[int] = []
    for spi, _ in seen:
        if not runs or runs[-1] != spi:
            runs.append(spi)
    assert len(runs) == len(set(runs)) == 4, [hex(s) for s in runs]  # no SPI comes back
    assert runs[0] == 0x1001  # the lab's first SA, gwA to gwB
    for spi, x in zip(runs[1:], row["series"], strict=True):
        assert f"0x{spi:08x}" in x["spis"], (hex(spi), x)
    for spi in runs:
        numbers = [n for s, n in seen if s == spi]
        assert numbers == list(range(1, len(numbers) + 1)), f"SPI 0x{spi:08x}: {numbers[:20]}"


def test_a_rekey_that_breaks_before_it_makes_is_seen_losing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the senders switched before the receivers have the new SA (step 2
    before step 1) — gwB drops gwA's packets for an unknown SPI until its reload lands,
    and the row counts them as lost, each rekey blocking for a measurable time."""
    monkeypatch.setattr(ours_rekey.Rollover, "order", (2, 1, 3))
    row, _, b = _rekeyed(tmp_path, False)
    assert row["rekeys"] == 3
    assert row["lost_packets"] > 0 and row["blocked_ms_per_rekey"] > 1, row
    assert row["blocked_ms_per_rekey_excess"] > 1, row
    assert b["inbound"]["drops"].get("unknown_spi", 0) > 0, b["inbound"]["drops"]
    assert row["control_lost_packets"] == 0, row
