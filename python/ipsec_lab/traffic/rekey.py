"""Rekey under load (issue 44 item 4): a constant offered rate for `minutes` while the
IPsec under test rolls every SA over to fresh keys every `rekey_s` seconds, and what each
rollover cost the traffic — the packets lost around it and its *effective blocked time*
(FD.io CSIT's: packets lost ÷ offered packet rate).

The load is one paced stream (udp-gso or trafgen: their own count of what left, the
flow's nftables counter of what arrived) at `load_pct` of the campaign's NDR (a search
first when none is stored) or at `rate_mbit`. The run is cut into intervals of `rekey_s`,
each read in two halves: the first the control (no rekey: what the load loses anyway —
on a small shared machine 50 % of a short search's NDR is not always loss-free), the
second with a rollover at its start. A half's loss is what left against what arrived,
less what is in flight across its edges (20 ms of traffic); its blocked time that loss
over the packet rate — resolved to one packet's time, which the row states — and the
rekeys' excess over the controls is the rekey's own.

A backend rekeys as it would in service: `ours` by a make-before-break rollover the lab
drives through SIGHUP reloads (`backends/ours_rekey.py`), each step confirmed in both
gateways' SA lists before the next. Backends that cannot are skipped with the reason.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import READY_S, Testbed
from ipsec_lab.traffic import Metered, Row, rfc2544
from ipsec_lab.traffic.generator import for_workload, noted
from ipsec_lab.traffic.latency import Background
from ipsec_lab.traffic.paced import Paced, delivered
from ipsec_lab.traffic.soak import IN_FLIGHT_S, STREAM_MARGIN_S, NdrLookup, rate_for
from ipsec_lab.traffic.workload import Context, Kind, Workload

Rekey = Callable[[], Row]  # one rollover of every SA; its figures


def rekey(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float,
          roll: Rekey | None, ndr: NdrLookup | None = None,
          minutes: float | None = None) -> list[Row]:  # fmt: skip
    """One row: the rollovers' cost to the traffic, every interval in `series`.
    `minutes` overrides the workload's (`run --quick`)."""
    if roll is None:  # the runner gives the backend's (which refuses with Unsupported)
        raise LabError("rekey: no rollover of the backend's SAs to drive")
    total_s = 60 * (minutes if minutes is not None else w.minutes)
    n = max(1, round(total_s / w.rekey_s))  # intervals, each a control half, then a rekey
    gen = for_workload(tb, flow, w)
    try:
        if not isinstance(gen, Paced):
            raise LabError("rekey: needs a paced generator (udp-gso or trafgen), whose count "
                           "of what left can be read mid-stream; iperf3's cannot")  # fmt: skip
        if warmup_s > 0:
            gen.trial(w.size, min(w.max_rate_mbit, 10.0), max(warmup_s, 1))
        rate, how = rate_for(gen, w, ndr)
        if rate <= 0:
            raise LabError(f"rekey: no rate to offer ({how})")
        return [metered(w.name, lambda: noted(_run(gen, w, roll, rate, how, n), gen))]
    finally:
        gen.close()


def _run(gen: Paced, w: Workload, roll: Rekey, rate: float, how: str, n: int) -> Row:
    pps = max(1, round(rate * 1e6 / (8 * w.size)))
    total = n * w.rekey_s
    since = gen.left_so_far()  # the warm-up's packets went through the same bucket
    bg = Background(lambda: gen.trial(w.size, rate, total + STREAM_MARGIN_S))
    series: list[Row] = []
    try:
        gen.until_sending(since, bg.thread.is_alive, READY_S)
        if not bg.thread.is_alive():
            bg.result(0)  # its error, if it failed
        t0 = time.monotonic()
        last = (t0, gen.sent(), gen.received())

        def half(until: float) -> Row:
            """Sleep till `until` (since t0), then the half-interval since `last`."""
            nonlocal last
            time.sleep(max(t0 + until - time.monotonic(), 0))
            t, s1, (r1, b1) = time.monotonic(), gen.sent(), gen.received()
            t_, s0, (r0, b0) = last
            got, _ = delivered(r1 - r0, b1 - b0, ((w.size, 1),))
            last = (t, s1, (r1, b1))
            return {"seconds": t - t_, **interval(s1 - s0, got, pps)}

        for i in range(n):
            control = half((i + 0.5) * w.rekey_s)  # the first half: no rekey
            x: Row = {"index": i, "rekey_at_s": time.monotonic() - t0}
            r = roll()
            x["rekey_seconds"], x["rekey_step_seconds"] = r["seconds"], r["step_seconds"]
            x["spis"] = [f"0x{s:08x}" for s in r["spis"]]
            x.update(half((i + 1) * w.rekey_s))
            x["control"] = control
            x["t_s"] = time.monotonic() - t0
            series.append(x)
            if not bg.thread.is_alive():
                raise LabError(f"rekey: the stream ended after {i + 1} of {n} rekeys")
    finally:
        bg.result(total * 2 + 60)
    return row(w, series, rate, how, pps)


