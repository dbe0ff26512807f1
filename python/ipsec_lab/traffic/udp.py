"""The udp and imix workloads: a fixed-size UDP stream or a simple IMIX at an offered
rate, sent by the campaign's generator (`traffic.generator`: trafgen where it can go,
else iperf3)."""

from __future__ import annotations

from ipsec_lab.scenario import Workload
from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.traffic import Metered, Row
from ipsec_lab.traffic.generator import for_workload, noted
from ipsec_lab.traffic.iperf import SIMPLE_IMIX


def udp(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    gen = for_workload(tb, flow, w)
    try:
        if warmup_s > 0:
            gen.trial(w.size, w.rate_mbit, max(warmup_s, 1))
        return [metered(w.name, lambda: noted(gen.trial(w.size, w.rate_mbit, w.seconds), gen))]
    finally:
        gen.close()


def imix(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    """Simple IMIX at `rate_mbit` offered in all: 7 : 4 : 1 packets of 40, 576 and 1500
    bytes — trafgen sends them interleaved, iperf3 as three concurrent streams (and its
    40-byte packets as 44)."""
    gen = for_workload(tb, flow, w)

    def run() -> Row:
        row = gen.mix(SIMPLE_IMIX, w.rate_mbit, w.seconds)
        small = row.get("mix_sizes", [s for s, _ in SIMPLE_IMIX])
        row["mix"] = "simple IMIX 7:4:1 of " + "/".join(map(str, small)) + " B"
        return noted(row, gen)

    try:
        return [metered(w.name, run)]
    finally:
        gen.close()
