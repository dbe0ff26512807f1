"""`ipsec-lab plan`: the cores (or the CPU) a link needs, from the model, a benchmark
of this engine, or a lab campaign's measured effort."""

from __future__ import annotations

import argparse
from typing import Any

from ipsec_lab.cli.args import (
    UserError,
    add_layout,
    arg_type,
    core_share,
    engine_suite,
    ip_size,
    lalg_of,
    mix_arg,
    non_negative,
    positive,
    rate_mbps,
    whole,
)
from ipsec_lab.cli.output import console, fmt_mbps, fmt_num, make_table, print_json
from ipsec_lab.cli.plan_sources import Mix, Source, campaign_sources
from ipsec_lab.model.plan import CycleCosts, Plan, cpu_mhz_here
from ipsec_lab.model.sizing import (
    mean_size,
)
from ipsec_lab.model.throughput import Fit, FitError, Point, SyncModel, fit, parse_point
from ipsec_lab.model.transforms import SecuredLength
from ipsec_lab.units import plural

BENCH_SIZES = [64, 128, 256, 512, 1024, 1420]


# One wording wherever plan's engine-only figure is shown.
ENGINE_ONLY = (
    "upper bound on rate, lower bound on cost: the engine alone, without the TUN, socket "
    "and kernel costs a gateway also pays (plan from a lab campaign with --campaign N)"
)


# Times of the engine taken at most this often before plan gives up on a busy machine.
BENCH_ATTEMPTS = 3


def _bench_fit(args: argparse.Namespace, suite: str, lalg: SecuredLength, notes: list[str]) -> Fit:
    """The model fitted to the engine's time per packet at BENCH_SIZES. Other work on the
    machine only adds time, so a size timed again keeps its least time; the engine is
    timed again (at most BENCH_ATTEMPTS times) while the times do not fit the model — a
    busy slice can make a small packet dearer than a large one."""
    from ipsec_lab import bench
    from ipsec_lab.meters import BUSY_CPUS

    least: dict[int, float] = {}
    busiest = 0.0
    for attempt in range(1, BENCH_ATTEMPTS + 1):
        rows, other = bench.run(
            [suite], BENCH_SIZES, ["tunnel"], [args.op], args.budget_ms, args.trials
        )
        busiest = max(busiest, other)
        for r in rows:
            size, ns = int(r["size"]), float(r["ns_per_packet"])
            least[size] = min(least.get(size, ns), ns)
        pts = [Point(size, size * 8e3 / ns) for size, ns in sorted(least.items())]
        try:
            f = fit(pts, lalg, "sync", auto_exclude=False)
        except FitError as e:
            why = str(e)
            continue
        if attempt > 1:
            notes.append(
                f"the engine was timed {attempt} times: its first times did not fit the "
                "model (a busy machine?); each size keeps its least time"
            )
        break
    else:
        raise UserError(
            f"the engine's times at {BENCH_SIZES} B did not fit the model in "
            f"{BENCH_ATTEMPTS} tries ({why}); other processes used {busiest:.2f} CPUs "
            f"meanwhile: rerun on a quiet machine, or with more --trials (now {args.trials}) "
            f"or a larger --budget-ms (now {args.budget_ms}) — if the machine was quiet, "
            "the engine itself is wrong: report it"
        )
    if busiest > BUSY_CPUS:
        notes.append(
            f"BUSY machine: other processes used {busiest:.2f} CPUs while the engine was "
            "timed (its figures include their interference: rerun on a quiet machine)"
        )
    return f


