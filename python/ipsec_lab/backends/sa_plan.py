"""The SAs a configuration needs, their SPIs and fresh keys: the planning every backend
that keys its own SAs shares (ours and xfrm; strongSwan negotiates its own).

Key lengths come from the engine's algorithm table (`ipsec_lab.algorithms`), so both
ends of a tunnel, whatever implements them, take keys of the lengths RFC 4106 §8.1,
RFC 4543 §6, RFC 4868 §2.1.1 etc. give.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from ipsec_lab.algorithms import CIPHERS, INTEGRITIES
from ipsec_lab.backends.base import ipsec_configuration


@dataclass(frozen=True)
class Layer:
    """One SA of a configuration: its protocol and algorithms."""

    protocol: str  # esp | ah
    encryption: str
    integrity: str
    legacy: bool


@dataclass(frozen=True)
class Layers:
    """What a configuration asks of a backend: one SA, or a bundle (RFC 4301 §4.5)."""

    esp: Layer | None
    ah: Layer | None
    ipcomp: bool

    @property
    def bundle(self) -> bool:
        return self.ipcomp or (self.esp is not None and self.ah is not None)

    def sas(self) -> list[Layer]:
        return [x for x in (self.esp, self.ah) if x]


# SPIs: left-to-right 0x1001 (ESP) / 0x1101 (AH), back 0x2002 / 0x2102.
# Many tunnels (testbed/tunnels.py): tunnel j's SAs take SPI + (j << 16), one SA a tunnel
NO_BUNDLES = "more than one tunnel: one SA a tunnel (no bundles) so far"
SPI = {("esp", "lr"): 0x1001, ("esp", "rl"): 0x2002, ("ah", "lr"): 0x1101, ("ah", "rl"): 0x2102}
IPCOMP_CPI = 2  # DEFLATE's well-known CPI (RFC 3173 §3.3)


def layers(configuration: str, backend: str) -> Layers:
    """The SAs of `configuration` for `backend` (named in the refusal of `none`)."""
    c = ipsec_configuration(configuration, backend)
    esp = Layer("esp", c.esp[0].name, c.esp[1].name, c.legacy) if c.esp else None
    ah = Layer("ah", "null", c.ah.name, c.legacy) if c.ah else None
    return Layers(esp, ah, c.ipcomp)


Keys = dict[tuple[str, str], tuple[str, str]]  # (protocol, "lr"|"rl") -> (enc, integ) hex


def fresh_keys(ls: Layers) -> Keys:
    """New random keys for each SA of `ls`, both directions, of the lengths the
    algorithms take (their salts included)."""
    return {
        (x.protocol, d): (
            secrets.token_hex(CIPHERS[x.encryption].key_material),
            secrets.token_hex(INTEGRITIES[x.integrity].key_material),
        )
        for x in ls.sas()
        for d in ("lr", "rl")
    }
