"""Where the delay under RRUL goes (issue 41 item 3's question): a probe's RTT beside four
TCP streams each way through the backend (the lab's `latency` workload with
`background = "tcp"`), and meanwhile, read from the kernel before and after:

- per thread of the IPsec processes (ours' gateways) and, apart, of each `ksoftirqd`:
  CPU time, and the time it spent *runnable but waiting for a CPU*
  (`/proc/PID/task/TID/schedstat`'s run delay) with the number of times it was
  scheduled — the wait a packet for that thread shares;
- the gateways' own counters of what their queues dropped (ours: `queue_delay_drops`
  with `--gateway aqm=true`, `tun_queue_drops`);
- each CPU's network backlog (`/proc/net/softnet_stat`: processed, dropped, squeezed).

A queue that stands is seen as drops (or its AQM's), a CPU that is short as run-queue
wait. `--placement off` puts every role on every CPU. `--gateway KEY=VALUE` adds a key to
each of ours' gateway configs (`aqm=true`, `tun_queue=16`, `workers=1`). Prints JSON.

    sudo .venv/bin/python benchmarks/rrul_where.py [--backend ours] [--seconds 5]
        [--placement auto|off] [--gateway aqm=true ...] [--repetitions 1]

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import emit, tunnel

from ipsec_lab import backends
from ipsec_lab.backends.ours import Ours
from ipsec_lab.testbed.placement import MODES, choose
from ipsec_lab.traffic import latency
from ipsec_lab.traffic.workload import Workload

Sched = dict[str, tuple[int, int, int]]


def sched(pids: list[int]) -> Sched:
    """Per thread of `pids` (`PID/name`): ns on a CPU, ns waiting for one, times run."""
    out: Sched = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:  # the process ended
            continue
        for t in tasks:
            try:
                name = (t / "comm").read_text().strip()
                run, wait, n = map(int, (t / "schedstat").read_text().split())
            except (OSError, ValueError):
                continue
            out[f"{pid}/{t.name} {name}"] = (run, wait, n)
    return out


def ksoftirqds() -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if Path(f"/proc/{p}/comm").read_text().startswith("ksoftirqd/"):
                    pids.append(int(p))
            except OSError:
                continue
    return pids


def softnet() -> list[tuple[int, int, int]]:
    """Per CPU: packets processed, dropped (the backlog full), squeezed (out of budget)."""
    rows = []
    for ln in Path("/proc/net/softnet_stat").read_text().splitlines():
        f = ln.split()
        rows.append((int(f[0], 16), int(f[1], 16), int(f[2], 16)))
    return rows


def threads_between(a: Sched, b: Sched) -> dict[str, dict[str, float]]:
    out = {}
    for k, z in b.items():
        s = a.get(k, (0, 0, 0))
        run, wait, n = z[0] - s[0], z[1] - s[1], z[2] - s[2]
        if run or wait:
            out[k] = {"cpu_s": run / 1e9, "runqueue_wait_s": wait / 1e9, "runs": n,
                      "wait_per_run_us": wait / max(n, 1) / 1e3}  # fmt: skip
    return out


def drops(backend: Any) -> dict[str, dict[str, int | None]]:
    """Ours: each gateway's queue drops so far (the others: none to read)."""
    if not isinstance(backend, Ours):
        return {}
    out: dict[str, dict[str, int | None]] = {}
    for key in backend.sockets:
        st = backend._stats(key)
        out[key] = {
            "tun_queue_drops": st.get("tun_queue_drops"),
            "outbound_queue_delay_drops": st["outbound"]["io"].get("queue_delay_drops", 0),
            "inbound_queue_delay_drops": st["inbound"]["io"].get("queue_delay_drops", 0),
        }
    return out


def one(tb: Any, backend: Any, seconds: float) -> dict[str, Any]:
    flow = tb.topo.flows[0]
    w = Workload("latency", background="tcp", seconds=seconds)
    pids, soft = backend.pids(), ksoftirqds()
    s0, k0, n0, d0 = sched(pids), sched(soft), softnet(), drops(backend)
    (row,) = latency.latency(tb, flow, w, lambda _, f: f(), 0)
    s1, k1, n1 = sched(pids), sched(soft), softnet()
    time.sleep(0.2)  # the gateways publish their counters every 100 ms
    d1 = drops(backend)
    keep = ("rtt_p50_us", "rtt_p99_us", "one_way_up_p50_us", "one_way_down_p50_us", "mbps",
            "probes_lost", "probes_sent")  # fmt: skip
    backlog = [
        {"cpu": c, "processed": b[0] - a[0], "dropped": b[1] - a[1], "squeezed": b[2] - a[2]}
        for c, (a, b) in enumerate(zip(n0, n1, strict=True))
    ]
    queue = {
        g: {k: None if v is None else v - (d0[g][k] or 0) for k, v in c.items()}
        for g, c in d1.items()
    }
    return {
        "probes": {k: row.get(k) for k in keep},
        "threads": threads_between(s0, s1),
        "ksoftirqd": threads_between(k0, k1),
        "softnet": backlog,
        "queue_drops": queue,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="ours", help="any backend that runs here")
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument("--seconds", type=float, default=5.0, help="probing, per repetition")
    ap.add_argument("--placement", choices=MODES, default="auto")
    ap.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ours: a [gateway] key added to each config (TOML value)",
    )
    ap.add_argument("--repetitions", type=int, default=1)
    args = ap.parse_args()
    extra = []
    for kv in args.gateway:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip() or not v.strip():
            ap.error(f"--gateway {kv!r}: KEY=VALUE (a TOML value: aqm=true, tun_queue=16)")
        extra.append(f"{k.strip()} = {v.strip()}")
    if extra and args.backend not in ("ours", "ours-udp"):
        ap.error("--gateway: ours' and ours-udp's gateway keys only")
    if args.repetitions < 1:
        ap.error("--repetitions: at least 1")
    if args.backend in ("ours", "ours-udp"):
        lines = "".join(f"{x}\n" for x in extra)
        backend: Any = Ours(
            udp_encap=args.backend == "ours-udp",
            edit=lambda _, t: t.replace("[gateway]\n", "[gateway]\n" + lines, 1),
        )
    else:
        backend = backends.make(args.backend)
    placement = choose(args.placement, trafgen=True)
    out: dict[str, Any] = {
        "backend": args.backend,
        "configuration": args.configuration,
        "gateway": extra,
        "placement": placement.record(),
        "runs": [],
    }
    with tunnel(backend, args.configuration, "rrul-where-", placement) as tb:
        for _ in range(args.repetitions):
            out["runs"].append(one(tb, backend, args.seconds))
    waits = [sum(t["runqueue_wait_s"] for t in r["threads"].values()) for r in out["runs"]]

    def median(key: str) -> float | None:  # None: no run had it (every probe lost)
        xs = [r["probes"][key] for r in out["runs"] if r["probes"][key] is not None]
        return statistics.median(xs) if xs else None

    out["median"] = {
        "rtt_p50_us": median("rtt_p50_us"),
        "mbps": median("mbps"),
        "runqueue_wait_s": statistics.median(waits),
    }
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
