"""An independent implementation both ways: scapy's scapy.layers.ipsec decrypts what we
seal, and we open what it encrypts — every algorithm both support (the legacy 3DES, DES
and HMAC-MD5 included), tunnel and transport, IPv4 and IPv6 (inner and outer), ESN on and
off, payloads of 0 to 1500 bytes."""

from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipsec_lab import DropError, SecurityAssociation

# scapy reaches 3DES through `cryptography`'s decrepit module, which warns on each use.
warnings.filterwarnings("ignore", message=".*TripleDES.*")

scapy_ipsec = pytest.importorskip("scapy.layers.ipsec")
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.packet import Raw  # noqa: E402

from scapyutil import (  # noqa: E402
    LEGACY,
    SCAPY_AUTH,
    SCAPY_CRYPT,
    V4,
    V6,
    enc_key_len,
    integ_key_len,
    unnamed,
)

# The (encryption, integrity) pairs checked both ways against scapy: each cipher once,
# each ESP integrity once, and the legacy ones on SAs marked legacy.
PAIRS = [
    ("aes128", "sha1"), ("aes192", "sha256"), ("aes256", "sha384"), ("aes256", "sha512"),
    ("aes128", "null"), ("null", "sha256"), ("aes128gcm16", "null"), ("aes256gcm16", "null"),
    ("chacha20poly1305", "null"), ("aes128gmac", "null"), ("aes256gmac", "null"),
    ("3des", "md5"), ("3des", "sha1"), ("des", "md5"), ("des", "null"), ("null", "md5"),
    ("aes128", "md5"),
]  # fmt: skip
# ours (encryption, integrity) -> scapy (crypt_algo, auth_algo), key lengths incl. salt
SUITES = {
    (e, i): (SCAPY_CRYPT[e], SCAPY_AUTH[i], enc_key_len(e), integ_key_len(i)) for e, i in PAIRS
}


def inner_packet(v6: bool, n: int, seed: int) -> bytes:
    payload = bytes((seed + i) & 0xFF for i in range(n))
    if v6:
        return bytes(IPv6(src=V6[2], dst=V6[3]) / UDP(sport=4000, dport=5001) / Raw(payload))
    return bytes(
        IP(src=V4[2], dst=V4[3], id=seed & 0xFFFF) / UDP(sport=4000, dport=5001) / Raw(payload)
    )


case = st.fixed_dictionaries(
    {
        "suite": st.sampled_from(sorted(SUITES)),
        "mode": st.sampled_from(["tunnel", "transport"]),
        "inner6": st.booleans(),
        "outer6": st.booleans(),
        "esn": st.booleans(),
        "size": st.one_of(st.integers(0, 64), st.integers(0, 1400), st.sampled_from([1400, 1432])),
        "seq_hi": st.sampled_from([0, 1, 0xFFFFFFFE]),
        "seq_lo": st.integers(1, 0xFFFFFFFF),
        "seed": st.integers(0, 255),
    }
)


def make_pair(c: dict) -> tuple[SecurityAssociation, object, object, bytes]:
    enc, integ = c["suite"]
    crypt_algo, auth_algo, klen, alen = SUITES[c["suite"]]
    key = os.urandom(klen) if klen else None
    akey = os.urandom(alen) if alen else None
    outer = V6 if (c["outer6"] if c["mode"] == "tunnel" else c["inner6"]) else V4
    tunnel = c["mode"] == "tunnel"
    ours = SecurityAssociation(
        0x1234,
        enc,
        integ,
        enc_key=key,
        integ_key=akey,
        mode=c["mode"],
        tunnel_src=outer[0] if tunnel else None,
        tunnel_dst=outer[1] if tunnel else None,
        esn=c["esn"],
        legacy=bool(LEGACY & {enc, integ}),
    )
    hdr = (
        (IPv6(src=outer[0], dst=outer[1]) if ":" in outer[0] else IP(src=outer[0], dst=outer[1]))
        if tunnel
        else None
    )
    kwargs = dict(
        spi=0x1234,
        crypt_algo=crypt_algo,
        crypt_key=key,
        auth_algo=auth_algo,
        auth_key=akey,
        tunnel_header=hdr,
        esn_en=c["esn"],
        esn=c["seq_hi"] if c["esn"] else 0,
    )
    theirs = scapy_ipsec.SecurityAssociation(scapy_ipsec.ESP, **kwargs)
    inner = inner_packet(c["inner6"], c["size"], c["seed"])
    return ours, theirs, (IPv6 if c["inner6"] else IP), inner


