"""`plan`'s sources of costs: a `Source` planned at the asked size or mix, and the
sources a lab campaign gives (the gateways measured at that size or mix; the per-packet +
per-byte fit over the sizes it measured, or the range those sizes allow)."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from ipsec_lab.cli.args import UserError, lab_dir
from ipsec_lab.model.plan import CycleCosts, Plan
from ipsec_lab.model.sizing import (
    SAME_SIZE,
    SIZING_SCENARIO,
    CostPoint,
    fit_costs,
    mean_size,
    measured_at,
    one_size_bounds,
    point_of,
    sizes_of,
)
from ipsec_lab.model.throughput import FitError
from ipsec_lab.model.transforms import parse_configuration
from ipsec_lab.units import plural


@dataclass
class Source:
    """One way of knowing the costs, planned at the asked size or mix."""

    name: str  # how the verdict names it
    costs: CycleCosts
    bound: str  # what its figure is: measured, predicted, an upper bound on rate
    detail: str
    split: bool = True  # False: a total per packet at the mix, not per packet + per byte
    bytes_only: bool = False  # a cost per byte of bulk TCP: none per packet was measured
    other: CycleCosts | None = None  # the cheap end of what the data allow (costs: the dear)
    se_cycles: float | None = None  # one standard error of the mix's cycles per packet
    fit: dict[str, Any] | None = None
    upper_bound: bool = False  # the engine alone: a bound on rate, never the answer

    def plans(self, args: argparse.Namespace, mix: Mix) -> dict[str, Any]:
        plan = Plan(self.costs, mix, args.target_mbps, args.max_load)
        ends: list[Plan] = []
        if self.other is not None:
            ends = [Plan(self.other, mix, args.target_mbps, args.max_load)]
        elif self.se_cycles:
            for d in (-self.se_cycles, self.se_cycles):
                c = self.costs
                shifted = CycleCosts(
                    max(c.cycles_per_packet + d, 0.0), c.cycles_per_byte, c.lalg, c.mhz
                )
                if shifted.cycles(round(mean_size(mix))) > 0:  # else: open at that end
                    ends.append(Plan(shifted, mix, args.target_mbps, args.max_load))
        rates = sorted([plan.per_core_mbps] + [e.per_core_mbps for e in ends])
        doc: dict[str, Any] = {
            "name": self.name,
            "costs_are": self.bound,
            "upper_bound": self.upper_bound,
            "detail": self.detail,
            "cycles_per_packet": self.costs.cycles_per_packet if self.split else None,
            "cycles_per_byte": (
                self.costs.cycles_per_byte if self.split or self.bytes_only else None
            ),
            "per_core_mbps": plan.per_core_mbps,
            "cores": plan.cores,
            "per_core_mbps_range": [rates[0], rates[-1]] if ends else None,
            "cores_range": None,
        }
        if ends and plan.cores is not None:
            cores = sorted([plan.cores] + [e.cores or 0 for e in ends])
            doc["cores_range"] = [cores[0], cores[-1]]
            if self.other is not None:  # a range, no one figure: plan for its worst end
                doc["cores"] = cores[-1]
        if self.other is not None:
            doc["per_core_mbps"] = rates[0]
        # cycles per packet at the mix: clock x bits per packet / Mbit/s of one core
        per_packet = self.costs.mhz * 8 * mean_size(mix)
        doc["cycles_per_packet_at_mix"] = per_packet / doc["per_core_mbps"]
        doc["cycles_per_packet_at_mix_range"] = (
            [per_packet / rates[-1], per_packet / rates[0]] if ends else None
        )
        doc["range_is"] = (
            None if not ends else "what the sizes allow" if self.other else "one standard error"
        )
        if self.fit:
            doc["fit"] = self.fit
        return doc


Mix = tuple[tuple[int, float], ...]


def _campaign_points(args: argparse.Namespace) -> tuple[list[CostPoint], list[float], str]:
    """The cost points of a campaign's one (backend, configuration), its bulk TCP efforts
    (µs/kB, both gateways) and what they are."""
    from ipsec_lab.store import Store

    db = lab_dir(args) / "results.sqlite"
    if not db.exists():
        raise UserError(f"--campaign: no results in {db} (give --lab DIR)")
    store = Store(db)
    try:
        if store.campaign(args.campaign) is None:
            raise UserError(f"--campaign {args.campaign}: no such campaign in {db}")
        runs = [r for r in store.runs(args.campaign) if r["status"] == "done"]
    finally:
        store.close()
    if args.backend:
        runs = [r for r in runs if r["backend"] == args.backend]
    if args.configuration:
        want = parse_configuration(args.configuration).text
        runs = [r for r in runs if parse_configuration(r["configuration"]).text == want]
    metered = [
        (r, x) for r in runs for x in r["results"] if (x.get("ipsec_effort_us_per_kb") or 0) > 0
    ]
    pairs = sorted({(r["backend"], r["configuration"]) for r, _ in metered})
    if not pairs:
        raise UserError(
            f"--campaign {args.campaign}: no run with the IPsec processes' CPU measured"
            + (f" for {args.configuration}" if args.configuration else "")
        )
    if len(pairs) > 1:
        raise UserError(
            f"--campaign {args.campaign} has several: "
            + ", ".join(f"{b} {c}" for b, c in pairs)
            + "; choose with --backend and --configuration"
        )
    points = [p for _, x in metered if (p := point_of(x)) is not None]
    # bulk TCP: a row of neither a size nor a mix (nor latency, soak or an application's)
    other = ("size", "mix", "load_pct", "held", "file_bytes")
    tcp = [float(x["ipsec_effort_us_per_kb"]) for _, x in metered if not any(k in x for k in other)]
    b, c = pairs[0]
    return points, tcp, f"campaign {args.campaign}, {b} {c}"


def campaign_sources(args: argparse.Namespace, mhz: float, mix: Mix) -> list[Source]:
    points, tcp, what = _campaign_points(args)
    if not points:
        if not tcp:
            raise UserError(
                f"--campaign {args.campaign}: {what} measured no packet size the plan can "
                f"use (latency and soak run at light load); run {SIZING_SCENARIO}"
            )
        if args.mix or args.size is not None:
            raise UserError(
                f"--campaign {args.campaign}: {what} measured bulk TCP only, which its "
                "gateways handle in GSO batches of up to 64 KB rather than packets: it says "
                "nothing of the cost per packet, so it cannot plan a --size or --mix. Run "
                f"`sudo ipsec-lab run {SIZING_SCENARIO}` (a size sweep, a few minutes) and "
                "plan from that campaign"
            )
        us_per_kb = statistics.median(tcp)
        per_gw = us_per_kb / 2  # µs per kB of payload, both gateways: half is one's
        detail = (
            f"{what}, bulk TCP, {plural(len(tcp), 'measurement')}: {us_per_kb:.3g} µs/kB "
            f"for both gateways' IPsec processes, {per_gw:.3g} per gateway (TUN and "
            "socket costs included; the kernel's own forwarding is not)"
        )
        return [
            Source(
                "the gateways measured (bulk TCP)",
                CycleCosts.flat(per_gw * mhz / 1024, 0.0, mhz),
                "measured: the lab's gateways with bulk TCP (GSO batches), TUN, "
                "sockets and all; not a per-packet figure",
                detail,
                split=False,
                bytes_only=True,
            )
        ]
    out: list[Source] = []
    mean = mean_size(mix)
    at = measured_at(points, mix)
    if at:
        us = statistics.median(p.us for p in at)
        # per byte of what was delivered (a mix's delivered mean moves with its loss)
        got = statistics.median(p.size for p in at)
        out.append(
            Source(
                "the gateways measured",
                CycleCosts.flat(us * mhz / got, 0.0, mhz),
                "measured: the lab's gateways at this size or mix, TUN, sockets and all",
                f"{what}: {us:.3g} µs of a gateway's IPsec CPU (the two's mean) per packet at "
                f"{'this mix' if len(mix) > 1 else f'{mix[0][0]} B'} "
                f"({plural(len(at), 'measurement')})",
                split=False,
            )
        )
    sizes = sizes_of(points)
    try:
        f = fit_costs(points)
    except FitError:
        if out:  # measured at the asked size or mix: no range to add
            return out
        # Each size measured bounds the split (both terms >= 0): from all of its cost per
        # packet to all of it per byte. Too few or too close sizes: the loosest of those.
        ends, said = [], []
        for size in sizes:
            near = statistics.median(p.us for p in points if abs(p.size - size) <= size * SAME_SIZE)
            said.append(f"{near:.3g} µs per packet at {size:.0f} B")
            for pk, by in one_size_bounds(near, size):
                ends.append(CycleCosts.flat(by * mhz, pk * mhz, mhz))
        # planned at the dear end (the least a core carries); the cheap end is the other
        ends.sort(key=lambda c: Plan(c, mix, None, 1.0).per_core_mbps)
        shown = ", ".join(f"{x:.0f}" for x in sizes)
        out.append(
            Source(
                "the model (sizes measured: a range)",
                ends[0],
                f"what the sizes allow: {what} measured {shown} B, which cannot separate "
                "per-packet from per-byte cost; from all per packet to all per byte "
                f"(one answer: run {SIZING_SCENARIO})",
                f"{what}: " + ", ".join(said),
                split=False,
                other=ends[-1],
            )
        )
        return out
    a, b = f.us_per_packet, f.us_per_byte
    se = f.us_se(mean)
    warn = ""
    if a < 0 or b < 0:
        warn = (
            f"; the fit's {'per-packet' if a < 0 else 'per-byte'} term came out below 0 "
            "(the sizes' costs are not on a line: noisy or load-dependent), taken as 0"
        )
    fit_doc = f.to_json()
    out.append(
        Source(
            "the model (t_fix + per byte, fitted)",
            CycleCosts.flat(max(b, 0.0) * mhz, max(a, 0.0) * mhz, mhz),
            "predicted: study 2's two terms fitted to the lab's gateways at "
            + ", ".join(f"{s:.0f}" for s in sizes)
            + " B",
            f"{what}: {a:.3g} µs per packet + {b * 1024:.3g} µs per kB of packet, a gateway's "
            f"IPsec CPU (the two's mean), least squares over "
            f"{plural(len(points), 'measurement')}{warn}{_beyond(mix, sizes)}",
            se_cycles=None if se is None else se * mhz,
            fit=fit_doc,
        )
    )
    return out


def _beyond(mix: Mix, sizes: list[float]) -> str:
    """A note when the asked sizes lie outside those the fit saw (an extrapolation)."""
    asked = [s for s, w in mix if w > 0]
    if min(asked) >= sizes[0] * (1 - SAME_SIZE) and max(asked) <= sizes[-1] * (1 + SAME_SIZE):
        return ""
    return (f"; extrapolated: {min(asked)}-{max(asked)} B asked, "
            f"{sizes[0]:.0f}-{sizes[-1]:.0f} B measured")  # fmt: skip
