"""Many tunnels between the line testbed's gateways (testbed/tunnels.py): N tunnels are N
SAs each way, each with keys of its own, and a flow spread over them puts each datagram
into the tunnel of its destination. Needs root (CI runs as root)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours
from ipsec_lab.backends.sa_plan import SPI
from ipsec_lab.testbed import topology, tunnels
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.traffic.paced import UdpGso
from netutil import capture
from test_gateway_traffic_root import settle

pytestmark = pytest.mark.root

N = 16


def _esp_by_spi(pcap: Path, src: str) -> Counter[int]:
    from scapy.all import IP, rdpcap

    out: Counter[int] = Counter()
    for p in rdpcap(str(pcap)):
        if IP in p and p[IP].src == src and p[IP].proto == 50:
            out[int.from_bytes(bytes(p[IP].payload)[0:4], "big")] += 1
    return out


def test_n_tunnels_are_n_sas_each_carrying_its_share_of_a_spread_flow(tmp_path: Path) -> None:
    """16 tunnels through ours; 12,500 datagrams of 200 B spread over their 16
    destinations (below udp-gso's GSO rate: a datagram a message, each to the next
    destination). The wire shows 16 SPIs from gwA, each carrying 1/16 of the datagrams;
    gwB opened each on its own inbound SA; the sink counted every one."""
    with Testbed(topology("line"), tmp_path / "run") as tb:
        gw = Ours(tunnels=N)
        gw.start(tb, "esp:aes128gcm16")
        try:
            tunnels.route_far(tb, N)
            flow = dataclasses.replace(tb.topo.flows[0], destinations=N)
            gen = UdpGso(tb, flow, 1, "the test's")
            try:
                with capture(tb, "gwA", "wan", "wan") as pcap:
                    row = gen.trial(200, 20, 1.0)
            finally:
                gen.close()
            st = settle(gw, "gwB")
            text = gw.configs["gwA"].read_text()
        finally:
            gw.stop(tb)
    sent = int(row["sent_packets"])
    assert sent == 12_500 and row["lost_packets"] == 0, row
    spis = _esp_by_spi(pcap, "192.0.2.1")
    assert set(spis) == {SPI[("esp", "lr")] + (j << 16) for j in range(N)}, spis
    assert sum(spis.values()) == sent
    assert max(spis.values()) - min(spis.values()) <= 1, spis  # in turn: 781 or 782 each
    opened = {s["name"]: s["packets"] for s in st["inbound"]["sas"]}
    assert set(opened) == {"in"} | {f"in-{j}" for j in range(1, N)}, opened
    assert sum(opened.values()) == sent and min(opened.values()) > 0, opened
    # every SA its own key: 2 x 16 distinct keys in gwA's config
    keys = [ln for ln in text.splitlines() if ln.startswith("enc_key")]
    assert len(keys) == 2 * N and len(set(keys)) == 2 * N
