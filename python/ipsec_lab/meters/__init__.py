"""Meters around each measurement: CPU (machine-wide /proc/stat per CPU, sampled through
the run; the IPsec processes' own CPU from /proc/PID/stat), interface counters on every
wire end, and the CPU effort derived from them.

What each CPU figure includes (all namespaces share one kernel):
- `cpu_busy_s`, `effort_us_per_kb`: machine-wide busy CPU time (user + nice + system +
  irq + softirq; idle, iowait and steal excluded) over the measurement, per kB (1024 B)
  of payload delivered — netperf's service demand. It includes the traffic programs at
  both ends, the kernel's forwarding and any user-space IPsec: compare configurations
  with each other and with `none`, as study 1 did, not with other machines.
- `ipsec_cpu_s`, `ipsec_effort_us_per_kb`: CPU time of the backend's processes alone
  (charon with kernel-libipsec, or ipsec-gw), user + system; zero for `none` (kernel
  forwarding is softirq time, in the machine-wide figure only).
- `ipsec_cpu_wait_s`: how long the backend's threads were runnable but waiting for a CPU
  (the scheduler's run delay): a packet for a thread waits that long too, so a large
  figure says the latency measured is the CPU's, not the IPsec's queues'.
- `ipsec_rss_start_bytes`, `ipsec_rss_end_bytes`: the backend processes' resident memory
  before and after the measurement (a leak shows as growth over a long run).
- `cpu_series`: per-sample machine-wide user / system / softirq / idle shares, for
  load-over-time plots (study 1, figures 6-7).
- `soaker_cpu_used`, `soaker_effort_us_per_kb` (scenario `soaker = true`): study 3's CPU
  soaker (`meters.soaker`): CPUs' worth taken from an idle-priority busy loop on every CPU.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from ipsec_lab import metrics
from ipsec_lab.meters.soaker import Soaker

KB = 1024
# Often enough for >= 10 points in a 2-second measurement (/proc/stat counts 10 ms ticks:
# a 0.1 s sample on 2 CPUs resolves 5 % of load).
SAMPLE_S = 0.1
MIN_METERED_S = 0.3


def _busy(t: Any) -> float:
    # Steal (time the hypervisor gave to other guests) is not work done here: left out.
    return float(t.user + t.nice + t.system + t.irq + t.softirq)


class CpuSampler:
    """Machine-wide CPU times at start and end, and shares every `interval` between."""

    def __init__(self, interval: float = SAMPLE_S) -> None:
        self.interval = interval
        self.series: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        prev = psutil.cpu_times()
        while not self._stop.wait(self.interval):
            now = psutil.cpu_times()
            d = {f: getattr(now, f) - getattr(prev, f) for f in now._fields}
            total = sum(d.values()) or 1.0
            self.series.append(
                {
                    "t": round(time.monotonic() - self.t0, 3),
                    "user": (d["user"] + d["nice"]) / total,
                    "system": d["system"] / total,
                    "softirq": (d["softirq"] + d["irq"]) / total,
                    "idle": (d["idle"] + d.get("iowait", 0.0)) / total,
                }
            )
            prev = now

    def __enter__(self) -> CpuSampler:
        self.t0 = time.monotonic()
        self.start_total = psutil.cpu_times()
        self.start_per_cpu = psutil.cpu_times(percpu=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.end_total = psutil.cpu_times()
        self.end_per_cpu = psutil.cpu_times(percpu=True)
        self.wall_s = time.monotonic() - self.t0

    @property
    def busy_s(self) -> float:
        return _busy(self.end_total) - _busy(self.start_total)

    def per_cpu(self) -> list[dict[str, float]]:
        out = []
        for a, b in zip(self.start_per_cpu, self.end_per_cpu):
            d = {f: getattr(b, f) - getattr(a, f) for f in b._fields}
            out.append(
                {
                    "user_s": d["user"] + d["nice"],
                    "system_s": d["system"],
                    "softirq_s": d["softirq"] + d["irq"],
                    "idle_s": d["idle"] + d.get("iowait", 0.0),
                }
            )
        return out


def process_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes (and their threads) so far."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


# A run is flagged when, with no traffic flowing just before it, other processes used more
# than this many CPUs' worth: its CPU figures (effort, load) would count their work too.
BUSY_CPUS = 0.25
IDLE_SAMPLE_S = 0.3


def other_cpu(
    pids: Sequence[int] = (), soaker: Soaker | None = None, seconds: float = IDLE_SAMPLE_S
) -> float:
    """CPUs' worth used over `seconds` by anything but this process, `pids` (the IPsec
    under test, idle) and study 3's soaker: sampled while no traffic flows, that is
    another program's work (a compile, a browser), which a run's machine-wide CPU
    figures would silently include."""
    me = psutil.Process()
    mark = soaker.mark() if soaker else None
    t0, s0, p0 = psutil.cpu_times(), me.cpu_times(), process_cpu_s(pids)
    w0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - w0
    t1, s1, p1 = psutil.cpu_times(), me.cpu_times(), process_cpu_s(pids)
    if soaker and mark:
        busy = soaker.used_since(mark)["soaker_cpu_used"] * wall
    else:
        busy = _busy(t1) - _busy(t0)
    ours = (s1.user + s1.system - s0.user - s0.system) + (p1 - p0)
    return float(max(0.0, busy - ours) / wall)


def busy_note(cpus: float, busy: int, n: int) -> str:
    """The summary's note for `busy` of `n` repetitions measured on a busy machine."""
    return (
        f"BUSY machine in {busy} of {n} runs: other processes used up to "
        f"{metrics.BY_KEY['other_cpu_before'].show(cpus)} "
        "just before (CPU figures include their work)"
    )


