"""IPComp (RFC 3173, DEFLATE per RFC 2394) against an independent DEFLATE: Python's zlib
(C zlib) with negative wbits, both directions, at window bits 11 and 15; incompressible
data goes out as it was, small payloads are skipped, bad data and a decompression bomb
are named, counted drops."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipsec_lab import DropError, IpcompAssociation

TEXT = (Path(__file__).resolve().parent / "fixtures" / "prose.txt").read_bytes()


def raw_deflate(data: bytes, wbits: int, level: int = 6) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, -wbits)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("wbits", [11, 15])
@settings(max_examples=60, deadline=None)
@given(start=st.integers(0, len(TEXT) - 2000), size=st.integers(90, 1900))
def test_zlib_inflates_what_we_compress(wbits: int, start: int, size: int) -> None:
    payload = TEXT[start : start + size]
    ipca = IpcompAssociation(0x1234, window_bits=wbits)
    out = ipca.compress(payload, 4)
    if out is None:
        # Sent as it was: C zlib would not shrink it much either, header included.
        # (zlib-rs matches like zlib-ng, not C zlib: sizes differ by up to ~16 bytes.)
        assert len(raw_deflate(payload, wbits)) + 4 >= len(payload) - 16
        return
    # RFC 3173 §2.2: next header, flags 0, CPI; then raw DEFLATE (no zlib header).
    assert out[0] == 4 and out[1] == 0 and int.from_bytes(out[2:4], "big") == 0x1234
    assert zlib.decompress(out[4:], -wbits) == payload
    assert len(out) < len(payload)


@pytest.mark.parametrize("wbits", [8, 9, 11, 15])
def test_we_inflate_what_zlib_compresses(wbits: int) -> None:
    ipca = IpcompAssociation(0x1234)
    for size in (100, 1400, 9000, 60000):
        payload = (TEXT * 30)[:size]
        data = bytes([41, 0, 0x12, 0x34]) + raw_deflate(payload, max(wbits, 9))
        got, nh = ipca.decompress(data)
        assert got == payload and nh == 41
    assert ipca.counters()["decompressed"] == 4


def test_incompressible_goes_out_as_it_was_and_small_is_skipped() -> None:
    ipca = IpcompAssociation(0x1234)
    assert ipca.compress(os.urandom(1400), 4) is None
    assert ipca.compress(TEXT[:80], 4) is None  # under the 90-byte minimum
    assert ipca.compress(TEXT[:1400], 4) is not None
    c = ipca.counters()
    assert (c["incompressible"], c["too_small"], c["compressed"]) == (1, 1, 1)
    assert c["bytes_in"] == 1400 + 80 + 1400
    assert c["bytes_out"] < c["bytes_in"]
    # A payload that compresses to exactly its own size (header included) is not sent
    # compressed either: the header must be paid for.
    small = IpcompAssociation(0x1234, min_size=0)
    assert small.compress(b"\x00" * 6, 4) is None


def test_decompression_bomb_and_bad_data_are_counted_drops() -> None:
    ipca = IpcompAssociation(0x1234)
    bomb = bytes([4, 0, 0x12, 0x34]) + raw_deflate(b"\x00" * 200_000, 15)
    assert len(bomb) < 1000
    with pytest.raises(DropError) as e:
        ipca.decompress(bomb)
    assert e.value.args[0] == "decompressed_too_big"
    with pytest.raises(DropError) as e:
        ipca.decompress(bytes([4, 0, 0x12, 0x34]) + b"\xff\xfe garbage")
    assert e.value.args[0] == "bad_compressed_data"
    with pytest.raises(DropError) as e:
        ipca.decompress(bytes([4, 0, 0x99, 0x99]) + raw_deflate(TEXT[:500], 11))
    assert e.value.args[0] == "unknown_spi"
    with pytest.raises(DropError) as e:
        ipca.decompress(b"\x04\x00")
    assert e.value.args[0] == "truncated"
    with pytest.raises(DropError) as e:
        ipca.decompress(bytes([108, 0, 0x12, 0x34]) + raw_deflate(TEXT[:500], 11))
    assert e.value.args[0] == "bad_next_header"  # IPComp inside IPComp (RFC 3173 §3.5)
    assert ipca.counters()["drops"] == {
        "decompressed_too_big": 1,
        "bad_compressed_data": 1,
        "unknown_spi": 1,
        "truncated": 1,
        "bad_next_header": 1,
    }


def test_transport_packets_round_trip_and_match_zlib() -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.packet import Raw

    pkt = bytes(IP(src="10.1.0.1", dst="10.2.0.1") / UDP(sport=1, dport=2) / Raw(TEXT[:1200]))
    tx, rx = IpcompAssociation(0x1234), IpcompAssociation(0x1234)
    wire = tx.seal(pkt)
    ip = IP(wire)
    assert ip.proto == 108 and ip.len == len(wire) < len(pkt)
    assert zlib.decompress(wire[24:], -11) == pkt[20:]  # what follows IPv4 + IPComp
    assert rx.open(wire) == pkt
    # Incompressible: the packet goes out unchanged.
    noise = bytes(IP(src="10.1.0.1", dst="10.2.0.1") / UDP() / Raw(os.urandom(1000)))
    assert tx.seal(noise) == noise


def test_ipcomp_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="CPI 100 is reserved"):
        IpcompAssociation(100)
    with pytest.raises(ValueError, match="window of 16 bits"):
        IpcompAssociation(0x1234, window_bits=16)
    with pytest.raises(ValueError, match="level 0"):
        IpcompAssociation(0x1234, level=0)
    assert IpcompAssociation(2).cpi == 2  # DEFLATE's well-known CPI
