"""`ipsec-lab model fit|predict`, `plan`, `advise ipcomp` and `overhead`: the model's
commands. Pure calculation unless asked to measure (``--bench``, ``advise`` costs "here")."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from ipsec_lab import units
from ipsec_lab.model import ipcomp as ipc
from ipsec_lab.model import overhead as ovh
from ipsec_lab.model import pcap as cap
from ipsec_lab.model.plan import CycleCosts, Plan, cpu_mhz_here
from ipsec_lab.model.throughput import (
    MIXES,
    AsyncModel,
    FitError,
    Model,
    Point,
    SyncModel,
    fit,
    parse_mix,
    parse_point,
    predict_mix,
)
from ipsec_lab.model.transforms import (
    IPCOMP_DEFAULT_MIN,
    ConfigError,
    Layout,
    SecuredLength,
    parse_configuration,
    parse_lalg,
)

USER_ERRORS = (FitError, ConfigError, cap.CaptureError, ValueError, OSError)

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
DEFAULT_SIZES = [64, 128, 256, 512, 1024, 1280, 1420]
BENCH_SIZES = [64, 128, 256, 512, 1024, 1420]


# One wording wherever plan's engine-only figure is shown (README included).
ENGINE_ONLY = (
    "upper bound on rate, lower bound on cost: the engine alone, without the TUN, socket "
    "and kernel costs a gateway also pays (plan from a lab campaign with --campaign N)"
)


class UserError(Exception):
    """Bad input found after argument parsing; printed as one line, exit 2."""


# --- argument types -----------------------------------------------------------------------


def _arg(fn: Any) -> Any:
    """Wrap a parser so argparse prints its message as the error."""

    def wrapped(text: str) -> Any:
        try:
            return fn(text)
        except USER_ERRORS as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = getattr(fn, "__name__", "value")
    return wrapped


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be greater than 0")
    return v


# A rate in Mbit/s (100, 100M, 1G, 1.5Gbit/s, 500kbps: bits, SI prefixes; a byte rate is
# refused with the bit spelling suggested) and a size in bytes (1024, 1K, 10MB, 1GiB:
# binary prefixes): the grammar of `ipsec_lab.units`, its errors as argparse's.
rate_mbps = _arg(units.rate_mbit)
_bytes = _arg(units.size_bytes)


def _share(text: str) -> float:
    """A share of one core: more than 0 and at most 1 (0.8), or a percentage (80%)."""
    t = text.strip()
    pct = t.endswith("%")
    try:
        v = float(t.removesuffix("%")) / (100 if pct else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(
            f"{text}: a share of one core, more than 0 and at most 1 (0.8 or 80%)"
        )
    return v


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return v


def span(low: float, high: float | None) -> str:
    return f"at least {low}" if high is None else f"{low} to {high}"


def whole(low: int, high: int | None = None, what: str = "value") -> Any:
    """An argparse type: a whole number from ``low`` (to ``high``), errors naming ``what``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < 0 and low >= 0:
            raise argparse.ArgumentTypeError(f"{v} is negative: {what} must be {span(low, high)}")
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{v}: {what} must be {span(low, high)}")
        return v

    parse.__name__ = what
    return parse


_ip_size = whole(20, 65535, "IP packet size")


def _size_range(text: str) -> list[int]:
    parts = text.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"range {text!r}: write START:STOP[:STEP]") from None
    if len(nums) not in (2, 3) or (len(nums) == 3 and nums[2] < 1):
        raise argparse.ArgumentTypeError(f"range {text!r}: write START:STOP[:STEP], STEP >= 1")
    start, stop = nums[0], nums[1]
    step = nums[2] if len(nums) == 3 else 1
    if not 20 <= start <= stop <= 65535:
        raise argparse.ArgumentTypeError(f"range {text!r}: need 20 <= START <= STOP <= 65535")
    if (stop - start) // step > 100_000:
        raise argparse.ArgumentTypeError(f"range {text!r}: more than 100,000 sizes")
    return list(range(start, stop + 1, step))


def _add_layout(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("packet layout (for configuration names)")
    g.add_argument(
        "--ipsec-mode",
        choices=["tunnel", "transport"],
        default="tunnel",
        help="IPsec mode (default: tunnel, as a gateway)",
    )
    g.add_argument(
        "--outer", type=int, choices=[4, 6], default=4, help="outer IP version (default: 4)"
    )
    g.add_argument(
        "--inner", type=int, choices=[4, 6], default=4, help="inner IP version (default: 4)"
    )
    g.add_argument(
        "--udp-encap", action="store_true", help="ESP in UDP (RFC 3948, NAT traversal): +8 B"
    )


def _layout(args: argparse.Namespace) -> Layout:
    return Layout(args.ipsec_mode, args.outer, args.inner, args.udp_encap)


def _lalg(args: argparse.Namespace) -> SecuredLength:
    return parse_lalg(args.lalg, _layout(args))


def _print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=1)
    print()


