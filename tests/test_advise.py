"""The IPComp advisor against study 1's findings: at 10 Mbit/s compression beats the link
while CPU-bound, at 100 Mbit/s it slows everything; what compresses and what does not."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from ipsec_lab.model import ipcomp as ipc
from ipsec_lab.studies import ferrante2005 as F

TEXT = Path(__file__).resolve().parent / "fixtures" / "prose.txt"


def test_study1_at_10_mbit_ipcomp_beats_the_link_while_cpu_bound() -> None:
    """Costs from study 1's 100 Mbit/s figures predict its 10 Mbit/s finding: IPComp on
    compressible data is CPU-bound yet faster than the link allows without IPsec."""
    sample = ipc.published(1 - F.IPCOMP_COMPRESSIBLE_REDUCTION_10, F.PACKET_SIZE)
    a = ipc.advise(sample, F.ipcomp_costs("compressible"), 10.0)
    both, none, esp = a.case("ipcomp+esp"), a.case("none"), a.case("esp")
    assert both.limit == "cpu" and none.limit == "link" and esp.limit == "link"
    assert both.mbps > none.mbps > esp.mbps
    assert a.gain_pct > 0 and "pays" in a.verdict
    # Published: 11.67 Mbit/s measured, 17.44 "with enough CPU".
    assert both.mbps == pytest.approx(F.IPCOMP_COMPRESSIBLE_MBPS_10, rel=0.1)
    assert both.link_mbps == pytest.approx(F.IPCOMP_ENOUGH_CPU_MBPS_10, rel=0.1)


@pytest.mark.parametrize(
    "data, reduction, published",
    [
        ("compressible", F.IPCOMP_COMPRESSIBLE_REDUCTION_100, F.IPCOMP_COMPRESSIBLE_MBPS_100),
        ("incompressible", 0.0, F.IPCOMP_INCOMPRESSIBLE_MBPS_100),
    ],
)
def test_study1_at_100_mbit_ipcomp_slows_everything(
    data: str, reduction: float, published: float
) -> None:
    sample = ipc.published(1 - reduction, F.PACKET_SIZE)
    a = ipc.advise(sample, F.ipcomp_costs(data), 100.0)
    both, esp = a.case("ipcomp+esp"), a.case("esp")
    assert both.limit == "cpu" and esp.limit == "cpu"
    assert both.mbps < esp.mbps
    assert a.gain_pct < 0 and "does not pay" in a.verdict
    assert esp.mbps == pytest.approx(F.ENC_SHA1_MBPS_100, rel=0.01)
    assert both.mbps == pytest.approx(published, rel=0.1)


def test_real_text_compresses_and_random_bytes_do_not() -> None:
    text = ipc.measure(ipc.packetize(TEXT.read_bytes(), 1500))
    assert text.compressed >= text.packets - 1  # all but perhaps a short last packet
    assert text.ratio < 0.8
    rnd = ipc.measure(ipc.packetize(os.urandom(300_000), 1500))
    assert rnd.compressed == 0 and rnd.incompressible == rnd.packets
    assert rnd.ratio == 1.0
    # Each packet really compresses to what is counted (raw DEFLATE, RFC 2394).
    for p, out in zip(ipc.packetize(TEXT.read_bytes(), 1500), text.out):
        if out is not None:
            c = ipc.deflate_raw(p)
            assert len(c) == out and zlib.decompress(c, -15) == p


def test_small_packets_are_not_compressed_and_window_bits_matter() -> None:
    pkts = ipc.packetize(TEXT.read_bytes()[:4000], 80)
    r = ipc.measure(pkts, min_size=90)
    assert r.too_small == r.packets and r.compressed == 0 and r.compress_input == 0
    big = TEXT.read_bytes() * 3
    w9 = ipc.measure([big[:9000]], wbits=9).out[0]
    w15 = ipc.measure([big[:9000]], wbits=15).out[0]
    assert w9 is not None and w15 is not None and w15 < w9
    with pytest.raises(ValueError, match="window bits 16"):
        ipc.measure([big], wbits=16)


def test_packetize_makes_ip_packets_of_the_given_size() -> None:
    pkts = ipc.packetize(b"x" * 3000, 1500)
    assert [len(p) for p in pkts] == [1500, 1500, 120]
    assert all(int.from_bytes(p[2:4], "big") == len(p) for p in pkts)