def _model_source(args: argparse.Namespace, mhz: float, notes: list[str]) -> Source:
    """The costs given as model parameters, points to fit, cycles, or the engine bench."""
    if args.cycles_per_byte is not None:
        return Source(
            "the costs given",
            CycleCosts.flat(args.cycles_per_byte, args.cycles_per_packet, mhz),
            "as given",
            "--cycles-per-byte/-packet",
        )
    fitted: dict[str, Any] | None = None
    if args.bench:
        suite = engine_suite(args.bench)
        args.lalg = args.bench
    lalg = lalg_of(args)
    pts = args.point or []
    if args.bench or pts:
        if args.bench:
            f = _bench_fit(args, suite, lalg, notes)
            notes.append(
                f"measured here: engine {args.op} of {suite}, tunnel mode, one core, "
                f"sizes {BENCH_SIZES} (the engine alone: no TUN, sockets or kernel)"
            )
        else:
            f = fit(pts, lalg, "sync", auto_exclude=False)
        model = f.model
        fitted = f.to_json()
    else:
        if args.r_alg_mbps is None:
            raise UserError("--t-fix-ms needs --r-alg-mbps")
        model = SyncModel(args.t_fix_ms, args.r_alg_mbps, lalg)
    assert isinstance(model, SyncModel)
    costs = CycleCosts.from_model(model, mhz)
    if args.bench:
        return Source(
            "the engine alone", costs, ENGINE_ONLY, f"ipsec-lab bench of {args.bench}",
            fit=fitted, upper_bound=True,
        )  # fmt: skip
    return Source(
        "the model given", costs, "as given", "--point" if pts else "--t-fix-ms", fit=fitted
    )


def _describe(mix: Mix, text: str | None) -> str:
    if len(mix) == 1:
        return f"{mix[0][0]}-byte packets"
    return f"{text or 'the mix'} (mean {mean_size(mix):.0f} B)"


def _cores_text(p: dict[str, Any]) -> str:
    lo_hi = p["cores_range"]
    upper = p["upper_bound"]
    if lo_hi and p["range_is"] == "what the sizes allow":
        if lo_hi[0] == lo_hi[1]:
            return plural(lo_hi[1], "core")
        return f"{lo_hi[0]}-{plural(lo_hi[1], 'core')}"
    core = f"{'at least ' if upper else ''}{plural(p['cores'], 'core')}"
    if lo_hi and lo_hi[0] != lo_hi[1]:
        return f"{core} ({lo_hi[0]}-{lo_hi[1]} within one standard error)"
    return core


