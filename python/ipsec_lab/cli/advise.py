"""`ipsec-lab advise ipcomp`: whether IPComp pays for this traffic and link."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from ipsec_lab.cli.args import (
    UserError,
    add_layout,
    engine_suite,
    ip_size,
    layout_of,
    non_negative,
    rate_mbps,
    whole,
)
from ipsec_lab.cli.output import console, fmt_num, make_table, print_json
from ipsec_lab.model import ipcomp as ipc
from ipsec_lab.model import pcap as cap
from ipsec_lab.model.transforms import IPCOMP_DEFAULT_MIN


def _sample(args: argparse.Namespace) -> tuple[ipc.Compressibility, list[bytes]]:
    given = [x for x in (args.data, args.pcap, args.reduction_pct) if x is not None]
    if len(given) != 1:
        raise UserError("give one sample: --data FILE, --pcap FILE or --reduction-pct PCT")
    if args.reduction_pct is not None:
        r = ipc.published(1 - args.reduction_pct / 100, args.packet_size,
                          source=f"{args.reduction_pct:g} % reduction (given)")  # fmt: skip
        return r, []
    if args.data is not None:
        path = Path(args.data)
        if path.is_dir():
            raise UserError(f"--data {path}: is a directory; give a file of the data to send")
        if not path.exists():
            raise UserError(f"--data {path}: no such file")
        try:
            with open(path, "rb") as f:  # a device or a FIFO too (/dev/stdin)
                data = f.read(args.max_bytes)
        except OSError as e:
            raise UserError(f"--data {path}: {e.strerror or e}") from None
        if not data:
            raise UserError(f"--data {path}: empty (no bytes to compress)")
        packets = ipc.packetize(data, args.packet_size)
        src = f"{path} ({len(data)} B in {len(packets)} packets of {args.packet_size} B)"
    else:
        packets = []
        truncated = 0
        for size, ip in cap.ip_packets(args.pcap):
            if len(ip) < size:
                truncated += 1
                continue
            packets.append(ip[:size])
        if not packets:
            raise UserError(
                f"--pcap {args.pcap}: no whole IP packets ({truncated} cut short by the "
                "snap length; capture with -s 0)"
            )
        src = f"{args.pcap} ({len(packets)} packets" + (
            f", {truncated} cut short and skipped)" if truncated else ")"
        )
    r = ipc.measure(packets, args.min_size, args.window_bits, args.level, src)
    return r, packets


def _advise_costs(
    args: argparse.Namespace, sample: ipc.Compressibility, packets: list[bytes]
) -> ipc.Costs:
    if args.costs.startswith("ferrante2005"):
        from ipsec_lab.studies import ferrante2005

        kind = args.costs.partition("-")[2] or (
            "compressible" if sample.compressed * 2 > sample.packets else "incompressible"
        )
        base = ferrante2005.ipcomp_costs(kind)
    else:
        fwd = 0.0
        comp = 0.0
        esp = 0.0
        parts = []
        if args.compress_us_per_kb is None:
            if not packets:
                raise UserError(
                    "costs 'here' measure DEFLATE on the sample: give --data or --pcap, "
                    "or --compress-us-per-kb"
                )
            comp = ipc.time_compression(packets, args.min_size, args.window_bits, args.level)
            parts.append("DEFLATE timed on the sample (zlib)")
        if args.esp_us_per_kb is None:
            suite = engine_suite(args.esp)
            size = int(statistics.median(sample.sizes))
            size = max(28, min(size, 9000))
            from ipsec_lab import bench

            row = bench.run([suite], [size], ["tunnel"], ["seal"], 60, 5)[0][0]
            esp = float(row["us_per_kb"])
            parts.append(f"ESP {suite} seal by the engine benchmark at {size} B")
        base = ipc.Costs(fwd, esp, comp, "measured here: " + "; ".join(parts))
    return ipc.Costs(
        args.forward_us_per_kb if args.forward_us_per_kb is not None else base.forward_us_per_kb,
        args.esp_us_per_kb if args.esp_us_per_kb is not None else base.esp_us_per_kb,
        args.compress_us_per_kb if args.compress_us_per_kb is not None else base.compress_us_per_kb,
        base.source,
    )


def _advise_ipcomp(args: argparse.Namespace) -> int:
    sample, packets = _sample(args)
    costs = _advise_costs(args, sample, packets)
    advice = ipc.advise(sample, costs, args.link_mbps, args.esp, layout_of(args), args.l2_bytes)
    doc = advice.to_json()
    if args.json:
        print_json(doc)
        return 0
    c = console()
    s = doc["sample"]
    c.print(
        f"[bold]sample[/bold] {s['source']}: {s['compressed']} of {s['packets']} packets "
        f"compressed, {s['incompressible']} sent as they were (no gain), {s['too_small']} "
        f"under {s['min_size']} B; IPComp output {100 * s['ratio']:.1f} % of input"
    )
    c.print(
        f"[bold]costs[/bold] ({costs.source}): forward {costs.forward_us_per_kb:.3g}, "
        f"ESP {costs.esp_us_per_kb:.3g}, DEFLATE {costs.compress_us_per_kb:.3g} µs/kB"
    )
    rows = [
        [
            k["name"],
            f"{k['mbps']:.4g}",
            k["limit"],
            fmt_num(k["cpu_mbps"]),
            f"{k['link_mbps']:.4g}",
            f"{k['effort_us_per_kb']:.3g}",
        ]
        for k in doc["cases"]
    ]
    c.print(
        make_table(
            f"predicted throughput on a {args.link_mbps:g} Mbit/s link (inner Mbit/s)",
            ["case", "Mbit/s", "limit", "CPU allows", "link allows", "µs/kB"],
            rows,
            caption="'CPU allows' — where no forwarding cost is known, none is assumed",
        )
    )
    c.print(f"[bold]{advice.verdict}[/bold]")
    return 0


def add_parser(sub: Any) -> None:
    a = sub.add_parser("advise", help="advice from the model (ipcomp)")
    asub = a.add_subparsers(dest="advise_command", metavar="SUBCOMMAND")
    asub.required = True
    p = asub.add_parser(
        "ipcomp",
        help="would IPComp (DEFLATE before ESP) pay for this data on this link?",
        description=(
            "Compress a sample of your data packet by packet as IPComp would (raw DEFLATE, "
            "packets under the minimum size skipped, packets that do not shrink sent as "
            "they were), then predict throughput with no IPsec, with ESP and with IPComp + "
            "ESP, and say what limits each: the link or the CPU. Costs are measured here "
            "(DEFLATE on the sample, ESP with the engine benchmark) or taken from study 1 "
            "(--costs ferrante2005)."
        ),
        epilog="example:\n  ipsec-lab advise ipcomp --data /usr/share/common-licenses/GPL-3 "
        "\\\n      --link-mbps 10M",
    )
    p.add_argument("--data", metavar="FILE", help="a file of the data to be sent")
    p.add_argument("--pcap", metavar="FILE", help="a capture of the traffic (whole packets)")
    p.add_argument(
        "--reduction-pct",
        type=non_negative,
        metavar="PCT",
        help="no sample: every packet shrinks by this much (a published figure)",
    )
    p.add_argument("--link-mbps", type=rate_mbps, required=True, metavar="RATE",
                   help="link rate, Mbit/s (or with k/M/G: 100M, 1G)")  # fmt: skip
    p.add_argument(
        "--esp", default="esp:aes128-sha1", metavar="CONFIG", help="default: esp:aes128-sha1"
    )
    p.add_argument(
        "--packet-size",
        type=ip_size,
        default=1500,
        metavar="BYTES",
        help="inner IP packets to cut --data into (default: 1500)",
    )
    p.add_argument(
        "--min-size",
        type=whole(0),
        default=IPCOMP_DEFAULT_MIN,
        metavar="BYTES",
        help=f"smaller packets are not compressed (default: {IPCOMP_DEFAULT_MIN}, Linux's)",
    )
    p.add_argument(
        "--window-bits",
        type=int,
        default=ipc.DEFAULT_WBITS,
        choices=range(8, 16),
        metavar="8-15",
        help=f"DEFLATE window (default: {ipc.DEFAULT_WBITS}, as Linux)",
    )
    p.add_argument(
        "--level",
        type=int,
        default=ipc.DEFAULT_LEVEL,
        choices=range(1, 10),
        metavar="1-9",
        help=f"DEFLATE level (default: {ipc.DEFAULT_LEVEL})",
    )
    p.add_argument(
        "--max-bytes",
        type=whole(1),
        default=16 * 1024 * 1024,
        help="use at most this much of --data (default: 16 MiB)",
    )
    p.add_argument(
        "--costs",
        choices=[
            "here",
            "ferrante2005",
            "ferrante2005-compressible",
            "ferrante2005-incompressible",
        ],
        default="here",
        metavar="COSTS",
        help="where CPU costs come from: here (measured now), ferrante2005, "
        "ferrante2005-compressible or ferrante2005-incompressible (default: here)",
    )
    p.add_argument("--forward-us-per-kb", type=non_negative, metavar="US")
    p.add_argument("--esp-us-per-kb", type=non_negative, metavar="US")
    p.add_argument("--compress-us-per-kb", type=non_negative, metavar="US")
    p.add_argument(
        "--l2-bytes",
        type=whole(0),
        default=ipc.ETHERNET_HEADER,
        metavar="BYTES",
        help="link-layer bytes per packet (default: 14, Ethernet)",
    )
    add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_advise_ipcomp, user_errors=True)
