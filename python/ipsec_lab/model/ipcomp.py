"""The IPComp advisor: does compressing before ESP pay, for this data on this link?

Study 1 found both answers: at 10 Mbit/s, compressible data went *faster* than the link
allows without IPsec (the CPU was the limit, but fewer bytes crossed the link), while at
100 Mbit/s IPComp slowed everything (the CPU limit fell far below the link). Study 3 says
the same: compression pays only when the link, not the CPU, is the bottleneck.

The advisor makes that a calculation. Per inner kB (1024 bytes) it adds up CPU effort
(µs/kB) for forwarding, for DEFLATE on every packet at or above the minimum size
(RFC 3173 §2.2: a packet that does not shrink is still paid for, then sent as it was) and
for ESP on what comes out of IPComp; the CPU then allows ``8192 / effort`` Mbit/s. The link
allows ``link rate * inner bytes / wire bytes``, the wire bytes counted per packet from
the real compressed sizes and the configuration's headers. Throughput is the smaller of
the two, and the limit is named.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipsec_lab.model.transforms import (
    IPCOMP_DEFAULT_MIN,
    IPCOMP_HEADER,
    CompressedLen,
    Configuration,
    Layout,
    packet_plan,
    parse_configuration,
)

KB = 1024
DEFAULT_WBITS = 11  # Linux's IPComp DEFLATE window (crypto/deflate.c, DEFLATE_DEF_WINBITS)
DEFAULT_LEVEL = 6  # zlib's default level
ETHERNET_HEADER = 14  # what tc and a capture count per frame on Ethernet/veth


class AdviceError(ValueError):
    """Input the IPComp advisor cannot use, saying what is wrong."""


def deflate_raw(data: bytes, wbits: int = DEFAULT_WBITS, level: int = DEFAULT_LEVEL) -> bytes:
    """Raw DEFLATE (no zlib header), as RFC 2394 §2 puts it in an IPComp payload."""
    # zlib cannot write a raw stream with an 8-bit window; it uses 9 bits instead.
    c = zlib.compressobj(level, zlib.DEFLATED, -max(wbits, 9))
    return c.compress(data) + c.flush()


@dataclass
class Compressibility:
    """Per-packet DEFLATE results over a sample, as IPComp would see them."""

    sizes: list[int] = field(default_factory=list)  # inner packet sizes
    out: list[int | None] = field(default_factory=list)  # compressed size, None = not sent so
    too_small: int = 0
    incompressible: int = 0
    compressed: int = 0
    min_size: int = IPCOMP_DEFAULT_MIN
    source: str = ""

    @property
    def packets(self) -> int:
        return len(self.sizes)

    @property
    def bytes_in(self) -> int:
        return sum(self.sizes)

    @property
    def compress_input(self) -> int:
        """Bytes DEFLATE ran over (every packet at or above the minimum size)."""
        return sum(s for s in self.sizes if s >= self.min_size)

    @property
    def bytes_after(self) -> int:
        """Bytes leaving IPComp (IPComp header included where a packet was compressed)."""
        return sum(s if c is None else c + IPCOMP_HEADER for s, c in zip(self.sizes, self.out))

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_in

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "packets": self.packets,
            "min_size": self.min_size,
            "compressed": self.compressed,
            "incompressible": self.incompressible,
            "too_small": self.too_small,
            "bytes_in": self.bytes_in,
            "bytes_after_ipcomp": self.bytes_after,
            "ratio": self.ratio,
            "reduction_pct": 100 * (1 - self.ratio),
        }


def measure(
    packets: Iterable[bytes],
    min_size: int = IPCOMP_DEFAULT_MIN,
    wbits: int = DEFAULT_WBITS,
    level: int = DEFAULT_LEVEL,
    source: str = "",
) -> Compressibility:
    """Compress each packet on its own (IPComp is stateless per datagram, RFC 3173 §2.2)."""
    if not 8 <= wbits <= 15:
        raise AdviceError(f"window bits {wbits}: DEFLATE allows 8 to 15")
    r = Compressibility(min_size=min_size, source=source)
    for p in packets:
        r.sizes.append(len(p))
        if len(p) < min_size:
            r.too_small += 1
            r.out.append(None)
            continue
        c = len(deflate_raw(p, wbits, level))
        if c + IPCOMP_HEADER < len(p):
            r.compressed += 1
            r.out.append(c)
        else:
            r.incompressible += 1
            r.out.append(None)
    if not r.sizes:
        raise AdviceError("the sample holds no packets")
    return r


def published(ratio: float, size: int, packets: int = 1000, source: str = "") -> Compressibility:
    """A sample described by a published figure: every packet of ``size`` bytes shrinks to
    ``ratio`` of its size (ratio >= 1: nothing compresses)."""
    r = Compressibility(min_size=0, source=source)
    for _ in range(packets):
        r.sizes.append(size)
        c = round(size * ratio) - IPCOMP_HEADER
        if ratio < 1 and c + IPCOMP_HEADER < size:
            r.compressed += 1
            r.out.append(c)
        else:
            r.incompressible += 1
            r.out.append(None)
    return r


def _ip_tcp_header(total: int, seq: int) -> bytes:
    """An IPv4 + TCP header (20 + 20 bytes) for a data segment; checksums left zero,
    as they do not change what DEFLATE finds in the payload."""
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, total, seq & 0xFFFF, 0x4000, 64, 6, 0,
        bytes([10, 1, 0, 2]), bytes([10, 2, 0, 2]),
    )  # fmt: skip
    tcp = struct.pack("!HHIIBBHHH", 80, 40000, seq & 0xFFFFFFFF, 1, 0x50, 0x18, 502, 0, 0)
    return ip + tcp


def packetize(data: bytes, packet_size: int = 1500) -> list[bytes]:
    """Cut a byte stream into IPv4/TCP packets of ``packet_size`` bytes (the last shorter),
    as a bulk transfer would put it on the inner side of a gateway."""
    if packet_size < 41:
        raise AdviceError(f"packet size {packet_size}: needs room for 40 header bytes + data")
    mss = packet_size - 40
    out = []
    for off in range(0, len(data), mss):
        chunk = data[off : off + mss]
        out.append(_ip_tcp_header(40 + len(chunk), off) + chunk)
    return out


@dataclass(frozen=True)
class Costs:
    """CPU effort in µs per kB (1024 B): forwarding per inner kB, ESP per kB entering ESP,
    DEFLATE per kB it runs over (compressed or not)."""

    forward_us_per_kb: float
    esp_us_per_kb: float
    compress_us_per_kb: float
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "forward_us_per_kb": self.forward_us_per_kb,
            "esp_us_per_kb": self.esp_us_per_kb,
            "compress_us_per_kb": self.compress_us_per_kb,
            "source": self.source,
        }


def time_compression(
    packets: Sequence[bytes],
    min_size: int = IPCOMP_DEFAULT_MIN,
    wbits: int = DEFAULT_WBITS,
    level: int = DEFAULT_LEVEL,
    repeats: int = 5,
    budget_s: float = 2.0,
) -> float:
    """DEFLATE effort on this sample here, µs per kB of input: the median of ``repeats``
    passes (zlib from C through Python; the per-call overhead is under 1 µs)."""
    work = [p for p in packets if len(p) >= min_size]
    if not work:
        return 0.0
    nbytes = sum(len(p) for p in work)
    # Keep each pass bounded in time on big samples.
    one = time.perf_counter()
    deflate_raw(work[0], wbits, level)
    per = max(time.perf_counter() - one, 1e-7) * len(work)
    if per * repeats > budget_s:
        keep = max(1, int(len(work) * budget_s / (per * repeats)))
        work = work[:keep]
        nbytes = sum(len(p) for p in work)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for p in work:
            deflate_raw(p, wbits, level)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2] * 1e6 / (nbytes / KB)


@dataclass
class Case:
    name: str
    effort_us_per_kb: float
    cpu_mbps: float | None  # None: no CPU limit known for this case
    link_mbps: float  # inner Mbit/s the link allows
    wire_bytes: int  # bytes on the link for the whole sample

    @property
    def mbps(self) -> float:
        return self.link_mbps if self.cpu_mbps is None else min(self.cpu_mbps, self.link_mbps)

    @property
    def limit(self) -> str:
        return "link" if self.cpu_mbps is None or self.link_mbps <= self.cpu_mbps else "cpu"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mbps": self.mbps,
            "limit": self.limit,
            "cpu_mbps": self.cpu_mbps,
            "link_mbps": self.link_mbps,
            "effort_us_per_kb": self.effort_us_per_kb,
            "wire_bytes": self.wire_bytes,
        }


@dataclass
class Advice:
    link_rate_mbps: float
    esp: str
    sample: Compressibility
    costs: Costs
    cases: list[Case]

    def case(self, name: str) -> Case:
        return next(c for c in self.cases if c.name == name)

    @property
    def gain_pct(self) -> float:
        """IPComp + ESP over ESP alone, in % of throughput."""
        return 100 * (self.case("ipcomp+esp").mbps / self.case("esp").mbps - 1)

    @property
    def verdict(self) -> str:
        with_c, without = self.case("ipcomp+esp"), self.case("esp")
        if self.gain_pct > 1:
            why = (
                "the link is the bottleneck without it and compression shrinks what crosses it"
                if without.limit == "link"
                else "it moves fewer bytes through ESP than it costs to compress them"
            )
            return f"IPComp pays: {self.gain_pct:+.1f} % throughput ({why})."
        if with_c.limit == "cpu":
            why = (
                f"DEFLATE costs {self.costs.compress_us_per_kb:.3g} µs/kB and the CPU becomes "
                f"the bottleneck at {with_c.mbps:.4g} Mbit/s"
            )
        else:
            why = "the data does not compress enough to matter"
        return f"IPComp does not pay: {self.gain_pct:+.1f} % throughput ({why})."

    def to_json(self) -> dict[str, Any]:
        return {
            "link_mbps": self.link_rate_mbps,
            "esp": self.esp,
            "sample": self.sample.to_json(),
            "costs": self.costs.to_json(),
            "cases": [c.to_json() for c in self.cases],
            "gain_pct": self.gain_pct,
            "verdict": self.verdict,
        }


def _fixed(c: int | None) -> CompressedLen:
    return lambda _n: c


def advise(
    sample: Compressibility,
    costs: Costs,
    link_mbps: float,
    esp: str = "esp:aes128-sha1",
    layout: Layout | None = None,
    l2_bytes: int = ETHERNET_HEADER,
) -> Advice:
    """Throughput with no IPsec, with ESP, and with IPComp + ESP, and what limits each."""
    if link_mbps <= 0:
        raise AdviceError("link rate must be positive")
    esp_cfg = parse_configuration(esp)
    if esp_cfg.ipcomp or esp_cfg.esp is None:
        raise AdviceError(f"{esp!r}: give the ESP layer alone, e.g. esp:aes128-sha1")
    both = Configuration(f"ipcomp+{esp}", True, esp_cfg.esp, esp_cfg.ah)
    lay = layout or Layout()
    n_in = sample.bytes_in

    def wire(cfg: Configuration, with_out: bool) -> int:
        total = 0
        for s, c in zip(sample.sizes, sample.out):
            # The sample already applied the minimum size: pass 0 so none is re-applied.
            plan = packet_plan(cfg, s, lay, _fixed(c) if with_out else None, 0)
            total += plan.wire + l2_bytes
        return total

    def case(name: str, effort: float, wire_bytes: int, cpu_known: bool) -> Case:
        cpu = 8 * KB / effort if cpu_known and effort > 0 else None
        return Case(name, effort, cpu, link_mbps * n_in / wire_bytes, wire_bytes)

    fwd = costs.forward_us_per_kb
    none = case("none", fwd, sum(s + l2_bytes for s in sample.sizes), fwd > 0)
    e_esp = fwd + costs.esp_us_per_kb
    esp_case = case("esp", e_esp, wire(esp_cfg, False), True)
    e_both = (
        fwd
        + costs.compress_us_per_kb * sample.compress_input / n_in
        + costs.esp_us_per_kb * sample.bytes_after / n_in
    )
    both_case = case("ipcomp+esp", e_both, wire(both, True), True)
    return Advice(link_mbps, esp, sample, costs, [none, esp_case, both_case])
