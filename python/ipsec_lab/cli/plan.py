"""`ipsec-lab plan`: the cores (or the CPU) a link needs, from the model, a benchmark
of this engine, or a lab campaign's measured effort."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from ipsec_lab.cli.args import (
    UserError,
    add_layout,
    arg_type,
    core_share,
    engine_suite,
    ip_size,
    lab_dir,
    lalg_of,
    mix_arg,
    non_negative,
    positive,
    rate_mbps,
    whole,
)
from ipsec_lab.cli.output import console, fmt_mbps, make_table, print_json
from ipsec_lab.model.plan import CycleCosts, Plan, cpu_mhz_here
from ipsec_lab.model.throughput import Point, SyncModel, fit, parse_point
from ipsec_lab.model.transforms import parse_configuration

BENCH_SIZES = [64, 128, 256, 512, 1024, 1420]


# One wording wherever plan's engine-only figure is shown.
ENGINE_ONLY = (
    "upper bound on rate, lower bound on cost: the engine alone, without the TUN, socket "
    "and kernel costs a gateway also pays (plan from a lab campaign with --campaign N)"
)


def _bench_points(suite: str, budget_ms: int, trials: int, op: str) -> list[Point]:
    from ipsec_lab import bench

    rows = bench.run([suite], BENCH_SIZES, ["tunnel"], [op], budget_ms, trials)
    return [Point(int(r["size"]), float(r["size"]) * 8e3 / float(r["ns_per_packet"])) for r in rows]


def _campaign_effort(args: argparse.Namespace) -> tuple[float, str]:
    """The median IPsec-process µs/kB of a lab campaign's runs of one configuration."""
    from ipsec_lab import runner
    from ipsec_lab.store import Store

    db = lab_dir(args) / "results.sqlite"
    if not db.exists():
        raise UserError(f"--campaign: no results in {db} (give --lab DIR)")
    store = Store(db)
    try:
        if store.campaign(args.campaign) is None:
            raise UserError(f"--campaign {args.campaign}: no such campaign in {db}")
        rows = runner.summarize(store.runs(args.campaign))
    finally:
        store.close()
    rows = [r for r in rows if r.get("ipsec_effort_median")]
    if args.backend:
        rows = [r for r in rows if r["backend"] == args.backend]
    if args.configuration:
        want = parse_configuration(args.configuration).text
        rows = [r for r in rows if parse_configuration(r["configuration"]).text == want]
    pairs = sorted({(r["backend"], r["configuration"]) for r in rows})
    if not pairs:
        raise UserError(
            f"--campaign {args.campaign}: no run with the IPsec processes' CPU measured"
            + (f" for {args.configuration}" if args.configuration else "")
        )
    if len(pairs) > 1:
        raise UserError(
            f"--campaign {args.campaign} has several: "
            + ", ".join(f"{b} {c}" for b, c in pairs)
            + "; choose with --backend and --configuration"
        )
    vals = [float(r["ipsec_effort_median"]) for r in rows]
    b, c = pairs[0]
    return statistics.median(vals), f"campaign {args.campaign}, {b} {c}, {len(vals)} measurements"


