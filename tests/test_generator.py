"""The trafgen generator's packets, as trafgen itself writes them (into a pcap file) and
scapy reads them: sizes, mix order, addresses, ports, IP IDs and checksums."""

from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import pytest
from scapy.all import IP, UDP, Ether, rdpcap  # type: ignore[attr-defined]

from ipsec_lab.testbed.build import LabError
from ipsec_lab.traffic.paced import SINK_PORT, SOURCE_PORT, packets

DMAC, SMAC = "02:00:00:00:00:02", "02:00:00:00:00:01"


def _written(tmp_path: Path, conf: str, count: int) -> list[Ether]:
    assert shutil.which("trafgen"), "trafgen (Debian netsniff-ng) is not installed: make deps"
    cfg, pcap = tmp_path / "t.cfg", tmp_path / "t.pcap"
    cfg.write_text(conf)
    p = subprocess.run(["trafgen", "--conf", str(cfg), "--out", str(pcap), "--num", str(count),
                        "--cpus", "1", "--no-sock-mem", "--notouch-irq"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr + p.stdout
    return list(rdpcap(str(pcap)))


def test_a_mix_is_sent_in_its_proportions_with_valid_headers(tmp_path: Path) -> None:
    mix = ((40, 7), (576, 4), (1500, 1))
    frames = _written(tmp_path, packets(mix, DMAC, SMAC, "10.1.0.2", "10.2.0.2", flows=3), 36)
    assert len(frames) == 36
    sizes = [len(f[IP]) for f in frames]
    assert collections.Counter(sizes) == {40: 21, 576: 12, 1500: 3}
    # interleaved within each round of 12, not 7 small ones in a row then the rest
    assert sizes[:3] == [40, 576, 1500]
    for f in frames:
        assert f[Ether].dst == DMAC and f[Ether].src == SMAC
        ip, udp = f[IP], f[UDP]
        assert (ip.src, ip.dst, ip.ttl, ip.flags) == ("10.1.0.2", "10.2.0.2", 64, 0)
        assert udp.dport == SINK_PORT and SOURCE_PORT <= udp.sport < SOURCE_PORT + 3
        assert udp.len == len(ip) - 20
        # the checksums trafgen wrote are the ones scapy computes
        again = IP(bytes(ip))
        del again.chksum, again[UDP].chksum
        again = IP(bytes(again))
        assert (ip.chksum, udp.chksum) == (again.chksum, again[UDP].chksum)
    # each size's packets step through the flows' source ports; the largest (the ones a
    # tunnel with a smaller MTU fragments) each have an IP ID of their own
    small = [f for f in frames if len(f[IP]) == 40]
    assert {f[UDP].sport for f in small} == {SOURCE_PORT, SOURCE_PORT + 1, SOURCE_PORT + 2}
    assert [f[IP].id for f in frames if len(f[IP]) == 1500] == [1, 2, 3]


def test_one_size_one_flow(tmp_path: Path) -> None:
    frames = _written(tmp_path, packets(((64, 1),), DMAC, SMAC, "10.1.0.2", "10.2.0.2"), 5)
    assert [len(f[IP]) for f in frames] == [64] * 5
    assert {f[UDP].sport for f in frames} == {SOURCE_PORT}
    assert [f[IP].id for f in frames] == [1, 2, 3, 4, 5]
    assert len(frames[0]) == 64 + 14  # the Ethernet header, no padding


def test_a_packet_shorter_than_its_headers_is_refused() -> None:
    with pytest.raises(LabError, match="shorter than its headers"):
        packets(((27, 1),), DMAC, SMAC, "10.1.0.2", "10.2.0.2")


def test_the_sink_counts_packets_a_gateway_coalesced_into_one_buffer() -> None:
    """ours writes a flow's datagrams into its TUN device as one UDP GSO buffer (one IP
    and UDP header for them all): the sink's counter sees one buffer. 10 packets of 64 B
    as 3 buffers of 4 + 4 + 2 carry 3 headers and 10 payloads of 36 bytes."""
    from ipsec_lab.traffic.paced import delivered

    buffers, ip_bytes = 3, 3 * 28 + 10 * 36
    assert delivered(buffers, ip_bytes, ((64, 1),)) == (10, 10 * 64)
    # nothing coalesced: one buffer a packet, exact for a mix too
    mix = ((40, 7), (576, 4), (1500, 1))
    assert delivered(12, 7 * 40 + 4 * 576 + 1500, mix) == (12, 7 * 40 + 4 * 576 + 1500)
    # packets without payload cannot be coalesced: a buffer is a packet
    assert delivered(5, 5 * 28, ((28, 1),)) == (5, 140)
