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
from ipsec_lab.traffic import Row
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


def _spread(tb: Testbed, rate_mbit: float = 20, seconds: float = 1.0) -> tuple[Row, Path]:
    """Datagrams of 200 B at `rate_mbit` for `seconds` (12,500 by default) spread over N
    tunnels' destinations (a datagram a message, each to the next), captured on gwA's
    wan: (udp-gso's row, pcap)."""
    flow = dataclasses.replace(tb.topo.flows[0], destinations=N)
    gen = UdpGso(tb, flow, 1, "the test's")
    try:
        with capture(tb, "gwA", "wan", "wan") as pcap:
            row = gen.trial(200, rate_mbit, seconds)
    finally:
        gen.close()
    return row, pcap


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
            row, pcap = _spread(tb)
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


def _wireguard_data_by_port(pcap: Path, src: str) -> Counter[int]:
    """WireGuard transport-data messages (type 4) from `src`, by UDP destination port."""
    from scapy.all import IP, UDP, rdpcap

    out: Counter[int] = Counter()
    for p in rdpcap(str(pcap)):
        if IP in p and UDP in p and p[IP].src == src and bytes(p[UDP].payload)[:1] == b"\x04":
            out[int(p[UDP].dport)] += 1
    return out


@pytest.mark.parametrize("backend", ["wireguard-go", "boringtun"])
def test_n_wireguard_tunnels_are_a_hub_with_a_peer_per_site(tmp_path: Path, backend: str) -> None:
    """16 tunnels through a user-space WireGuard: gwA's one device has 16 peers, gwB plays
    the 16 sites, a device each. A flow spread over the 16 destinations (6,250 datagrams
    at 5 Mbit/s: 3,125 a second, well below wireguard-go's rate here — at 12,500 a second
    it lost some, about its 1420-B NDR in packets, and the capture missed a few) leaves gwA as
    WireGuard data to each site's port in equal shares (cryptokey routing picked the
    peer), every site's device received, the sink counted every datagram; after stop no
    device, rule or table of the run's is left on either gateway."""
    from ipsec_lab.backends.userspace_wireguard import Boringtun, WireguardGo

    wg = (WireguardGo if backend == "wireguard-go" else Boringtun)(tunnels=N)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        wg.start(tb, "wireguard")
        try:
            tunnels.route_far(tb, N)
            hub = wg._ends[0]
            sites = wg._ends[1:]
            assert [e.node for e in wg._ends] == ["gwA"] + ["gwB"] * N
            peers = tb.run("gwA", ["wg", "show", hub.dev, "allowed-ips"]).split("\n")
            allowed = {ln.split()[1] for ln in peers if ln.strip()}
            assert allowed == {"10.2.0.0/24"} | {f"10.128.0.{i}/32" for i in range(N - 1)}
            row, pcap = _spread(tb, 5, 2.0)
            rx = {}
            for e in sites:
                got = tb.run("gwB", ["wg", "show", e.dev, "transfer"]).split()
                rx[e.dev] = int(got[1])
            devs = [e.dev for e in wg._ends]
        finally:
            wg.stop(tb)
        left = {n: tb.run(n, ["ip", "-o", "link", "show"]) + tb.run(n, ["ip", "rule", "show"])
                for n in ("gwA", "gwB")}  # fmt: skip
        tables = tb.run("gwA", ["ip", "route", "show", "table", "all"])
    sent = int(row["sent_packets"])
    assert sent == 6_250 and row["lost_packets"] == 0, row
    ports = _wireguard_data_by_port(pcap, "192.0.2.1")
    assert set(ports) == {e.port for e in sites}, ports
    assert sum(ports.values()) == sent
    assert max(ports.values()) - min(ports.values()) <= 1, ports  # in turn: 390 or 391 each
    assert all(n > 0 for n in rx.values()), rx
    for node, text in left.items():
        assert not [d for d in devs if d in text], (node, text)
        assert "lookup 23" not in text and "0x4c4157" not in text, (node, text)
    assert "table 230" not in tables, tables
