"""The model's wire sizes against two real implementations: our engine's ESP output,
and scapy's AH, legacy ESP, UDP encapsulation and AH+ESP bundles."""

from __future__ import annotations

import warnings

import pytest

from ipsec_lab import SecurityAssociation
from ipsec_lab.algorithms import AH_INTEGRITY, CIPHERS, INTEGRITIES
from ipsec_lab.model import Layout, packet_plan, parse_configuration, wire_size

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=".*TripleDES.*")

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.ipsec import AH, ESP  # noqa: E402
from scapy.layers.ipsec import SecurityAssociation as ScapySA  # noqa: E402
from scapy.packet import Packet, Raw  # noqa: E402

from scapyutil import (  # noqa: E402
    COMBINED,
    LEGACY,
    SCAPY_AUTH,
    SCAPY_CRYPT,
    enc_key_len,
    integ_key_len,
)

SIZES = [48, 63, 64, 65, 100, 127, 128, 129, 511, 512, 1400, 1420, 1500]


def _suites() -> list[tuple[str, str]]:
    out = []
    for e in CIPHERS:
        for i in INTEGRITIES:
            if (e in COMBINED and i != "null") or (e == "null" and i == "null"):
                continue
            if i in ("aes128gmac", "aes256gmac"):
                continue  # AES-GMAC as integrity is AH's only (RFC 4543 §5.3)
            out.append((e, i))
    return out


def _inner(size: int, version: int = 4) -> bytes:
    head: Packet = (
        IP(src="10.1.0.2", dst="10.2.0.2")
        if version == 4
        else IPv6(src="fd00:1::2", dst="fd00:2::2")
    )
    pkt = head / UDP(sport=1000, dport=2000)
    pad = size - len(bytes(pkt))
    return bytes(pkt / Raw(b"\x5a" * pad))


LAYOUTS = [
    ("tunnel", 4, 4, "192.0.2.1", "192.0.2.2"),
    ("tunnel", 6, 4, "2001:db8::1", "2001:db8::2"),
    ("transport", 4, 4, None, None),
    ("transport", 4, 6, None, None),
]


@pytest.mark.parametrize("enc, integ", _suites())
@pytest.mark.parametrize("mode, outer, inner, src, dst", LAYOUTS)
def test_esp_wire_size_is_what_the_engine_sends(
    enc: str, integ: str, mode: str, outer: int, inner: int, src: str | None, dst: str | None
) -> None:
    sa = SecurityAssociation(
        0x1000,
        enc,
        integ,
        enc_key=bytes(range(enc_key_len(enc))) or None,  # distinct bytes: 3DES refuses K1 = K2
        integ_key="22" * integ_key_len(integ) or None,
        mode=mode,
        tunnel_src=src,
        tunnel_dst=dst,
        legacy=bool(LEGACY & {enc, integ}),
    )
    cfg = parse_configuration(f"esp:{enc}" + ("" if integ == "null" else f"-{integ}"))
    lay = Layout(mode, outer, inner)
    for size in SIZES:
        if inner == 6 and size < 48:
            continue
        sealed = sa.seal(_inner(size, inner))
        assert len(sealed) == wire_size(cfg, size, lay), (enc, integ, mode, size)


def _scapy_len(sa: ScapySA, size: int, inner: int = 4) -> int:
    pkt = IP(_inner(size)) if inner == 4 else IPv6(_inner(size, 6))
    return len(bytes(sa.encrypt(pkt)))


# AH's integrity algorithms scapy has: (its name, key bytes)
AH_SCAPY = {i: (SCAPY_AUTH[i], integ_key_len(i)) for i in AH_INTEGRITY if i in SCAPY_AUTH}


def _outer(version: int) -> Packet:
    if version == 4:
        return IP(src="192.0.2.1", dst="192.0.2.2")
    return IPv6(src="2001:db8::1", dst="2001:db8::2")


@pytest.mark.parametrize("integ", sorted(AH_SCAPY))
@pytest.mark.parametrize(
    "mode, version", [("tunnel", 4), ("tunnel", 6), ("transport", 4), ("transport", 6)]
)
def test_ah_wire_size_matches_scapy(integ: str, mode: str, version: int) -> None:
    """AH header + ICV padded to 32 bits (IPv4) or 64 bits (IPv6), RFC 4302 §2.2."""
    name, klen = AH_SCAPY[integ]
    kw = {"tunnel_header": _outer(version)} if mode == "tunnel" else {}
    sa = ScapySA(AH, spi=0x1000, auth_algo=name, auth_key=b"k" * klen, **kw)
    lay = Layout(mode, version, version if mode == "transport" else 4)
    cfg = parse_configuration(f"ah:{integ}")
    for size in SIZES:
        inner = version if mode == "transport" else 4
        assert _scapy_len(sa, size, inner) == wire_size(cfg, size, lay), (integ, mode, size)


