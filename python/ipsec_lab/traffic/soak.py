"""Soak: a constant offered rate for minutes, recorded interval by interval — delivered
rate, loss, latency percentiles, the IPsec processes' memory and CPU — and judged as a
whole: did loss stay within the tolerance in every interval, and how fast did the
resident memory grow (FD.io CSIT soaks 30 minutes; a gateway that leaks or drifts shows
nothing in 5-second trials).

The load is the campaign's UDP generator at `load_pct` of the NDR the campaign measured
for the configuration (a search first when none is stored) or at `rate_mbit`. With a
paced generator (udp-gso, trafgen) it is one paced stream for the whole soak and each
interval's loss is what left
the source (the pacing bucket's own count) against what reached the sink (the flow's
nftables counter); packets in flight across an interval's edge (20 ms of traffic) are not
loss. With iperf3 (where neither can go) each interval is its own trial, a fraction
of a second apart. Beside it, irtt probes each interval (every `probe_interval_ms`,
10 ms unless given).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import READY_S, Testbed
from ipsec_lab.traffic import Metered, Meters, Row, rfc2544
from ipsec_lab.traffic.generator import Generator, for_workload, noted
from ipsec_lab.traffic.latency import (
    Background,
    Probe,
    histogram_percentile,
    probes_row,
    same_clock,
)
from ipsec_lab.traffic.paced import Paced, delivered
from ipsec_lab.traffic.workload import Context, Kind, Lookup, Workload

IN_FLIGHT_S = 0.02  # traffic in flight across an interval's edge: not counted as loss
PROBE_SHARE = 0.7  # of each interval the probes run (their last replies awaited after)
STREAM_MARGIN_S = 2.0  # the stream runs this much past the last interval's edge
HOUR_S = 3600.0

# Where a workload finds the NDR already measured: (size) -> (Mbit/s, where from) or None.
NdrLookup = Lookup  # (Mbit/s, where from) of an NDR at a size
# The IPsec processes' (CPU s, resident bytes) so far, summed over every node (None: the
# backend runs none the lab can read).
Procs = Callable[[], tuple[float, int] | None]


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) points, per hour; None under 2."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if not sxx:
        return None
    return sum((t - mx) * (v - my) for t, v in points) / sxx * HOUR_S


def judge(series: list[Row], tolerance_pct: float) -> Row:
    """The soak's verdict from its intervals: held (every interval's loss within the
    tolerance), the first interval that was not (index from 0, and its end time), the RSS
    growth per hour (least squares over the intervals' readings)."""
    bad = [i for i, s in enumerate(series) if float(s["loss_pct"]) > tolerance_pct]
    rss = [(float(s["t_s"]), float(s["ipsec_rss_bytes"])) for s in series
           if s.get("ipsec_rss_bytes") is not None]  # fmt: skip
    out: Row = {
        "held": not bad and bool(series),
        "failed_intervals": len(bad),
        "first_failed_interval": bad[0] if bad else None,
        "first_failed_at_s": series[bad[0]]["t_s"] if bad else None,
        "rss_growth_bytes_per_hour": slope_per_hour(rss),
        "rss_first_bytes": rss[0][1] if rss else None,
        "rss_last_bytes": rss[-1][1] if rss else None,
    }
    return out


def _interval(sent: int, got: int, got_bytes: int, secs: float, pps: float) -> Row:
    """One interval's figures: loss beyond what is in flight across its edges."""
    lost = max(sent - got - pps * IN_FLIGHT_S, 0.0)
    return {"sent_packets": sent, "received_packets": got,
            "loss_pct": 100.0 * lost / sent if sent else 100.0,
            "mbps": got_bytes * 8 / secs / 1e6 if secs else 0.0}  # fmt: skip


def rate_for(gen: Generator, w: Workload, ndr: NdrLookup | None) -> tuple[float, str]:
    """The offered rate: `rate_mbit`, or `load_pct` of the campaign's NDR (or of one a
    search finds here first)."""
    if w.load_pct is None:
        return w.rate_mbit, "rate_mbit"
    found = ndr(w.size) if ndr else None
    if found is None:
        r = rfc2544.search(lambda rate: rfc2544.loss_trial(gen, w.size, rate, w.trial_s),
                           w.max_rate_for(w.size), w.resolution_for(w.size), 0.0,
                           w.max_trials)  # fmt: skip
        bound = ", generator-bound" if r.generator_bound else ""
        found = (r.rate_mbps, f"searched here ({len(r.trials)} trials{bound})")
    return found[0] * w.load_pct / 100, f"{w.load_pct:g} % of NDR {found[0]:.4g} Mbit/s, {found[1]}"


def soak(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float,
         ndr: NdrLookup | None = None, minutes: float | None = None) -> list[Row]:  # fmt: skip
    """One row: the soak's verdict and every interval (`series`). `minutes` overrides
    the workload's (`run --quick`)."""
    procs: Procs | None = metered.procs if isinstance(metered, Meters) else None
    total_s = 60 * (minutes if minutes is not None else w.minutes)
    n = max(1, round(total_s / w.interval_s))
    gen = for_workload(tb, flow, w)
    probe = Probe(tb, flow)
    try:
        if warmup_s > 0:
            gen.trial(w.size, min(w.max_rate_mbit, 10.0), max(warmup_s, 1))
        rate, how = rate_for(gen, w, ndr)
        if rate <= 0:
            raise LabError(f"soak: no rate to offer ({how})")
        if isinstance(gen, Paced):  # the load beside the probes: no GSO, nice (paced)
            gen.beside_probes()

        def run() -> Row:
            if isinstance(gen, Paced):
                series = _stream(gen, tb, w, probe, procs, rate, n)
            else:
                series = _trials(gen, tb, w, probe, procs, rate, n)
            return _row(w, series, rate, how)

        return [metered(w.name, lambda: noted(run(), gen))]
    finally:
        probe.close()
        gen.close()


def _row(w: Workload, series: list[Row], rate: float, how: str) -> Row:
    hist: dict[int, int] = {}
    for s in series:
        for k, c in s.pop("histogram", []):
            hist[k] = hist.get(k, 0) + c
    merged = [[k, hist[k]] for k in sorted(hist)]
    secs = sum(float(s["seconds"]) for s in series)
    got_bytes = sum(int(s.pop("received_bytes")) for s in series)
    row: Row = {
        "size": w.size, "offered_mbps": rate, "rate_source": how, "minutes": secs / 60,
        "interval_s": w.interval_s, "intervals": len(series),
        "loss_tolerance_pct": w.loss_tolerance_pct,
        "sent_packets": sum(int(s["sent_packets"]) for s in series),
        "lost_packets": sum(max(int(s["sent_packets"]) - int(s["received_packets"]), 0)
                            for s in series),
        "payload_bytes": got_bytes - 28 * sum(int(s["received_packets"]) for s in series),
        "seconds": secs, "mbps": got_bytes * 8 / secs / 1e6 if secs else 0.0,
        "histogram": merged, "series": series,
        **judge(series, w.loss_tolerance_pct),
    }  # fmt: skip
    row["loss_pct"] = (
        100.0 * row["lost_packets"] / row["sent_packets"] if row["sent_packets"] else 100.0
    )
    if merged:
        for p, key in ((50, "rtt_p50_us"), (99, "rtt_p99_us"), (99.9, "rtt_p99_9_us")):
            row[key] = histogram_percentile(merged, p) / 1e3
    return row


def _probe_figures(data: dict[str, Any], same: bool) -> Row:
    p = probes_row(data, same)
    keep = ("rtt_p50_us", "rtt_p99_us", "rtt_max_us", "probe_loss_pct", "histogram")
    return {k: p[k] for k in keep if k in p}


def _procs_now(procs: Procs | None) -> tuple[float, int] | None:
    return procs() if procs else None


def _stream(gen: Paced, tb: Testbed, w: Workload, probe: Probe, procs: Procs | None,
            rate: float, n: int) -> list[Row]:  # fmt: skip
    """One paced stream (udp-gso or trafgen) for the whole soak, read at every interval's end (the
    intervals' edges fixed on the clock; each interval's probes end before its edge)."""
    pps = max(1, round(rate * 1e6 / (8 * w.size)))
    total = n * w.interval_s
    same = same_clock(tb)
    probe_s, wait_s = w.interval_s * PROBE_SHARE, min(w.interval_s * 0.15, 1.0)
    bg = stream(gen, w.size, rate, total + STREAM_MARGIN_S)
    series: list[Row] = []
    try:
        t0 = last = time.monotonic()
        s0, (r0, b0), q0 = gen.sent(), gen.received(), _procs_now(procs)
        for i in range(n):
            data = probe.run(probe_s, w.probe_interval_ms, w.probe_bytes, wait_s)
            time.sleep(max(t0 + (i + 1) * w.interval_s - time.monotonic(), 0))
            t = time.monotonic()
            s1, (r1, b1), q1 = gen.sent(), gen.received(), _procs_now(procs)
            got, got_bytes = delivered(r1 - r0, b1 - b0, ((w.size, 1),))
            x = {"index": i, "t_s": t - t0, "seconds": t - last,
                 **_interval(s1 - s0, got, got_bytes, t - last, pps),
                 "received_bytes": got_bytes, **_probe_figures(data, same)}  # fmt: skip
            if q0 is not None and q1 is not None:
                x["ipsec_cpu_s"], x["ipsec_rss_bytes"] = q1[0] - q0[0], q1[1]
            series.append(x)
            s0, r0, b0, q0, last = s1, r1, b1, q1, t
            if not bg.thread.is_alive():
                raise LabError(f"soak: the stream ended after {i + 1} of {n} intervals")
    finally:
        bg.result(total * 2 + 60)
    return series


def stream(gen: Paced, size: int, rate: float, seconds: float) -> Background:
    """One paced stream of `seconds` in the background, once its bucket lets packets
    out (what went before — a warm-up, a control — went through the same bucket); its
    error raised here if it failed at once. The caller waits for its result."""
    since = gen.left_so_far()
    bg = Background(lambda: gen.trial(size, rate, seconds))
    try:
        gen.until_sending(since, bg.thread.is_alive, READY_S)
        if not bg.thread.is_alive():
            bg.result(0)  # its error, if it failed
    except BaseException:
        bg.result(seconds * 2 + 60)
        raise
    return bg


def _trials(gen: Generator, tb: Testbed, w: Workload, probe: Probe, procs: Procs | None,
            rate: float, n: int) -> list[Row]:  # fmt: skip
    """One trial per interval (iperf3: no stream to read mid-way), probes beside it."""
    same = same_clock(tb)
    series: list[Row] = []
    t0 = time.monotonic()
    q0 = _procs_now(procs)
    secs = max(w.interval_s - 0.2, 0.5)
    for i in range(n):
        bg = Background(lambda: gen.trial(w.size, rate, secs))
        try:
            data = probe.run(secs * PROBE_SHARE, w.probe_interval_ms, w.probe_bytes,
                             min(secs * 0.15, 1.0))  # fmt: skip
        finally:
            t = bg.result(secs * 3 + 30)
        q1 = _procs_now(procs)
        sent = int(t.get("sender_packets") or t.get("sent_packets") or 0)
        got = sent - int(t.get("lost_packets") or 0) - int(t.get("unarrived_packets") or 0)
        ip_bytes = float(t["mbps"]) * 1e6 / 8 * float(t["seconds"])
        x = {"index": i, "t_s": time.monotonic() - t0, "seconds": float(t["seconds"]),
             "sent_packets": sent, "received_packets": got,
             "loss_pct": 100.0 * (sent - got) / sent if sent else 100.0,
             "mbps": float(t["mbps"]), "received_bytes": int(ip_bytes),
             **_probe_figures(data, same)}  # fmt: skip
        if q0 is not None and q1 is not None:
            x["ipsec_cpu_s"], x["ipsec_rss_bytes"] = q1[0] - q0[0], q1[1]
        series.append(x)
        q0 = q1
    return series


def _run(c: Context) -> list[Row]:
    return soak(c.tb, c.flow, c.workload, c.meters, c.warmup_s, c.searched("ndr_mbps"),
                c.soak_minutes)  # fmt: skip


KEYS = frozenset({
    "minutes", "load_pct", "rate_mbit", "interval_s", "size", "loss_tolerance_pct",
    "probe_interval_ms", "probe_bytes", "generator", "flows",
}) | rfc2544.SEARCH_KEYS  # fmt: skip
SOAK = Kind(
    "soak",
    "`minutes` at `load_pct` of the NDR (or `rate_mbit`), every interval's loss, delay "
    "and the IPsec processes' CPU and memory",
    KEYS,
    _run,
    lambda w, rate_mbit: w.minutes * 60 + 5,
    tools=lambda w: ("irtt",),
    generated=lambda w: True,
)
