"""How ipsec-gw scales with crypto workers: iperf3 TCP through plain forwarding, raw ESP
and ESP in UDP, for each number of crypto workers per direction and each number of
streams, on the `line` testbed (client - gwA - gwB - server). Prints JSON.

    sudo .venv/bin/python benchmarks/gateway_scaling.py [--workers 1,2,4,8]
        [--streams 1,4,8] [--repetitions 3] [--seconds 8] [--configuration esp:aes128gcm16]

Per (transport, workers, streams): the median Mbit/s over the repetitions, its ratio to
plain forwarding's median for the same streams measured in the same run, and the two
gateways' CPU seconds per GiB moved (their processes' user + system time, all threads,
from /proc), with the ratio of that to 1 worker's (efficiency: a crew that buys speed
with much more CPU per byte shows here). Runs alternate — every cell once, then again —
so a shared machine's drift lands on all cells alike. Not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import psutil
from bench_common import emit, mbps, tunnel

from ipsec_lab.backends import make
from ipsec_lab.backends.ours import Ours
from ipsec_lab.traffic.workload import Workload

GIB = 1 << 30


def _ints(text: str, what: str, ap: argparse.ArgumentParser) -> list[int]:
    try:
        xs = [int(x) for x in text.split(",") if x]
    except ValueError:
        ap.error(f"--{what}: {text!r} is not a comma-separated list of whole numbers")
    if not xs or min(xs) < 1:
        ap.error(f"--{what}: give at least one number, each 1 or more")
    return xs


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _run(args: argparse.Namespace, transport: str, workers: int, streams: int) -> dict[str, Any]:
    """One run of one cell on a fresh testbed: Mbit/s and the gateways' CPU s per GiB."""
    if transport == "plain":
        backend: Any = make("none")
    else:
        line = f"crypto_workers = {workers}\n"
        backend = Ours(
            udp_encap=transport == "esp-udp",
            edit=lambda node, text: text.replace("[gateway]\n", f"[gateway]\n{line}", 1),
        )
    with tunnel(backend, args.configuration, "gw-scaling-") as tb:
        pids = backend.pids()
        before = _cpu_s(pids)
        rate = mbps(tb, Workload("tcp", streams=streams, seconds=args.seconds))
        cpu = _cpu_s(pids) - before
    moved_gib = rate * 1e6 / 8 * args.seconds / GIB
    return {"mbps": rate, "cpu_s_per_gib": cpu / moved_gib if pids and moved_gib else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,4,8", help="crypto workers per direction to try")
    ap.add_argument("--streams", default="1,4,8", help="iperf3 TCP streams to try")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each iperf3 run")
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    args = ap.parse_args()
    workers = _ints(args.workers, "workers", ap)
    streams = _ints(args.streams, "streams", ap)
    if args.repetitions < 1:
        ap.error("--repetitions: at least 1")
    cells = [("plain", 1, s) for s in streams] + [
        (t, w, s) for t in ("esp-raw", "esp-udp") for w in workers for s in streams
    ]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for rep in range(args.repetitions):
        for cell in cells:
            runs.setdefault(cell, []).append(_run(args, *cell))
            print(f"{rep + 1}/{args.repetitions} {cell}: {runs[cell][-1]}", file=sys.stderr)

    def median(cell: tuple[str, int, int], key: str) -> float | None:
        xs = [r[key] for r in runs[cell] if r[key] is not None]
        return statistics.median(xs) if xs else None

    table: list[dict[str, Any]] = []
    for t, w, s in cells:
        m, plain = median((t, w, s), "mbps"), median(("plain", 1, s), "mbps")
        cpu = median((t, w, s), "cpu_s_per_gib")
        cpu_one = median((t, workers[0], s), "cpu_s_per_gib")
        table.append(
            {
                "transport": t,
                "crypto_workers": w if t != "plain" else None,
                "streams": s,
                "mbps_median": m,
                "ratio_to_plain": m / plain if m and plain else None,
                "gateway_cpu_s_per_gib_median": cpu,
                f"cpu_per_gib_ratio_to_{workers[0]}_worker": cpu / cpu_one
                if cpu and cpu_one and t != "plain"
                else None,
                "mbps_all": [r["mbps"] for r in runs[(t, w, s)]],
            }
        )
    out = {
        "configuration": args.configuration,
        "seconds": args.seconds,
        "repetitions": args.repetitions,
        "cells": table,
    }
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
