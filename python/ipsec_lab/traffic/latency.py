"""Latency under load: a probe stream beside a background load, one row per load.

The probe is `irtt` (Debian `irtt`): isochronous UDP round trips at a fixed interval, each
stamped by the client and by the server on both clocks, so every probe gives its RTT
(without the server's own processing time) and both one-way delays; its JSON holds every
round trip, so percentiles and the histogram come from the probes themselves, not from a
tool's summary. (sockperf's under-load mode gives percentiles too, but one-way figures only
through its own clock exchange and no per-probe record; netperf's TCP_RR measures a
transaction, not a packet.) One-way delays need the two ends' clocks to agree: in the
namespace testbed they are one clock; on real hosts they are as good as the hosts' sync
(`hosts check` reports each clock's offset), and each row says which.

The background is the campaign's UDP generator (a paced one where it can go) at `loads`
percent of the PDR the same campaign measured for the configuration, or — none stored —
of the PDR a search run here first finds (FD.io CSIT measures latency at 0, 10, 50 and
90 % of its PDR); or bulk TCP, four streams each way (`background = "tcp"`, as flent's
RRUL loads the path). Every percentile is recomputable from the row's histogram
(`histogram`, HDR-style: log-spaced buckets 1 % wide).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import READY_S, Testbed, on_hosts
from ipsec_lab.traffic import BACKGROUND_NICE, Metered, Row, rfc2544, wait_listening
from ipsec_lab.traffic.generator import Generator, for_workload, noted
from ipsec_lab.traffic.iperf import PORT, Servers
from ipsec_lab.traffic.paced import Paced
from ipsec_lab.traffic.workload import Kind, Lookup, Workload

IRTT_PORT = 2112
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# The histogram's buckets: the first 1 µs wide from 0, then each 1 % wider than the last
# (a percentile read back from it is within 0.5 % of the probes' own).
HIST_FLOOR_NS = 1000
HIST_GROWTH = 1.01
# The background starts this long before the probes and ends this long after them.
LEAD_S = 0.5
# How long the probe client waits for the last replies (irtt --wait).
WAIT_S = 1.0

# The data plane's clock: per IPsec node, (CPU ns, packets sealed or opened) so far.
PlaneClock = Callable[[], dict[str, tuple[int, int]]]
# Where a workload finds the PDR already measured: (size) -> (Mbit/s, where it came from),
# or None when the campaign has none for this configuration and link.
PdrLookup = Lookup  # (Mbit/s, where from) of a PDR at a size


# --- percentiles and the histogram ------------------------------------------------------


def _rank(p: float, n: int) -> int:
    """The nearest rank of percentile `p` among `n` values (1-based; 99.9 of 1000 is
    the 999th, not the 1000th a float's 999.0000000000001 would round up to)."""
    return max(1, math.ceil(round(p * n / 100, 9)))


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile `p` (0..100] of values sorted ascending."""
    if not sorted_values:
        raise ValueError("no values")
    k = _rank(p, len(sorted_values))
    return float(sorted_values[k - 1])


def bucket(v_ns: float) -> int:
    """The histogram bucket of a value in ns (0: below HIST_FLOOR_NS)."""
    if v_ns < HIST_FLOOR_NS:
        return 0
    return 1 + int(math.log(v_ns / HIST_FLOOR_NS) / math.log(HIST_GROWTH))


def bucket_bounds(k: int) -> tuple[float, float]:
    if k == 0:
        return 0.0, float(HIST_FLOOR_NS)
    lo = HIST_FLOOR_NS * HIST_GROWTH ** (k - 1)
    return lo, lo * HIST_GROWTH


def histogram(values_ns: Sequence[float]) -> list[list[int]]:
    """The values as [[bucket, count], …] (buckets in order, empty ones left out)."""
    counts: dict[int, int] = {}
    for v in values_ns:
        k = bucket(v)
        counts[k] = counts.get(k, 0) + 1
    return [[k, counts[k]] for k in sorted(counts)]


def histogram_percentile(hist: Sequence[Sequence[int]], p: float) -> float:
    """Percentile `p` read back from a histogram: the middle of the bucket that holds
    the nearest-rank value (geometric middle, 0.5 % from either edge)."""
    total = sum(int(c) for _, c in hist)
    if not total:
        raise ValueError("an empty histogram")
    rank = _rank(p, total)
    seen = 0
    for k, c in hist:
        seen += int(c)
        if seen >= rank:
            lo, hi = bucket_bounds(int(k))
            return (lo + hi) / 2 if k == 0 else math.sqrt(lo * hi)
    raise AssertionError("unreachable")


def summary(values_ns: Sequence[float], prefix: str) -> Row:
    """`prefix`_min/_p50/_p90/_p99/_p99_9/_max/_mean in µs of values in ns."""
    xs = sorted(values_ns)
    if not xs:
        return {}
    out: Row = {f"{prefix}_min_us": xs[0] / 1e3, f"{prefix}_max_us": xs[-1] / 1e3,
                f"{prefix}_mean_us": sum(xs) / len(xs) / 1e3}  # fmt: skip
    for p in PERCENTILES:
        out[f"{prefix}_p{str(p).rstrip('0').rstrip('.').replace('.', '_')}_us"] = (
            percentile(xs, p) / 1e3
        )
    return out


def probes_row(data: dict[str, Any], same_clock: bool) -> Row:
    """What irtt's JSON says of one probe run: RTT percentiles, histogram, jitter, loss,
    and (`same_clock`: both ends read one clock) the one-way delays."""
    trips = data.get("round_trips") or []
    got = [t for t in trips if t.get("lost") == "false" and "rtt" in (t.get("delay") or {})]
    rtts = [float(t["delay"]["rtt"]) for t in got]
    row: Row = {
        "probes_sent": len(trips),
        "probes_lost": len(trips) - len(got),
        "probe_loss_pct": 100.0 * (len(trips) - len(got)) / len(trips) if trips else 100.0,
        "probe_interval_ms": float(data["config"]["params"]["interval"]) / 1e6,
        "probe_bytes": int(data["config"]["params"]["length"]),
        "histogram": histogram(rtts),
        "histogram_unit": f"ns; bucket k >= 1 holds [{HIST_FLOOR_NS} x {HIST_GROWTH}^(k-1), "
                          f"{HIST_FLOOR_NS} x {HIST_GROWTH}^k), bucket 0 [0, {HIST_FLOOR_NS})",
        **summary(rtts, "rtt"),
    }  # fmt: skip
    if len(rtts) > 1:  # RFC 3550's idea: the mean change between successive probes
        row["jitter_us"] = (
            sum(abs(b - a) for a, b in itertools.pairwise(rtts)) / (len(rtts) - 1) / 1e3
        )
    if same_clock:
        row.update(summary([float(t["delay"]["send"]) for t in got if "send" in t["delay"]],
                           "one_way_up"))  # fmt: skip
        row.update(summary([float(t["delay"]["receive"]) for t in got
                            if "receive" in t["delay"]], "one_way_down"))  # fmt: skip
    row["one_way_clock"] = "one clock" if same_clock else "two hosts' clocks: one-way not kept"
    return row


# --- running it ----------------------------------------------------------------------------


class Probe:
    """irtt's server on the flow's sink for the probe's life; `run` one probe stream."""

    def __init__(self, tb: Testbed, flow: Flow) -> None:
        self.tb, self.flow = tb, flow
        self.server = tb.spawn(flow.sink, ["irtt", "server", "-b",
                                           f"{flow.sink_addr}:{IRTT_PORT}", "-i", "0",
                                           "-d", "0", "-l", "0"], "irtt-server")  # fmt: skip
        wait_listening(tb, flow.sink, IRTT_PORT, "u")

    def run(self, seconds: float, interval_ms: float, size: int,
            wait_s: float = WAIT_S) -> dict[str, Any]:  # fmt: skip
        """Probes every `interval_ms` for `seconds`, then `wait_s` for the last replies."""
        argv = ["irtt", "client", "-i", f"{interval_ms:g}ms", "-d", f"{seconds:g}s",
                "-l", str(size), "-Q", "-o", "-", f"--wait={wait_s * 1000:.0f}ms",
                f"{self.flow.sink_addr}:{IRTT_PORT}"]  # fmt: skip
        text = self.tb.run(self.flow.source, argv, timeout=seconds + wait_s + 30)
        try:
            data: dict[str, Any] = json.loads(text)
        except json.JSONDecodeError:
            raise LabError(f"irtt on {self.flow.source} gave no JSON: {text[-400:]}") from None
        return data

    def close(self) -> None:
        self.tb.stop(self.server)


class Background:
    """A load beside the probes, in a thread: `fn()` returns its row."""

    def __init__(self, fn: Callable[[], Row]) -> None:
        self.row: Row | None = None
        self.error: BaseException | None = None

        def go() -> None:
            try:
                self.row = fn()
            except BaseException as e:  # handed to the caller by `result`
                self.error = e

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def result(self, timeout: float) -> Row:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise LabError(f"the background load did not end within {timeout:g} s")
        if self.error is not None:
            raise LabError(f"the background load failed: {self.error}")
        assert self.row is not None
        return self.row


def _pdr(gen: Generator, w: Workload, lookup: PdrLookup | None) -> tuple[float, str]:
    """The PDR the loads are shares of: the campaign's, or a search's run here."""
    found = lookup(w.size) if lookup else None
    if found is not None:
        return found
    # a search on the PDR's own tolerance: the rate it finds is the PDR
    r = rfc2544.search(lambda rate: rfc2544.loss_trial(gen, w.size, rate, w.trial_s),
                       w.max_rate_for(w.size), w.resolution_for(w.size), rfc2544.PDR_LOSS_PCT,
                       w.max_trials)  # fmt: skip
    how = (
        f"searched here ({len(r.trials)} trials{', generator-bound' if r.generator_bound else ''})"
    )
    return r.rate_mbps, how


def same_clock(tb: Testbed) -> bool:
    """Whether a flow's two ends read one clock (the namespaces of one machine)."""
    return not on_hosts(tb)


def latency(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float,
            pdr: PdrLookup | None = None) -> list[Row]:  # fmt: skip
    """One row per load (udp background) or one row (tcp background)."""
    probe = Probe(tb, flow)
    same = same_clock(tb)
    try:
        if w.background == "tcp":
            return [metered(f"{w.name}-tcp", lambda: _under_tcp(tb, flow, w, probe, same))]
        gen = for_workload(tb, flow, w)
        try:
            if warmup_s > 0:
                gen.trial(w.size, min(w.max_rate_mbit, 10.0), max(warmup_s, 1))
            # no load above 0 asked: no PDR needed
            rate, source = _pdr(gen, w, pdr) if max(w.loads) > 0 else (0.0, "no load asked")
            clock = rfc2544.plane_clock(metered)
            clock = clock if clock and clock() else None  # {}: no plane to read
            if isinstance(gen, Paced):  # the backgrounds beside the probes (no GSO, nice)
                gen.beside_probes()
            rows = []
            for load in w.loads:

                def one(load: float = load) -> Row:
                    row = _under_udp(gen, w, probe, same, load, rate, source, clock)
                    return noted(row, gen)

                rows.append(metered(f"{w.name}-{load:g}%", one))
            return rows
        finally:
            gen.close()
    finally:
        probe.close()


def _under_udp(gen: Generator, w: Workload, probe: Probe, same: bool, load: float,
               pdr_mbps: float, source: str, clock: PlaneClock | None = None) -> Row:  # fmt: skip
    """The probes beside `load` % of the PDR of `w.size`-byte UDP; with the data plane's
    clock (ours), the gateways' CPU time per packet meanwhile — the model's t_S at this
    load (t_fix + L_alg / R_alg, with what waking up costs a gateway at low load), to
    read beside the one-way delay."""
    offered = pdr_mbps * load / 100
    row: Row = {"load_pct": load, "load_of_pdr_mbps": pdr_mbps, "pdr_source": source,
                "background": "udp", "size": w.size,
                "background_offered_mbps": offered}  # fmt: skip
    span = w.seconds + 2 * LEAD_S
    since = gen.left_so_far() if isinstance(gen, Paced) else 0
    bg = Background(lambda: gen.trial(w.size, offered, span)) if offered > 0 else None
    c0 = c1 = None
    try:
        if bg:
            if isinstance(gen, Paced):  # the load under way first, however long it took
                gen.until_sending(since, bg.thread.is_alive, READY_S)
                if not bg.thread.is_alive():
                    bg.result(0)  # it failed: its error, before any probe
            time.sleep(LEAD_S)
        c0 = clock() if clock else None
        data = probe.run(w.seconds, w.probe_interval_ms, w.probe_bytes)
        c1 = clock() if clock else None
    finally:
        back = bg.result(span * 3 + 30) if bg else None
    row.update(probes_row(data, same))
    if c0 and c1:
        ns = rfc2544.cpu_per_packet(c0, c1)  # summed over the gateways a packet passes
        row["plane_ns_per_packet"] = ns
        row["t_s_us"] = ns / 1e3 if ns else None
    if back:
        row.update(background_mbps=back["mbps"], background_loss_pct=back["loss_pct"],
                   background_sent_mbps=back.get("sent_mbps"))  # fmt: skip
        row["payload_bytes"] = back["payload_bytes"]
        row["seconds"] = back["seconds"]
        row["mbps"] = back["mbps"]
    else:
        row.update(payload_bytes=0, seconds=w.seconds)
    return row


def _under_tcp(tb: Testbed, flow: Flow, w: Workload, probe: Probe, same: bool) -> Row:
    """The probes beside bulk TCP, four streams each way (iperf3 --bidir)."""
    from ipsec_lab.traffic.iperf import _client, _tcp_row

    span = w.seconds + 2 * LEAD_S
    # the load at the lowest priority, as a paced one beside probes (Paced.beside_probes):
    # bulk TCP keeps the traffic CPU busy, and the probes are the instrument
    srv = Servers(tb, flow.sink, [PORT], nice=BACKGROUND_NICE)
    try:
        args = ["-p", str(PORT), "-P", "4", "--bidir", "-t", f"{span:g}"]
        bg = Background(lambda: _tcp_row(_client(tb, flow, args, span, BACKGROUND_NICE)))
        try:
            time.sleep(LEAD_S)
            data = probe.run(w.seconds, w.probe_interval_ms, w.probe_bytes)
        finally:
            back = bg.result(span * 3 + 30)
    finally:
        srv.close()
    row: Row = {"load_pct": None, "background": "tcp 4 streams each way"}
    row.update(probes_row(data, same))
    row.update(background_mbps=back["mbps"], payload_bytes=back["payload_bytes"],
               seconds=back["seconds"], mbps=back["mbps"])  # fmt: skip
    return row


def _seconds(w: Workload, rate_mbit: float) -> float:
    """Each load's probes (with their lead and wait)."""
    return (w.seconds + 2.5) * (1 if w.background == "tcp" else len(w.loads))


KEYS = frozenset({
    "seconds", "size", "loads", "background", "probe_interval_ms", "probe_bytes", "generator",
    "flows",
}) | rfc2544.SEARCH_KEYS  # fmt: skip
LATENCY = Kind(
    "latency",
    "irtt's probes (RTT, one-way delay, IPDV) beside UDP at `loads` % of the PDR, or "
    "beside bulk TCP each way (`background`)",
    KEYS,
    lambda c: latency(c.tb, c.flow, c.workload, c.meters, c.warmup_s, c.searched("pdr_mbps")),
    _seconds,
    tools=lambda w: ("irtt",),
    generated=lambda w: w.background == "udp",
)
