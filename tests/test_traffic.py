"""The traffic side without namespaces: the RFC 2544 search (NDR, PDR, forwarding rate at
overload, several sizes), what a trial counts, CPU per packet, and the SMTP message."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab import scenario
from ipsec_lab.traffic import rfc2544
from ipsec_lab.traffic.apps import mail_message
from ipsec_lab.traffic.rfc2544 import partial_drop_rate, search


def _lossy_above(capacity: float, calls: list[float]) -> object:
    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        loss = 0.0 if rate <= capacity else 100 * (rate - capacity) / rate
        return {"offered_mbps": rate, "loss_pct": loss}

    return trial


@pytest.mark.parametrize("capacity", [1.0, 17.3, 63.0, 99.9])
def test_search_brackets_the_loss_free_rate_within_the_resolution(capacity: float) -> None:
    calls: list[float] = []
    r = search(_lossy_above(capacity, calls), 100.0, 0.5, 0.0, 30)  # type: ignore[arg-type]
    assert r.converged
    assert capacity - 0.5 <= r.rate_mbps <= capacity
    assert calls[0] == 100.0  # the first trial is at the top rate
    assert [t["offered_mbps"] for t in r.trials] == calls
    # every verdict agrees with the loss it saw
    assert all(t["passed"] == (t["loss_pct"] == 0) for t in r.trials)


def test_search_passing_at_the_top_stops_at_once() -> None:
    calls: list[float] = []
    r = search(_lossy_above(500, calls), 100.0, 1.0, 0.0, 30)  # type: ignore[arg-type]
    assert r.converged and r.rate_mbps == 100.0 and calls == [100.0]


def test_search_tolerance_and_trial_bound() -> None:
    calls: list[float] = []
    # 5 % loss just above 50 Mbit/s: with a 10 % tolerance the search goes higher
    r = search(_lossy_above(50, calls), 100.0, 0.1, 10.0, 40)  # type: ignore[arg-type]
    assert r.rate_mbps > 50
    calls.clear()
    r = search(_lossy_above(50, calls), 100.0, 0.001, 0.0, 4)  # type: ignore[arg-type]
    assert not r.converged and len(r.trials) == 4 and "4 trials" in r.reason


def test_a_generator_short_of_the_rate_ends_the_search_generator_bound() -> None:
    """A generator that cannot send faster than 70 Mbit/s through a path that loses
    nothing: a trial asked for 100 passes, but the path only saw 70 — the search must end
    generator-bound near 70, never call 100 loss-free."""
    calls: list[float] = []

    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        return {"offered_mbps": rate, "sent_mbps": min(rate, 70.0), "loss_pct": 0.0}

    r = search(trial, 100.0, 1.0, 0.0, 20)
    assert r.generator_bound and r.converged and calls[:2] == [100.0, 100.0]
    assert r.rate_mbps == 70.0 and "generator-bound" in r.reason, r
    assert partial_drop_rate(r.trials) == 70.0  # the PDR too: only what was sent
    assert len(calls) <= 6  # it looks just above what was sent, not all the way down
    # a path that loses above 60 with the same generator: the path's rate, not bound
    r = search(lambda rate: {"offered_mbps": rate, "sent_mbps": min(rate, 70.0),
                             "loss_pct": 0.0 if rate <= 60 else 5.0},
               100.0, 1.0, 0.0, 20)  # fmt: skip
    assert not r.generator_bound and 59.0 <= r.rate_mbps <= 60.0, r
    # one that keeps up (within 5 %) is not bound; the rate found is what it sent
    r = search(lambda rate: {"offered_mbps": rate, "sent_mbps": rate * 0.97, "loss_pct": 0.0},
               100.0, 1.0, 0.0, 20)  # fmt: skip
    assert not r.generator_bound and r.rate_mbps == 97.0


def test_one_stall_of_the_generator_does_not_end_a_search() -> None:
    """A generator that falls short once (a moment without its core) at the top rate of a
    path that carries 100: the trial is repeated, and the search finds the path's rate,
    not generator-bound at the stalled trial's 80; both trials stay on the record."""
    calls: list[float] = []

    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        sent = 80.0 if len(calls) == 1 else rate
        return {"offered_mbps": rate, "sent_mbps": sent, "loss_pct": 0.0}

    r = search(trial, 100.0, 1.0, 0.0, 20)
    assert not r.generator_bound and r.converged and r.rate_mbps == 100.0, r
    assert calls == [100.0, 100.0]
    assert r.trials[0]["repeated"] and "repeated" not in r.trials[1]


