"""The 64-byte NDR through each backend, searched with iperf3, trafgen and udp-gso in the
same run, on the `line` testbed (client - gwA - gwB - server) placed as a campaign places
it (traffic on CPU 0 of 2, the IPsec on the rest; `--unplaced`: every role anywhere), and
what each paced generator sends here flat out into plain forwarding's sink: which figure
is the generator's, which the gateway's. Prints JSON: per backend and generator the NDR
(median over repetitions) and the gateways' CPU share at the top of the search; each paced
generator's NDR over iperf3's per backend. Plain forwarding's generator-bound NDR is each
generator's paced ceiling here.

    sudo .venv/bin/python benchmarks/generator_ndr.py [--backend none --backend ours ...]
        [--size 64] [--repetitions 3] [--trial-s 2] [--unplaced]

The generators alternate within each backend's tunnel (iperf3, trafgen, udp-gso, iperf3,
…) so a machine's drift lands on all. Not a test: nothing here asserts a rate. trafgen's
flat out (its TX_RING) gives up with EAGAIN where its socket's buffer fills (placed, the
veth's frames wait on the IPsec's CPU): the JSON says so instead of a rate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench_common import emit, tunnel

from ipsec_lab import backends, meters
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.placement import choose
from ipsec_lab.traffic import rfc2544
from ipsec_lab.traffic.generator import PACED
from ipsec_lab.traffic.paced import Trafgen, UdpGso
from ipsec_lab.traffic.workload import Workload

GENERATORS = ("iperf3", *PACED)


def _ndr(tb: Any, backend: Any, generator: str, args: argparse.Namespace) -> dict[str, Any]:
    """One search; with it the CPUs' worth the IPsec processes used while it ran (near
    one per busy worker thread: the gateway, not the generator, at its limit)."""
    pids = backend.pids()
    c0, t0 = meters.process_cpu_s(pids), time.monotonic()
    w = Workload("rfc2544", size=args.size, trial_s=args.trial_s,
                 max_rate_mbit=args.max_rate, resolution_mbit=args.resolution,
                 max_trials=args.max_trials, generator=generator)  # fmt: skip
    (row,) = rfc2544.rfc2544(tb, tb.topo.flows[0], w, lambda _, f: f(), 0)
    cpus = (meters.process_cpu_s(pids) - c0) / (time.monotonic() - t0) if pids else None
    top = max((t for t in row["trials"] if t["passed"]), key=lambda t: t["offered_mbps"],
              default=None)  # fmt: skip
    return {"ndr_mbps": row["mbps"], "generator_bound": row.get("generator_bound"),
            "search": row["search"], "trials": len(row["trials"]), "ipsec_cpus": cpus,
            "sent_mbps_at_ndr": top.get("sent_mbps") if top else None}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", action="append", default=[],
                    help="none, ours, ours-udp, strongswan-libipsec… (repeat; default: "
                         "none, ours, ours-udp)")  # fmt: skip
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument("--size", type=int, default=64, help="inner IP packet bytes")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--trial-s", type=float, default=2.0)
    ap.add_argument("--max-rate", type=float, default=1000.0, help="Mbit/s, the search's top")
    ap.add_argument("--resolution", type=float, default=2.0, help="Mbit/s")
    ap.add_argument("--max-trials", type=int, default=14)
    ap.add_argument("--flat-out-packets", type=int, default=2_000_000)
    ap.add_argument(
        "--unplaced",
        action="store_true",
        help="every role on every CPU (placement off), as before placement",
    )
    args = ap.parse_args()
    names = args.backend or ["none", "ours", "ours-udp"]
    for n in names:
        if n not in backends.NAMES:
            ap.error(f"--backend: unknown {n!r} (known: {', '.join(backends.NAMES)})")
    # as a campaign here places its roles (traffic on CPU 0 of 2, the IPsec on the rest)
    placement = choose("off" if args.unplaced else "auto", trafgen=True)
    out: dict[str, Any] = {"size": args.size, "configuration": args.configuration,
                           "repetitions": args.repetitions, "placement": placement.record(),
                           "backends": {}}  # fmt: skip
    for name in names:
        print(f"{name}…", file=sys.stderr)
        runs: dict[str, list[dict[str, Any]]] = {g: [] for g in GENERATORS}
        flat: dict[str, list[dict[str, Any]]] = {g: [] for g in PACED}
        flat_errors: dict[str, str] = {}
        backend = backends.make(name)
        with tunnel(backend, args.configuration, "gen-ndr-", placement) as tb:
            for _ in range(args.repetitions):
                for gen in GENERATORS:
                    runs[gen].append(_ndr(tb, backend, gen, args))
            if name == "none":  # what each paced one sends here flat out, counted
                for gen in PACED:
                    tg = (Trafgen if gen == "trafgen" else UdpGso)(tb, tb.topo.flows[0])
                    try:
                        for _ in range(args.repetitions):
                            flat[gen].append(tg.flat_out(args.size, args.flat_out_packets))
                    except LabError as e:  # trafgen's TX_RING gives up on a full socket
                        flat_errors[gen] = str(e).splitlines()[-1]
                    finally:
                        tg.close()
        b: dict[str, Any] = {}
        for gen, rs in runs.items():
            ndrs = [float(r["ndr_mbps"]) for r in rs]
            b[gen] = {
                "ndr_mbps_median": statistics.median(ndrs), "ndr_mbps": ndrs,
                "kpps_median": statistics.median(ndrs) * 1e3 / (8 * args.size),
                "generator_bound": [r["generator_bound"] for r in rs], "runs": rs,
            }  # fmt: skip
        ip = b["iperf3"]["ndr_mbps_median"]
        for gen in PACED:
            b[f"{gen}_over_iperf3"] = b[gen]["ndr_mbps_median"] / ip if ip else None
            if gen in flat_errors:
                b[f"{gen}_flat_out"] = {"error": flat_errors[gen]}
            elif flat[gen]:
                b[f"{gen}_flat_out"] = {
                    "sent_kpps_median": statistics.median(f["sent_pps"] for f in flat[gen]) / 1e3,
                    "delivered_share_median": statistics.median(
                        f["received_packets"] / f["sender_packets"] for f in flat[gen]),
                    "runs": flat[gen]}  # fmt: skip
        out["backends"][name] = b
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
