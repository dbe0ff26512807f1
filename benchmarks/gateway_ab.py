"""A/B of one ipsec-gw change: the gateway as the lab configures it (A) against the same
with extra `[gateway]` lines (B) — or A run by another ipsec-gw build (`--binary-a`, e.g.
an older commit's) — in alternating runs on the `line` testbed, raw ESP and ESP in UDP.
Prints JSON: per variant the median TCP and UDP Mbit/s and B's ratio to A.

    sudo .venv/bin/python benchmarks/gateway_ab.py --line "workers = 1" [--repetitions 3]
        [--configuration esp:aes128gcm16] [--tcp-s 5] [--udp-s 3]
    sudo .venv/bin/python benchmarks/gateway_ab.py --binary-a /tmp/old/ipsec-gw

The lab starts ipsec-gw with `--init-state`; a build older than that option (before
issue 29) needs a wrapper script that drops it and execs the old binary.

Runs alternate (A raw, B raw, A UDP, B UDP, then again) so a machine's drift lands on
both sides. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_common import emit, mbps, tunnel

from ipsec_lab.backends.ours import Ours
from ipsec_lab.traffic.workload import Workload


def _run(
    args: argparse.Namespace, udp_encap: bool, lines: list[str], binary: Path | None
) -> tuple[float, float]:
    """One run: TCP then UDP 1420 B through a fresh tunnel; (TCP Mbit/s, UDP Mbit/s)."""
    extra = "".join(f"{x}\n" for x in lines)

    def edit(node: str, text: str) -> str:
        return text.replace("[gateway]\n", f"[gateway]\n{extra}", 1)

    gw = Ours(udp_encap=udp_encap, edit=edit if lines else None, binary=binary)
    with tunnel(gw, args.configuration, "gw-ab-") as tb:
        t = mbps(tb, Workload("tcp", seconds=args.tcp_s))
        u = mbps(tb, Workload("udp", size=1420, rate_mbit=args.udp_rate, seconds=args.udp_s))
    return t, u


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--line", action="append", default=[], help="a [gateway] line for B")
    ap.add_argument("--binary-a", type=Path, help="another ipsec-gw build for A")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument("--tcp-s", type=float, default=5.0)
    ap.add_argument("--udp-s", type=float, default=3.0)
    ap.add_argument("--udp-rate", type=float, default=3000.0, help="UDP Mbit/s offered")
    args = ap.parse_args()
    if args.repetitions < 1:
        ap.error("--repetitions: at least 1")
    if not args.line and not args.binary_a:
        ap.error("give B its --line, or A its --binary-a")
    runs: dict[str, list[tuple[float, float]]] = {}
    for rep in range(args.repetitions):
        for udp_encap in (False, True):
            for variant, lines, binary in (("A", [], args.binary_a), ("B", args.line, None)):
                key = f"{'ours-udp' if udp_encap else 'ours'} {variant}"
                runs.setdefault(key, []).append(_run(args, udp_encap, lines, binary))
                print(f"{rep + 1}/{args.repetitions} {key}: {runs[key][-1]}", file=sys.stderr)
    out: dict[str, Any] = {
        "configuration": args.configuration,
        "b_lines": args.line,
        "a_binary": str(args.binary_a) if args.binary_a else None,
    }
    for backend in ("ours", "ours-udp"):
        med = {
            v: [statistics.median(x[i] for x in runs[f"{backend} {v}"]) for i in (0, 1)]
            for v in ("A", "B")
        }
        out[backend] = {
            "tcp_mbps_median": {"A": med["A"][0], "B": med["B"][0]},
            "udp_1420_mbps_median": {"A": med["A"][1], "B": med["B"][1]},
            "ratio_b_to_a": {"tcp": med["B"][0] / med["A"][0], "udp": med["B"][1] / med["A"][1]},
            "runs": {v: runs[f"{backend} {v}"] for v in ("A", "B")},
        }
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
