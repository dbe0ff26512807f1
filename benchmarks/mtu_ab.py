"""A/B of ipsec-gw's TUN MTU on a real 1500-byte link: `mtu = "auto"` (the path's MTU
less the SAs' overhead: nothing sealed is fragmented) against a fixed number (default
1500, what the lab configured before `auto`: every full-size packet leaves as two
fragments in UDP; in plain ESP the raw socket refuses it, so only ESP in UDP is run for
a fixed MTU over the path). TCP client -> server through the `line` testbed, runs
alternating so a machine's drift lands on both. Prints JSON: per variant the runs, the
median, and auto's ratio to fixed.

    sudo .venv/bin/python benchmarks/mtu_ab.py [--repetitions 3] [--fixed 1500]
        [--configuration esp:aes128gcm16] [--tcp-s 5]

Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench_common import emit, mbps, tunnel

from ipsec_lab.backends.ours import Ours
from ipsec_lab.traffic.workload import Workload


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--fixed", type=int, default=1500, help="B's fixed TUN MTU (bytes)")
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument("--tcp-s", type=float, default=5)
    args = ap.parse_args()
    fixed = f"mtu = {args.fixed}"
    runs: dict[str, list[float]] = {"auto": [], fixed: []}
    for rep in range(args.repetitions):
        for name in runs:
            edit = None if name == "auto" else (lambda n, t: t.replace('mtu = "auto"', fixed, 1))
            gw = Ours(udp_encap=True, edit=edit)
            with tunnel(gw, args.configuration, f"mtu-ab-{rep}-") as tb:
                runs[name].append(mbps(tb, Workload("tcp", seconds=args.tcp_s)))
            print(f"{rep + 1}/{args.repetitions} {name}: {runs[name][-1]:.0f} Mbit/s",
                  file=sys.stderr)  # fmt: skip
    med = {k: statistics.median(v) for k, v in runs.items()}
    return emit({
        "benchmark": "mtu_ab",
        "backend": "ours-udp",
        "configuration": args.configuration,
        "link_mtu": 1500,
        "variants": {k: {"tcp_mbps": v, "median_mbps": med[k]} for k, v in runs.items()},
        "ratio_auto_to_fixed": med["auto"] / med[fixed] if med[fixed] else None,
    })  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