# Linux's CPU-time clock of a whole process, any process: clock_getcpuclockid(3) makes
# MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) = (~pid << 3) | 2 (include/linux/posix-timers.h).
CPUCLOCK_SCHED = 2


def process_cpu_ns(pids: Sequence[int]) -> int:
    """Nanoseconds these processes have run on a CPU so far, all their threads (ended ones
    too), by the scheduler's own clock — to time a short stretch of work exactly, where
    /proc/PID/stat counts 10 ms ticks. A process that is gone counts 0."""
    total = 0
    for pid in pids:
        try:
            total += time.clock_gettime_ns((~pid << 3) | CPUCLOCK_SCHED)
        except OSError:
            continue  # EINVAL: no such process (any more)
    return total


def process_cpu_wait_ns(pids: Sequence[int]) -> int | None:
    """Nanoseconds the living threads of these processes have been runnable but waiting for
    a CPU so far (each thread's /proc/PID/task/TID/schedstat, its second field: the run
    delay). None where the kernel keeps no such count."""
    total, seen = 0, False
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[1])
                seen = True
            except (OSError, IndexError, ValueError):
                continue
    return total if seen else None


def rss_bytes(pids: Sequence[int]) -> int:
    """Resident memory of these processes, summed."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    return {k: {f: after[k][f] - v[f] for f in v} for k, v in before.items() if k in after}


class HostMeters:
    """The CPU of each real host of a testbed, from its own /proc/stat (`read`: node ->
    (busy s, total s, CPUs) so far), which of them are the device under test, and
    (`procs`: node -> (CPU s, resident bytes) so far) the IPsec processes the lab runs
    on them."""

    def __init__(
        self,
        read: Callable[[], dict[str, tuple[float, float, int]]],
        dut: Sequence[str],
        procs: Callable[[], dict[str, tuple[float, int]]] | None = None,
    ) -> None:
        self.read = read
        self.dut = tuple(dut)
        self.procs = procs

    def read_procs(self) -> dict[str, tuple[float, int]]:
        return self.procs() if self.procs else {}

    def fill_procs(self, row: dict[str, Any], q0: dict[str, tuple[float, int]],
                   q1: dict[str, tuple[float, int]], kb: float) -> None:  # fmt: skip
        """The IPsec processes' CPU and memory on the hosts where the lab runs them
        (`ipsec_cpu_s`, `ipsec_effort_us_per_kb`, RSS at start and end, and per host)."""
        nodes = sorted(n for n in q1 if n in q0)
        if not nodes:
            return
        cpu = sum(q1[n][0] - q0[n][0] for n in nodes)
        row["hosts_ipsec"] = {n: {"cpu_s": q1[n][0] - q0[n][0], "rss_bytes": q1[n][1]}
                              for n in nodes}  # fmt: skip
        row["ipsec_cpu_s"] = cpu
        row["ipsec_effort_us_per_kb"] = cpu * 1e6 / kb if kb else None
        row["ipsec_rss_start_bytes"] = sum(q0[n][1] for n in nodes)
        row["ipsec_rss_end_bytes"] = sum(q1[n][1] for n in nodes)

    def fill(self, row: dict[str, Any], h0: dict[str, tuple[float, float, int]],
             h1: dict[str, tuple[float, float, int]], kb: float) -> None:  # fmt: skip
        """Per host: CPU load and effort; the row's `cpu_load` / `effort_us_per_kb` the
        DUT's (summed over its hosts), None with a note where the lab cannot read them."""
        per: dict[str, dict[str, float | None]] = {}
        for node, (b1, t1, n) in sorted(h1.items()):
            if node not in h0:
                continue
            busy, total = b1 - h0[node][0], t1 - h0[node][1]
            per[node] = {
                "cpu_busy_s": busy, "cpu_load": busy / total if total else None,
                "effort_us_per_kb": busy * 1e6 / kb if kb else None, "cpus": n,
            }  # fmt: skip
        row["hosts_cpu"] = per
        dut = [per[d] for d in self.dut if d in per]
        row["machine_effort_us_per_kb"] = row.get("effort_us_per_kb")
        if len(dut) == len(self.dut) and dut:
            busy = sum(float(d["cpu_busy_s"] or 0) for d in dut)
            loads = [d["cpu_load"] for d in dut if d["cpu_load"] is not None]
            row["cpu_load"] = sum(loads) / len(loads) if loads else None
            row["effort_us_per_kb"] = busy * 1e6 / kb if kb else None
        else:
            row["cpu_load"] = row["effort_us_per_kb"] = None
            missing = ", ".join(d for d in self.dut if d not in per)
            note = f"no CPU figure for the device under test: {missing} not metered"
            row["cpu_note"] = "; ".join(x for x in (row.get("cpu_note"), note) if x)


