"""The kernel's IPsec's N tunnels, run INSIDE the micro-VM by tests/test_vm_root.py (the
host's kernel has no ESP; kernel-libipsec cannot carry the lab's N tunnels,
strongswan.LIBIPSEC_NO_TUNNELS): strongSwan's, N CHILD_SAs under one IKE_SA and an
IKE_SA each, set up at once and timed (issue 44's IKE set-up rate), and xfrm's keyed by
hand, raw and in UDP; a flow spread over them puts each datagram into its own tunnel's
SA."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipsec_lab.backends.sa_plan import SPI
from ipsec_lab.backends.strongswan import StrongSwan
from ipsec_lab.backends.xfrm import Xfrm
from ipsec_lab.testbed import topology, tunnels
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.traffic.paced import UdpGso

sys.path.insert(0, str(Path(__file__).parents[1]))
from netutil import capture, ip_packets


def _spread(tb: Testbed, n: int, name: str) -> tuple[dict[str, object], Path]:
    """4 datagrams of 200 B a tunnel, spread over the N destinations in 1 s, captured on
    gwA's outer link: the sender's row and the capture."""
    tunnels.route_far(tb, n)
    flow = dataclasses.replace(tb.topo.flows[0], destinations=n)
    gen = UdpGso(tb, flow, 1, "the test's")
    try:
        with capture(tb, "gwA", "wan", f"wan-{name}-{n}") as pcap:
            row = gen.trial(200, 200 * 8 * 4 * n / 1e6, 1.0)
    finally:
        gen.close()
    return row, pcap


@pytest.fixture(scope="module")
def line(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """One `line` testbed for every case (under TCG a build costs seconds): each backend
    is stopped after its case (charon's SIGTERM, xfrm's flush); FAR's routes stay, as
    they do for a campaign's backends one after another."""
    with Testbed(topology("line"), tmp_path_factory.mktemp("line")) as tb:
        yield tb


# CI's budget: the 256 under one IKE_SA; the rest at 16 (a DH exchange per
# tunnel, both ends at once, is the costly case under TCG)
@pytest.mark.parametrize(("ike_sas", "n"), [("one", 256), ("per-tunnel", 16)])
def test_strongswan_kernel_sets_up_n_tunnels_each_carrying_its_share(
    line: Testbed, ike_sas: str, n: int
) -> None:
    """charon on gwA and gwB, N tunnels (`ike_sas`) set up at once: every CHILD_SA
    established on both, the set-up's figures consistent; 4 datagrams a tunnel spread
    over the N destinations leave gwA under N SPIs, each its share, none lost; gwB holds
    one IKE_SA or N."""
    tb = line
    gw = StrongSwan("kernel", tunnels=n, ike_sas=ike_sas)
    gw.start(tb, "esp:aes128gcm16")
    try:
        fig = gw.set_up_figures()
        row, pcap = _spread(tb, n, ike_sas)
        listed = gw._swanctl(tb, "gwB", "--list-sas", "--raw")
    finally:
        gw.stop(tb)
    assert fig["ike_sas"] == ike_sas, fig
    assert fig["tunnels_per_s"] == pytest.approx(n / float(fig["ike_setup_s"])), fig
    assert listed.count("state=INSTALLED") == n, listed[-2000:]
    assert listed.count("state=ESTABLISHED") == (1 if ike_sas == "one" else n), listed[-2000:]
    sent = int(str(row["sent_packets"]))
    assert sent == 4 * n and row["lost_packets"] == 0, row
    spis = Counter(p[:4] for src, _, proto, p in ip_packets(pcap)
                   if src == "192.0.2.1" and proto == 50)  # fmt: skip
    assert len(spis) == n and sum(spis.values()) == sent, spis
    assert max(spis.values()) - min(spis.values()) <= 1, spis  # in turn: 4 each


@pytest.mark.parametrize(("udp", "n"), [(False, 16), (True, 16)])
def test_xfrm_keys_n_tunnels_each_carrying_its_share(line: Testbed, udp: bool, n: int) -> None:
    """xfrm keyed by hand with N tunnels (raw ESP, ESP in UDP): the datagrams leave gwA
    under exactly the SPIs SPI + (j << 16), 4 each, none lost."""
    gw = Xfrm(udp_encap=udp, tunnels=n)
    gw.start(line, "esp:aes128gcm16")
    try:
        row, pcap = _spread(line, n, f"xfrm-{udp}")
    finally:
        gw.stop(line)
    sent = int(str(row["sent_packets"]))
    assert sent == 4 * n and row["lost_packets"] == 0, row
    at = 8 if udp else 0  # after the UDP header (RFC 3948 §2.2: no marker before ESP)
    spis = Counter(int.from_bytes(p[at : at + 4], "big") for src, _, proto, p in ip_packets(pcap)
                   if src == "192.0.2.1" and proto == (17 if udp else 50))  # fmt: skip
    assert set(spis) == {SPI[("esp", "lr")] + (j << 16) for j in range(n)}, spis
    assert set(spis.values()) == {4}, spis