def test_no_paced_generator_drives_a_source_that_does_its_own_ipsec(tmp_path: Path) -> None:
    """trafgen writes frames below the source's IP stack: host-to-host IPsec there would
    not see them; udp-gso is paced on the source's test interface, there its IPsec's.
    auto falls back to iperf3 saying why for each; either asked for is an error; on
    `line` (sources without IPsec) auto takes udp-gso, the fastest."""
    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import LabError, Testbed
    from ipsec_lab.traffic import generator

    for topo in ("pair", "clients"):
        tb = Testbed(topology(topo), tmp_path / topo)  # not built: nothing is run
        flow = tb.topo.flows[0]
        name, why = generator.choose(tb, flow, "auto")
        assert name == "iperf3" and "IPsec would not see them" in why, why
        assert "udp-gso is paced on the source's test interface" in why, why
        with pytest.raises(LabError, match=r"generator trafgen: .*below"):
            generator.choose(tb, flow, "trafgen")
        with pytest.raises(LabError, match=r"generator udp-gso: .*own \(host-to-host\) IPsec"):
            generator.choose(tb, flow, "udp-gso")
        assert generator.choose(tb, flow, "iperf3") == ("iperf3", "asked for")
    tb = Testbed(topology("line"), tmp_path / "line")
    flow = tb.topo.flows[0]
    assert generator.choose(tb, flow, "auto") == ("udp-gso", "the fastest here")
    assert generator.choose(tb, flow, "trafgen") == ("trafgen", "asked for")
    assert generator.choose(tb, flow, "udp-gso") == ("udp-gso", "asked for")


def test_search_with_nothing_passing_reports_zero() -> None:
    r = search(lambda rate: {"loss_pct": 100.0}, 10.0, 1.0, 0.0, 20)
    assert r.rate_mbps == 0.0 and r.converged


@pytest.mark.parametrize("capacity", [0.8, 4.2, 17.0, 370.0])
def test_search_narrows_to_the_rate_an_overloaded_device_delivered(capacity: float) -> None:
    """Trials that report what they delivered (at most the capacity) hint where to look:
    the same answer as plain halving from a generous ceiling, in fewer trials."""
    calls: list[float] = []

    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        loss = 0.0 if rate <= capacity else 100 * (rate - capacity) / rate
        return {"offered_mbps": rate, "loss_pct": loss, "mbps": min(rate, capacity)}

    r = search(trial, 1000.0, 0.05, 0.0, 40)  # type: ignore[arg-type]
    plain: list[float] = []
    p = search(_lossy_above(capacity, plain), 1000.0, 0.05, 0.0, 40)  # type: ignore[arg-type]
    assert r.converged and capacity - 0.05 <= r.rate_mbps <= capacity
    assert p.converged and abs(p.rate_mbps - r.rate_mbps) <= 0.05
    assert len(calls) < len(plain)
    assert calls[1] <= 1.5 * capacity  # the second trial already sits near the capacity


@pytest.mark.parametrize("capacity", [3.0, 60.0])
def test_search_is_not_misled_by_a_device_that_delivers_little_when_overloaded(
    capacity: float,
) -> None:
    """Receive livelock: flooded, the device delivers a quarter of what it forwards
    loss-free. The hint (1.5 x that) is tried, passes, and the search goes on above it."""

    def trial(rate: float) -> dict[str, float]:
        if rate <= capacity:
            return {"offered_mbps": rate, "loss_pct": 0.0, "mbps": rate}
        return {"offered_mbps": rate, "loss_pct": 50.0, "mbps": capacity / 4}

    r = search(trial, 1000.0, 0.05, 0.0, 60)  # type: ignore[arg-type]
    assert r.converged and capacity - 0.05 <= r.rate_mbps <= capacity