@pytest.mark.parametrize("enc, klen", [("3des", enc_key_len("3des")), ("des", enc_key_len("des"))])
@pytest.mark.parametrize("integ", ["md5", "sha1"])
def test_legacy_esp_wire_size_matches_scapy(enc: str, klen: int, integ: str) -> None:
    name, ilen = AH_SCAPY[integ]
    sa = ScapySA(
        ESP,
        spi=0x1000,
        crypt_algo=SCAPY_CRYPT[enc],
        crypt_key=b"k" * klen,
        auth_algo=name,
        auth_key=b"a" * ilen,
        tunnel_header=_outer(4),
    )
    cfg = parse_configuration(f"esp:{enc}-{integ}")
    for size in SIZES:
        assert _scapy_len(sa, size) == wire_size(cfg, size), (enc, integ, size)


def test_udp_encapsulation_matches_scapy() -> None:
    sa = ScapySA(
        ESP,
        spi=0x1000,
        crypt_algo="AES-GCM",
        crypt_key=b"k" * 20,
        tunnel_header=_outer(4),
        nat_t_header=UDP(sport=4500, dport=4500),
    )
    cfg = parse_configuration("esp:aes128gcm16")
    lay = Layout(udp_encap=True)
    for size in SIZES:
        assert _scapy_len(sa, size) == wire_size(cfg, size, lay) == wire_size(cfg, size) + 8


def test_ah_over_esp_bundle_is_engine_esp_inside_scapy_ah() -> None:
    """Study 1's "AH + ESP": ESP AES-128-CBC tunnel (our engine) inside AH HMAC-SHA-1-96
    in transport mode on the outer packet (scapy; it cannot parse an ESP packet it did not
    make, so the ESP part is handed to it as opaque bytes)."""
    esp = SecurityAssociation(
        0x1000, "aes128", enc_key="11" * 16, tunnel_src="192.0.2.1", tunnel_dst="192.0.2.2"
    )
    ah = ScapySA(AH, spi=0x2000, auth_algo="HMAC-SHA1-96", auth_key=b"a" * 20)
    cfg = parse_configuration("ah:sha1+esp:aes128")
    assert cfg.esp and cfg.ah and not cfg.ipcomp
    for size in SIZES:
        sealed = esp.seal(_inner(size))
        outer = IP(src="192.0.2.1", dst="192.0.2.2", proto=50) / Raw(sealed[20:])
        bundle = ah.encrypt(outer)
        assert bundle[AH].nh == 50 and bundle[AH].payloadlen == 4  # AH (24 B) over ESP
        # scapy appends stray bytes after an opaque payload here; the total length it
        # writes into the IP header is the packet's real length.
        assert bundle[IP].len == wire_size(cfg, size) == len(sealed) + 24


def test_configuration_errors_name_the_part() -> None:
    for text, msg in [
        ("esp:aes999", "unknown ESP encryption 'aes999'"),
        ("esp:aes128gcm16-sha1", "combined-mode"),
        ("esp:null", "needs integrity"),
        ("ah:aes128", "unknown AH integrity"),
        ("esp:aes128+esp:aes256", "esp given twice"),
        ("gre:x", "is not a layer"),
        ("ipcomp:lzs", "only deflate"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_configuration(text)
    # Layer order as written does not matter: RFC order is applied.
    a, b = parse_configuration("ah:sha1+esp:aes128"), parse_configuration("esp:aes128+ah:sha1")
    assert wire_size(a, 500) == wire_size(b, 500)


def test_ipcomp_layout_and_secured_lengths() -> None:
    cfg = parse_configuration("ipcomp+esp:aes128-sha1")
    # Compressible: 1500 -> 800 bytes + 4-byte IPComp header, then ESP over 804.
    plan = packet_plan(cfg, 1500, compressed_len=lambda n: 800)
    assert plan.compressed
    assert plan.wire == wire_size(parse_configuration("esp:aes128-sha1"), 804)
    assert plan.stages["compress"] == 1500
    assert plan.stages["cipher"] == 816  # ceil((804 + 2) / 16) * 16
    # HMAC-SHA-1 over 8 + 16 + 816 bytes, plus 9 bytes of padding, in 64-byte blocks.
    assert plan.stages["mac"] == 896
    assert plan.l_alg == 816 + 896
    # Not smaller: sent without IPComp (RFC 3173 §2.2); small: not even tried.
    big = packet_plan(cfg, 1500, compressed_len=lambda n: n - 3)
    assert not big.compressed and big.wire == wire_size(
        parse_configuration("esp:aes128-sha1"), 1500
    )
    small = packet_plan(cfg, 60, compressed_len=lambda n: 10)
    assert not small.compressed and "compress" not in small.stages