def seq_of(c: dict) -> int:
    return (c["seq_hi"] << 32 | c["seq_lo"]) if c["esn"] else c["seq_lo"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case)
def test_scapy_opens_what_we_seal(c: dict) -> None:
    ours, theirs, _cls, inner = make_pair(c)
    wire = ours.seal(inner, seq=seq_of(c))
    outer_cls = IPv6 if wire[0] >> 4 == 6 else IP
    got = theirs.decrypt(outer_cls(wire))
    assert bytes(got) == inner


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case)
def test_we_open_what_scapy_encrypts(c: dict) -> None:
    ours, theirs, cls, inner = make_pair(c)
    enc = theirs.encrypt(cls(inner), seq_num=c["seq_lo"])
    seq = seq_of(c)
    ours.set_replay_top(seq - 1)
    assert ours.open(bytes(enc)) == inner
    assert ours.counters()["packets"] == 1
    enc_alg, integ = c["suite"]
    if integ == "null" and enc_alg in ("aes128", "aes192", "aes256", "3des", "des"):
        # Encryption without integrity: the sequence number is not authenticated, so the
        # SA keeps no replay window (RFC 4303 §3.4.3) and the packet opens again.
        assert ours.open(bytes(enc)) == inner
        return
    # And the same packet again is a replay, by name.
    with pytest.raises(DropError) as e:
        ours.open(bytes(enc))
    assert e.value.args[0] == "replay"


def test_scapy_tampered_packet_is_an_icv_failure() -> None:
    c = {
        "suite": ("aes128gcm16", "null"),
        "mode": "tunnel",
        "inner6": False,
        "outer6": False,
        "esn": False,
        "size": 100,
        "seq_hi": 0,
        "seq_lo": 5,
        "seed": 1,
    }
    ours, theirs, cls, inner = make_pair(c)
    enc = bytearray(bytes(theirs.encrypt(cls(inner), seq_num=5)))
    enc[-20] ^= 0x40
    with pytest.raises(DropError) as e:
        ours.open(bytes(enc))
    assert e.value.args[0] == "icv_failure"
    assert ours.counters()["drops"] == {"icv_failure": 1}


@pytest.mark.parametrize("suite", sorted(s for s in SUITES if LEGACY & set(s)))
@pytest.mark.parametrize("mode", ["tunnel", "transport"])
def test_legacy_suites_both_ways(suite: tuple[str, str], mode: str) -> None:
    """Each legacy suite explicitly (hypothesis samples them, but not each for certain)."""
    for size, esn in [(0, False), (7, True), (100, False), (1400, True)]:
        c = {
            "suite": suite,
            "mode": mode,
            "inner6": size == 7,
            "outer6": size == 100,
            "esn": esn,
            "size": size,
            "seq_hi": 1 if esn else 0,
            "seq_lo": 9,
            "seed": size,
        }
        ours, theirs, cls, inner = make_pair(c)
        wire = ours.seal(inner, seq=seq_of(c))
        assert bytes(theirs.decrypt((IPv6 if wire[0] >> 4 == 6 else IP)(wire))) == inner
        ours2, theirs2, cls, inner = make_pair(c)
        enc = theirs2.encrypt(cls(inner), seq_num=c["seq_lo"])
        ours2.set_replay_top(seq_of(c) - 1)
        assert ours2.open(bytes(enc)) == inner


def test_legacy_needs_the_flag_from_python() -> None:
    with pytest.raises(ValueError, match="3des is a legacy algorithm"):
        SecurityAssociation(0x1000, "3des", "sha1", enc_key=os.urandom(24),
                            integ_key=os.urandom(20), mode="transport")  # fmt: skip
    with pytest.raises(ValueError, match="md5 is a legacy algorithm"):
        SecurityAssociation(0x1000, "aes128", "md5", enc_key=os.urandom(16),
                            integ_key=os.urandom(16), mode="transport")  # fmt: skip
    sa = SecurityAssociation(0x1000, "3des", "md5", enc_key=os.urandom(24),
                             integ_key=os.urandom(16), mode="transport", legacy=True)  # fmt: skip
    assert sa.suite == "3des-md5"


def test_every_algorithm_has_a_scapy_name() -> None:
    """A row added to the engine's table is checked against scapy too: name it in
    tests/scapyutil.py, and add a pair above."""
    from ipsec_lab.algorithms import CIPHERS, ESP_INTEGRITY

    assert unnamed() == []
    assert {e for e, _ in PAIRS} == set(CIPHERS)
    assert {i for _, i in PAIRS} == set(ESP_INTEGRITY)
