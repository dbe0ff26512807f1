"""A gateway's CPU cost per packet as study 2 splits it: a fixed part per packet (t_fix)
plus a part per byte, fitted to what a lab campaign measured at more than one packet size.

A campaign's rows give the IPsec processes' CPU per kB of payload (`ipsec_effort_us_per_kb`)
at a size (fixed-size UDP, an RFC 2544 search) or at a mix's mean size (IMIX: with a cost
linear in the size, a mix's mean cost per packet is the cost at its mean size). Least
squares over those points gives µs per packet + µs per byte with their standard errors; one
size alone cannot separate the two terms, and bulk TCP (handled in GSO batches of up to
64 KB, not packets) says nothing of either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ipsec_lab.model.throughput import FitError

IPV4_UDP = 28  # the lab's UDP generators: IPv4 + UDP headers in front of the payload
SIZING_SCENARIO = "scenarios/sizing.toml"
MIN_SPREAD = 2.0  # the largest size at least this many times the smallest


@dataclass(frozen=True)
class CostPoint:
    """One measurement: a gateway's IPsec CPU per packet (the mean of the two gateways')
    at a (mean) inner packet size."""

    size: float  # inner IP packet bytes (a mix: its mean)
    us: float  # µs of CPU per packet, a gateway's: the mean of the two
    what: str  # the measurement's label
    mix: tuple[tuple[int, float], ...] | None = None  # the mix, where it was one

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"size": self.size, "us_per_packet": self.us, "label": self.what}
        if self.mix:
            doc["mix"] = [{"size": s, "weight": w} for s, w in self.mix]
        return doc


def mean_size(mix: Iterable[tuple[int, float]]) -> float:
    items = list(mix)
    return sum(s * w for s, w in items) / sum(w for _, w in items)


def point_of(row: dict[str, Any], gateways: int = 2) -> CostPoint | None:
    """The cost point of one measurement's row (None: the row is not one — TCP, latency,
    soak, or no IPsec CPU metered). The effort is both gateways'; a point is one's."""
    eff = row.get("ipsec_effort_us_per_kb")
    if not eff or eff <= 0:
        return None
    if "load_pct" in row or "held" in row or "data" in row or "file_bytes" in row:
        return None  # latency (light load), soak, bulk TCP (GSO), applications
    label = str(row.get("label", ""))
    if row.get("mix"):
        sent, lost = row.get("sent_packets"), row.get("lost_packets")
        got = (sent or 0) - (lost or 0)
        if not row.get("payload_bytes") or got <= 0:
            return None
        per_packet = float(row["payload_bytes"]) / got
        sizes = row.get("mix_sizes") or [40, 576, 1500]
        weights = (7, 4, 1)[: len(sizes)]
        mix = tuple((int(s), float(w)) for s, w in zip(sizes, weights, strict=False))
        return CostPoint(per_packet + IPV4_UDP, eff * per_packet / 1024 / gateways, label, mix)
    size = row.get("size")
    if not size or size <= IPV4_UDP:
        return None
    return CostPoint(float(size), eff * (size - IPV4_UDP) / 1024 / gateways, label)


@dataclass(frozen=True)
class CostFit:
    """µs per packet = us_per_packet + us_per_byte x size, fitted (least squares)."""

    us_per_packet: float
    us_per_byte: float
    var_packet: float | None  # None: as many points as terms, no spread to estimate
    var_byte: float | None
    cov: float | None
    points: tuple[CostPoint, ...]

    def us(self, size: float) -> float:
        return self.us_per_packet + self.us_per_byte * size

    def us_se(self, size: float) -> float | None:
        """Standard error of the cost at `size` (a mix: at its mean size)."""
        if self.var_packet is None or self.var_byte is None or self.cov is None:
            return None
        v = self.var_packet + size * size * self.var_byte + 2 * size * self.cov
        return math.sqrt(max(v, 0.0))

    def to_json(self) -> dict[str, Any]:
        def se(v: float | None) -> float | None:
            return None if v is None else math.sqrt(max(v, 0.0))

        return {
            "us_per_packet": self.us_per_packet,
            "us_per_byte": self.us_per_byte,
            "us_per_packet_se": se(self.var_packet),
            "us_per_byte_se": se(self.var_byte),
            "points": [p.to_json() for p in self.points],
        }


SAME_SIZE = 0.05  # sizes within 5 % are one size (an IMIX's delivered mean moves with loss)


def sizes_of(points: Sequence[CostPoint]) -> list[float]:
    """The distinct sizes measured, each a group of sizes within `SAME_SIZE` (its median)."""
    groups: list[list[float]] = []
    for x in sorted(p.size for p in points):
        if groups and x <= groups[-1][0] * (1 + SAME_SIZE):
            groups[-1].append(x)
        else:
            groups.append([x])
    return [g[len(g) // 2] for g in groups]


def fit_costs(points: Sequence[CostPoint]) -> CostFit:
    """Least squares of per-packet cost on size (every repetition a point). Needs two sizes
    at least, the largest `MIN_SPREAD` x the smallest; with more points than two sizes the
    residuals give the terms' standard errors."""
    sizes = sizes_of(points)
    if len(sizes) < 2:
        raise FitError(
            f"one packet size measured ({sizes[0]:.0f} B): one size cannot separate the "
            f"per-packet from the per-byte cost (run {SIZING_SCENARIO})"
            if sizes
            else "no measurement with the IPsec processes' CPU at a packet size"
        )
    if sizes[-1] < MIN_SPREAD * sizes[0]:
        raise FitError(
            f"sizes {sizes[0]:.0f}-{sizes[-1]:.0f} B are too close to separate the "
            f"per-packet from the per-byte cost (the largest should be at least "
            f"{MIN_SPREAD:g} x the smallest; run {SIZING_SCENARIO})"
        )
    n = len(points)
    xs = [p.size for p in points]
    ys = [p.us for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if n > 2:
        s2 = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2)
        var_b = s2 / sxx
        var_a = s2 * (1 / n + mx * mx / sxx)
        cov = -mx * var_b
        return CostFit(a, b, var_a, var_b, cov, tuple(points))
    return CostFit(a, b, None, None, None, tuple(points))


def same_mix(
    a: Iterable[tuple[int, float]], b: Iterable[tuple[int, float]], slack: int = 4
) -> bool:
    """Whether two mixes are the same (weights normalised; sizes within `slack` bytes:
    iperf3 sends IMIX's 40-byte packets as 44)."""
    xa, xb = sorted((s, w) for s, w in a if w > 0), sorted((s, w) for s, w in b if w > 0)
    if len(xa) != len(xb):
        return False
    ta, tb = sum(w for _, w in xa), sum(w for _, w in xb)
    return all(
        abs(sa - sb) <= slack and abs(wa / ta - wb / tb) < 1e-3
        for (sa, wa), (sb, wb) in zip(xa, xb, strict=True)
    )


def measured_at(points: Sequence[CostPoint], mix: Sequence[tuple[int, float]]) -> list[CostPoint]:
    """The points measured at exactly the asked size or mix."""
    mix = [(s, w) for s, w in mix if w > 0]
    if len(mix) == 1:
        return [p for p in points if p.mix is None and round(p.size) == mix[0][0]]
    return [p for p in points if p.mix is not None and same_mix(p.mix, mix)]


def one_size_bounds(
    point_us: float, size: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """What one size allows: (µs per packet, µs per byte) all per packet, and all per byte.
    Any split with both terms >= 0 lies between, and so does its cost at every size."""
    return (point_us, 0.0), (0.0, point_us / size)
