"""The RFC 2544 §26.1 throughput test: the highest offered rate at which no frame is lost
(or no more than a tolerance), found by binary search on the offered rate.

The search itself is pure (`search`), so it is checked without a network; `rfc2544` runs
it with iperf3 UDP trials of a fixed inner IP packet size.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed
from ipsec_lab.traffic import Metered, Meters, Row, steady
from ipsec_lab.traffic.generator import Generator, for_workload, noted
from ipsec_lab.traffic.paced import SHORT_OF_RATE
from ipsec_lab.traffic.workload import Kind, Workload


@dataclass
class SearchResult:
    rate_mbps: float  # the highest rate that passed (0.0 if none did)
    trials: list[Row] = field(default_factory=list)
    converged: bool = False  # the pass/fail bracket narrowed to the resolution
    reason: str = ""
    # the search ended below a trial the generator could not offer (it passed at what
    # the generator managed): the rate found is the generator's ceiling, the path's is
    # at least that
    generator_bound: bool = False


def search(
    trial: Callable[[float], Row],
    max_rate: float,
    resolution: float,
    tolerance_pct: float,
    max_trials: int,
    short_of_rate: float = SHORT_OF_RATE,
) -> SearchResult:
    """Binary search. `trial(rate)` returns a row with `loss_pct`; a trial passes when its
    loss is at most `tolerance_pct`. The first trial is at `max_rate` (which may pass at
    once). Stops when the bracket [passed, failed] is narrower than `resolution` or after
    `max_trials`; every trial is kept, in order, with its verdict. A trial that passed
    while its generator sent less than `short_of_rate` of the rate asked (`sent_mbps`)
    says the path carries what was sent, and nothing of the rate asked: the bracket
    becomes [sent, asked] and the search looks just above what was sent. Ending on such
    a top, the search is generator-bound: the rate found is the generator's ceiling here
    (on one machine, often because the gateways took the CPU it needed). A short trial is
    first repeated once at the same rate (marked `repeated`): one stall of the generator
    does not end a search; a second short trial there does.

    A failed trial that reports the rate it delivered (`mbps`) also gives a hint: a
    device forwards about its capacity while overloaded, so the search bisects below
    1.5 x that rate first. The hint is only a hint: when the bisection reaches it, the
    hinted top is tried itself, and if it passes the search goes on above it (a device in
    receive livelock delivers far below its loss-free rate). A search from a generous
    ceiling then needs a few trials, not one per halving of the whole range."""
    lo, hi = 0.0, max_rate
    hint = max_rate  # an untested top suggested by what failed trials delivered
    res = SearchResult(0.0)
    rate = max_rate
    repeated: set[float] = set()  # rates whose short trial was tried again
    while len(res.trials) < max_trials:
        row = dict(trial(rate))
        row["passed"] = bool(row["loss_pct"] <= tolerance_pct)
        res.trials.append(row)
        sent = None if row.get("sent_mbps") is None else float(row["sent_mbps"])
        short = row["passed"] and sent is not None and sent < short_of_rate * rate
        if short and rate not in repeated and len(res.trials) < max_trials:
            # once, the same rate again: a generator that stalled for a moment (its core
            # taken by a gateway on one machine) is not yet one that cannot send it
            repeated.add(rate)
            row["repeated"] = True
            continue
        if short and sent is not None:
            # the generator could not offer `rate`: the path carried all it sent, and
            # above that this trial says nothing — nor would any trial the generator
            # falls as short of: the bracket's top is what it could be asked for
            lo, hi = max(lo, sent), min(rate, sent / short_of_rate)
            res.rate_mbps = max(res.rate_mbps, sent)
            res.generator_bound = True  # the bracket's top: the generator's, not a loss
        elif row["passed"]:
            lo = rate
            # the loss-free rate is what was offered and carried: never above what the
            # generator sent (within `short_of_rate` of the rate asked)
            res.rate_mbps = max(res.rate_mbps, min(rate, sent) if sent else rate)
            if rate >= max_rate:
                res.converged, res.reason = True, "passed at the highest rate asked for"
                return res
        else:
            hi = rate
            res.generator_bound = False  # the bracket's top: a loss
            delivered = row.get("mbps")
            if delivered is not None:
                hint = min(hint, 1.5 * float(delivered))
        if hi - lo <= resolution:
            res.converged = True
            res.reason = f"bracket {lo:g}..{hi:g} within {resolution:g}"
            if res.generator_bound:
                res.reason = (f"generator-bound: it sent at most {res.rate_mbps:.4g} Mbit/s "
                              f"(asked for {hi:.4g}), and the path lost nothing of it")  # fmt: skip
            return res
        top = hint if lo < hint < hi else hi
        rate = top if top - lo <= resolution else (lo + top) / 2
    res.reason = f"stopped after {max_trials} trials, bracket {lo:g}..{hi:g}"
    return res


PDR_LOSS_PCT = 0.5  # FD.io CSIT's partial drop rate: at most 0.5 % of packets lost


def partial_drop_rate(trials: list[Row], loss_pct: float = PDR_LOSS_PCT) -> float:
    """The PDR from a search's own trials: the highest offered rate whose loss was at
    most `loss_pct` (0.0 if none). The search bisects on the NDR's tolerance, so this is
    a lower bound of the true PDR — the trials between the NDR and the first failure
    that lost little count, none is run for it alone."""
    ok = [
        min(float(t["offered_mbps"]), float(t.get("sent_mbps") or t["offered_mbps"]))
        for t in trials
        if float(t["loss_pct"]) <= loss_pct
    ]  # never above what was sent
    return max(ok, default=0.0)


# What the path may hold when a trial ends without the gateway being overloaded: the
# packets of this much time in flight (a quota'd gateway runs 1 ms in every 5 or 10).
IN_FLIGHT_S = 0.02


def with_unarrived(row: Row, in_flight_s: float = IN_FLIGHT_S) -> Row:
    """A trial's loss counted against what the sender sent (RFC 2544 §26.1: frames
    offered vs forwarded): the receiver's own loss, plus the datagrams that never arrived
    before the test ended beyond what `in_flight_s` of traffic in flight explains. An
    overloaded gateway with a deep queue in front hides its excess there for a short
    trial; the receiver alone would call that trial loss-free."""
    sent = int(row.get("sender_packets") or row.get("sent_packets") or 0)
    if not sent:
        return row
    late = int(row.get("unarrived_packets") or 0)
    pps = sent / max(float(row.get("seconds") or 1.0), 1e-3)
    excess = max(late - (pps * in_flight_s + 2), 0)
    out = dict(row)
    out["receiver_loss_pct"] = row["loss_pct"]
    out["loss_pct"] = 100.0 * (int(row.get("lost_packets") or 0) + excess) / sent
    return out


# A trial overloaded the path when it lost more than the tolerance or delivered this
# much less than it offered (a queue in front of the gateway stretched its arrival).
OVERLOAD_SHORTFALL = 0.05
LIVELOCK_FACTOR = 1.5
OVERLOAD_FACTOR = 1.25  # the offered rate of dedicated overload trials, x the NDR


OVERLOAD_RETRIES = 2  # dedicated overload trials that may come out not overloaded


def overloaded(t: Row, tolerance_pct: float) -> bool:
    """Whether a trial pushed the path past its capacity: it lost more than the
    tolerance, or delivered under 95 % of what it offered (a queue stretched it)."""
    return bool(
        float(t["loss_pct"]) > tolerance_pct
        or float(t.get("mbps") or 0) < (1 - OVERLOAD_SHORTFALL) * float(t["offered_mbps"])
    )


def forwarding_rate_at_overload(
    trials: list[Row], tolerance_pct: float, livelock: bool = True
) -> tuple[float | None, float | None, int]:
    """RFC 2285's maximum forwarding rate, from a search's own trials: the median rate
    delivered by the trials that overloaded the path (lost more than the tolerance, or
    delivered under 95 % of what they offered); with the relative spread (max-min over
    median) of those deliveries and how many there were. (None, None, 0) if no trial
    overloaded it (the capacity is above the search's ceiling).

    A device that does not livelock forwards about its capacity however hard it is
    pushed, so every overloaded trial measures the same thing, averaged over the whole
    trial: a steadier estimate than the loss-free rate, which one scheduling hiccup
    moves (one dropped packet fails a trial) and a deep queue fools (it hides a short
    trial's excess)."""
    best = max((float(t.get("mbps") or 0) for t in trials), default=0.0)
    if not livelock:  # dedicated trials: those that did overload the path
        trials = [t for t in trials if overloaded(t, tolerance_pct)]
    over = [
        float(t["mbps"])
        for t in trials
        if t.get("mbps")
        # pushed far beyond what the path ever delivered (the search's first trial at
        # its ceiling), a host can livelock and deliver less: not the device's rate
        and (not livelock or float(t["offered_mbps"]) <= LIVELOCK_FACTOR * best)
        and overloaded(t, tolerance_pct)
    ]
    mid, spread = median_spread(over)
    return mid, spread, len(over)


def loss_trial(gen: Generator, size: int, rate: float, seconds: float) -> Row:
    """One trial; an iperf3 whose control connection broke (it shares the overloaded
    path with the flood) is tried once more, then counted as a failed trial. iperf3's
    loss is counted against what its sender sent (`with_unarrived`); a paced one's is so
    already (the sink's count after the path emptied)."""
    for attempt in (1, 2):
        try:
            row = gen.trial(size, rate, seconds)
            return with_unarrived(row) if gen.name == "iperf3" else row
        except LabError as e:
            if attempt == 2:
                return {"size": size, "offered_mbps": rate, "loss_pct": 100.0,
                        "payload_bytes": 0, "seconds": seconds, "mbps": 0.0,
                        "error": str(e)}  # fmt: skip
            time.sleep(1)
    raise AssertionError("unreachable")


# The data plane's clock: per IPsec node, (CPU ns its processes have run, packets it has
# sealed or opened), both so far (`Backend.plane_clock`).
PlaneClock = Callable[[], dict[str, tuple[int, int]]]
# Waiting for the data plane to go quiet: its packet counts unchanged for QUIET_SPAN_S (a
# gateway publishes them every 100 ms while busy and every 200 ms idle — POLL_MS in
# crates/ipsec-gw/src/dataplane/mod.rs — so the span holds a publication made after its
# first read; what the trial left queued is handled first), read every QUIET_EVERY_S,
# for at most QUIET_MAX_S. (0.62 s an overload trial, with reads QUIET_SPAN_S apart or
# so: an idle gateway's last count appears up to 200 ms late, then the span.)
QUIET_SPAN_S = 0.3
QUIET_EVERY_S = 0.05
QUIET_MAX_S = 10.0


def median_spread(xs: list[float]) -> tuple[float | None, float | None]:
    """The median of `xs` and their spread (max - min over median); None, None if empty."""
    if not xs:
        return None, None
    m = statistics.median(xs)
    return m, (max(xs) - min(xs)) / m if m else None


def plane_clock(metered: Metered) -> PlaneClock | None:
    """The data plane's clock the runner lends its meters (it reads {} where the IPsec
    under test has none: only a user-space gateway that counts its packets has one)."""
    return metered.plane_clock if isinstance(metered, Meters) else None


def quiet(clock: PlaneClock) -> dict[str, tuple[int, int]]:
    """The data plane's clock once nothing moves through it (bounded wait): its packet
    counts the same for QUIET_SPAN_S (its CPU time may move: an idle worker wakes)."""
    return steady(clock, QUIET_SPAN_S, QUIET_EVERY_S, QUIET_MAX_S,
                  key=lambda c: {k: v[1] for k, v in c.items()})  # fmt: skip


def cpu_per_packet(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> float | None:
    """CPU ns one packet costs the data plane on its way through: each IPsec node's CPU
    time over the packets it sealed or opened, summed over the nodes that handled any
    (each packet passes every one of them). None if none did."""
    total, seen = 0.0, False
    for node, (cpu1, n1) in after.items():
        cpu0, n0 = before.get(node, (cpu1, n1))
        if n1 > n0:
            total += (cpu1 - cpu0) / (n1 - n0)
            seen = True
    return total if seen and total > 0 else None


def overload_rounds(
    trial: Callable[[int, float], Row],
    tops: dict[int, float],
    ceiling: dict[int, float],
    want: int,
    tolerance_pct: float,
    clock: PlaneClock | None = None,
) -> dict[int, list[Row]]:
    """Dedicated overload trials for one or more packet sizes, `trial(size, rate)` each:
    per size, `want` trials offered `tops[size]` (above the capacity its search found)
    whose delivered rate is the device's forwarding rate at overload (RFC 2285 §3.6.2).

    With several sizes they run in rounds, one trial per size per round, the order
    rotated each round so that every size takes every place in turn: what a packet costs
    a shared host drifts over minutes, and rounds spread that drift over every size
    alike instead of handing one size a slow minute and the next a fast one — a model
    fitted at two sizes and checked at a third then compares like with like.

    A trial the path carried whole means the search fell short (a hiccup failed a trial
    below the capacity): that size's next trial offers 1.5 x more, up to its ceiling,
    and it may take OVERLOAD_RETRIES rounds more than `want`. With the data plane's
    clock, each trial also times what one packet costs it while saturated — the time a
    throughput model describes (t_fix + L_alg / R_alg), from its own CPU and packet
    counts, whatever was lost where: between trials the plane is let go quiet, so its
    counters and CPU time are read with nothing in flight. Each size's trials, in the
    order they ran, each with its `round`, marked `overload` (and with a clock its
    `plane_ns_per_packet`)."""
    sizes = list(tops)
    top = dict(tops)
    out: dict[int, list[Row]] = {s: [] for s in sizes}
    mark = quiet(clock) if clock and clock() else None  # {}: nothing to read
    for r in range(want + OVERLOAD_RETRIES):
        k = r % len(sizes)
        for size in sizes[k:] + sizes[:k]:
            got = out[size]
            if sum(1 for x in got if x["overload"]) >= want or len(got) >= want + OVERLOAD_RETRIES:
                continue
            t = dict(trial(size, top[size]))
            t["overload"] = overloaded(t, tolerance_pct)
            t["round"] = r
            if clock and mark is not None:
                now = quiet(clock)
                t["plane_ns_per_packet"] = cpu_per_packet(mark, now)
                mark = now
            got.append(t)
            if not t["overload"]:
                top[size] = min(top[size] * 1.5, ceiling[size])
    return out


def _search_row(w: Workload, size: int, r: SearchResult) -> Row:
    """A size's row from its search alone (its overload figures come with `_finish`)."""
    passed = [t for t in r.trials if t["passed"]]
    best = max(passed, key=lambda t: t["offered_mbps"]) if passed else None
    return {
        "size": size,
        "mbps": r.rate_mbps,  # the loss-free rate (inner IP packet bits)
        "ndr_mbps": r.rate_mbps if w.loss_tolerance_pct == 0 else None,
        "pdr_mbps": partial_drop_rate(r.trials),
        "converged": r.converged,
        "search": r.reason,
        "generator_bound": r.generator_bound,
        "trials": list(r.trials),
        "payload_bytes": sum(int(t["payload_bytes"]) for t in r.trials),
        "seconds": sum(float(t["seconds"]) for t in r.trials),
        "best_trial_loss_pct": best["loss_pct"] if best else None,
    }


def _finish(row: Row, overload: list[Row], tolerance_pct: float, metered: bool) -> None:
    """A size's MFR and CPU time per packet: from its dedicated overload trials, or
    (none run) from the overloaded trials of its search. `metered`: the overload trials
    ran inside the row's meters, so their bytes and seconds count in what the meters'
    effort divides by; outside them (several sizes interleaved) they are only listed."""
    ns = [float(t["plane_ns_per_packet"]) for t in overload
          if t.get("overload") and t.get("plane_ns_per_packet")]  # fmt: skip
    cost = median_spread(ns)
    mfr, spread, n_over = forwarding_rate_at_overload(
        overload or row["trials"], tolerance_pct, livelock=not overload
    )
    row.update(mfr_mbps=mfr, mfr_spread=spread, mfr_trials=n_over,
               plane_ns_per_packet=cost[0], plane_spread=cost[1],
               # each dedicated trial's figure, for an analysis's own uncertainty
               mfr_samples_mbps=[float(t["mbps"]) for t in overload
                                 if t.get("overload") and t.get("mbps")],
               plane_ns_samples=ns)  # fmt: skip
    row["trials"] = row["trials"] + overload
    if metered:
        row["payload_bytes"] += sum(int(t["payload_bytes"]) for t in overload)
        row["seconds"] += sum(float(t["seconds"]) for t in overload)


def rfc2544(tb: Testbed, flow: Flow, w: Workload, metered: Metered, warmup_s: float) -> list[Row]:
    """One row per size: the loss-free rate (and PDR) from a search, then, with
    `overload_trials`, the MFR and CPU time per packet from dedicated overload trials.
    One size: its meters cover the search and its overload trials. Several (`sizes`):
    each size's search is metered as its own row, then the overload trials of all sizes
    run interleaved in rounds (`overload_rounds`), listed in each row's `trials` but
    outside its meters (`payload_bytes` and `seconds` are the search's)."""
    gen = for_workload(tb, flow, w)
    sizes = w.all_sizes
    try:
        if warmup_s > 0:
            gen.trial(sizes[0], min(w.max_rate_mbit, 10.0), max(warmup_s, 1))
        clock = plane_clock(metered)
        searched: dict[int, SearchResult] = {}

        def run(size: int) -> Row:
            r = searched[size] = search(
                lambda rate: loss_trial(gen, size, rate, w.trial_s),
                w.max_rate_for(size),
                w.resolution_for(size),
                w.loss_tolerance_pct,
                w.max_trials,
            )
            row = noted(_search_row(w, size, r), gen)
            if len(sizes) == 1:
                _finish(row, overload().get(size, []), w.loss_tolerance_pct, metered=True)
            return row

        def overload() -> dict[int, list[Row]]:
            tops = {
                s: min(OVERLOAD_FACTOR * r.rate_mbps, w.max_rate_for(s))
                for s, r in searched.items()
                if r.rate_mbps > 0
            }
            if not w.overload_trials or not tops:
                return {}
            return overload_rounds(
                lambda size, rate: loss_trial(gen, size, rate, w.trial_s),
                tops, {s: w.max_rate_for(s) for s in tops}, w.overload_trials,
                w.loss_tolerance_pct, clock,
            )  # fmt: skip

        if len(sizes) == 1:
            return [metered(w.name, lambda: run(sizes[0]))]
        rows = [metered(w.size_label(s), functools.partial(run, s)) for s in sizes]
        trials = overload()
        for s, row in zip(sizes, rows, strict=True):
            _finish(row, trials.get(s, []), w.loss_tolerance_pct, metered=False)
        return rows
    finally:
        gen.close()


def _seconds(w: Workload, rate_mbit: float) -> float:
    """Each size's search (a binary search from the ceiling down to the resolution) and
    its overload trials."""
    import math

    total = 0.0
    for size in w.all_sizes:
        steps = math.ceil(math.log2(max(w.max_rate_for(size) / w.resolution_for(size), 2)))
        total += w.trial_s * (min(w.max_trials, steps + 1) + w.overload_trials)
    return total


KEYS = frozenset({
    "size", "sizes", "trial_s", "loss_tolerance_pct", "resolution_mbit", "max_rate_mbit",
    "max_trials", "overload_trials", "generator", "flows",
})  # fmt: skip
# the keys of a search for a PDR or NDR that a latency or soak workload runs first
SEARCH_KEYS = frozenset({"trial_s", "max_rate_mbit", "resolution_mbit", "max_trials"})
RFC2544 = Kind(
    "rfc2544",
    "RFC 2544's search for the loss-free rate (NDR) and the PDR at one or more `sizes`, "
    "then the forwarding rate at overload (`overload_trials`)",
    KEYS,
    lambda c: rfc2544(c.tb, c.flow, c.workload, c.meters, c.warmup_s),
    _seconds,
    generated=lambda w: True,
    without_df=True,
    spreads=True,
    article="an",
)
