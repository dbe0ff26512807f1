"""Where a small packet's cost goes in ipsec-gw (issue 41 item 2's question): the 64-B
NDR through the backend is searched first (trafgen), then UDP is offered at 10, 50 and
90 % of it, and for each load the two gateways' threads are read before and after from
/proc: CPU time (user: the engine's own work; system: its system calls and whatever
softirq work the kernel ran while it was the current task — on one machine, much of the
next namespace's receive path), wakeups (voluntary context switches: a thread that slept
in poll and was woken), preemptions (involuntary ones) and read/write calls
(`syscr`/`syscw` of /proc/PID/task/TID/io: the TUN device's reads and writes — socket
sends and receives are not counted there) and the time it was runnable but waiting for
a CPU (`schedstat`'s run delay: what a packet for that thread may wait on top). Each
is given per packet through the tunnel (what gwA sealed), per thread and in all.
Placement as the lab's default on this machine (traffic on the first CPU, the gateways
on the rest). Prints JSON.

    sudo .venv/bin/python benchmarks/gateway_cost.py [--backend ours] [--size 64]
        [--loads 10,50,90] [--seconds 4] [--repetitions 3]

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import emit

from ipsec_lab import backends
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.placement import choose
from ipsec_lab.traffic import rfc2544
from ipsec_lab.traffic.paced import Trafgen
from ipsec_lab.traffic.workload import Workload

USER_HZ = 100


def threads(pids: list[int]) -> dict[str, dict[str, int]]:
    """Per thread of `pids` (`PID/TID name`): CPU ticks, wakeups, preemptions, reads and
    writes so far."""
    out: dict[str, dict[str, int]] = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
                status = (task / "status").read_text()
                io = (task / "io").read_text()
                sched = (task / "schedstat").read_text().split()
            except OSError:  # the thread ended
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            f = stat[stat.rindex(")") + 2 :].split()
            kv = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in status.splitlines()
                  if ":" in ln}  # fmt: skip
            iov = dict(ln.split(": ") for ln in io.splitlines() if ": " in ln)
            out[f"{pid}/{task.name} {name}"] = {
                "user": int(f[11]),  # utime, field 14: the engine's own work
                "system": int(f[12]),  # stime, field 15: its system calls, and the
                # softirq work the kernel ran while it was the current task
                "wakeups": int(kv["voluntary_ctxt_switches"]),
                "preempted": int(kv["nonvoluntary_ctxt_switches"]),
                "reads": int(iov["syscr"]),
                "writes": int(iov["syscw"]),
                # ns runnable but waiting for a CPU (schedstat's run delay)
                "waited_ns": int(sched[1]),
            }
    return out


def sealed(backend: Any) -> int:
    """Packets gwA's SAs handled so far (the flow's way: all sealed, nothing comes back —
    the sink drops the flow, no ICMP)."""
    clock = backend.plane_clock()
    return int(clock["gwA"][1]) if "gwA" in clock else 0


def per_packet(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]],
               packets: int) -> dict[str, Any]:  # fmt: skip
    """What each thread (and all of them) spent per packet between two readings."""
    n = max(packets, 1)
    rows: dict[str, dict[str, float]] = {}
    total = dict.fromkeys(("cpu_us", "user_us", "system_us", "wakeups", "preempted",
                           "reads", "writes", "waited_us"), 0.0)  # fmt: skip
    for t, b in after.items():
        a = before.get(t, dict.fromkeys(b, 0))
        d = {k: b[k] - a[k] for k in b}
        us = 1e6 / USER_HZ / n
        row = {"cpu_us": (d["user"] + d["system"]) * us, "user_us": d["user"] * us,
               "system_us": d["system"] * us, "wakeups": d["wakeups"] / n,
               "preempted": d["preempted"] / n, "reads": d["reads"] / n,
               "writes": d["writes"] / n, "waited_us": d["waited_ns"] / 1e3 / n}  # fmt: skip
        if any(row.values()):
            rows[t] = row
        for k in total:
            total[k] += row[k]
    return {"threads": rows, "all": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ours", help="ours or ours-udp")
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument("--size", type=int, default=64, help="inner IP packet bytes")
    ap.add_argument("--loads", default="10,50,90", help="%% of the NDR, comma-separated")
    ap.add_argument("--seconds", type=float, default=4.0, help="per load and repetition")
    ap.add_argument("--repetitions", type=int, default=3)
    args = ap.parse_args()
    if args.backend not in ("ours", "ours-udp"):
        ap.error("--backend: ours or ours-udp (the per-thread figures are ipsec-gw's)")
    loads = [float(x) for x in args.loads.split(",")]
    if not loads or any(not 0 < x <= 100 for x in loads):
        ap.error("--loads: percentages in (0, 100]")
    placement = choose("auto", trafgen=True)
    backend = backends.make(args.backend)
    out: dict[str, Any] = {"backend": args.backend, "configuration": args.configuration,
                           "size": args.size, "placement": placement.record(),
                           "loads": {}}  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="gw-cost-"))
    try:
        with Testbed(topology("line"), root / "run", placement=placement) as tb:
            backend.start(tb, args.configuration)
            try:
                flow = tb.topo.flows[0]
                w = Workload("rfc2544", size=args.size, trial_s=2.0, max_rate_mbit=400.0,
                             resolution_mbit=1.0, max_trials=14, generator="trafgen")  # fmt: skip
                print("searching the NDR…", file=sys.stderr)
                (row,) = rfc2544.rfc2544(tb, flow, w, lambda _, f: f(), 0)
                ndr = float(row["mbps"])
                out["ndr_mbps"] = ndr
                out["ndr_generator_bound"] = row.get("generator_bound")
                gen = Trafgen(tb, flow)
                try:
                    for pct in loads:
                        rate = ndr * pct / 100
                        print(f"{pct:g} % of the NDR: {rate:.3g} Mbit/s…", file=sys.stderr)
                        reps = []
                        for _ in range(args.repetitions):
                            pids = backend.pids()
                            t0, s0 = threads(pids), sealed(backend)
                            trial = gen.trial(args.size, rate, args.seconds)
                            t1, s1 = threads(pids), sealed(backend)
                            cost = per_packet(t0, t1, s1 - s0)
                            cost["packets"] = s1 - s0
                            cost["loss_pct"] = trial["loss_pct"]
                            cost["mbps"] = trial["mbps"]
                            reps.append(cost)
                        med = {k: statistics.median(r["all"][k] for r in reps)
                               for k in reps[0]["all"]}  # fmt: skip
                        out["loads"][f"{pct:g}"] = {"rate_mbps": rate, "median": med,
                                                    "runs": reps}  # fmt: skip
                finally:
                    gen.close()
            finally:
                backend.stop(tb)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
