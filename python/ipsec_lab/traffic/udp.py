"""The udp and imix workloads: a fixed-size UDP stream or a simple IMIX at an offered
rate, sent by the campaign's generator (`traffic.generator`: udp-gso, else trafgen, where
a paced one can go, else iperf3)."""

from __future__ import annotations

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.interface import Testbed
from ipsec_lab.traffic import Metered, Row
from ipsec_lab.traffic.generator import for_workload, noted
from ipsec_lab.traffic.iperf import SIMPLE_IMIX
from ipsec_lab.traffic.workload import Kind, Workload

# A fixed-rate trial is the generator's when it sent under this share of the rate asked
# and the path lost (all but) none of it.
SENT_SHORT = 0.95
LOSS_NONE_PCT = 0.01


def bounded(row: Row) -> Row:
    """Say whether a fixed-rate row's figure is the generator's (`generator_bound`)."""
    offered, sent = row.get("offered_mbps"), row.get("sent_mbps")
    if offered and sent is not None:
        row["generator_bound"] = bool(
            sent < SENT_SHORT * offered and (row.get("loss_pct") or 0.0) <= LOSS_NONE_PCT
        )
    return row


def udp(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    gen = for_workload(tb, flow, w)
    try:
        if warmup_s > 0:
            gen.trial(w.size, w.rate_mbit, max(warmup_s, 1))
        return [
            metered(w.name, lambda: bounded(noted(gen.trial(w.size, w.rate_mbit, w.seconds), gen)))
        ]
    finally:
        gen.close()


def imix(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    """Simple IMIX at `rate_mbit` offered in all: 7 : 4 : 1 packets of 40, 576 and 1500
    bytes — udp-gso and trafgen send them interleaved, iperf3 as three concurrent streams (and its
    40-byte packets as 44)."""
    gen = for_workload(tb, flow, w)

    def run() -> Row:
        row = gen.mix(SIMPLE_IMIX, w.rate_mbit, w.seconds)
        small = row.get("mix_sizes", [s for s, _ in SIMPLE_IMIX])
        row["mix"] = "simple IMIX 7:4:1 of " + "/".join(map(str, small)) + " B"
        return bounded(noted(row, gen))

    try:
        return [metered(w.name, run)]
    finally:
        gen.close()


GENERATED_KEYS = frozenset({"generator", "flows"})  # every generated UDP kind's


def _seconds(w: Workload, rate_mbit: float) -> float:
    return w.seconds


UDP = Kind(
    "udp",
    "fixed-size UDP at `rate_mbit` for `seconds` (udp-gso, trafgen or iperf3)",
    frozenset({"seconds", "size", "rate_mbit"}) | GENERATED_KEYS,
    lambda c: udp(c.tb, c.flow, c.workload, c.meters, c.warmup_s),
    _seconds,
    generated=lambda w: True,
    without_df=True,
    spreads=True,
)
IMIX = Kind(
    "imix",
    "simple IMIX (7 : 4 : 1 packets of 40, 576 and 1500 bytes) at `rate_mbit`",
    frozenset({"seconds", "rate_mbit"}) | GENERATED_KEYS,
    lambda c: imix(c.tb, c.flow, c.workload, c.meters, c.warmup_s),
    _seconds,
    generated=lambda w: True,
    without_df=True,
    spreads=True,
    article="an",
)