def test_ndr_and_pdr_come_from_one_search() -> None:
    """A device losing nothing up to 100 Mbit/s and 0.3 % up to 120: the search for the
    NDR (0 loss) tries rates in between, and the PDR (<= 0.5 %, FD.io CSIT) is read from
    the same trials."""

    def trial(rate: float) -> dict[str, float]:
        loss = 0.0 if rate <= 100 else 0.3 if rate <= 120 else 20.0
        return {"offered_mbps": rate, "loss_pct": loss}

    r = search(trial, 1000.0, 1.0, 0.0, 30)
    assert 99.0 <= r.rate_mbps <= 100.0  # NDR
    pdr = partial_drop_rate(r.trials)
    assert r.rate_mbps < pdr <= 120.0  # the trials that lost 0.3 % count toward the PDR
    assert partial_drop_rate([{"offered_mbps": 5.0, "loss_pct": 1.0}]) == 0.0


def test_forwarding_rate_at_overload_is_the_median_delivery_of_overloaded_trials() -> None:
    from ipsec_lab.traffic.rfc2544 import forwarding_rate_at_overload

    trials = [
        {"offered_mbps": 500.0, "loss_pct": 97.0, "mbps": 40.0},  # livelock: left out
        {"offered_mbps": 45.0, "loss_pct": 0.0, "mbps": 45.0},  # passed: not overloaded
        {"offered_mbps": 90.0, "loss_pct": 10.0, "mbps": 80.0},
        {"offered_mbps": 84.0, "loss_pct": 0.0, "mbps": 78.0},  # 0 loss, arrived late
        {"offered_mbps": 81.0, "loss_pct": 1.0, "mbps": 79.0},
    ]
    mfr, spread, n = forwarding_rate_at_overload(trials, 0.1)
    assert (mfr, n) == (79.0, 3) and spread == pytest.approx(2 / 79)
    # dedicated overload trials at a fixed rate keep even a far-off one
    assert forwarding_rate_at_overload(trials[:1], 0.1, livelock=False)[0] == 40.0
    assert forwarding_rate_at_overload(trials[1:2], 0.1) == (None, None, 0)


def test_a_workload_of_several_sizes_scales_its_ceiling_to_one_packet_rate() -> None:
    sc = scenario.parse(
        "[[workloads]]\nkind = 'rfc2544'\nsizes = [128, 1280, 512]\nmax_rate_mbit = 500\n"
        "resolution_mbit = 1\noverload_trials = 3",
        "s.toml",
    )
    w = sc.workloads[0]
    assert w.all_sizes == (128, 1280, 512) and w.name == "rfc2544-128-1280-512"
    assert w.size_label(512) == "rfc2544-512"
    assert w.max_rate_for(1280) == 500 and w.max_rate_for(128) == pytest.approx(50)
    assert w.resolution_for(512) == pytest.approx(0.4)
    one = scenario.parse("[[workloads]]\nkind = 'rfc2544'\nsize = 512", "o.toml").workloads[0]
    assert one.all_sizes == (512,) and one.max_rate_for(512) == one.max_rate_mbit


def _drifting_device(
    capacity: dict[int, float], calls: list[tuple[int, float]], drift: float = 0.01
) -> Any:
    """An overloaded device whose speed drifts: every trial it gets `drift` faster, at
    every size alike (what a shared host does over minutes). A trial offered less than
    its capacity is carried whole."""

    def trial(size: int, rate: float) -> dict[str, float]:
        speed = 1 + drift * len(calls)
        calls.append((size, rate))
        cap = capacity[size] * speed
        got = min(rate, cap)
        return {"size": size, "offered_mbps": rate, "mbps": got,
                "loss_pct": 100 * (rate - got) / rate}  # fmt: skip

    return trial


