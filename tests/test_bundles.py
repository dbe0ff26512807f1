"""SA bundles against independent implementations: study 1's "AH + ESP" (ESP aes128
inside AH sha1) and "IPComp + ESP aes128-sha1", peeled and built layer by layer with
scapy (AH, ESP), Python's hmac (AH over ESP, which scapy verifies but cannot build: it
appends stray bytes to an AH packet whose payload is ESP) and C zlib (IPComp), both ways;
a byte-for-byte known answer with a fixed IV; and packets through the wrong layers as
named drops."""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import warnings
import zlib
from pathlib import Path

import pytest

from ipsec_lab import DropError, IpcompAssociation, SecurityAssociation, SecurityBundle

scapy_ipsec = pytest.importorskip("scapy.layers.ipsec")
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.packet import Raw  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)

TEXT = (Path(__file__).resolve().parent / "fixtures" / "prose.txt").read_bytes()
OUT = ("192.0.2.1", "192.0.2.2")


def inner(n: int, text: bool = True) -> bytes:
    data = TEXT[:n] if text else os.urandom(n)
    return bytes(IP(src="10.1.0.1", dst="10.2.0.1") / UDP(sport=7, dport=9) / Raw(data))


class Keys:
    def __init__(self) -> None:
        self.enc, self.integ, self.ah = os.urandom(16), os.urandom(20), os.urandom(20)

    def esp(self, integ: str = "null") -> SecurityAssociation:
        return SecurityAssociation(
            0x1000, "aes128", integ, enc_key=self.enc,
            integ_key=self.integ if integ != "null" else None,
            tunnel_src=OUT[0], tunnel_dst=OUT[1],
        )  # fmt: skip

    def ah_sa(self) -> SecurityAssociation:
        return SecurityAssociation(
            0x2000, "null", "sha1", integ_key=self.ah, tunnel_src=OUT[0], tunnel_dst=OUT[1],
            protocol="ah",
        )  # fmt: skip

    def scapy_esp(self, integ: str = "null", tunnel: bool = True) -> object:
        return scapy_ipsec.SecurityAssociation(
            scapy_ipsec.ESP, spi=0x1000, crypt_algo="AES-CBC", crypt_key=self.enc,
            auth_algo="HMAC-SHA1-96" if integ == "sha1" else "NULL",
            auth_key=self.integ if integ == "sha1" else None,
            tunnel_header=IP(src=OUT[0], dst=OUT[1], id=1, ttl=64) if tunnel else None,
        )  # fmt: skip

    def scapy_ah(self) -> object:
        return scapy_ipsec.SecurityAssociation(
            scapy_ipsec.AH, spi=0x2000, auth_algo="HMAC-SHA1-96", auth_key=self.ah
        )


