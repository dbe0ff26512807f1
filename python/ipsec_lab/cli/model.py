"""`ipsec-lab model fit|predict`: the Tisovsky-Baronak model from measured points or
given parameters, and what it predicts for sizes, ranges, mixes and captures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ipsec_lab.cli.args import (
    DEFAULT_SIZES,
    UserError,
    add_layout,
    arg_type,
    ip_size,
    lalg_of,
    mix_arg,
    non_negative,
    positive,
    rate_mbps,
    size_range,
    whole,
)
from ipsec_lab.cli.output import console, fmt_num, make_table, print_json
from ipsec_lab.model import pcap as cap
from ipsec_lab.model.throughput import (
    MIXES,
    AsyncModel,
    Model,
    SyncModel,
    fit,
    parse_point,
    predict_mix,
)


def _model_from_args(args: argparse.Namespace) -> tuple[Model, dict[str, Any] | None]:
    lalg = lalg_of(args)
    if args.point:
        if args.t_fix_ms is not None or args.r_alg_mbps is not None:
            raise UserError("give either --point (to fit) or the parameters, not both")
        f = fit(
            args.point,
            lalg,
            args.mode,
            link_mbps=getattr(args, "link_mbps", None),
            auto_exclude=not getattr(args, "no_exclude", False),
        )
        return f.model, f.to_json()
    missing = [
        n
        for n, v in (("--t-fix-ms", args.t_fix_ms), ("--r-alg-mbps", args.r_alg_mbps))
        if v is None
    ]
    if args.mode == "async" and args.t_oh_ms is None:
        missing.append("--t-oh-ms")
    if missing:
        raise UserError(f"{args.mode} model needs {', '.join(missing)} (or --point to fit)")
    if args.mode == "sync":
        if args.t_oh_ms is not None:
            raise UserError("--t-oh-ms belongs to the async model; add --mode async")
        return SyncModel(args.t_fix_ms, args.r_alg_mbps, lalg), None
    if args.t_oh_ms >= args.t_fix_ms:
        raise UserError("--t-oh-ms must be below --t-fix-ms (else there is no async regime)")
    return AsyncModel(args.t_fix_ms, args.t_oh_ms, args.r_alg_mbps, lalg), None


def _model_fit(args: argparse.Namespace) -> int:
    f = fit(
        args.point,
        lalg_of(args),
        args.mode,
        link_mbps=args.link_mbps,
        wire_overhead=args.wire_overhead,
        auto_exclude=not args.no_exclude,
        tolerance=args.tolerance,
    )
    doc = f.to_json()
    if args.json:
        print_json(doc)
        return 0
    c = console()
    params = ", ".join(
        f"{k} = {fmt_num(v)}"
        + (f" ± {fmt_num(doc['uncertainty'].get(k), '.2g')}" if doc["uncertainty"].get(k) else "")
        for k, v in f.model.params().items()
    )
    c.print(f"[bold]{f.model.mode} model, L_alg = {doc['lalg']}[/bold] ({f.method}): {params}")
    rows = [
        [
            str(p.size),
            str(p.l_alg),
            f"{p.mbps:.4g}",
            fmt_num(p.predicted_mbps),
            fmt_num(p.residual_pct, "+.2f"),
            p.excluded or "",
        ]
        for p in f.points
    ]
    c.print(
        make_table("points", ["size B", "L_alg B", "Mbit/s", "model", "resid %", "excluded"], rows)
    )
    for n in f.notes:
        c.print(f"[yellow]note:[/yellow] {n}")
    return 0


def _model_predict(args: argparse.Namespace) -> int:
    model, fitted = _model_from_args(args)
    sizes = list(args.size or [])
    for r in args.range or []:
        sizes += r
    if not sizes and not args.mix and not args.pcap:
        sizes = DEFAULT_SIZES
    preds = [
        {
            "size": s,
            "mbps": model.throughput_mbps(s),
            "kpps": 1.0 / model.time_ms(s),
            "t_ms": model.time_ms(s),
            "l_alg": model.lalg(s),
            "limit": model.limit(s),
        }
        for s in sizes
    ]
    doc: dict[str, Any] = {"model": {"mode": model.mode, "lalg": model.lalg.spec, **model.params()}}
    if fitted is not None:
        doc["fit"] = fitted
    doc["predictions"] = preds
    mixes = []
    for m in args.mix or []:
        mp = predict_mix(model, m[1])
        mixes.append({"mix": m[0], **mp.to_json()})
    if args.pcap:
        summary = cap.size_histogram(args.pcap)
        mp = predict_mix(model, sorted(summary.sizes.items()))
        mixes.append(
            {
                "mix": f"pcap:{args.pcap}",
                **mp.to_json(),
                "frames": summary.frames,
                "not_ip": summary.not_ip,
            }
        )
    if mixes:
        doc["mixes"] = mixes
    if args.json:
        print_json(doc)
        return 0
    c = console()
    c.print(
        f"[bold]{model.mode} model, L_alg = {model.lalg.spec}[/bold]: "
        + ", ".join(f"{k} = {v:.4g}" for k, v in model.params().items())
    )
    if preds:
        rows = [
            [str(p["size"]), str(p["l_alg"]), f"{p['mbps']:.4g}", f"{p['kpps']:.4g}", p["limit"]]
            for p in preds
        ]
        c.print(
            make_table("predicted", ["size B", "L_alg B", "Mbit/s", "kpps", "larger term"], rows)
        )
    for m in mixes:
        c.print(
            f"{m['mix']}: {m['mbps']:.4g} Mbit/s, {m['kpps']:.4g} kpps "
            f"(mean packet {m['mean_size']:.1f} B over {m['packets']:g} packets)"
        )
    return 0


def add_parser(sub: Any) -> None:
    m = sub.add_parser(
        "model",
        help="fit and use the Tisovsky-Baronak throughput model",
        description=(
            "The Tisovsky-Baronak model of a securing process: per packet "
            "t = t_fix + L_alg/R_alg (sync, software crypto) or "
            "t = max(t_fix, t_oh + L_alg/R_alg) (async, a crypto engine beside the CPU); "
            "throughput R(L) = L/t. Sizes are bytes of the inner IP packet, rates Mbit/s, "
            "times ms."
        ),
    )
    msub = m.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    msub.required = True
    lalg_help = (
        "secured length L_alg: ip (L_alg = L), esp:BLOCK (eq. 6), ah:BLOCK (eq. 5, IPv4, "
        "HMAC-96) or a configuration for the precise form, e.g. esp:aes128-sha1, "
        "esp:aes128gcm16, ah:sha1+esp:aes128 (default: ip)"
    )
    f = msub.add_parser(
        "fit",
        help="fit t_fix and R_alg (and t_oh) to measured points",
        description=(
            "Fit the model to measured (size, throughput) points. Two points (sync): the "
            "paper's eq. 10-11. More: least squares with standard errors. Async: one or "
            "more points below the break-point and two or more above it. Points the link "
            "rather than the securing process limited are left out (with --link-mbps, "
            "those at the link rate; otherwise, detected as a ceiling below the fit)."
        ),
        epilog="example:\n  ipsec-lab model fit --mode sync --lalg esp:16 "
        "--point 128:2.204 \\\n      --point 1280:11.382",
    )
    f.add_argument("--mode", choices=["sync", "async"], default="sync", help="default: sync")
    f.add_argument("--lalg", default="ip", metavar="FORM", help=lalg_help)
    f.add_argument(
        "--point",
        action="append",
        type=arg_type(parse_point),
        required=True,
        metavar="SIZE:MBPS",
        help="a measurement: inner IP packet size in bytes and throughput in Mbit/s (repeatable)",
    )
    f.add_argument(
        "--link-mbps",
        type=positive,
        metavar="RATE",
        help="link rate: points at it (within 2 %%, wire bytes counted) are left out",
    )
    f.add_argument(
        "--wire-overhead",
        type=whole(0),
        metavar="BYTES",
        help="bytes each packet adds on the link beyond what the --lalg configuration "
        "gives (the packet size alone for the paper's forms)",
    )
    f.add_argument(
        "--no-exclude", action="store_true", help="keep every point (no link-limit detection)"
    )
    f.add_argument(
        "--tolerance",
        type=positive,
        default=0.05,
        help="how far below the fit a top point must fall to be taken as link-limited "
        "(default: 0.05)",
    )
    add_layout(f)
    f.add_argument("--json", action="store_true", help="print JSON for scripts")
    f.set_defaults(func=_model_fit, user_errors=True)

    p = msub.add_parser(
        "predict",
        help="throughput for packet sizes, a mix (IMIX) or a capture's sizes",
        description=(
            "Predict throughput from given parameters (or from --point measurements, "
            "fitted first) for sizes, size ranges, mixes and a pcap's size distribution. "
            "A mix's throughput is its mean bytes per packet over its mean time per packet."
        ),
        epilog="example:\n  ipsec-lab model predict --mode sync --lalg esp:16 "
        "--t-fix-ms 0.4098 \\\n      --r-alg-mbps 21.179 --size 64 --size 512 --size 1420",
    )
    p.add_argument("--mode", choices=["sync", "async"], default="sync", help="default: sync")
    p.add_argument("--lalg", default="ip", metavar="FORM", help=lalg_help)
    p.add_argument("--t-fix-ms", type=non_negative, metavar="MS", help="per-packet time t_fix")
    p.add_argument("--r-alg-mbps", type=rate_mbps, metavar="RATE",
                   help="securing rate R_alg, Mbit/s (or with k/M/G: 1G)")  # fmt: skip
    p.add_argument(
        "--t-oh-ms", type=non_negative, metavar="MS", help="engine overhead t_oh (async)"
    )
    p.add_argument(
        "--point",
        action="append",
        type=arg_type(parse_point),
        metavar="SIZE:MBPS",
        help="fit these measurements first instead of giving parameters (repeatable)",
    )
    p.add_argument("--size", action="append", type=ip_size, metavar="BYTES", help="repeatable")
    p.add_argument(
        "--range",
        action="append",
        type=size_range,
        metavar="START:STOP[:STEP]",
        help="every size in a range, e.g. 64:1500:1 for the saw-tooth (repeatable)",
    )
    p.add_argument(
        "--mix",
        action="append",
        type=arg_type(mix_arg),
        metavar="MIX",
        help=f"{' or '.join(MIXES)} (simple IMIX: 7:4:1 of 40, 576, 1500 B IP packets), "
        "SIZE:WEIGHT,... or @FILE of 'SIZE WEIGHT' lines, a histogram (repeatable)",
    )
    p.add_argument("--pcap", type=Path, metavar="FILE", help="use the IP packet sizes of a capture")
    add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_model_predict, user_errors=True)