def _plan(args: argparse.Namespace) -> int:
    given = [x is not None and x != [] for x in (args.t_fix_ms, args.point, args.cycles_per_byte)]
    if sum(given) > 1:
        raise UserError("give one of --t-fix-ms/--r-alg-mbps, --point and --cycles-per-byte")
    if not any(given) and not args.bench and args.campaign is None:
        raise UserError(
            "give a source of costs: --campaign N (the lab's gateways measured), --bench "
            "CONFIG (the engine alone, here), --t-fix-ms/--r-alg-mbps, --point (to fit) or "
            "--cycles-per-byte; --campaign and --bench together show both side by side"
        )
    if args.bench and any(given):
        raise UserError(
            "--bench measures the costs: leave out --t-fix-ms, --point and --cycles-per-byte"
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
    mix: Mix = args.mix[1] if args.mix else ((args.size or 1500, 1.0),)
    sources: list[Source] = []
    if args.campaign is not None:
        sources += campaign_sources(args, mhz, mix)
    if any(given) or args.bench:
        sources.append(_model_source(args, mhz, notes))
    planned = [s.plans(args, mix) for s in sources]
    # The binding figure: the least one core carries (the most cores). The engine alone is
    # a bound, never the answer, while another source is there.
    real = [i for i, p in enumerate(planned) if not p["upper_bound"]]
    pick = min(real or range(len(planned)), key=lambda i: planned[i]["per_core_mbps"])
    binding, bp = sources[pick], planned[pick]
    for p in planned:
        if p["upper_bound"] and p["per_core_mbps"] < bp["per_core_mbps"]:
            notes.append(
                f"the engine alone measured here ({fmt_mbps(p['per_core_mbps'])} Mbit/s a core) "
                f"is slower than {binding.name} ({fmt_mbps(bp['per_core_mbps'])}): it should "
                "be faster — other machines or clocks (the campaign's cycles are counted at "
                "this machine's clock), or a busy benchmark"
            )
    plan = Plan(binding.costs, mix, args.target_mbps, args.max_load)  # a range: its dear end
    doc = plan.to_json()
    doc.update(
        per_core_mbps=bp["per_core_mbps"],
        cores=bp["cores"],
        cores_range=bp["cores_range"],
        binding=binding.name,
        sources=planned,
        notes=notes,
        costs_are=binding.bound,
    )
    doc.update(cycles_per_packet=bp["cycles_per_packet"], cycles_per_byte=bp["cycles_per_byte"])
    if binding.fit:
        doc["fit"] = binding.fit
    if args.json:
        print_json(doc)
        return 0
    _show(args, mix, mhz, plan, doc, binding, planned)
    return 0


def _show(
    args: argparse.Namespace,
    mix: Mix,
    mhz: float,
    plan: Plan,
    doc: dict[str, Any],
    binding: Source,
    planned: list[dict[str, Any]],
) -> None:
    c = console()
    what = _describe(mix, args.mix[0] if args.mix else None)
    if binding.name.endswith("(bulk TCP)"):
        what = "bulk TCP as the campaign measured it"
    bp = next(p for p in planned if p["name"] == binding.name)
    upper = binding.upper_bound
    if plan.target_mbps is not None:
        c.print(
            f"[bold]{plan.target_mbps:g} Mbit/s of {what} needs {_cores_text(bp)}[/bold] at "
            f"{mhz:.0f} MHz, each at most {100 * plan.max_load:.0f} % busy — "
            f"{'binding' if len(planned) > 1 else 'from'}: {binding.name}"
        )
    if binding.split:
        c.print(
            f"{doc['cycles_per_packet']:.0f} cycles per packet + "
            f"{doc['cycles_per_byte']:.3g} cycles per byte of L_alg ({binding.costs.lalg.spec}) "
            f"at {mhz:.0f} MHz; {doc['cycles_per_inner_byte']:.3g} cycles per packet byte at "
            f"mean size {doc['mean_size']:.0f} B (FreeS/WAN's figure: 140 for 3DES + HMAC)"
        )
    else:
        crng = bp["cycles_per_packet_at_mix_range"]
        cyc = (f"between {crng[0]:.0f} and {crng[1]:.0f}" if crng
               else f"{bp['cycles_per_packet_at_mix']:.0f}")  # fmt: skip
        c.print(f"{cyc} cycles per packet of {what} at {mhz:.0f} MHz ({binding.detail})")
    rng = bp["per_core_mbps_range"]
    c.print(
        f"one core: {'at most ' if upper else ''}{fmt_mbps(bp['per_core_mbps'])} Mbit/s"
        + (f" ({fmt_mbps(rng[0])}-{fmt_mbps(rng[1])})" if rng else "")
        + f"; {'at least ' if upper else ''}{doc['mhz_per_mbps']:.3g} MHz per Mbit/s "
        "(FreeS/WAN rule: 25)"
    )
    c.print(f"[dim]costs: {binding.bound}[/dim]")
    if len(planned) > 1:
        rows = [
            [
                p["name"] + (" (binds)" if p["name"] == binding.name else ""),
                fmt_num(p["cycles_per_packet_at_mix"], ".0f"),
                fmt_mbps(p["per_core_mbps"]),
                "—" if p["cores"] is None else _cores_text(p),
                p["costs_are"].split(":")[0].split(",")[0],
            ]
            for p in planned
        ]
        c.print(
            make_table(
                f"the sources side by side, at {what}",
                ["source", "cycles/packet", "one core Mbit/s", "cores", "figure"],
                rows,
            )
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
    for p in planned:
        c.print(f"[dim]source: {p['name']}: {p['detail']}[/dim]")
    for n in doc["notes"]:
        c.print(f"[dim]note: {n}[/dim]")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="cores for a target rate at a size or mix, cycles per packet/byte, study 3's table",
        description=(
            "How many cores a gateway needs for a rate at a packet size or mix, from what "
            "you have: a lab campaign of the gateways (--campaign: what they do; a size "
            "sweep such as scenarios/sizing.toml separates the cost per packet from the "
            "cost per byte, study 2's two terms), the engine benchmark run here (--bench: "
            "the engine alone, an upper bound on rate), model parameters, measured points "
            "or cycles per byte. Given more than one, they are shown side by side and the "
            "first line names the one that binds. Also FreeS/WAN's 'minimum gateway per "
            "link' table (study 3) regenerated beside its 25-MHz-per-Mbit/s rule."
        ),
        epilog="examples:\n"
        "  sudo ipsec-lab run scenarios/sizing.toml    # then, with its campaign number:\n"
        "  ipsec-lab plan --campaign 1 --bench aes128gcm16 --target-mbps 10G --mix imix\n"
        "  ipsec-lab plan --bench esp:aes128gcm16 --target-mbps 10G\n"
        "  ipsec-lab plan --cycles-per-byte 140 --cpu-mhz 450",
    )
    p.add_argument(
        "--t-fix-ms",
        type=non_negative,
        metavar="MS",
        help="the model's fixed time per packet t_fix, ms (with --r-alg-mbps)",
    )
    p.add_argument(
        "--r-alg-mbps",
        type=rate_mbps,
        metavar="RATE",
        help="securing rate R_alg, Mbit/s (or with k/M/G: 1G)",
    )
    p.add_argument(
        "--point",
        action="append",
        type=arg_type(parse_point),
        metavar="SIZE:MBPS",
        help="a measured throughput at a size, e.g. 128:45.2; two or more are "
        "fitted to t_fix and R_alg (repeat the flag)",
    )
    p.add_argument("--lalg", default="ip", metavar="FORM", help="secured-length form (default: ip)")
    p.add_argument(
        "--bench",
        metavar="CONFIG",
        help="measure this ESP configuration with the engine benchmark here, e.g. "
        "esp:aes128gcm16 (about a second): the engine alone, an upper bound on rate",
    )
    p.add_argument(
        "--campaign",
        type=whole(1),
        metavar="N",
        help="plan from a lab campaign: its gateways' IPsec CPU per packet at each size it "
        "measured (see `ipsec-lab results`); with --configuration when it has several",
    )
    p.add_argument("--configuration", metavar="CONFIG", help="with --campaign: which one")
    p.add_argument("--backend", default=None, metavar="B", help="with --campaign: which one")
    p.add_argument("--lab", metavar="DIR", help="with --campaign: the lab directory")
    p.add_argument("--op", choices=["seal", "open"], default="seal", help="with --bench")
    p.add_argument("--budget-ms", type=whole(1), default=60, help="with --bench (default: 60)")
    p.add_argument("--trials", type=whole(1), default=5, help="with --bench (default: 5)")
    p.add_argument(
        "--cycles-per-byte",
        type=non_negative,
        metavar="C",
        help="CPU cycles per byte of packet, as FreeS/WAN quoted them (140 for 3DES "
        "+ HMAC on a Pentium II)",
    )
    p.add_argument(
        "--cycles-per-packet",
        type=non_negative,
        default=0.0,
        metavar="C",
        help="with --cycles-per-byte: cycles per packet besides (default: 0)",
    )
    p.add_argument("--cpu-mhz", type=positive, metavar="MHZ", help="default: this machine's")
    p.add_argument(
        "--size",
        type=ip_size,
        default=None,
        metavar="BYTES",
        help="inner IP packet size (default: 1500)",
    )
    p.add_argument(
        "--mix",
        type=arg_type(mix_arg),
        metavar="MIX",
        help="a mix instead of --size: imix (7:4:1 of 40, 576, 1500 B), SIZE:WEIGHT,... or @FILE",
    )
    p.add_argument(
        "--target-mbps",
        type=rate_mbps,
        metavar="RATE",
        help="rate to plan for, Mbit/s (or with k/M/G: 100M, 1G)",
    )
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
