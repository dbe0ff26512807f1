"""The gateway benchmark: ipsec-gw against plain forwarding, in one run, on one testbed
(client - gwA - gwB - server, unshaped), as a lab campaign. Prints JSON.

    sudo .venv/bin/python benchmarks/gateway.py [--repetitions 3] [--soak-s 300]
        [--configuration esp:aes128gcm16] [--backends ours,ours-udp]
        [--soak-backend ours-udp] [--lab DIR]

Per workload (iperf3 TCP with 1 and 4 streams, UDP at 64, 512 and 1420 bytes): the median
Mbit/s of plain forwarding (`none`) and of each ipsec-gw backend — `ours` (raw ESP) and
`ours-udp` (ESP in UDP 4500, with UDP GSO/GRO); `strongswan` (its user-space ESP on a
TUN device) for reference when named — over the repetitions, their ratio to
plain forwarding measured in the same run, the gateways' CPU seconds per GiB moved (from
/proc/PID/stat), and the spread. Then a soak: TCP saturating the tunnel for --soak-s
seconds through --soak-backend (default `ours-udp`: its GSO/GRO path holds the biggest
buffers), with the gateways' resident memory before and after (it must stay flat).
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import emit

from ipsec_lab import runner, scenario

UDP_RATE_MBIT = 5000  # above what iperf3 can send: the sender's ceiling, not ours
# What --backends may name: ipsec-gw's two and, for reference, strongSwan's user-space ESP
# (charon with kernel-libipsec, also on a TUN device).
COMPARED = ("ours", "ours-udp", "strongswan")


def _soak(cfg: str, soak_s: float, backend: str) -> str:
    return f"""
name = "gateway-soak"
topology = "line"
backends = ["{backend}"]
configurations = ["{cfg}"]
warmup_s = 1
[[workloads]]
kind = "tcp"
label = "soak"
seconds = {soak_s:g}
"""


def _scenario(cfg: str, reps: int, backends: list[str]) -> str:
    udp = "".join(
        f'\n[[workloads]]\nkind = "udp"\nsize = {n}\nrate_mbit = {UDP_RATE_MBIT}\nseconds = 5\n'
        for n in (64, 512, 1420)
    )
    text = f"""
name = "gateway-bench"
topology = "line"
backends = {json.dumps(["none", *backends])}
configurations = ["{cfg}"]
repetitions = {reps}
warmup_s = 1
[[workloads]]
kind = "tcp"
seconds = 10
[[workloads]]
kind = "tcp"
streams = 4
seconds = 10
{udp}"""
    return text


def _backend(ours: list[dict[str, Any]], m_plain: float | None, soak: bool) -> dict[str, Any]:
    """One backend's figures for one workload, against plain forwarding's median."""
    m_ours = statistics.median(x["mbps"] for x in ours)
    # ipsec_effort is µs per kB (1024 B): x 1,048,576 kB per GiB / 1e6 = s per GiB
    cpu_s_per_gib = [
        x["ipsec_effort_us_per_kb"] * 1.048576 for x in ours if x["ipsec_effort_us_per_kb"]
    ]
    entry: dict[str, Any] = {
        "mbps_median": m_ours,
        "ratio_to_none": m_ours / m_plain if m_plain else None,
        "mbps_all": [x["mbps"] for x in ours],
        "gateway_cpu_s_per_gib_median": statistics.median(cpu_s_per_gib) if cpu_s_per_gib else None,
        "machine_effort_us_per_kb": statistics.median(x["effort_us_per_kb"] for x in ours),
    }
    if soak:
        entry["rss_start_bytes"] = [x.get("ipsec_rss_start_bytes") for x in ours]
        entry["rss_end_bytes"] = [x.get("ipsec_rss_end_bytes") for x in ours]
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--soak-s", type=float, default=300.0)
    ap.add_argument("--configuration", default="esp:aes128gcm16")
    ap.add_argument(
        "--backends",
        default="ours,ours-udp",
        help=f"backends to set beside plain forwarding, comma-separated: {', '.join(COMPARED)}",
    )
    ap.add_argument("--soak-backend", default="ours-udp", choices=("ours", "ours-udp"))
    ap.add_argument("--lab", type=Path)
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in COMPARED:
            ap.error(f"--backends: {b!r} is not one of {', '.join(COMPARED)}")
    lab = args.lab or Path(tempfile.mkdtemp(prefix="ipsec-gw-bench-"))
    runs: list[dict[str, Any]] = []
    texts = [_scenario(args.configuration, args.repetitions, backends)]
    if args.soak_s:
        texts.append(_soak(args.configuration, args.soak_s, args.soak_backend))
    for text in texts:
        c = runner.Campaign(scenario.parse(text, "bench"), lab)
        c.on_progress = lambda p: print(f"{p.done}/{p.total} {p.current}", file=sys.stderr)
        c.run()
        runs += c.store.runs(c.id)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        for x in r["results"]:
            rows.setdefault((x["label"], r["backend"]), []).append(x)
    out: dict[str, Any] = {"configuration": args.configuration, "workloads": {}}
    for label in dict.fromkeys(lbl for lbl, _ in rows):
        plain = rows.get((label, "none"), [])
        m_plain = statistics.median(x["mbps"] for x in plain) if plain else None
        entry: dict[str, Any] = {
            "none_mbps_median": m_plain,
            "none_mbps_all": [x["mbps"] for x in plain],
            "none_machine_effort_us_per_kb": statistics.median(x["effort_us_per_kb"] for x in plain)
            if plain
            else None,
        }
        for b in dict.fromkeys([*backends, args.soak_backend]):
            ours = rows.get((label, b), [])
            if ours:
                entry[b] = _backend(ours, m_plain, label == "soak")
        out["workloads"][label] = entry
    out["lab"] = str(lab)
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
