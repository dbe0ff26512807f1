"""Capacity planning: cycles per packet and per byte, cores for a target rate, and the
FreeS/WAN "MHz per Mbit/s" table (study 3) regenerated from a measurement.

A synchronous model's two terms become CPU cycles at clock f:
``cycles_per_packet = t_fix * f`` and ``cycles_per_byte = f / R_alg`` (per byte of secured
length), so a packet of L bytes costs ``cycles_per_packet + cycles_per_byte * L_alg(L)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ipsec_lab.model.throughput import SyncModel
from ipsec_lab.model.transforms import SecuredLength, parse_lalg

# Study 3 (FreeS/WAN performance notes): Pentium II cycles per byte from the NAI work, and
# the rule of thumb that came of them.
FREESWAN_CYCLES_PER_BYTE = {
    "Linux IP stack alone": 5.0,
    "IPsec without crypto": 11.0,
    "IPsec, HMAC-SHA-1 only": 24.0,
    "IPsec, 3DES + HMAC": 140.0,
}
FREESWAN_MHZ_PER_MBPS = 25.0  # "MHz needed ~ 25 x link Mbit/s" (140 cycles/byte + margin)

# Links of the rule-of-thumb table, nominal line rates in Mbit/s.
LINKS: tuple[tuple[str, float], ...] = (
    ("DSL / cable", 1.5),
    ("T1", 1.544),
    ("E1", 2.048),
    ("Ethernet", 10.0),
    ("T3", 44.736),
    ("Fast Ethernet", 100.0),
    ("OC3", 155.52),
    ("Gigabit Ethernet", 1000.0),
    ("10 Gigabit Ethernet", 10000.0),
)


def cpu_mhz_here() -> float | None:
    """The clock /proc/cpuinfo reports (nominal on most VMs; turbo may run faster)."""
    from ipsec_lab.environment import cpu_mhz

    return cpu_mhz()


@dataclass(frozen=True)
class CycleCosts:
    """Cycles per packet plus cycles per byte of secured length."""

    cycles_per_packet: float
    cycles_per_byte: float
    lalg: SecuredLength
    mhz: float  # the clock the cycles were counted at (one core)

    @classmethod
    def from_model(cls, model: SyncModel, mhz: float) -> CycleCosts:
        return cls(
            cycles_per_packet=model.t_fix_ms * 1e-3 * mhz * 1e6,
            cycles_per_byte=mhz * 1e6 / (model.r_alg_mbps * 1e6 / 8),
            lalg=model.lalg,
            mhz=mhz,
        )

    @classmethod
    def flat(cls, cycles_per_byte: float, cycles_per_packet: float, mhz: float) -> CycleCosts:
        """Costs quoted per byte of packet (as FreeS/WAN's), with L_alg = L."""
        return cls(cycles_per_packet, cycles_per_byte, parse_lalg("ip"), mhz)

    def cycles(self, size: int) -> float:
        return self.cycles_per_packet + self.cycles_per_byte * self.lalg(size)

    def cycles_per_inner_byte(self, size: int) -> float:
        """The figure FreeS/WAN quoted: all cycles of a packet over its bytes."""
        return self.cycles(size) / size

    def per_core_mbps(self, mix: Iterable[tuple[int, float]]) -> float:
        items = list(mix)
        n = sum(w for _, w in items)
        cyc = sum(w * self.cycles(s) for s, w in items) / n
        size = sum(w * s for s, w in items) / n
        return size * 8 * self.mhz / cyc  # bytes/packet * packets/µs... -> Mbit/s

    def mhz_for(self, mbps: float, mix: Iterable[tuple[int, float]]) -> float:
        """Clock (one core, MHz) needed to secure ``mbps`` of this mix."""
        items = list(mix)
        n = sum(w for _, w in items)
        cyc = sum(w * self.cycles(s) for s, w in items) / n
        size = sum(w * s for s, w in items) / n
        pps = mbps * 1e6 / 8 / size
        return pps * cyc / 1e6


@dataclass
class Plan:
    costs: CycleCosts
    mix: tuple[tuple[int, float], ...]
    target_mbps: float | None
    max_load: float

    @property
    def per_core_mbps(self) -> float:
        return self.costs.per_core_mbps(self.mix)

    @property
    def cores(self) -> int | None:
        if self.target_mbps is None:
            return None
        return math.ceil(self.target_mbps / (self.per_core_mbps * self.max_load) - 1e-9)

    def table(self) -> list[dict[str, Any]]:
        """Study 3's table: the clock each link needs, by the old rule and by ours."""
        rows = []
        for name, rate in LINKS:
            mhz = self.costs.mhz_for(rate, self.mix)
            rows.append(
                {
                    "link": name,
                    "mbps": rate,
                    "rule_mhz": FREESWAN_MHZ_PER_MBPS * rate,
                    "freeswan_3des_mhz": rate * FREESWAN_CYCLES_PER_BYTE["IPsec, 3DES + HMAC"] / 8,
                    "ours_mhz": mhz,
                    "cores_here": math.ceil(mhz / (self.costs.mhz * self.max_load) - 1e-9),
                }
            )
        return rows

    def to_json(self) -> dict[str, Any]:
        mean = sum(s * w for s, w in self.mix) / sum(w for _, w in self.mix)
        return {
            "lalg": self.costs.lalg.spec,
            "cpu_mhz": self.costs.mhz,
            "cycles_per_packet": self.costs.cycles_per_packet,
            "cycles_per_byte": self.costs.cycles_per_byte,
            "cycles_per_inner_byte": sum(
                w * self.costs.cycles_per_inner_byte(s) for s, w in self.mix
            )
            / sum(w for _, w in self.mix),
            "mix": [{"size": s, "weight": w} for s, w in self.mix],
            "mean_size": mean,
            "per_core_mbps": self.per_core_mbps,
            "max_load": self.max_load,
            "target_mbps": self.target_mbps,
            "cores": self.cores,
            "mhz_per_mbps": self.costs.mhz_for(1.0, self.mix),
            "rule_mhz_per_mbps": FREESWAN_MHZ_PER_MBPS,
            "links": self.table(),
        }