def _checksum(h: bytes) -> bytes:
    s = sum(struct.unpack(f"!{len(h) // 2}H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return struct.pack("!H", ~s & 0xFFFF)


def ah_over(esp_wire: bytes, key: bytes, seq: int, spi: int = 0x2000) -> bytes:
    """RFC 4302 by hand: AH (HMAC-SHA1-96, 24 bytes) inserted after the IPv4 header of an
    ESP tunnel packet, the ICV over the header with its mutable fields zeroed (§3.3.3.1),
    AH with a zero ICV, and the ESP packet."""
    ip, esp = bytearray(esp_wire[:20]), esp_wire[20:]
    ah = bytearray(struct.pack("!BBHII", 50, 24 // 4 - 2, 0, spi, seq) + bytes(12))
    ip[2:4] = (20 + 24 + len(esp)).to_bytes(2, "big")
    ip[9] = 51
    ip[10:12] = b"\0\0"
    ip[10:12] = _checksum(bytes(ip))
    zeroed = bytearray(ip)
    zeroed[1] = 0  # DSCP/ECN
    zeroed[6:9] = b"\0\0\0"  # flags, fragment offset, TTL
    zeroed[10:12] = b"\0\0"  # checksum
    ah[12:] = hmac.new(key, bytes(zeroed) + bytes(ah) + esp, hashlib.sha1).digest()[:12]
    return bytes(ip) + bytes(ah) + esp


@pytest.mark.parametrize("n", [0, 100, 1400])
def test_ah_plus_esp_peeled_by_scapy(n: int) -> None:
    k = Keys()
    wire = SecurityBundle(k.esp(), ah=k.ah_sa()).seal(inner(n))
    assert IP(wire).proto == 51 and wire[20] == 50  # outer IP | AH (next: ESP) | ESP
    esp_pkt = k.scapy_ah().decrypt(IP(wire))  # raises on a bad ICV
    assert bytes(k.scapy_esp().decrypt(IP(bytes(esp_pkt)))) == inner(n)


@pytest.mark.parametrize("n", [0, 100, 1400])
def test_ah_plus_esp_built_by_scapy_opens(n: int) -> None:
    k = Keys()
    esp_wire = bytes(k.scapy_esp().encrypt(IP(inner(n))))
    wire = ah_over(esp_wire, k.ah, seq=1)
    k.scapy_ah().decrypt(IP(wire))  # the hand-built AH is what scapy verifies too
    assert SecurityBundle(k.esp(), ah=k.ah_sa()).open(wire) == inner(n)


def test_ah_plus_esp_known_answer_with_a_fixed_iv() -> None:
    """Byte for byte: our bundle against scapy's ESP then AH by hand, same keys, IV and
    sequence numbers."""
    k = Keys()
    iv = bytes(range(16))
    pkt = inner(300)
    ours = SecurityBundle(k.esp(), ah=k.ah_sa()).seal(pkt, iv=iv, seq=5)
    esp_wire = bytes(k.scapy_esp().encrypt(IP(pkt), seq_num=5, iv=iv))
    assert ours == ah_over(esp_wire, k.ah, seq=1)


@pytest.mark.parametrize("text", [True, False])
def test_ipcomp_plus_esp_peeled_by_scapy_and_zlib(text: bool) -> None:
    k = Keys()
    pkt = inner(1400, text)
    ipca = IpcompAssociation(0x3000)
    wire = SecurityBundle(k.esp("sha1"), ipcomp=ipca).seal(pkt)
    # Peel ESP with scapy (as transport: the payload is IPComp, not an IP packet).
    esp = k.scapy_esp("sha1", tunnel=False).decrypt(IP(wire))
    payload = bytes(esp)[20:]
    if text:
        assert esp.proto == 108 and len(wire) < len(pkt)
        assert payload[:4] == bytes([4, 0, 0x30, 0x00])  # IPv4 inside, CPI 0x3000
        assert zlib.decompress(payload[4:], -15) == pkt
        assert ipca.counters()["compressed"] == 1
    else:
        assert esp.proto == 4 and payload == pkt  # incompressible: sent as it was
        assert ipca.counters()["incompressible"] == 1


@pytest.mark.parametrize("text", [True, False])
def test_ipcomp_plus_esp_built_by_scapy_and_zlib_opens(text: bool) -> None:
    k = Keys()
    pkt = inner(1400, text)
    c = zlib.compressobj(6, zlib.DEFLATED, -11)
    ipcomp = bytes([4, 0, 0x30, 0x00]) + c.compress(pkt) + c.flush()
    body = Raw(ipcomp) if text else Raw(pkt)
    outer = IP(src=OUT[0], dst=OUT[1], proto=108 if text else 4) / body
    wire = bytes(k.scapy_esp("sha1", tunnel=False).encrypt(outer))
    rx = IpcompAssociation(0x3000)
    assert SecurityBundle(k.esp("sha1"), ipcomp=rx).open(wire) == pkt
    assert rx.counters()["decompressed"] == (1 if text else 0)


def test_wrong_layers_are_named_drops() -> None:
    k = Keys()
    bundle = SecurityBundle(k.esp(), ah=k.ah_sa())
    # ESP without the AH layer the bundle requires.
    esp_only = bytes(k.scapy_esp().encrypt(IP(inner(100))))
    with pytest.raises(DropError) as e:
        bundle.open(esp_only)
    assert e.value.args[0] == "bundle_mismatch"
    # AH straight over the inner packet (tunnel), not over ESP.
    ah_tunnel = scapy_ipsec.SecurityAssociation(
        scapy_ipsec.AH, spi=0x2000, auth_algo="HMAC-SHA1-96", auth_key=k.ah,
        tunnel_header=IP(src=OUT[0], dst=OUT[1]),
    )  # fmt: skip
    with pytest.raises(DropError) as e:
        SecurityBundle(k.esp(), ah=k.ah_sa()).open(bytes(ah_tunnel.encrypt(IP(inner(100)))))
    assert e.value.args[0] == "bundle_mismatch"
    # ESP in AH in the wrong order (ESP outside AH).
    ah_inside = bytes(ah_tunnel.encrypt(IP(inner(100))))
    esp_outside = bytes(k.scapy_esp().encrypt(IP(ah_inside)))
    with pytest.raises(DropError) as e:
        SecurityBundle(k.esp(), ah=k.ah_sa()).open(esp_outside)
    assert e.value.args[0] == "bundle_mismatch"


def test_bundle_arguments_name_what_is_wrong() -> None:
    k = Keys()
    with pytest.raises(ValueError, match="not an AH SA"):
        SecurityBundle(k.esp(), ah=k.esp())
    transport = SecurityAssociation(0x1000, "aes128", enc_key=k.enc, mode="transport")
    with pytest.raises(ValueError, match="tunnel mode"):
        SecurityBundle(transport)


@pytest.mark.parametrize("n", [0, 100, 1000, 1400])
def test_the_model_lays_bundles_out_as_the_engine_sends_them(n: int) -> None:
    from ipsec_lab.model import packet_plan, parse_configuration, wire_size

    k = Keys()
    pkt = inner(n)
    ah_esp = SecurityBundle(k.esp(), ah=k.ah_sa()).seal(pkt)
    assert len(ah_esp) == wire_size(parse_configuration("ah:sha1+esp:aes128"), len(pkt))
    ipca = IpcompAssociation(0x3000)
    wire = SecurityBundle(k.esp("sha1"), ipcomp=ipca).seal(pkt)
    # The model is told how small DEFLATE made the payload; the layout is its own.
    compressed = IpcompAssociation(0x3000).compress(pkt, 4)
    plan = packet_plan(
        parse_configuration("ipcomp+esp:aes128-sha1"),
        len(pkt),
        compressed_len=lambda _n: None if compressed is None else len(compressed) - 4,
    )
    assert len(wire) == plan.wire
    assert plan.compressed == (compressed is not None)