def _console() -> Any:
    from ipsec_lab.tables import WholeConsole as Console

    return Console()


def _table(title: str, cols: list[str], rows: list[list[str]], caption: str | None = None) -> Any:
    from rich.table import Table

    t = Table(title=title, caption=caption)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    return t


def _mbps(v: float) -> str:
    """A rate for reading: 56,150 rather than 5.615e+04."""
    return f"{v:,.0f}" if v >= 1000 else f"{v:.4g}"


def _f(v: float | None, fmt: str = ".4g") -> str:
    return "—" if v is None else format(v, fmt)


# --- model fit / predict ------------------------------------------------------------------


def _model_from_args(args: argparse.Namespace) -> tuple[Model, dict[str, Any] | None]:
    lalg = _lalg(args)
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
        _lalg(args),
        args.mode,
        link_mbps=args.link_mbps,
        wire_overhead=args.wire_overhead,
        auto_exclude=not args.no_exclude,
        tolerance=args.tolerance,
    )
    doc = f.to_json()
    if args.json:
        _print_json(doc)
        return 0
    c = _console()
    params = ", ".join(
        f"{k} = {_f(v)}"
        + (f" ± {_f(doc['uncertainty'].get(k), '.2g')}" if doc["uncertainty"].get(k) else "")
        for k, v in f.model.params().items()
    )
    c.print(f"[bold]{f.model.mode} model, L_alg = {doc['lalg']}[/bold] ({f.method}): {params}")
    rows = [
        [
            str(p.size),
            str(p.l_alg),
            f"{p.mbps:.4g}",
            _f(p.predicted_mbps),
            _f(p.residual_pct, "+.2f"),
            p.excluded or "",
        ]
        for p in f.points
    ]
    c.print(_table("points", ["size B", "L_alg B", "Mbit/s", "model", "resid %", "excluded"], rows))
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
        _print_json(doc)
        return 0
    c = _console()
    c.print(
        f"[bold]{model.mode} model, L_alg = {model.lalg.spec}[/bold]: "
        + ", ".join(f"{k} = {v:.4g}" for k, v in model.params().items())
    )
    if preds:
        rows = [
            [str(p["size"]), str(p["l_alg"]), f"{p['mbps']:.4g}", f"{p['kpps']:.4g}", p["limit"]]
            for p in preds
        ]
        c.print(_table("predicted", ["size B", "L_alg B", "Mbit/s", "kpps", "larger term"], rows))
    for m in mixes:
        c.print(
            f"{m['mix']}: {m['mbps']:.4g} Mbit/s, {m['kpps']:.4g} kpps "
            f"(mean packet {m['mean_size']:.1f} B over {m['packets']:g} packets)"
        )
    return 0


def _mix_arg(text: str) -> tuple[str, tuple[tuple[int, float], ...]]:
    return (text, parse_mix(text))


def _add_model(sub: Any) -> None:
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
        type=_arg(parse_point),
        required=True,
        metavar="SIZE:MBPS",
        help="a measurement: inner IP packet size in bytes and throughput in Mbit/s (repeatable)",
    )
    f.add_argument(
        "--link-mbps",
        type=_positive,
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
        type=_positive,
        default=0.05,
        help="how far below the fit a top point must fall to be taken as link-limited "
        "(default: 0.05)",
    )
    _add_layout(f)
    f.add_argument("--json", action="store_true", help="print JSON for scripts")
    f.set_defaults(func=_model_fit)

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
    p.add_argument("--t-fix-ms", type=_non_negative, metavar="MS", help="per-packet time t_fix")
    p.add_argument("--r-alg-mbps", type=rate_mbps, metavar="RATE",
                   help="securing rate R_alg, Mbit/s (or with k/M/G: 1G)")  # fmt: skip
    p.add_argument(
        "--t-oh-ms", type=_non_negative, metavar="MS", help="engine overhead t_oh (async)"
    )
    p.add_argument(
        "--point",
        action="append",
        type=_arg(parse_point),
        metavar="SIZE:MBPS",
        help="fit these measurements first instead of giving parameters (repeatable)",
    )
    p.add_argument("--size", action="append", type=_ip_size, metavar="BYTES", help="repeatable")
    p.add_argument(
        "--range",
        action="append",
        type=_size_range,
        metavar="START:STOP[:STEP]",
        help="every size in a range, e.g. 64:1500:1 for the saw-tooth (repeatable)",
    )
    p.add_argument(
        "--mix",
        action="append",
        type=_arg(_mix_arg),
        metavar="MIX",
        help=f"{' or '.join(MIXES)} (simple IMIX: 7:4:1 of 40, 576, 1500 B IP packets), "
        "SIZE:WEIGHT,... or @FILE of 'SIZE WEIGHT' lines, a histogram (repeatable)",
    )
    p.add_argument("--pcap", type=Path, metavar="FILE", help="use the IP packet sizes of a capture")
    _add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_model_predict)


