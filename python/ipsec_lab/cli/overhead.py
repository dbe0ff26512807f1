"""`ipsec-lab overhead`: the bytes each configuration adds on the wire."""

from __future__ import annotations

import argparse
from typing import Any

from ipsec_lab.cli.args import (
    DEFAULT_SIZES,
    add_layout,
    arg_type,
    ip_size,
    layout_of,
    size_bytes,
    whole,
)
from ipsec_lab.cli.output import console, human_bytes, make_table, print_json
from ipsec_lab.model import overhead as ovh
from ipsec_lab.model.transforms import parse_configuration

DEFAULT_CONFIGS = [
    "esp:aes128gcm16",
    "esp:chacha20poly1305",
    "esp:aes128-sha1",
    "esp:aes256-sha256",
    "esp:null-sha1",
    "ah:sha1",
    "ah:sha1+esp:aes128",
    "esp:3des-md5",
]


def _overhead(args: argparse.Namespace) -> int:
    lay = layout_of(args)
    configs = args.config or DEFAULT_CONFIGS
    parsed = [parse_configuration(c) for c in configs]
    sizes = args.size or ([] if args.transfer else DEFAULT_SIZES)
    rows = [ovh.per_packet(cfg, s, lay) for cfg in parsed for s in sizes]
    transfers = [
        ovh.transfer_view(configs, n, args.mtu, lay, args.request_bytes, args.l2_bytes)
        for n in args.transfer or []
    ]
    doc: dict[str, Any] = {"layout": lay.__dict__, "packets": rows, "transfers": transfers}
    if args.json:
        print_json(doc)
        return 0
    c = console()
    if rows:
        cols = ["config"] + [f"{s} B" for s in sizes]
        table_rows = [
            [cfg.text]
            + [f"{r['wire']} (+{r['overhead_pct']:.0f} %)" for r in rows if r["config"] == cfg.text]
            for cfg in parsed
        ]
        c.print(make_table(f"bytes on the wire per inner IP packet ({lay.mode})", cols, table_rows))
    for t in transfers:
        trows = [
            [
                "none",
                str(t["none"]["packets"]),
                str(t["none"]["wire_bytes"]),
                "",
                "",
                str(t["none"]["segment_data"]),
            ]
        ] + [
            [
                r["config"],
                str(r["packets"]),
                str(r["wire_bytes"]),
                f"{r['load_pct']:+.1f}",
                f"{r['packets_pct']:+.1f}",
                str(r["segment_data"]),
            ]
            for r in t["configs"]
        ]
        c.print(
            make_table(
                f"a TCP transfer of {human_bytes(t['bytes'])}, MTU {t['mtu']} (study 4's view)",
                ["config", "packets", "wire B", "load %", "packets %", "data/segment"],
                trows,
                caption="both directions; MSS clamped so protected segments fit the MTU",
            )
        )
    over = sorted({(r["config"], r["size"], r["wire"]) for r in rows if r["wire"] > args.mtu})
    for cfg_text, size, wire in over:
        c.print(
            f"[yellow]warning:[/yellow] {cfg_text} at {size} B: the protected packet is "
            f"{wire} B, over the {args.mtu} B MTU — it would be fragmented (or refused with "
            f"DF set); the largest inner packet that fits is "
            f"{ovh.largest_inner(parse_configuration(cfg_text), args.mtu, lay)} B"
        )
    legacy = [cfg.text for cfg in parsed if cfg.legacy]
    if legacy:
        c.print(
            f"[yellow]note:[/yellow] {', '.join(legacy)} use broken or weak algorithms "
            "(DES, 3DES, MD5), modelled to reproduce the older studies: do not deploy them"
        )
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "overhead",
        help="bytes IPsec adds per packet and per application transfer",
        description=(
            "Bytes on the wire for each configuration and inner IP packet size (outer IP "
            "header, UDP encapsulation, ESP/AH/IPComp headers, IV, padding, ICV), and with "
            "--transfer study 4's view of a whole TCP transfer: packets and bytes in both "
            "directions and the % increase over no IPsec."
        ),
        epilog="example:\n  ipsec-lab overhead --config esp:3des-md5 --transfer 1KB "
        "--transfer 10MB",
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="CONFIG",
        type=arg_type(lambda t: parse_configuration(t).text),
        help="e.g. esp:aes128gcm16, ah:sha1+esp:aes128 (repeatable; default: a common set)",
    )
    p.add_argument("--size", action="append", type=ip_size, metavar="BYTES", help="repeatable")
    p.add_argument(
        "--transfer",
        action="append",
        type=size_bytes,
        metavar="SIZE",
        help="an application transfer, e.g. 1KB, 10MB (1 KB = 1024 B; repeatable)",
    )
    p.add_argument(
        "--mtu", type=whole(68), default=1500, help="link MTU (default: 1500; at least 68)"
    )
    p.add_argument(
        "--request-bytes",
        type=whole(0),
        default=0,
        metavar="BYTES",
        help="client request before the transfer (e.g. ~100 for an HTTP GET; default: 0)",
    )
    p.add_argument(
        "--l2-bytes",
        type=whole(0),
        default=14,
        metavar="BYTES",
        help="link-layer bytes per packet counted in the load (default: 14, Ethernet)",
    )
    add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_overhead, user_errors=True)
