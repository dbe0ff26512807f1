"""The algorithms and stages the engine knows, read from the engine itself.

One source: the table in ``crates/ipsec/src/crypto/table.rs`` (one row per algorithm)
and ``Stage::ALL`` in ``crates/ipsec/src/stage.rs``, exported by ``_native.algorithms()``
and ``_native.stages()``. The model, the backends, the benchmark and the tests read these
dictionaries; none keeps its own list. Adding a cipher suite is its Rust row (and its
known-answer tests); everything here follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ipsec_lab import _native


@dataclass(frozen=True)
class Cipher:
    """An ESP encryption (or combined-mode) algorithm: one row of the engine's table."""

    name: str  # the strongSwan proposal keyword, which is also ours
    title: str  # what the RFCs call it: AES-GCM-128, HMAC-SHA-256-128
    rfc: str
    kind: str  # "none", "cbc", "aead", "gmac"
    key_len: int  # cipher key bytes, without the salt
    salt_len: int  # salt bytes after the key (combined modes)
    iv: int  # IV bytes carried in each packet
    icv: int  # ICV of a combined mode (0 = needs a separate integrity algorithm)
    block_len: int  # the cipher block the plaintext is padded to (1: stream or counter)
    align: int  # the ciphertext (payload + pad + trailer) is a multiple of this (RFC 4303 §2.4)
    work_block: int  # the block function's width, for the precise secured length
    legacy: bool
    kernel: str  # the Linux crypto API name (`ip xfrm state … enc|aead NAME`)
    libipsec: bool  # strongSwan's kernel-libipsec implements it

    @property
    def key_material(self) -> int:
        """Bytes of key an SA takes: the key, and the salt of a combined mode."""
        return self.key_len + self.salt_len

    @property
    def aead(self) -> bool:
        return self.kind in ("aead", "gmac")


@dataclass(frozen=True)
class Integrity:
    """An integrity algorithm (ESP integrity or AH): one row of the engine's table."""

    name: str  # the strongSwan proposal keyword, which is also ours
    title: str  # what the RFCs call it: AES-GCM-128, HMAC-SHA-256-128
    rfc: str
    key_len: int  # HMAC key (the hash output) or GMAC's AES key, without the salt
    salt_len: int
    iv: int  # GMAC in AH carries an 8-byte IV in front of the ICV (RFC 4543 §3.1)
    icv: int  # ICV bytes on the wire
    block: int  # hash block (HMAC) or GHASH block (GMAC)
    md_pad: int  # minimum Merkle-Damgård padding: 0x80 + length field (0 for GMAC)
    esp: bool  # ESP may use it (RFC 4543 §5.3 keeps AH's GMAC out of ESP)
    ah: bool  # AH may use it
    legacy: bool
    kernel: str | None  # the Linux crypto API name; None where Linux has none

    @property
    def key_material(self) -> int:
        return self.key_len + self.salt_len

    @property
    def kernel_trunc_bits(self) -> int:
        """The ICV length `ip xfrm state … auth-trunc NAME KEY BITS` takes."""
        return 8 * self.icv


def _cipher(row: dict[str, Any]) -> Cipher:
    return Cipher(
        name=row["name"], title=row["title"], rfc=row["rfc"], kind=row["kind"],
        key_len=row["key_len"], salt_len=row["salt_len"], iv=row["iv_len"], icv=row["icv_len"],
        block_len=row["block_len"], align=row["align"], work_block=row["work_block"],
        legacy=row["legacy"],
        kernel=row["kernel"], libipsec=row["libipsec"],
    )  # fmt: skip


def _integrity(row: dict[str, Any]) -> Integrity:
    return Integrity(
        name=row["name"], title=row["title"], rfc=row["rfc"], key_len=row["key_len"],
        salt_len=row["salt_len"],
        iv=row["iv_len"], icv=row["icv_len"], block=row["work_block"], md_pad=row["md_pad"],
        esp=row["esp"], ah=row["ah"], legacy=row["legacy"], kernel=row["kernel"],
    )  # fmt: skip


_TABLE = _native.algorithms()
# ESP encryption algorithms, in the order the engine lists them.
CIPHERS: dict[str, Cipher] = {r["name"]: _cipher(r) for r in _TABLE["encryption"]}
# Every integrity algorithm; ESP_INTEGRITY and AH_INTEGRITY are those each protocol takes.
INTEGRITIES: dict[str, Integrity] = {r["name"]: _integrity(r) for r in _TABLE["integrity"]}
ESP_INTEGRITY: dict[str, Integrity] = {k: v for k, v in INTEGRITIES.items() if v.esp}
AH_INTEGRITY: dict[str, Integrity] = {k: v for k, v in INTEGRITIES.items() if v.ah}

# The engine's stages in order, and those whose cost grows with the packet: the model's
# L_alg / R_alg (the rest is t_fix).
STAGES: tuple[str, ...] = tuple(label for label, _ in _native.stages())
PER_BYTE_STAGES: frozenset[str] = frozenset(label for label, per in _native.stages() if per)


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def markdown() -> str:
    """The algorithm tables of docs/algorithms.md, as the engine's table has them
    (`python -m ipsec_lab.algorithms` prints them; a test checks the doc agrees)."""
    lines = [
        "| name | algorithm | RFC | key | salt | IV | ICV | pads to | legacy | Linux xfrm | "
        "libipsec |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in CIPHERS.values():
        lines.append(
            f"| `{c.name}` | {c.title} | {c.rfc} | {c.key_len} | {c.salt_len} | {c.iv} | "
            f"{c.icv or ''} | {c.align} | {_yes(c.legacy)} | `{c.kernel}` | {_yes(c.libipsec)} |"
        )
    lines += [
        "",
        "| name | algorithm | RFC | key | salt | IV | ICV | ESP | AH | legacy | Linux xfrm |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i in INTEGRITIES.values():
        kernel = f"`{i.kernel}` {i.kernel_trunc_bits}" if i.kernel else ""
        lines.append(
            f"| `{i.name}` | {i.title} | {i.rfc} | {i.key_len} | {i.salt_len} | {i.iv} | "
            f"{i.icv} | {_yes(i.esp)} | {_yes(i.ah)} | {_yes(i.legacy)} | {kernel} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