def test_overload_rounds_give_every_size_every_place_and_the_same_drift() -> None:
    """Rounds rotate the sizes (each takes each place in turn), so a drift in the
    host's speed moves every size's median about alike: the ratio of two sizes' MFRs is
    the device's own to within a round's drift. One size after another, as separate runs
    measure them, the later size gets the faster minutes and the ratio is off by nine
    trials' drift."""
    from ipsec_lab.traffic.rfc2544 import forwarding_rate_at_overload, overload_rounds

    cap = {128: 10.0, 1280: 80.0, 512: 40.0}
    tops = {s: 2 * c for s, c in cap.items()}
    calls: list[tuple[int, float]] = []
    got = overload_rounds(_drifting_device(cap, calls), tops, tops, 9, 0.1)
    order = [s for s, _ in calls]
    assert order[:9] == [128, 1280, 512, 1280, 512, 128, 512, 128, 1280]
    for s in cap:  # every place in a round, three times each
        assert [order[i] for i in range(0, 27, 3)].count(s) == 3
    assert all(len(ts) == 9 and all(t["overload"] for t in ts) for ts in got.values())
    assert [t["round"] for t in got[512]] == list(range(9))

    def mfr(ts: list[dict[str, Any]]) -> float:
        m = forwarding_rate_at_overload(ts, 0.1, livelock=False)[0]
        assert m is not None
        return m

    assert mfr(got[1280]) / mfr(got[128]) == pytest.approx(8.0, rel=0.025)
    assert mfr(got[512]) / mfr(got[128]) == pytest.approx(4.0, rel=0.025)
    calls.clear()
    one_by_one = {
        s: overload_rounds(_drifting_device(cap, calls), {s: tops[s]}, tops, 9, 0.1)[s] for s in cap
    }
    assert mfr(one_by_one[1280]) / mfr(one_by_one[128]) > 8.0 * 1.06


def test_overload_rounds_offer_more_after_a_trial_the_path_carried_whole() -> None:
    """A size whose search fell short (its first overload trial is carried whole) is
    offered 1.5 x more each time, up to its ceiling; a size the path never overloads
    stops after its retries; the others are not held up by it. With the data plane's
    clock each trial is timed from quiet to quiet."""
    from ipsec_lab.traffic import rfc2544 as r

    cap = {64: 10.0, 1420: 1000.0}  # 1420: above its ceiling, never overloaded
    calls: list[tuple[int, float]] = []
    tops, ceiling = {64: 8.0, 1420: 100.0}, {64: 40.0, 1420: 120.0}
    ns = iter(range(0, 10**9, 10**6))
    clock = lambda: {"gwA": (next(ns), len(calls) * 1000)}  # noqa: E731
    old = (r.QUIET_SPAN_S, r.QUIET_EVERY_S, r.QUIET_MAX_S)
    r.QUIET_SPAN_S, r.QUIET_EVERY_S, r.QUIET_MAX_S = 0.0, 0.0, 1.0
    try:
        got = r.overload_rounds(_drifting_device(cap, calls), tops, ceiling, 2, 0.1, clock)
    finally:
        r.QUIET_SPAN_S, r.QUIET_EVERY_S, r.QUIET_MAX_S = old
    assert [t["offered_mbps"] for t in got[64]] == [8.0, 12.0, 12.0]
    assert [t["overload"] for t in got[64]] == [False, True, True]
    assert [t["offered_mbps"] for t in got[1420]] == [100.0, 120.0, 120.0, 120.0]
    assert not any(t["overload"] for t in got[1420])
    assert len(got[1420]) == 2 + r.OVERLOAD_RETRIES
    assert all(t["plane_ns_per_packet"] and t["plane_ns_per_packet"] > 0 for t in got[64])