def measure(
    fn: Callable[[], dict[str, Any]],
    counters: Callable[[], dict[str, dict[str, int]]],
    ipsec_pids: Callable[[], list[int]],
    source_end: str,
    soaker: Soaker | None = None,
    hosts: HostMeters | None = None,
) -> dict[str, Any]:
    """Run `fn` (a traffic measurement returning at least `payload_bytes`) inside the
    meters; return its row with CPU, effort and wire figures added. `source_end` is the
    traffic source's `node/ifname`: its tx is the wire load source -> sink, rx the other
    way (study 4's network load and transactions, per direction). With `hosts` (a
    testbed of real hosts), each host's CPU is metered apart and the row's CPU load and
    effort are the device under test's (its hosts'), not this machine's."""
    pids = ipsec_pids()
    h0 = hosts.read() if hosts else {}
    q0 = hosts.read_procs() if hosts else {}
    c0 = counters()
    p0 = process_cpu_s(pids)
    w0 = process_cpu_wait_ns(pids)
    rss0 = rss_bytes(pids)
    mark = soaker.mark() if soaker else None
    with CpuSampler() as cpu:
        row = fn()
    soaked = soaker.used_since(mark) if soaker and mark else None
    p1 = process_cpu_s(pids)
    w1 = process_cpu_wait_ns(pids)
    c1 = counters()
    wire = delta(c0, c1)
    kb = row["payload_bytes"] / KB
    if cpu.wall_s < MIN_METERED_S:
        # /proc/stat counts in 10 ms ticks: a shorter measurement's CPU time is noise.
        kb = 0
        row["cpu_note"] = f"shorter than {MIN_METERED_S} s: too short to meter CPU"
    row["cpu_busy_s"] = cpu.busy_s
    row["cpu_wall_s"] = cpu.wall_s
    row["cpu_load"] = cpu.busy_s / (cpu.wall_s * (psutil.cpu_count() or 1))
    row["effort_us_per_kb"] = cpu.busy_s * 1e6 / kb if kb else None
    row["ipsec_cpu_s"] = p1 - p0
    # a thread that ended meanwhile takes its count with it: never below 0
    row["ipsec_cpu_wait_s"] = max(w1 - w0, 0) / 1e9 if w0 is not None and w1 is not None else None
    if pids:
        row["ipsec_rss_start_bytes"], row["ipsec_rss_end_bytes"] = rss0, rss_bytes(pids)
    row["ipsec_effort_us_per_kb"] = (p1 - p0) * 1e6 / kb if kb and pids else None
    if soaked is not None:
        row.update(soaked)
        used_s = soaked["soaker_cpu_used"] * soaked["soaker_wall_s"]
        row["soaker_effort_us_per_kb"] = used_s * 1e6 / kb if kb else None
    row["per_cpu"] = cpu.per_cpu()
    row["cpu_series"] = cpu.series
    row["wire"] = wire
    if hosts is not None:
        # the processes' window inside the hosts' (read after it opened, before it closes):
        # their CPU is then part of what the hosts' /proc/stat counted
        q1 = hosts.read_procs()
        hosts.fill(row, h0, hosts.read(), kb)
        hosts.fill_procs(row, q0, q1, kb)
    if source_end in wire:
        w = wire[source_end]
        row["wire_up_bytes"], row["wire_up_packets"] = w["tx_bytes"], w["tx_packets"]
        row["wire_down_bytes"], row["wire_down_packets"] = w["rx_bytes"], w["rx_packets"]
    return row


