"""Scapy's names for the engine's algorithms: scapy is the independent implementation the
interop and wire-size tests check the engine against, so its names stay here, on the
test side; every other fact of an algorithm (key, salt, ICV lengths, legacy or not) comes
from the engine's table through `ipsec_lab.algorithms`.

`test_every_algorithm_has_a_scapy_name` (in test_scapy_interop.py) fails when the table
grows a row that is not named here: a new suite is then checked against scapy too."""

from __future__ import annotations

from ipsec_lab.algorithms import AH_INTEGRITY, CIPHERS, ESP_INTEGRITY, INTEGRITIES

# ours -> scapy's ESP crypt_algo (scapy's 3DES/DES come from `cryptography`'s)
SCAPY_CRYPT = {
    "null": "NULL", "aes128": "AES-CBC", "aes192": "AES-CBC", "aes256": "AES-CBC",
    "aes128gcm16": "AES-GCM", "aes256gcm16": "AES-GCM", "chacha20poly1305": "CHACHA20-POLY1305",
    "aes128gmac": "AES-NULL-GMAC", "aes256gmac": "AES-NULL-GMAC", "3des": "3DES", "des": "DES",
}  # fmt: skip
# ours -> scapy's auth_algo (ESP and AH); AH-GMAC (RFC 4543 §4) is in no open AH, scapy's
# included, so it has none
SCAPY_AUTH = {
    "null": "NULL", "md5": "HMAC-MD5-96", "sha1": "HMAC-SHA1-96", "sha256": "SHA2-256-128",
    "sha384": "SHA2-384-192", "sha512": "SHA2-512-256",
}  # fmt: skip
NOT_IN_SCAPY = {"aes128gmac", "aes256gmac"}  # as AH integrity only

# Outer (tunnel) and inner addresses of the interop tests: (outer src, outer dst, inner
# src, inner dst), IPv4 and IPv6 documentation and unique-local prefixes.
V4 = ("192.0.2.1", "192.0.2.2", "10.1.0.5", "10.2.0.9")
V6 = ("2001:db8::1", "2001:db8::2", "fd00:1::5", "fd00:2::9")

LEGACY = {n for n, c in CIPHERS.items() if c.legacy} | {
    n for n, i in INTEGRITIES.items() if i.legacy
}
COMBINED = {n for n, c in CIPHERS.items() if c.aead}


def enc_key_len(enc: str) -> int:
    """Key material bytes of an encryption algorithm, its salt included."""
    return CIPHERS[enc].key_material


def integ_key_len(integ: str) -> int:
    return INTEGRITIES[integ].key_material


def unnamed() -> list[str]:
    """Algorithms of the engine's table with no scapy name here (should be none)."""
    return sorted(
        [f"encryption {n}" for n in CIPHERS if n not in SCAPY_CRYPT]
        + [f"integrity {n}" for n in ESP_INTEGRITY if n not in SCAPY_AUTH]
        + [f"AH {n}" for n in AH_INTEGRITY if n not in SCAPY_AUTH and n not in NOT_IN_SCAPY]
    )