def interval(sent: int, got: int, pps: int) -> Row:
    """A half-interval's loss — beyond what is in flight across its edges — and the
    time it blocked the traffic (the loss at the offered packet rate)."""
    lost = max(sent - got - pps * IN_FLIGHT_S, 0.0)
    return {"sent_packets": sent, "received_packets": got, "lost_packets": round(lost),
            "blocked_ms": 1e3 * lost / pps}  # fmt: skip


def row(w: Workload, series: list[Row], rate: float, how: str, pps: int) -> Row:
    """The rekey row from its intervals: each a control half (no rekey) and the half
    with the rekey, the same length, so the load's own loss is measured beside it."""
    controls = [s["control"] for s in series]
    halves = [*series, *controls]
    blocked = [float(s["blocked_ms"]) for s in series]
    lost = sum(int(s["lost_packets"]) for s in series)
    lost_control = sum(int(c["lost_packets"]) for c in controls)
    sent = sum(int(s["sent_packets"]) for s in halves)
    got = sum(int(s["received_packets"]) for s in halves)
    secs = sum(float(s["seconds"]) for s in halves)
    took = [float(s["rekey_seconds"]) for s in series]
    n = len(series)
    return {
        "size": w.size, "offered_mbps": rate, "rate_source": how, "offered_pps": pps,
        "rekey_s": w.rekey_s, "rekeys": n, "minutes": secs / 60,
        "rekeyed_by": "make-before-break rollover by the lab (3 reloads of each gateway)",
        "sent_packets": sent, "received_packets": got,
        "lost_packets": lost, "control_lost_packets": lost_control,
        "blocked_ms_per_rekey_median": statistics.median(blocked) if blocked else None,
        "blocked_ms_per_rekey_max": max(blocked) if blocked else None,
        "blocked_ms_control": 1e3 * lost_control / pps / n if n else None,
        # what the rekeys lost beyond what as much time without one did: the rekey's
        # own blocked time once the load's loss is taken out (negative: within noise)
        "blocked_ms_per_rekey_excess": 1e3 * (lost - lost_control) / pps / n if n else None,
        # one packet's time: the finest blocked time the count can show; what is in
        # flight across a half's edge (IN_FLIGHT_S of traffic) is not counted lost
        "blocked_resolution_ms": 1e3 / pps, "in_flight_allowance_ms": 1e3 * IN_FLIGHT_S,
        "rekey_seconds_median": statistics.median(took) if took else None,
        "loss_pct": 100.0 * max(sent - got, 0) / sent if sent else 100.0,
        "seconds": secs, "mbps": got * w.size * 8 / secs / 1e6 if secs else 0.0,
        "payload_bytes": got * (w.size - 28), "series": series,
    }  # fmt: skip


def _run_kind(c: Context) -> list[Row]:
    return rekey(c.tb, c.flow, c.workload, c.meters, c.warmup_s, c.rekey,
                 c.searched("ndr_mbps"), c.soak_minutes)  # fmt: skip


KEYS = frozenset({
    "minutes", "rekey_s", "load_pct", "rate_mbit", "size", "generator", "flows",
}) | rfc2544.SEARCH_KEYS  # fmt: skip
REKEY = Kind(
    "rekey",
    "`minutes` at `load_pct` of the NDR (or `rate_mbit`) while every SA is rekeyed every "
    "`rekey_s`: packets lost and the blocked time per rekey",
    KEYS,
    _run_kind,
    lambda w, rate_mbit: w.minutes * 60 + 5,
    generated=lambda w: True,
    spreads=True,  # over the scenario's tunnels, each of them rekeyed
)