class OtherCpu:
    """CPUs' worth used by anything but this process while the block ran: what a
    benchmark shares the machine with (`with OtherCpu() as o: ...; o.cpus`)."""

    def __init__(self) -> None:
        self.cpus = 0.0
        self._me = psutil.Process()

    def __enter__(self) -> OtherCpu:
        self._t0, self._s0 = psutil.cpu_times(), self._me.cpu_times()
        self._w0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.monotonic() - self._w0, 1e-6)
        t1, s1 = psutil.cpu_times(), self._me.cpu_times()
        ours = s1.user + s1.system - self._s0.user - self._s0.system
        self.cpus = float(max(0.0, _busy(t1) - _busy(self._t0) - ours) / wall)

    @property
    def busy(self) -> bool:
        return self.cpus > BUSY_CPUS


ETHERNET = 14  # the L2 header a veth's byte counters include
TCP_IPV4 = 52  # IPv4 (20) + TCP (20) + timestamps (12), Linux's default per segment


def count_segments(row: dict[str, Any], mtu: int | None) -> None:
    """Count a TCP row's wire as the segments it leaves as. A veth's counters see a GSO
    buffer (up to 64 KB) as one packet with one set of headers, where a real link carries
    a segment of at most the MTU each with its own: plain forwarding's wire bytes then
    read lower than an IPsec's counted per packet. A direction whose mean packet is over
    the link's frame is split at the MSS (`mtu` - 52): `wire_*_bytes` and `_packets` as
    segments (an estimate), the counters' own under `wire_*_gso_bytes`/`_packets`, and
    `wire_counted` says so. A non-TCP row over the frame is only marked."""
    if not mtu:
        return
    tcp = "data" in row or "retransmits" in row
    for way in ("up", "down"):
        b, n = row.get(f"wire_{way}_bytes"), row.get(f"wire_{way}_packets")
        if not b or not n or b / n <= mtu + ETHERNET:
            continue
        row[f"wire_{way}_gso_bytes"], row[f"wire_{way}_gso_packets"] = b, n
        if not tcp:
            row["wire_counted"] = "GSO buffers: headers once per buffer, not per segment"
            continue
        payload = b / n - ETHERNET - TCP_IPV4  # a buffer's mean TCP payload
        segs = math.ceil(payload / (mtu - TCP_IPV4))
        row[f"wire_{way}_bytes"] = int(b + n * (segs - 1) * (ETHERNET + TCP_IPV4))
        row[f"wire_{way}_packets"] = n * segs
        row["wire_counted"] = (f"segments: GSO buffers split at the {mtu}-B link's MSS, "
                               "headers on each (an estimate)")  # fmt: skip
