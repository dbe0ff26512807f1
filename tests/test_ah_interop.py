"""AH (RFC 4302) against an independent implementation, both ways: scapy verifies what we
seal and we open what it signs — every HMAC integrity algorithm both support, tunnel and
transport, IPv4 and IPv6, with an IPv4 option and an IPv6 extension header, ESN on and
off; and malformed AH is a named, counted drop."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipsec_lab import DropError, SecurityAssociation

scapy_ipsec = pytest.importorskip("scapy.layers.ipsec")
from scapy.layers.inet import IP, UDP, IPOption_NOP, IPOption_Router_Alert  # noqa: E402
from scapy.layers.inet6 import (  # noqa: E402
    HBHOptUnknown,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrHopByHop,
    PadN,
)
from scapy.packet import Packet, Raw  # noqa: E402

from ipsec_lab.algorithms import AH_INTEGRITY  # noqa: E402
from scapyutil import SCAPY_AUTH, V4, V6, integ_key_len  # noqa: E402

# ours -> scapy auth_algo, key length: AH's integrity algorithms scapy has
AUTH = {i: (SCAPY_AUTH[i], integ_key_len(i)) for i in AH_INTEGRITY if i in SCAPY_AUTH}


def inner_packet(v6: bool, n: int, seed: int, ext: bool) -> Packet:
    payload = Raw(bytes((seed + i) & 0xFF for i in range(n)))
    udp = UDP(sport=4000, dport=5001)
    if v6:
        p: Packet = IPv6(src=V6[2], dst=V6[3], tc=0xB8, fl=0x12345, hlim=33)
        if ext:
            # A hop-by-hop header with an option whose data may change en route (type
            # 0x3e has the 0x20 bit) and a destination options header: the ICV must zero
            # the first option's data and cover the rest.
            p = p / IPv6ExtHdrHopByHop(options=[HBHOptUnknown(otype=0x3E, optdata=b"\xaa\xbb")])
            p = p / IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\x00\x00\x00\x00")])
        return IPv6(bytes(p / udp / payload))
    opts = [IPOption_Router_Alert(), IPOption_NOP(), IPOption_NOP()] if ext else []
    return IP(bytes(IP(src=V4[2], dst=V4[3], tos=0xB8, ttl=33, options=opts) / udp / payload))


def cases(integs: list[str]) -> st.SearchStrategy[dict]:
    """Hypothesis cases for AH with one of `integs`: mode, families, options, ESN, size,
    sequence number and payload seed."""
    return st.fixed_dictionaries(
        {
            "integ": st.sampled_from(integs),
            "mode": st.sampled_from(["tunnel", "transport"]),
            "inner6": st.booleans(),
            "outer6": st.booleans(),
            "ext": st.booleans(),
            "esn": st.booleans(),
            "size": st.one_of(st.integers(0, 64), st.integers(0, 1400)),
            "seq_hi": st.sampled_from([0, 1, 0xFFFFFFFE]),
            "seq_lo": st.integers(1, 0xFFFFFFFF),
            "seed": st.integers(0, 255),
        }
    )


case = cases(sorted(AUTH))


def make_pair(c: dict) -> tuple[SecurityAssociation, object, Packet]:
    name, klen = AUTH[c["integ"]]
    key = os.urandom(klen)
    tunnel = c["mode"] == "tunnel"
    outer = V6 if (c["outer6"] if tunnel else c["inner6"]) else V4
    ours = SecurityAssociation(
        0x2345,
        "null",
        c["integ"],
        integ_key=key,
        mode=c["mode"],
        tunnel_src=outer[0] if tunnel else None,
        tunnel_dst=outer[1] if tunnel else None,
        esn=c["esn"],
        protocol="ah",
        legacy=c["integ"] == "md5",
    )
    hdr = None
    if tunnel:
        hdr = (
            IPv6(src=outer[0], dst=outer[1]) if ":" in outer[0] else IP(src=outer[0], dst=outer[1])
        )
    theirs = scapy_ipsec.SecurityAssociation(
        scapy_ipsec.AH,
        spi=0x2345,
        auth_algo=name,
        auth_key=key,
        tunnel_header=hdr,
        esn_en=c["esn"],
        esn=c["seq_hi"] if c["esn"] else 0,
    )
    return ours, theirs, inner_packet(c["inner6"], c["size"], c["seed"], c["ext"])


def seq_of(c: dict) -> int:
    return (c["seq_hi"] << 32 | c["seq_lo"]) if c["esn"] else c["seq_lo"]


def _parse(wire: bytes) -> Packet:
    return IPv6(wire) if wire[0] >> 4 == 6 else IP(wire)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case)
def test_scapy_verifies_what_we_seal(c: dict) -> None:
    ours, theirs, inner = make_pair(c)
    wire = ours.seal(bytes(inner), seq=seq_of(c))
    got = theirs.decrypt(_parse(wire))  # raises IPSecIntegrityError on a bad ICV
    if c["mode"] == "tunnel":
        assert bytes(got) == bytes(inner)
    else:
        # scapy hands back the transport payload undissected: compare the bytes.
        udp = bytes(inner[UDP])
        assert bytes(got)[-len(udp) :] == udp


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case)
def test_we_open_what_scapy_signs(c: dict) -> None:
    ours, theirs, inner = make_pair(c)
    signed = bytes(theirs.encrypt(inner, seq_num=c["seq_lo"]))
    ours.set_replay_top(seq_of(c) - 1)
    opened = ours.open(signed)
    if c["mode"] == "tunnel":
        assert opened == bytes(inner)
    else:
        assert bytes(_parse(opened)[UDP]) == bytes(inner[UDP])
        assert len(opened) == len(bytes(inner))
    assert ours.counters()["packets"] == 1
    with pytest.raises(DropError) as e:
        ours.open(signed)
    assert e.value.args[0] == "replay"


def _sample(mode: str = "tunnel", integ: str = "sha256") -> tuple[SecurityAssociation, bytes]:
    c = {
        "integ": integ, "mode": mode, "inner6": False, "outer6": False, "ext": False,
        "esn": False, "size": 100, "seq_hi": 0, "seq_lo": 7, "seed": 3,
    }  # fmt: skip
    ours, theirs, inner = make_pair(c)
    return ours, bytes(theirs.encrypt(inner, seq_num=7))


def test_mutable_fields_may_change_in_transit() -> None:
    ours, signed = _sample()
    p = IP(signed)
    p.ttl = 7  # routers decrement TTL and rewrite DSCP: AH does not cover them
    p.tos = 0x04
    del p.chksum
    assert ours.open(bytes(p)) is not None


def test_immutable_fields_and_payload_are_covered() -> None:
    for tamper in ("src", "payload", "icv", "id"):
        ours, signed = _sample()
        b = bytearray(signed)
        if tamper == "src":
            b[15] ^= 1
            b[10:12] = b"\0\0"
            p = IP(bytes(b))
            del p.chksum
            b = bytearray(bytes(p))
        elif tamper == "payload":
            b[-1] ^= 0x80
        elif tamper == "icv":
            b[20 + 12] ^= 1
        else:
            b[4] ^= 1
            p = IP(bytes(b))
            del p.chksum
            b = bytearray(bytes(p))
        with pytest.raises(DropError) as e:
            ours.open(bytes(b))
        assert e.value.args[0] == "icv_failure", tamper
    assert ours.counters()["drops"] == {"icv_failure": 1}


def test_malformed_ah_is_a_named_drop() -> None:
    ours, signed = _sample()
    b = bytearray(signed)
    b[21] = 6  # AH payload length: 32 bytes instead of the 28 HMAC-SHA-256-128 gives
    with pytest.raises(DropError) as e:
        ours.open(bytes(b))
    assert e.value.args[0] == "malformed_ah"
    b[21] = 0  # shorter than the fixed part
    with pytest.raises(DropError) as e:
        ours.open(bytes(b))
    assert e.value.args[0] == "malformed_ah"
    for cut in range(20, len(signed)):
        short = bytearray(signed[:cut])
        short[2:4] = cut.to_bytes(2, "big")
        with pytest.raises(DropError) as e:
            ours.open(bytes(short))
        assert e.value.args[0] in {"truncated", "malformed_ah", "icv_failure", "malformed_inner"}
    # A tunnel AH whose next header is neither IPv4 nor IPv6 (with a valid ICV).
    assert set(ours.counters()["drops"]) <= {
        "malformed_ah", "truncated", "icv_failure", "malformed_inner",
    }  # fmt: skip


def test_ah_sa_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="AH authenticates only"):
        SecurityAssociation(0x1000, "aes128", "sha1", enc_key=os.urandom(16),
                            integ_key=os.urandom(20), mode="transport", protocol="ah")  # fmt: skip
    with pytest.raises(ValueError, match="md5 is a legacy algorithm"):
        SecurityAssociation(0x1000, "null", "md5", integ_key=os.urandom(16), mode="transport",
                            protocol="ah")  # fmt: skip
    with pytest.raises(ValueError, match='protocol: "gre"'):
        SecurityAssociation(0x1000, "null", "sha1", integ_key=os.urandom(20), mode="transport",
                            protocol="gre")  # fmt: skip
    sa = SecurityAssociation(0x1000, "null", "sha1", integ_key=os.urandom(20),
                             mode="transport", protocol="ah")  # fmt: skip
    assert sa.protocol == "ah"


def test_ah_wire_size_is_what_the_model_says() -> None:
    from ipsec_lab.model import Layout, parse_configuration, wire_size

    for integ in [*sorted(AUTH), "aes128gmac", "aes256gmac"]:
        for outer6 in (False, True):
            c = {
                "integ": integ, "mode": "tunnel", "inner6": False, "outer6": outer6,
                "ext": False, "esn": False, "size": 200, "seq_hi": 0, "seq_lo": 1, "seed": 0,
            }  # fmt: skip
            ours, _, inner = gmac_sa(c) if integ.endswith("gmac") else make_pair(c)
            wire = ours.seal(bytes(inner))
            lay = Layout(outer=6 if outer6 else 4)
            assert len(wire) == wire_size(parse_configuration(f"ah:{integ}"), len(inner), lay)


# AES-GMAC in AH (RFC 4543 §4). No open implementation of AH-GMAC exists to interoperate
# with (Linux, OpenBSD and libreswan have none), so the framing is checked against the
# RFC's text and the tag against an independent AES-GCM: scapy builds the AH-authenticated
# data (its own `zero_mutable_fields`, which its HMAC AH verification uses), and Python
# `cryptography`'s AESGCM, with an empty plaintext, gives the GMAC tag.
GMAC_KEY = {"aes128gmac": 16, "aes256gmac": 32}

gmac_case = cases(sorted(GMAC_KEY))


def gmac_sa(c: dict, key: bytes | None = None) -> tuple[SecurityAssociation, bytes, Packet]:
    if key is None:
        key = os.urandom(GMAC_KEY[c["integ"]] + 4)  # AES key ‖ 4-byte salt (RFC 4543 §5.4)
    tunnel = c["mode"] == "tunnel"
    outer = V6 if (c["outer6"] if tunnel else c["inner6"]) else V4
    sa = SecurityAssociation(
        0x2345, "null", c["integ"], integ_key=key, mode=c["mode"],
        tunnel_src=outer[0] if tunnel else None, tunnel_dst=outer[1] if tunnel else None,
        esn=c["esn"], protocol="ah",
    )  # fmt: skip
    return sa, key, inner_packet(c["inner6"], c["size"], c["seed"], c["ext"])


def gmac_tag(key: bytes, wire: bytes, seq: int, esn: bool) -> tuple[int, bytes]:
    """(offset of AH in `wire`, the GMAC tag RFC 4543 §4 gives for it), computed from
    `wire` without our code: the AH-authenticated data as scapy zeroes it, the IV put back
    (only the tag field is zeroed, §7: the IV is authenticated), the ESN high half
    appended (RFC 4302 §2.5.1), nonce = salt ‖ IV."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    pkt = _parse(wire)
    ah_at = len(wire) - len(bytes(pkt[scapy_ipsec.AH]))
    iv = wire[ah_at + 12 : ah_at + 20]
    zeroed = bytearray(bytes(scapy_ipsec.zero_mutable_fields(pkt.copy(), sending=False)))
    assert zeroed[ah_at + 12 : ah_at + 36] == bytes(24)  # scapy zeroed IV and tag
    zeroed[ah_at + 12 : ah_at + 20] = iv
    aad = bytes(zeroed) + ((seq >> 32).to_bytes(4, "big") if esn else b"")
    return ah_at, AESGCM(key[:-4]).encrypt(key[-4:] + iv, b"", aad)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gmac_case)
