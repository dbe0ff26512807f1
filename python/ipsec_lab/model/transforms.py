"""What a configuration puts on the wire and how many bytes its algorithms work through.

A *configuration* is a set of IPsec layers written as in strongSwan proposals and joined
with ``+``: ``esp:aes128gcm16``, ``esp:aes128-sha1``, ``ah:sha1``, ``ah:sha1+esp:aes128``,
``ipcomp+esp:aes128-sha1``, or ``none`` (no IPsec) — or ``wireguard``, WireGuard's one
suite, for the peers engineers compare IPsec with. Whatever order they are written in,
the layers are applied outbound in the order of RFC 4301 §4.5 / RFC 3173 §3:
IPComp, then ESP, then AH (AH outermost, so it also covers the ESP header).

Two numbers per packet come out of it, both as a function of the inner IP packet size L:

* the **wire size** of the protected packet (outer IP header, UDP encapsulation, ESP, AH
  and IPComp headers, IV, padding, ICV), exactly as RFC 4303 §2, RFC 4302 §2, RFC 3173 §2.2
  and RFC 3948 §2.1 lay it out, with minimal padding as our engine emits it;
* the **secured length** L_alg of the Tisovsky-Baronak model: in the paper's forms
  (eq. 5 for AH, eq. 6 for ESP, or L_alg = L) and a *precise* form that counts, for each
  algorithm, the bytes its block function really runs over (cipher blocks, hash blocks
  including the Merkle-Damgård padding, GHASH blocks) and adds them up.

In the precise form a cipher + HMAC configuration counts every byte once per algorithm
that processes it, so its fitted R_alg is the rate of "crypto bytes" through both; the
per-algorithm split is kept in :attr:`PacketPlan.stages` for the engine's per-stage counters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ipsec_lab.algorithms import AH_INTEGRITY, CIPHERS, ESP_INTEGRITY, Cipher, Integrity

IPV4_HEADER = 20
IPV6_HEADER = 40
ESP_HEADER = 8  # RFC 4303 §2: SPI + sequence number
ESP_TRAILER = 2  # RFC 4303 §2: pad length + next header
AH_FIXED = 12  # RFC 4302 §2: next header, payload len, reserved, SPI, sequence number
IPCOMP_HEADER = 4  # RFC 3173 §2.2: next header, flags, CPI
UDP_ENCAP = 8  # RFC 3948 §2.1: UDP header in front of ESP
# Paper's eq. 5 constants for IPv4 + HMAC-xxx-96 (study 2).
PAPER_AH_L_IP = 12
PAPER_AH_L_AH = 24
# Linux compresses nothing shorter than this (net/xfrm/xfrm_algo.c, deflate threshold).
IPCOMP_DEFAULT_MIN = 90
# WireGuard's transport data message (the whitepaper, §5.4.6): type, reserved, receiver
# index and counter (1 + 3 + 4 + 8 bytes) before the packet, zero-padded to 16 bytes, and
# Poly1305's 16-byte tag after it; always in UDP (8 bytes) and a tunnel.
WIREGUARD = "wireguard"
WG_HEADER = 16
WG_PAD = 16
WG_TAG = 16


class ConfigError(ValueError):
    """A configuration or secured-length form that cannot be understood."""


# The algorithms come from the engine's one table (crates/ipsec/src/crypto/table.rs):
# ESP's encryption and integrity algorithms, and AH's (which adds GMAC, RFC 4543: an
# 8-byte IV before the 16-byte ICV, and has no null).
INTEGRITY = ESP_INTEGRITY


@dataclass(frozen=True)
class Layout:
    """Where the packet goes: mode, IP versions, UDP encapsulation."""

    mode: str = "tunnel"  # or "transport"
    outer: int = 4  # outer IP version (tunnel mode)
    inner: int = 4  # inner IP version (its header stays in front in transport mode)
    udp_encap: bool = False
    # WireGuard pads a packet to 16 bytes but never past its device's MTU (None: no cap)
    tunnel_mtu: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("tunnel", "transport"):
            raise ConfigError(f"mode {self.mode!r}: must be tunnel or transport")
        if self.outer not in (4, 6) or self.inner not in (4, 6):
            raise ConfigError("IP version must be 4 or 6")

    @property
    def inner_header(self) -> int:
        return IPV4_HEADER if self.inner == 4 else IPV6_HEADER

    @property
    def ip_header(self) -> int:
        """The IP header in front of the IPsec headers on the wire."""
        if self.mode == "transport":
            return self.inner_header
        return IPV4_HEADER if self.outer == 4 else IPV6_HEADER

    @property
    def ip_version(self) -> int:
        return self.inner if self.mode == "transport" else self.outer


@dataclass(frozen=True)
class Configuration:
    """Parsed layers of a configuration; ``None`` where a layer is absent."""

    text: str
    ipcomp: bool = False
    esp: tuple[Cipher, Integrity] | None = None
    ah: Integrity | None = None
    wireguard: bool = False  # WireGuard's one suite (ChaCha20-Poly1305), not IPsec

    @property
    def legacy(self) -> bool:
        algs: list[Cipher | Integrity] = []
        if self.esp:
            algs += list(self.esp)
        if self.ah:
            algs.append(self.ah)
        return any(a.legacy for a in algs)

    @property
    def is_none(self) -> bool:
        return not (self.ipcomp or self.esp or self.ah or self.wireguard)


def parse_configuration(text: str) -> Configuration:
    """Parse ``ah:sha1+esp:aes128``-style text; errors name the bad part."""
    t = text.strip().lower()
    if t in ("none", "plain", ""):
        return Configuration("none")
    if t == WIREGUARD:
        return Configuration(WIREGUARD, wireguard=True)
    if WIREGUARD in t.split("+"):
        raise ConfigError(f"{text!r}: wireguard is a configuration of its own (WireGuard has "
                          "one suite, ChaCha20-Poly1305); it joins no IPsec layer")  # fmt: skip
    ipcomp = False
    esp: tuple[Cipher, Integrity] | None = None
    ah: Integrity | None = None
    canonical: list[str] = []
    for part in t.split("+"):
        if ":" not in part and part not in ("ipcomp", "esp", "ah"):
            part = "esp:" + part  # one spelling everywhere: a bare suite is ESP's
        canonical.append(part)
        proto, _, algs = part.partition(":")
        if proto == "ipcomp":
            if ipcomp:
                raise ConfigError(f"{text!r}: ipcomp given twice")
            if algs not in ("", "deflate"):
                raise ConfigError(f"{text!r}: IPComp algorithm {algs!r}: only deflate")
            ipcomp = True
        elif proto == "esp":
            if esp:
                raise ConfigError(f"{text!r}: esp given twice")
            enc, _, integ = algs.partition("-")
            if enc not in CIPHERS:
                hint = suggest_suite(algs, CIPHERS, INTEGRITY) or _did_you_mean(enc, CIPHERS)
                raise ConfigError(
                    f"{text!r}: unknown ESP encryption {enc!r}{hint}; one of {', '.join(CIPHERS)}"
                )
            c = CIPHERS[enc]
            integ = integ or "null"
            if integ not in INTEGRITY:
                raise ConfigError(
                    f"{text!r}: unknown ESP integrity {integ!r}{_did_you_mean(integ, INTEGRITY)}"
                    f"; one of {', '.join(INTEGRITY)}"
                )
            i = INTEGRITY[integ]
            if c.kind in ("aead", "gmac") and i.name != "null":
                raise ConfigError(f"{text!r}: {enc} is combined-mode and takes no integrity")
            if c.kind == "none" and i.name == "null":
                raise ConfigError(f"{text!r}: ESP with null encryption needs integrity")
            esp = (c, i)
        elif proto == "ah":
            if ah:
                raise ConfigError(f"{text!r}: ah given twice")
            if algs not in AH_INTEGRITY:
                raise ConfigError(
                    f"{text!r}: unknown AH integrity {algs!r}"
                    f"{_did_you_mean(algs, AH_INTEGRITY)}; one of {', '.join(AH_INTEGRITY)}"
                )
            ah = AH_INTEGRITY[algs]
        else:
            raise ConfigError(
                f"{text!r}: {part!r} is not a layer; write ipcomp, esp:ENC[-INTEG] or ah:INTEG "
                "joined by '+' (or wireguard alone)"
            )
    return Configuration("+".join(canonical), ipcomp, esp, ah)


def suggest_suite(algs: str, ciphers: Iterable[str], integrities: Iterable[str]) -> str:
    """A did-you-mean for an ESP suite written another way (`aes-128-gcm`, `AES_128_GCM`,
    `chacha20-poly1305`, `aes-128-cbc-sha1`): the one spelling ipsec-lab uses, or ""."""
    import difflib
    import re

    squashed = re.sub(r"[-_ /]", "", algs.lower()).replace("cbc", "")
    known = list(ciphers)
    best = ""
    for c in sorted(known, key=len, reverse=True):  # aes128gcm16 before aes128
        if squashed.startswith(c) or (c.startswith(squashed) and len(squashed) >= 5):
            rest = squashed[len(c) :] if squashed.startswith(c) else ""
            best = c + (f"-{rest}" if rest in set(integrities) and rest != "null" else "")
            break
    if not best:
        close = difflib.get_close_matches(squashed, known, n=1, cutoff=0.75)
        best = close[0] if close else ""
    return f" (did you mean {best}?)" if best else ""


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(known), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _ceil_to(n: int, block: int) -> int:
    return -(-n // block) * block


def ah_length(integ: Integrity, ip_version: int) -> int:
    """AH header bytes: fixed part + IV + ICV, padded to 32 bits (IPv4) or 64 bits (IPv6),
    RFC 4302 §2.2 / §3.3.3.2.1."""
    return _ceil_to(AH_FIXED + integ.iv + integ.icv, 4 if ip_version == 4 else 8)


def esp_ciphertext(cipher: Cipher, payload: int) -> int:
    """Payload + minimal padding + trailer, aligned to the cipher block and 4 bytes."""
    return _ceil_to(payload + ESP_TRAILER, cipher.align)


def _hash_work(integ: Integrity, n: int) -> int:
    """Bytes of hash blocks run over an n-byte message (padding included)."""
    if integ.name == "null":
        return 0
    return _ceil_to(n + integ.md_pad, integ.block)


CompressedLen = Callable[[int], int | None]


@dataclass
class PacketPlan:
    """One packet through a configuration: sizes at each layer and the bytes each
    algorithm works through (the precise secured length is their sum)."""

    inner: int
    wire: int
    compressed: bool = False
    stages: dict[str, int] = field(default_factory=dict)

    @property
    def l_alg(self) -> int:
        return sum(v for k, v in self.stages.items() if k != "compress")


def packet_plan(
    cfg: Configuration,
    size: int,
    layout: Layout | None = None,
    compressed_len: CompressedLen | None = None,
    ipcomp_min: int = IPCOMP_DEFAULT_MIN,
) -> PacketPlan:
    """Lay one inner IP packet of ``size`` bytes out through ``cfg``.

    ``compressed_len(n)`` gives the DEFLATE output for an n-byte IPComp payload, or None
    for "incompressible"; without it, data is taken as incompressible (RFC 3173 §2.2:
    a packet that does not get smaller is sent without the IPComp header).
    """
    lay = layout or Layout()
    if size < lay.inner_header:
        raise ConfigError(f"packet size {size} is shorter than an IPv{lay.inner} header")
    # The part that IPsec protects: the whole inner packet (tunnel) or what follows the
    # IP header (transport, RFC 4303 §3.1.1).
    if cfg.wireguard:
        return _wireguard_plan(size, lay)
    head = lay.inner_header if lay.mode == "transport" else 0
    payload = size - head
    stages: dict[str, int] = {}
    compressed = False
    if cfg.ipcomp and payload >= ipcomp_min:
        stages["compress"] = payload
        c = compressed_len(payload) if compressed_len else None
        if c is not None and c + IPCOMP_HEADER < payload:
            payload = c + IPCOMP_HEADER
            compressed = True
    if cfg.esp:
        cipher, integ = cfg.esp
        ct = esp_ciphertext(cipher, payload)
        if cipher.kind == "cbc" or cipher.kind == "aead":
            stages["cipher"] = _ceil_to(ct, cipher.work_block)
        if cipher.kind == "gmac":
            # GHASH over SPI, sequence number, IV and the plaintext (RFC 4543: all AAD).
            stages["mac"] = _ceil_to(ESP_HEADER + cipher.iv + ct, 16)
        if integ.name != "null":
            # HMAC over ESP header + IV + ciphertext (RFC 4303 §3.3.2).
            stages["mac"] = _hash_work(integ, ESP_HEADER + cipher.iv + ct)
        payload = ESP_HEADER + cipher.iv + ct + (cipher.icv or integ.icv)
        if lay.udp_encap:
            payload += UDP_ENCAP
    if cfg.ah:
        ah = ah_length(cfg.ah, lay.ip_version)
        covered = lay.ip_header + ah + payload  # RFC 4302 §3.3.3: the whole packet
        if cfg.ah.iv:  # GMAC: GHASH blocks, no Merkle-Damgård padding
            stages["ah_mac"] = _ceil_to(covered, 16)
        else:
            stages["ah_mac"] = _hash_work(cfg.ah, covered)
        payload += ah
    if cfg.is_none:
        wire = size
    elif lay.mode == "transport":
        wire = head + payload
    else:
        wire = lay.ip_header + payload
    return PacketPlan(size, wire, compressed, stages)


def wireguard_overhead(lay: Layout) -> int:
    """What WireGuard adds to a packet besides its padding: the outer IP header (the
    layout's outer version; the inner's where it says transport, host to host), UDP, the
    data message's header and Poly1305's tag — 60 bytes over IPv4, 80 over IPv6."""
    version = lay.outer if lay.mode == "tunnel" else lay.inner
    ip = IPV4_HEADER if version == 4 else IPV6_HEADER
    return ip + UDP_ENCAP + WG_HEADER + WG_TAG


def _wireguard_plan(size: int, lay: Layout) -> PacketPlan:
    """WireGuard carries the whole packet (it has no transport mode) zero-padded to 16
    bytes but not past the device's MTU (`lay.tunnel_mtu`, when given), in a transport
    data message in UDP (whitepaper §5.4.6); the outer IP header is the layout's outer
    version (the inner's where the layout says transport: host to host)."""
    padded = _ceil_to(size, WG_PAD)
    if lay.tunnel_mtu is not None:
        padded = min(padded, max(size, lay.tunnel_mtu))
    wire = wireguard_overhead(lay) + padded
    chacha = CIPHERS["chacha20poly1305"]
    return PacketPlan(size, wire, False, {"cipher": _ceil_to(padded, chacha.work_block)})


def wire_size(cfg: Configuration, size: int, layout: Layout | None = None) -> int:
    """Bytes of the IP packet on the wire for one inner packet of ``size`` bytes
    (incompressible data for IPComp)."""
    return packet_plan(cfg, size, layout).wire


# --- the secured length in the forms the CLI accepts --------------------------------------


@dataclass(frozen=True)
class SecuredLength:
    """L_alg(L): one of the paper's forms or a configuration's precise form."""

    spec: str
    kind: str  # "ip", "esp", "ah", "config"
    block: int = 0
    config: Configuration | None = None
    layout: Layout = Layout()

    def __call__(self, size: int) -> int:
        if self.kind == "ip":
            return size
        if self.kind == "esp":  # eq. 6
            return math.ceil((size + ESP_TRAILER) / self.block) * self.block
        if self.kind == "ah":  # eq. 5, IPv4, HMAC-xxx-96
            return math.ceil((size + PAPER_AH_L_IP + PAPER_AH_L_AH) / self.block) * self.block
        assert self.config is not None
        return packet_plan(self.config, size, self.layout).l_alg

    def wire(self, size: int) -> int | None:
        """Wire size when the form names a configuration (None for the paper's forms)."""
        if self.config is None:
            return None
        return wire_size(self.config, size, self.layout)


def parse_lalg(spec: str, layout: Layout | None = None) -> SecuredLength:
    """``ip``, ``esp:B``, ``ah:B`` or a configuration (``esp:aes128-sha1``, ...)."""
    s = spec.strip().lower()
    lay = layout or Layout()
    if s == "ip":
        return SecuredLength(spec, "ip", layout=lay)
    proto, _, rest = s.partition(":")
    if proto in ("esp", "ah") and rest.isdigit():
        b = int(rest)
        if b % 4 or not 4 <= b <= 256:
            # ESP pads its trailer to 4-byte alignment at least (RFC 4303 §2.4), AH its
            # header to 32 bits (RFC 4302 §2.2): no other block can occur.
            why = ("ESP pads to a multiple of 4 bytes (RFC 4303 §2.4): 4 for GCM and "
                   "ChaCha20, 8 for 3DES, 16 for AES-CBC") if proto == "esp" else (
                   "AH aligns to 32 bits (RFC 4302 §2.2): 4 for IPv4, 8 for IPv6")  # fmt: skip
            raise ConfigError(
                f"--lalg {spec!r}: the block must be a multiple of 4 from 4 to 256 bytes; {why}"
            )
        return SecuredLength(spec, proto, b, layout=lay)
    try:
        cfg = parse_configuration(s)
    except ConfigError as e:
        raise ConfigError(
            f"--lalg {spec!r} is not a secured-length form: use ip, esp:BLOCK, ah:BLOCK "
            f"(the paper's eq. 6 and 5) or a configuration such as esp:aes128-sha1 ({e})"
        ) from None
    if cfg.is_none:
        raise ConfigError(f"--lalg {spec!r}: no IPsec means no secured length; use ip")
    return SecuredLength(spec, "config", config=cfg, layout=lay)