# --- plan --------------------------------------------------------------------------------


def _bench_points(suite: str, budget_ms: int, trials: int, op: str) -> list[Point]:
    from ipsec_lab import bench

    rows = bench.run([suite], BENCH_SIZES, ["tunnel"], [op], budget_ms, trials)
    return [Point(int(r["size"]), float(r["size"]) * 8e3 / float(r["ns_per_packet"])) for r in rows]


def _esp_suite(config: str) -> str:
    cfg = parse_configuration(config)
    if cfg.esp is None or cfg.ipcomp or cfg.ah:
        raise UserError(
            f"{config!r}: the engine benchmark measures one ESP SA, e.g. esp:aes128gcm16"
        )
    enc, integ = cfg.esp
    suite = enc.name if integ.name == "null" else f"{enc.name}-{integ.name}"
    return suite


def _campaign_effort(args: argparse.Namespace) -> tuple[float, str]:
    """The median IPsec-process µs/kB of a lab campaign's runs of one configuration."""
    from ipsec_lab import runner
    from ipsec_lab.cli_lab import _lab_dir
    from ipsec_lab.store import Store

    db = _lab_dir(args) / "results.sqlite"
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
            suite = _esp_suite(args.bench)
            args.lalg = args.bench
            pts = _bench_points(suite, args.budget_ms, args.trials, args.op)
            notes.append(
                f"measured here: engine {args.op} of {suite}, tunnel mode, one core, "
                f"sizes {BENCH_SIZES} (the engine alone: no TUN, sockets or kernel)"
            )
            bound = ENGINE_ONLY
        else:
            pts = args.point or []
        lalg = _lalg(args)
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
        _print_json(doc)
        return 0
    c = _console()
    c.print(
        f"[bold]{doc['cycles_per_packet']:.0f} cycles per packet + "
        f"{doc['cycles_per_byte']:.3g} cycles per byte of L_alg ({costs.lalg.spec})[/bold] "
        f"at {mhz:.0f} MHz; {doc['cycles_per_inner_byte']:.3g} cycles per packet byte at "
        f"mean size {doc['mean_size']:.0f} B (FreeS/WAN's figure: 140 for 3DES + HMAC)"
    )
    upper = bound.startswith("upper bound")
    c.print(
        f"one core: {'at most ' if upper else ''}{_mbps(doc['per_core_mbps'])} Mbit/s; "
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
        _table(
            "minimum gateway per link (study 3's table, regenerated)",
            ["link", "Mbit/s", "rule MHz", "FreeS/WAN 3DES MHz", "ours MHz", "cores here"],
            rows,
            caption="rule: 25 MHz per Mbit/s; FreeS/WAN 3DES: 140 cycles/byte (Pentium II)",
        )
    )
    for n in notes:
        c.print(f"[dim]note: {n}[/dim]")
    return 0


def _add_plan(sub: Any) -> None:
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
    p.add_argument("--t-fix-ms", type=_non_negative, metavar="MS")
    p.add_argument("--r-alg-mbps", type=rate_mbps, metavar="RATE",
                   help="securing rate R_alg, Mbit/s (or with k/M/G: 1G)")  # fmt: skip
    p.add_argument("--point", action="append", type=_arg(parse_point), metavar="SIZE:MBPS")
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
    p.add_argument("--cycles-per-byte", type=_non_negative, metavar="C")
    p.add_argument("--cycles-per-packet", type=_non_negative, default=0.0, metavar="C")
    p.add_argument("--cpu-mhz", type=_positive, metavar="MHZ", help="default: this machine's")
    p.add_argument(
        "--size", type=_ip_size, default=1500, metavar="BYTES", help="packet size (default: 1500)"
    )
    p.add_argument("--mix", type=_arg(_mix_arg), metavar="MIX", help="a mix instead of --size")
    p.add_argument("--target-mbps", type=rate_mbps, metavar="RATE",
                   help="rate to plan for, Mbit/s (or with k/M/G: 100M, 1G)")  # fmt: skip
    p.add_argument(
        "--max-load",
        type=_share,
        default=0.8,
        metavar="SHARE",
        help="busiest a core may be, more than 0 and at most 1, or a percentage (default: "
        "0.8 = 80 %%, headroom for bursts and the rest)",
    )
    _add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_plan)


