"""Rekey under load (issue 44 item 4): a constant offered rate for `minutes` while the
IPsec under test rolls every SA over to fresh keys every `rekey_s` seconds, and what the
rollovers cost the traffic — the packets lost and the *effective blocked time* (FD.io
CSIT's: packets lost ÷ offered packet rate), per rekey.

The load is a paced stream (udp-gso or trafgen) at `load_pct` of the campaign's NDR (a
search first when none is stored) or at `rate_mbit`: first a control stream as long as
three rekey intervals with no rekey (what the load loses anyway — on a small shared
machine 50 % of a short search's NDR is not always loss-free), then the stream with a
rollover at the middle of every interval. Each stream's loss is exact: what left the
pacing bucket against what the sink's counter had once the path emptied. The rekeys'
blocked time is the rekey stream's loss at the offered packet rate, divided by the
rekeys (resolved to one packet's time); the excess is that beyond the control's loss
rate. Mid-stream the two counters are read by programs in two namespaces, milliseconds
apart: an interval's `missing_packets` (signed) says where loss fell, to within some
30 ms of traffic either way, and is no figure of the row.

A backend rekeys as it would in service: `ours` by a make-before-break rollover the lab
drives through SIGHUP reloads (`backends/ours_rekey.py`), each step confirmed in both
gateways' SA lists before the next. Backends that cannot are skipped with the reason,
before anything is sent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed
from ipsec_lab.traffic import Metered, Row, rfc2544
from ipsec_lab.traffic.generator import for_workload, noted
from ipsec_lab.traffic.paced import Paced, delivered
from ipsec_lab.traffic.soak import NdrLookup, rate_for, stream
from ipsec_lab.traffic.workload import Context, Kind, Workload

Rekey = Callable[[bool], Row]  # one rollover of every SA (True: only refuse); its figures


def rekey(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float,
          roll: Rekey | None, ndr: NdrLookup | None = None,
          minutes: float | None = None) -> list[Row]:  # fmt: skip
    """One row: the rollovers' cost to the traffic, every rekey in `series`. `roll(dry)`:
    the backend's rollover (`dry`: only refuse, with Unsupported, if it has none).
    `minutes` overrides the workload's (`run --quick`)."""
    if roll is None:  # the runner gives the backend's (which refuses with Unsupported)
        raise LabError("rekey: no rollover of the backend's SAs to drive")
    roll(True)  # refused here, before a search and a stream for nothing
    total_s = 60 * (minutes if minutes is not None else w.minutes)
    n = max(1, round(total_s / w.rekey_s))  # intervals, a rekey in the middle of each
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

        def run() -> Row:
            control = gen.trial(w.size, rate, CONTROL_INTERVALS * w.rekey_s)
            return _run(gen, w, roll, rate, how, n, control)

        return [metered(w.name, lambda: noted(run(), gen))]
    finally:
        gen.close()


CONTROL_INTERVALS = 3  # the control stream: as long as this many rekey intervals
STREAM_MARGIN_S = 0.5  # the rekey stream runs this much past its last interval's edge


def _run(gen: Paced, w: Workload, roll: Rekey, rate: float, how: str, n: int,
         control: Row) -> Row:  # fmt: skip
    pps = max(1, round(rate * 1e6 / (8 * w.size)))
    total = n * w.rekey_s
    bg = stream(gen, w.size, rate, total + STREAM_MARGIN_S)
    series: list[Row] = []
    try:
        t0 = time.monotonic()
        last = reading(gen, w.size)
        for i in range(n):
            time.sleep(max(t0 + (i + 0.5) * w.rekey_s - time.monotonic(), 0))
            x: Row = {"index": i, "rekey_at_s": time.monotonic() - t0}
            r = roll(False)
            x["rekey_seconds"], x["rekey_step_seconds"] = r["seconds"], r["step_seconds"]
            x["spis"] = [f"0x{s:08x}" for s in r["spis"]]
            time.sleep(max(t0 + (i + 1) * w.rekey_s - time.monotonic(), 0))
            now = reading(gen, w.size)
            x.update({"t_s": now[0] - t0, "seconds": now[0] - last[0],
                      "sent_packets": now[1] - last[1],
                      "missing_packets": now[1] - last[1] - round(now[2] - last[2])})  # fmt: skip
            last = now
            series.append(x)
            if not bg.thread.is_alive():
                raise LabError(f"rekey: the stream ended after {i + 1} of {n} rekeys")
    finally:
        done = bg.result(total * 2 + 60)
    return row(w, series, rate, how, pps, done, control)


def reading(gen: Paced, size: int) -> tuple[float, int, float]:
    """(when, packets the bucket let out, packets the sink had counted then): the sink
    read just before and just after the bucket, taken at the bucket's read by linear
    interpolation (each read is a program in a namespace, milliseconds long)."""
    ta = time.monotonic()
    ra = delivered(*gen.received(), ((size, 1),))[0]
    tb = time.monotonic()
    sent = gen.sent()
    tc = time.monotonic()
    rb = delivered(*gen.received(), ((size, 1),))[0]
    td = time.monotonic()
    ma, ms, mb = (ta + tb) / 2, (tb + tc) / 2, (tc + td) / 2
    got = ra + (rb - ra) * (ms - ma) / (mb - ma) if mb > ma else float(rb)
    return ms, sent, got


def row(w: Workload, series: list[Row], rate: float, how: str, pps: int, stream: Row,
        control: Row) -> Row:  # fmt: skip
    """The rekey row: the rekey stream's and the control's exact loss (each a paced
    trial: sent against what the sink had once the path emptied), per rekey."""
    n = len(series)
    lost, sent = int(stream["lost_packets"]), int(stream["sent_packets"])
    c_lost, c_sent = int(control["lost_packets"]), int(control["sent_packets"])
    # the control's loss rate over as many packets as the rekey stream sent
    expected = c_lost * sent / c_sent if c_sent else 0.0
    took = [float(x["rekey_seconds"]) for x in series]
    secs = float(stream["seconds"])
    got = sent - lost
    return {
        "size": w.size, "offered_mbps": rate, "rate_source": how, "offered_pps": pps,
        "rekey_s": w.rekey_s, "rekeys": n, "minutes": secs / 60,
        "rekeyed_by": "make-before-break rollover by the lab (3 reloads of each gateway)",
        "sent_packets": sent, "received_packets": got, "lost_packets": lost,
        "control_sent_packets": c_sent, "control_lost_packets": c_lost,
        "control_seconds": float(control["seconds"]),
        "blocked_ms_per_rekey": 1e3 * lost / pps / n if n else None,
        # beyond what the load loses anyway (the control's rate): the rekeys' own
        # (negative: within the load's own loss)
        "blocked_ms_per_rekey_excess": 1e3 * (lost - expected) / pps / n if n else None,
        "blocked_resolution_ms": 1e3 / pps,  # one packet's time: the finest it can show
        "rekey_seconds_median": statistics.median(took) if took else None,
        "loss_pct": 100.0 * lost / sent if sent else 100.0,
        "seconds": secs, "mbps": float(stream.get("mbps") or got * w.size * 8 / secs / 1e6),
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
