"""How much of plain forwarding the gateway's data path keeps before any cryptography:
plain forwarding, ipsec-gw, and an `io-ceiling` build of ipsec-gw (dataplane/crypto.rs: packets
framed exactly as ESP with AES-GCM-16 would frame them, but neither encrypted nor
authenticated; TUN offloads, batching, UDP GSO/GRO and GRO into the TUN device all the
gateway's own), in alternating runs on the `line` testbed. Prints JSON: medians and
ratios — ceiling / plain is the most any cipher could leave, real / ceiling what
the cryptography costs on top.

    sudo .venv/bin/python benchmarks/io_ceiling.py [--repetitions 3] [--tcp-s 5]
        [--backends ours-udp,ours]

Builds the io-ceiling binary into target/io-ceiling first (cargo; the normal build is
untouched). That binary protects nothing: it runs only inside the testbed's namespaces,
here. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_common import emit, mbps, tunnel

from ipsec_lab.backends.none import NoIpsec
from ipsec_lab.backends.ours import Ours
from ipsec_lab.traffic.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
CEILING = ROOT / "target/io-ceiling/release/ipsec-gw"
CONFIGURATION = "esp:aes128gcm16"  # the framing the ceiling build copies


def build() -> None:
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "ipsec-gw", "--features", "io-ceiling",
         "--target-dir", str(ROOT / "target/io-ceiling")],
        cwd=ROOT, check=True,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--tcp-s", type=float, default=5.0)
    ap.add_argument("--backends", default="ours-udp,ours", help="ours-udp and/or ours")
    args = ap.parse_args()
    names = [b for b in args.backends.split(",") if b]
    if args.repetitions < 1 or not names or any(b not in ("ours", "ours-udp") for b in names):
        ap.error("--repetitions at least 1; --backends: ours-udp and/or ours")
    print("building the io-ceiling binary (target/io-ceiling)", file=sys.stderr)
    build()
    variants: dict[str, Any] = {"none": lambda: NoIpsec()}
    for b in names:
        udp = b == "ours-udp"
        variants[b] = lambda udp=udp: Ours(udp_encap=udp)
        variants[f"{b} io-ceiling"] = lambda udp=udp: Ours(udp_encap=udp, binary=CEILING)
    runs: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(args.repetitions):
        for key, make in variants.items():
            with tunnel(make(), CONFIGURATION, "io-ceiling-") as tb:
                runs[key].append(mbps(tb, Workload("tcp", seconds=args.tcp_s)))
            print(f"{rep + 1}/{args.repetitions} {key}: {runs[key][-1]:.0f}", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    out: dict[str, Any] = {"configuration": CONFIGURATION, "tcp_s": args.tcp_s}
    out["tcp_mbps_median"] = med
    out["runs"] = runs
    out["ratios"] = {
        b: {
            "ceiling_to_none": med[f"{b} io-ceiling"] / med["none"],
            "real_to_none": med[b] / med["none"],
            "real_to_ceiling": med[b] / med[f"{b} io-ceiling"],
        }
        for b in names
    }
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