def _plan(args: argparse.Namespace) -> int:
    sources = sum(
        x is not None and x != []
        for x in (args.t_fix_ms, args.point, args.bench, args.cycles_per_byte, args.campaign)
    )
    if sources != 1:
        raise UserError(
            "give one source of costs: --t-fix-ms/--r-alg-mbps, --point (to fit), "
            "--bench CONFIG (measure the engine here), --campaign N (the lab's gateway "
            "measurements) or --cycles-per-byte"
        )
    mhz = args.cpu_mhz or cpu_mhz_here()
    notes: list[str] = []
    if mhz is None:
        raise UserError("no clock in /proc/cpuinfo: give --cpu-mhz")
    if not args.cpu_mhz:
        notes.append(
            f"clock {mhz:.0f} MHz from /proc/cpuinfo (nominal; a VM or turbo may differ): "
            "cycles are time x this clock"
        )
    fitted: dict[str, Any] | None = None
    bound = "as given"
    if args.campaign is not None:
        us_per_kb, what = _campaign_effort(args)
        # µs per kB of payload, both gateways' IPsec processes: half is one gateway's
        per_gw = us_per_kb / 2
        costs = CycleCosts.flat(per_gw * mhz / 1024, 0.0, mhz)
        bound = "measured: the lab's gateways, TUN, sockets and all"
        notes.append(
            f"measured in the lab: {what}: {us_per_kb:.3g} µs/kB for both gateways' IPsec "
            f"processes, {per_gw:.3g} per gateway (TUN and socket costs included; the kernel's "
            "own forwarding is not)"
        )
    elif args.cycles_per_byte is not None:
        costs = CycleCosts.flat(args.cycles_per_byte, args.cycles_per_packet, mhz)
    else:
        if args.bench:
            suite = engine_suite(args.bench)
            args.lalg = args.bench
            pts = _bench_points(suite, args.budget_ms, args.trials, args.op)
            notes.append(
                f"measured here: engine {args.op} of {suite}, tunnel mode, one core, "
                f"sizes {BENCH_SIZES} (the engine alone: no TUN, sockets or kernel)"
            )
            bound = ENGINE_ONLY
        else:
            pts = args.point or []
        lalg = lalg_of(args)
        if pts:
            f = fit(pts, lalg, "sync", auto_exclude=False)
            model = f.model
            fitted = f.to_json()
        else:
            if args.r_alg_mbps is None:
                raise UserError("--t-fix-ms needs --r-alg-mbps")
            model = SyncModel(args.t_fix_ms, args.r_alg_mbps, lalg)
        assert isinstance(model, SyncModel)
        costs = CycleCosts.from_model(model, mhz)
    mix = args.mix[1] if args.mix else ((args.size, 1.0),)
    plan = Plan(costs, mix, args.target_mbps, args.max_load)
    doc = plan.to_json()
    doc["notes"] = notes
    doc["costs_are"] = bound
    if fitted:
        doc["fit"] = fitted
    if args.json:
        print_json(doc)
        return 0
    c = console()
    c.print(
        f"[bold]{doc['cycles_per_packet']:.0f} cycles per packet + "
        f"{doc['cycles_per_byte']:.3g} cycles per byte of L_alg ({costs.lalg.spec})[/bold] "
        f"at {mhz:.0f} MHz; {doc['cycles_per_inner_byte']:.3g} cycles per packet byte at "
        f"mean size {doc['mean_size']:.0f} B (FreeS/WAN's figure: 140 for 3DES + HMAC)"
    )
    upper = bound.startswith("upper bound")
    c.print(
        f"one core: {'at most ' if upper else ''}{fmt_mbps(doc['per_core_mbps'])} Mbit/s; "
        f"{'at least ' if upper else ''}{doc['mhz_per_mbps']:.3g} MHz per Mbit/s "
        "(FreeS/WAN rule: 25)"
    )
    c.print(f"[dim]costs: {bound}[/dim]")
    if plan.target_mbps is not None:
        c.print(
            f"[bold]{plan.target_mbps:g} Mbit/s needs {'at least ' if upper else ''}"
            f"{plan.cores} core(s)[/bold] at "
            f"{mhz:.0f} MHz, each at most {100 * plan.max_load:.0f} % busy"
        )
    rows = [
        [
            r["link"],
            f"{r['mbps']:g}",
            f"{r['rule_mhz']:.0f}",
            f"{r['freeswan_3des_mhz']:.0f}",
            f"{r['ours_mhz']:.1f}",
            str(r["cores_here"]),
        ]
        for r in doc["links"]
    ]
    c.print(
        make_table(
            "minimum gateway per link (study 3's table, regenerated)",
            ["link", "Mbit/s", "rule MHz", "FreeS/WAN 3DES MHz", "ours MHz", "cores here"],
            rows,
            caption="rule: 25 MHz per Mbit/s; FreeS/WAN 3DES: 140 cycles/byte (Pentium II)",
        )
    )
    for n in notes:
        c.print(f"[dim]note: {n}[/dim]")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="cycles per packet/byte, cores for a target rate, study 3's MHz table",
        description=(
            "Turn a configuration's costs into cycles per packet and per byte, the cores "
            "needed for a target rate at a packet size or mix, and FreeS/WAN's 'minimum "
            "gateway per link' table (study 3) regenerated beside its 25-MHz-per-Mbit/s "
            "rule. Costs come from model parameters, measured points, the engine benchmark "
            "run here (--bench), or cycles per byte."
        ),
        epilog="examples:\n  ipsec-lab plan --bench esp:aes128gcm16 --target-mbps 10G\n"
        "  ipsec-lab plan --cycles-per-byte 140 --cpu-mhz 450\n"
        "  ipsec-lab plan --campaign 1 --backend ours --configuration esp:aes128gcm16",
    )
    p.add_argument("--t-fix-ms", type=non_negative, metavar="MS")
    p.add_argument("--r-alg-mbps", type=rate_mbps, metavar="RATE",
                   help="securing rate R_alg, Mbit/s (or with k/M/G: 1G)")  # fmt: skip
    p.add_argument("--point", action="append", type=arg_type(parse_point), metavar="SIZE:MBPS")
    p.add_argument("--lalg", default="ip", metavar="FORM", help="secured-length form (default: ip)")
    p.add_argument(
        "--bench",
        metavar="CONFIG",
        help="measure this ESP configuration with the engine benchmark here, e.g. "
        "esp:aes128gcm16 (about 5 s)",
    )
    p.add_argument(
        "--campaign",
        type=whole(1),
        metavar="N",
        help="plan from a lab campaign's measurements: the IPsec processes' µs/kB of its "
        "gateways (see `ipsec-lab results`); with --configuration when it has several",
    )
    p.add_argument("--configuration", metavar="CONFIG", help="with --campaign: which one")
    p.add_argument("--backend", default=None, metavar="B", help="with --campaign: which one")
    p.add_argument("--lab", metavar="DIR", help="with --campaign: the lab directory")
    p.add_argument("--op", choices=["seal", "open"], default="seal", help="with --bench")
    p.add_argument("--budget-ms", type=whole(1), default=60, help="with --bench (default: 60)")
    p.add_argument("--trials", type=whole(1), default=5, help="with --bench (default: 5)")
    p.add_argument("--cycles-per-byte", type=non_negative, metavar="C")
    p.add_argument("--cycles-per-packet", type=non_negative, default=0.0, metavar="C")
    p.add_argument("--cpu-mhz", type=positive, metavar="MHZ", help="default: this machine's")
    p.add_argument(
        "--size", type=ip_size, default=1500, metavar="BYTES", help="packet size (default: 1500)"
    )
    p.add_argument("--mix", type=arg_type(mix_arg), metavar="MIX", help="a mix instead of --size")
    p.add_argument("--target-mbps", type=rate_mbps, metavar="RATE",
                   help="rate to plan for, Mbit/s (or with k/M/G: 100M, 1G)")  # fmt: skip
    p.add_argument(
        "--max-load",
        type=core_share,
        default=0.8,
        metavar="SHARE",
        help="busiest a core may be, more than 0 and at most 1, or a percentage (default: "
        "0.8 = 80 %%, headroom for bursts and the rest)",
    )
    add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_plan, user_errors=True)