def test_a_row_s_bytes_are_those_its_meters_covered() -> None:
    """One size: the overload trials run inside the row's meters, so its payload bytes
    and seconds (what the CPU effort divides by) count them with the search's; several
    sizes interleaved: they ran outside every row's meters, and are only listed."""
    from ipsec_lab.traffic.rfc2544 import SearchResult, _finish, _search_row

    w = scenario.parse("[[workloads]]\nkind = 'rfc2544'\nsize = 512", "o.toml").workloads[0]
    found = [{"offered_mbps": 9.0, "loss_pct": 0.0, "passed": True, "mbps": 9.0,
              "payload_bytes": 1000, "seconds": 2.0}]  # fmt: skip
    over = [{"offered_mbps": 12.0, "loss_pct": 9.0, "mbps": 10.0, "overload": True,
             "payload_bytes": 3000, "seconds": 2.0}] * 2  # fmt: skip
    for metered, (payload, seconds) in ((True, (7000, 6.0)), (False, (1000, 2.0))):
        row = _search_row(w, 512, SearchResult(9.0, list(found)))
        _finish(row, over, 0.1, metered=metered)
        assert (row["payload_bytes"], row["seconds"]) == (payload, seconds)
        assert len(row["trials"]) == 3 and row["mfr_mbps"] == 10.0


def test_cpu_per_packet_sums_each_node_s_cpu_over_its_own_packets() -> None:
    """A packet passes gwA (sealed) and gwB (opened): its cost is each one's CPU over
    the packets it handled — not over the packets delivered, which an overloaded gwB
    may have dropped after gwA sealed them; a node that handled none adds nothing."""
    from ipsec_lab.traffic.rfc2544 import cpu_per_packet, median_spread, quiet

    before = {"gwA": (10_000_000, 1000), "gwB": (20_000_000, 900), "gwC": (5, 7)}
    after = {"gwA": (30_000_000, 3000), "gwB": (32_000_000, 2400), "gwC": (500_005, 7)}
    # gwA 20 ms / 2000 = 10 µs, gwB 12 ms / 1500 = 8 µs
    assert cpu_per_packet(before, after) == pytest.approx(18_000)
    assert cpu_per_packet(before, before) is None
    assert median_spread([18.0, 20.0, 19.0]) == (19.0, pytest.approx(2 / 19))
    assert median_spread([]) == (None, None)
    # quiet: read until the packet counts stand still for its span (the CPU may move)
    with _fake_time() as t, pytest.MonkeyPatch.context() as mp:
        mp.setattr(rfc2544, "QUIET_SPAN_S", 0.25)  # binary fractions: exact sums
        mp.setattr(rfc2544, "QUIET_EVERY_S", 0.0625)
        reads = iter([{"gwA": (1, 5)}, {"gwA": (2, 9)}] + [{"gwA": (3 + i, 9)} for i in range(99)])
        got = quiet(lambda: next(reads))
        # the count changed at the read at 0.0625 s, then four reads, the last 0.25 after
        assert got == {"gwA": (6, 9)} and t.now == 0.3125