# --- advise ipcomp -------------------------------------------------------------------------


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
        with open(path, "rb") as f:  # a device or a FIFO too (/dev/stdin)
            data = f.read(args.max_bytes)
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
            suite = _esp_suite(args.esp)
            size = int(statistics.median(sample.sizes))
            size = max(28, min(size, 9000))
            from ipsec_lab import bench

            row = bench.run([suite], [size], ["tunnel"], ["seal"], 60, 5)[0]
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
    advice = ipc.advise(sample, costs, args.link_mbps, args.esp, _layout(args), args.l2_bytes)
    doc = advice.to_json()
    if args.json:
        _print_json(doc)
        return 0
    c = _console()
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
            _f(k["cpu_mbps"]),
            f"{k['link_mbps']:.4g}",
            f"{k['effort_us_per_kb']:.3g}",
        ]
        for k in doc["cases"]
    ]
    c.print(
        _table(
            f"predicted throughput on a {args.link_mbps:g} Mbit/s link (inner Mbit/s)",
            ["case", "Mbit/s", "limit", "CPU allows", "link allows", "µs/kB"],
            rows,
            caption="'CPU allows' — where no forwarding cost is known, none is assumed",
        )
    )
    c.print(f"[bold]{advice.verdict}[/bold]")
    return 0


def _add_advise(sub: Any) -> None:
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
        type=_non_negative,
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
        type=_ip_size,
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
    p.add_argument("--forward-us-per-kb", type=_non_negative, metavar="US")
    p.add_argument("--esp-us-per-kb", type=_non_negative, metavar="US")
    p.add_argument("--compress-us-per-kb", type=_non_negative, metavar="US")
    p.add_argument(
        "--l2-bytes",
        type=whole(0),
        default=ipc.ETHERNET_HEADER,
        metavar="BYTES",
        help="link-layer bytes per packet (default: 14, Ethernet)",
    )
    _add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_advise_ipcomp)


# --- overhead ----------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    """10 MB, 1 KB, 1.5 MB, 300 B (KB = 1024 B, as the lab's file sizes)."""
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.3g} {unit}"
    return f"{n:.0f} B"


def _overhead(args: argparse.Namespace) -> int:
    lay = _layout(args)
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
        _print_json(doc)
        return 0
    c = _console()
    if rows:
        cols = ["config"] + [f"{s} B" for s in sizes]
        table_rows = [
            [cfg.text]
            + [f"{r['wire']} (+{r['overhead_pct']:.0f} %)" for r in rows if r["config"] == cfg.text]
            for cfg in parsed
        ]
        c.print(_table(f"bytes on the wire per inner IP packet ({lay.mode})", cols, table_rows))
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
            _table(
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


def _add_overhead(sub: Any) -> None:
    p = sub.add_parser(
        "overhead",
        help="bytes IPsec adds per packet and per application transfer",
        description=(
            "Bytes on the wire for each configuration and inner IP packet size (outer IP "
            "header, UDP encapsulation, ESP/AH/IPComp headers, IV, padding, ICV), and with "
            "--transfer study 4's view of a whole TCP transfer: packets and bytes in both "
            "directions and the %% increase over no IPsec."
        ),
        epilog="example:\n  ipsec-lab overhead --config esp:3des-md5 --transfer 1KB "
        "--transfer 10MB",
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="CONFIG",
        type=_arg(lambda t: parse_configuration(t).text),
        help="e.g. esp:aes128gcm16, ah:sha1+esp:aes128 (repeatable; default: a common set)",
    )
    p.add_argument("--size", action="append", type=_ip_size, metavar="BYTES", help="repeatable")
    p.add_argument(
        "--transfer",
        action="append",
        type=_bytes,
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
    _add_layout(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_overhead)


# The commands this module adds (cli.main runs them through `run`).
COMMANDS = ("model", "plan", "advise", "overhead")


def add_parsers(sub: Any) -> None:
    _add_model(sub)
    _add_plan(sub)
    _add_advise(sub)
    _add_overhead(sub)


def run(args: argparse.Namespace, prog: str) -> int:
    """Call a model command; bad input found after parsing is one line and exit 2."""
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        raise  # the reader went away (`| head`): cli.main ends quietly, not a user error
    except (UserError, *USER_ERRORS) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return rc