def test_ah_gmac_tag_is_an_independent_gmac(c: dict) -> None:
    sa, key, inner = gmac_sa(c)
    seq = seq_of(c)
    wire = sa.seal(bytes(inner), seq=seq)
    ah_at, tag = gmac_tag(key, wire, seq, c["esn"])
    ah = wire[ah_at:]
    v6_outer = wire[0] >> 4 == 6
    # RFC 4543 §4 + erratum 3643: IV (8) ‖ tag (16); 36 bytes over IPv4, 40 over IPv6.
    assert ah[1] == (8 if v6_outer else 7)
    assert ah[8:12] == (seq & 0xFFFFFFFF).to_bytes(4, "big")
    assert ah[12:20] == seq.to_bytes(8, "big")  # the IV: the 64-bit sequence number
    assert ah[20:36] == tag
    if v6_outer:
        assert ah[36:40] == bytes(4)
    # And it opens again, once.
    rx, _, _ = gmac_sa(c, key)
    rx.set_replay_top(seq - 1)
    assert rx.open(wire) is not None
    with pytest.raises(DropError) as e:
        rx.open(wire)
    assert e.value.args[0] == "replay"


def _gmac_signed(key: bytes, seq: int, v6: bool) -> tuple[bytes, bytes]:
    """A transport-mode AH-GMAC packet built and signed without our code: scapy's AH with
    an IV and a zero tag, the tag from `gmac_tag`, put in place."""
    udp = UDP(sport=4000, dport=5001) / Raw(b"signed elsewhere " * 5)
    iv = seq.to_bytes(8, "big")
    if v6:
        ip: Packet = IPv6(src=V6[2], dst=V6[3], hlim=9, tc=0x20)
        auth = iv + bytes(16) + bytes(4)
    else:
        ip = IP(src=V4[2], dst=V4[3], ttl=9, tos=0x20, id=77)
        auth = iv + bytes(16)
    ah = scapy_ipsec.AH(nh=17, payloadlen=len(auth) // 4 + 1, spi=0x2345, seq=seq, icv=auth)
    wire = bytearray(bytes(ip / ah / udp))
    ah_at, tag = gmac_tag(key, bytes(wire), seq, False)
    wire[ah_at + 20 : ah_at + 36] = tag
    return bytes(wire), bytes(udp)


def test_ah_gmac_opens_what_an_independent_gmac_signs_and_refuses_tampering() -> None:
    for v6 in (False, True):
        key = os.urandom(20)
        signed, udp = _gmac_signed(key, 5, v6)

        def rx(key: bytes = key) -> SecurityAssociation:
            return SecurityAssociation(0x2345, "null", "aes128gmac", integ_key=key,
                                       mode="transport", protocol="ah")  # fmt: skip

        opened = rx().open(signed)
        ah_len = 40 if v6 else 36
        assert len(opened) == len(signed) - ah_len and opened.endswith(udp)
        assert bytes(_parse(opened)[UDP]) == udp
        ah_at = len(signed) - ah_len - len(udp)
        for what, at in (("iv", ah_at + 15), ("tag", ah_at + 30), ("payload", len(signed) - 1)):
            b = bytearray(signed)
            b[at] ^= 1
            sa = rx()
            with pytest.raises(DropError) as e:
                sa.open(bytes(b))
            assert e.value.args[0] == "icv_failure", (v6, what)
        # The salt is part of the key: the right AES key with another salt fails.
        other = SecurityAssociation(0x2345, "null", "aes128gmac", integ_key=key[:16] + b"salt",
                                    mode="transport", protocol="ah")  # fmt: skip
        with pytest.raises(DropError) as e:
            other.open(signed)
        assert e.value.args[0] == "icv_failure"


def test_ah_gmac_is_for_ah_only_and_takes_key_and_salt() -> None:
    with pytest.raises(ValueError, match="for AH only"):
        SecurityAssociation(0x1000, "null", "aes128gmac", integ_key=os.urandom(20),
                            mode="transport")  # fmt: skip
    with pytest.raises(ValueError, match="must be 36 bytes"):
        SecurityAssociation(0x1000, "null", "aes256gmac", integ_key=os.urandom(32),
                            mode="transport", protocol="ah")  # fmt: skip