class _FakeTime:
    """time.monotonic and time.sleep for a test: sleeping moves the clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


@contextlib.contextmanager
def _fake_time() -> Iterator[_FakeTime]:
    import time as real

    fake = _FakeTime()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(real, "monotonic", fake.monotonic)
        mp.setattr(real, "sleep", fake.sleep)
        yield fake


def test_steady_ends_its_span_after_the_last_change_and_never_sooner() -> None:
    """A count that changes at 0.05 and 0.13 s and then stands still, read every 1/32 s
    with a span of 1/8 s: taken 1/8 s after the read that saw its last change (reads
    1/8 s apart would take up to twice that), never sooner; one that never stands
    still is taken at the bound; compared by `key`; `first`: a read already made."""
    from ipsec_lab.traffic import steady

    with _fake_time() as t:

        def count() -> int:
            return 1 if t.now < 0.05 else 2 if t.now < 0.13 else 3

        assert steady(count, 0.125, 0.03125, 2.0) == 3
        assert t.now == 0.15625 + 0.125  # the last change seen at the read at 5/32 s

    with _fake_time() as t:
        ticks = iter(range(10**6))
        assert steady(lambda: next(ticks), 0.125, 0.03125, 2.0) >= 63  # never still
        assert t.now == 2.0  # the bound

    with _fake_time() as t:
        pairs = iter([(5, i) for i in range(100)])  # the second field moves
        assert steady(lambda: next(pairs), 0.125, 0.03125, 2.0, key=lambda p: p[0]) == (5, 4)
        assert t.now == 0.125

    with _fake_time() as t:
        got: list[int] = []

        def once_more() -> int:
            got.append(1)
            return 7

        assert steady(once_more, 0.125, 0.03125, 2.0, first=7) == 7
        assert len(got) == 4 and t.now == 0.125  # no read of its own before the first sleep


def test_a_trial_counts_what_never_arrived_beyond_what_was_in_flight() -> None:
    from ipsec_lab.traffic.rfc2544 import with_unarrived

    row = {"loss_pct": 0.0, "lost_packets": 0, "sender_packets": 1000,
           "sent_packets": 850, "unarrived_packets": 150, "seconds": 1.0}  # fmt: skip
    out = with_unarrived(row)
    # 1000 pps x 20 ms + 2 = 22 may be in flight; 128 more were queued: 12.8 %
    assert out["loss_pct"] == pytest.approx(12.8) and out["receiver_loss_pct"] == 0.0
    calm = with_unarrived({**row, "sent_packets": 990, "unarrived_packets": 10})
    assert calm["loss_pct"] == 0.0


@pytest.mark.parametrize("n", [1024, 10 * 1024, 1 << 20])
def test_mail_message_is_about_the_size_asked_and_well_formed(n: int) -> None:
    import email

    m = mail_message(n, random.Random(1))
    assert n - 80 <= len(m) <= n
    assert all(len(line) <= 998 for line in m.split(b"\r\n"))
    msg = email.message_from_bytes(m)
    assert msg["Content-Transfer-Encoding"] == "base64"
    assert len(msg.get_payload(decode=True)) > 0


class _SlowProbes:
    """A testbed whose `ss` probes time out `slow` times (a starved emulated machine —
    CI's VM once took over 5 s for one) before one answers `answer`."""

    def __init__(self, slow: int, answer: str) -> None:
        self.slow, self.answer, self.timeouts = slow, answer, []  # type: list[float]

    def run(self, node: str, argv: list[str], timeout: float = 30, **_: Any) -> str:
        from ipsec_lab.testbed.build import LabError

        assert argv[0] == "ss" and node == "server"
        self.timeouts.append(timeout)
        if self.slow:
            self.slow -= 1
            raise LabError(f"timed out after {timeout:g} s: ss")
        return self.answer


def test_waiting_for_a_listener_outlasts_a_probe_that_times_out() -> None:
    from ipsec_lab.traffic import wait_listening

    tb = _SlowProbes(slow=2, answer="LISTEN 0 5 0.0.0.0:5301 0.0.0.0:*\n")
    wait_listening(tb, "server", 5301, timeout=30)  # type: ignore[arg-type]
    assert len(tb.timeouts) == 3
    # each probe may take what is left of the whole wait, not a fixed 5 s
    assert tb.timeouts[0] > 25


def test_waiting_for_a_listener_fails_at_its_deadline_and_says_the_probe_was_slow() -> None:
    from ipsec_lab.testbed.build import LabError
    from ipsec_lab.traffic import wait_listening

    tb = _SlowProbes(slow=10**9, answer="")
    with pytest.raises(LabError, match=r"nothing listens on port 5301 in server after 0.2 s "
                       r"\(its last probe, ss, timed out\)"):  # fmt: skip
        wait_listening(tb, "server", 5301, timeout=0.2)  # type: ignore[arg-type]

    # an error other than a timeout is not swallowed
    class Broken(_SlowProbes):
        def run(self, node: str, argv: list[str], timeout: float = 30, **_: Any) -> str:
            from ipsec_lab.testbed.build import LabError

            raise LabError("ip netns exec: no such namespace")

    with pytest.raises(LabError, match="no such namespace"):
        wait_listening(Broken(0, ""), "server", 5301, timeout=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sent, loss, bound",
    [(552.0, 0.0, True), (552.0, 45.0, False), (1990.0, 0.0, False), (552.0, 0.005, True)],
)
def test_a_fixed_rate_row_says_when_its_figure_is_the_generators(
    sent: float, loss: float, bound: bool
) -> None:
    """Issue 45's case: IMIX at 2,000 Mbit/s offered, the generator managed 552 and the
    path lost none of it: that row is the generator's; a lossy one is the path's."""
    from ipsec_lab import runner
    from ipsec_lab.traffic.udp import bounded

    got = sent * (1 - loss / 100)
    row = bounded({"offered_mbps": 2000.0, "sent_mbps": sent, "loss_pct": loss, "mbps": got,
                   "generator": "trafgen", "label": "imix"})  # fmt: skip
    assert row["generator_bound"] is bound
    run = {"backend": "none", "configuration": "none", "link": "unshaped", "flow": "c-s",
           "workload": "imix", "status": "done", "reason": None, "results": [row]}  # fmt: skip
    (s,) = runner.summarize([run])
    assert s["note"].startswith("generator-bound" if bound else "offered 2000 Mbit/s")
    assert f"sent {sent:.0f} Mbit/s" in s["note"] and s["loss_pct_median"] == loss


def test_a_load_is_waited_for_until_its_packets_leave_not_for_a_fixed_time() -> None:
    """Latency and soak start their probes once the paced generator's bucket has let out
    packets beyond what it had (a warm-up's count stays in the bucket): not before, however
    long the sender took to start; a sender that died ends the wait at once; one that never
    sends is an error naming it."""
    from ipsec_lab.testbed import Flow
    from ipsec_lab.testbed.build import LabError
    from ipsec_lab.traffic.paced import Paced

    counts = iter([500, 500, 500, 501])
    g = Paced.__new__(Paced)
    g.name, g.flow = "udp-gso", Flow("f", "client", "server", "10.0.0.2", "gwA/eth0")
    g.sent = lambda: next(counts)  # type: ignore[method-assign]
    g.until_sending(500, lambda: True, 5.0)
    assert next(counts, None) is None  # it read until the count moved past 500
    g.sent = lambda: 500  # type: ignore[method-assign]
    g.until_sending(500, lambda: False, 5.0)  # the sender's thread ended: no wait
    with pytest.raises(LabError, match=r"udp-gso on client sent nothing within 0\.2 s"):
        g.until_sending(500, lambda: True, 0.2)

    def no_bucket() -> int:
        raise LabError("not paced")

    g.sent = no_bucket  # type: ignore[method-assign]
    assert g.left_so_far() == 0


def test_an_iperf3_client_refused_between_two_tests_waits_for_the_server_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """iperf3's server closes its listener between tests: a client refused right after
    the warm-up waits until the port listens again and tries once more; a second refusal
    (or any other error) is the run's error."""
    import json as json_

    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import LabError
    from ipsec_lab.traffic import iperf

    refused = json_.dumps({"error": "unable to connect to server: Connection refused"})
    good = json_.dumps({"end": {}})
    waited: list[tuple[str, int]] = []
    monkeypatch.setattr(iperf, "wait_listening", lambda tb, node, port: waited.append((node, port)))

    class Tb:
        def __init__(self, answers: list[str]) -> None:
            self.answers = answers

        def run(self, node: str, argv: list[str], timeout: float = 60, check: bool = True) -> str:
            return self.answers.pop(0)

    flow = topology("line").flows[0]
    assert iperf._client(Tb([refused, good]), flow, ["-p", "5202", "-t", "1"], 1) == {"end": {}}  # type: ignore[arg-type]
    assert waited == [(flow.sink, 5202)]
    with pytest.raises(LabError, match="Connection refused"):
        iperf._client(Tb([refused, refused]), flow, ["-t", "1"], 1)  # type: ignore[arg-type]
    assert waited[-1] == (flow.sink, iperf.PORT) and len(waited) == 2
    with pytest.raises(LabError, match="busy"):
        iperf._client(Tb([json_.dumps({"error": "the server is busy"})]), flow, [], 1)  # type: ignore[arg-type]
    assert len(waited) == 2  # no wait for another error
