"""`ipsec-lab bench`: time the engine's seal and open per suite, configuration and
packet size on one core, beside the raw crypto of the same bytes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ipsec_lab import _native
from ipsec_lab.cli.args import positive_size, suite_arg, whole
from ipsec_lab.units import plural


def _bench(args: argparse.Namespace) -> int:
    from ipsec_lab import bench, environment

    if args.study1 or args.config:
        return _bench_configs(args)

    cases = (
        len(args.suite or _native.default_suites())
        * len(args.size or _native.DEFAULT_SIZES)
        * len(args.mode or ["tunnel"])
        * len(args.op or ["seal", "open"])
    )
    passes = [False, True] if args.stages else [False]
    estimate_s = cases * 2 * len(passes) * args.budget_ms / 1000
    try:
        results = []
        others = []
        for timed in passes:
            if args.json or not sys.stderr.isatty():
                rows, other = bench.run(
                    args.suite, args.size, args.mode, args.op, args.budget_ms, args.trials,
                    stages=timed, repeat=args.repeat,
                )  # fmt: skip
                results.append(rows)
                others.append(other)
                continue
            from rich.progress import Progress

            with Progress(transient=True) as prog:
                label = "stage timing on" if timed else "benchmark"
                task = prog.add_task(f"{label}, ~{estimate_s:.0f} s in all", total=cases)

                def tick(done: int, total: int, task: Any = task) -> None:
                    prog.update(task, completed=done, total=total)

                rows, other = bench.run(
                    args.suite, args.size, args.mode, args.op, args.budget_ms, args.trials,
                    tick, stages=timed, repeat=args.repeat,
                )  # fmt: skip
                results.append(rows)
                others.append(other)
        if args.stages:
            rows = bench.with_stage_split(results[0], results[1], _native.stage_off_cost_ns())
        else:
            rows = results[0]
    except ValueError as e:
        print(f"ipsec-lab bench: {e}", file=sys.stderr)
        return 2
    env = environment.describe()
    load = _load(max(others), args.repeat)
    if args.json:
        json.dump({"results": rows, **load, "environment": env}, sys.stdout, indent=1)
        print()
        return 0
    _print_table(rows, env, load)
    if args.stages:
        _print_stages(rows)
    return 0


def _load(other: float, repeat: int) -> dict[str, Any]:
    """What the JSON says of the machine while the benchmark ran."""
    from ipsec_lab.meters import BUSY_CPUS

    return {"repetitions": repeat, "other_cpu": other, "busy": other > BUSY_CPUS,
            "busy_threshold_cpus": BUSY_CPUS}  # fmt: skip


def _busy_line(load: dict[str, Any]) -> str | None:
    if not load["busy"]:
        return None
    return (
        f"[bold red]BUSY machine[/bold red]: other processes used {load['other_cpu']:.2f} "
        f"CPUs while the benchmark ran (more than {load['busy_threshold_cpus']:g}): the "
        "timings include their interference — rerun on a quiet machine"
    )


def _ns(r: dict[str, Any]) -> tuple[str, str]:
    """The median and the repetitions' min-max of a row's ns per packet."""
    spread = f"{r['ns_min']:.0f}-{r['ns_max']:.0f}" if "ns_min" in r else "—"
    return f"{r['ns_per_packet']:.0f}", spread


def _bench_configs(args: argparse.Namespace) -> int:
    """`bench --config ...` and `bench --study1`: whole configurations, bundles included."""
    from ipsec_lab import bench, environment

    if args.suite or args.mode or (args.stages and args.study1):
        print(
            "ipsec-lab bench: --config and --study1 take neither --suite nor --mode, and "
            "--study1 not --stages",
            file=sys.stderr,
        )
        return 2
    from ipsec_lab.model.transforms import ConfigError, parse_configuration

    for text in args.config or []:
        try:
            cfg = parse_configuration(text)  # the words the lab uses, with a did-you-mean
        except ConfigError as e:
            print(f"ipsec-lab bench: --config {e}", file=sys.stderr)
            return 2
        if cfg.wireguard:
            print("ipsec-lab bench: --config wireguard: the engine does IPsec (ESP, AH, "
                  "IPComp); measure WireGuard through a lab backend (wireguard-go, boringtun)",
                  file=sys.stderr)  # fmt: skip
            return 2
    env = environment.describe()
    try:
        if args.study1:
            from ipsec_lab.meters import OtherCpu

            with OtherCpu() as o:
                doc: dict[str, Any] = bench.study1(
                    args.budget_ms, args.trials, (args.size or [1420])[0]
                )
            other = o.cpus
        else:
            rows, other = bench.run_configs(
                args.config, args.size or [1420], args.op or ["seal", "open"],
                args.data or ["text"], args.budget_ms, args.trials, stages=args.stages,
                repeat=args.repeat,
            )  # fmt: skip
            for r in rows:
                if "stages" in r:
                    bench.add_model_terms(r)
            doc = {"results": rows}
    except ValueError as e:
        print(f"ipsec-lab bench: {e}", file=sys.stderr)
        return 2
    doc.update(_load(other, 1 if args.study1 else args.repeat))
    doc["environment"] = env
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    if args.study1:
        t = Table(
            title=f"study 1's configurations, sealed here at {doc['size']} B (one core)",
            caption="effort = CPU µs per kB sealed; ratios to enc + SHA-1, ours (measured in "
            "this run) beside the paper's (100 Mbit/s, Pentium III, FreeS/WAN)",
        )
        for col in ["configuration", "ipsec-lab", "data", "Mbit/s", "µs/kB", "ratio", "paper"]:
            t.add_column(
                col, justify="left" if col in ("configuration", "ipsec-lab", "data") else "right"
            )
        for r in doc["rows"]:
            t.add_row(
                r["name"], r["config"], r["payload"], f"{r['mbps']:.0f}", f"{r['us_per_kb']:.3f}",
                f"{r['effort_vs_enc_sha1']:.2f}", f"{r['published_effort_vs_enc_sha1']:.2f}",
            )  # fmt: skip
    else:
        t = Table(
            title="ipsec-lab configuration benchmark (one core, median of "
            f"{plural(args.repeat, 'repetition')})",
            caption="min-max: ns per packet over the repetitions",
        )
        cols = ["config", "data", "op", "size B", "ns/pkt", "min-max", "Mbit/s", "µs/kB", "wire B"]
        for col in cols:
            t.add_column(col, justify="left" if col in ("config", "data", "op") else "right")
        for r in doc["results"]:
            t.add_row(
                r["config"], r["payload"], r["op"], str(r["size"]), *_ns(r),
                f"{r['mbps']:.0f}", f"{r['us_per_kb']:.3f}", str(r["wire_len"]),
            )  # fmt: skip
    c = Console()
    c.print(t)
    if args.stages and not args.study1:
        _print_stages(doc["results"])
    if line := _busy_line(doc):
        c.print(line)
    c.print(
        f"[dim]{env['cpu']} · {env['cpus']} CPUs · Linux {env['kernel']} · git {env['git']}[/dim]"
    )
    return 0


def _print_stages(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    labels = sorted({k for r in rows for k in r["stages"]}, key=_stage_order)
    costs = all("stage_timing_cost" in r for r in rows)
    caption = (
        "t_fix = lookups, replay, header, padding, IV, copies; per byte = cipher, MAC, "
        "compression (each net of a clock reading)"
    )
    if costs:
        caption += (
            ". cost on / off = time with timing / without - 1 / the no-clock branches' time "
            "per packet, both measured in this run"
        )
    t = Table(
        title="where the time goes: ns per packet by stage (stage timing on)", caption=caption
    )
    cols = ["what", "op", "size B", *labels, "t_fix", "per byte"]
    for col in [*cols, *(["cost on", "cost off"] if costs else [])]:
        t.add_column(col, justify="left" if col in ("what", "op") else "right")
    for r in rows:
        what = r.get("suite") or f"{r['config']} ({r['payload']})"
        cells = [
            what,
            r["op"],
            str(r["size"]),
            *[f"{r['stages'][k]:.0f}" if k in r["stages"] else "" for k in labels],
            f"{r['t_fix_ns']:.0f}",
            f"{r['per_byte_ns']:.0f}",
        ]
        if costs:
            cells += [
                f"{100 * r['stage_timing_cost']:+.0f} %",
                f"{100 * r['stage_timing_off_cost']:.2f} %",
            ]
        t.add_row(*cells)
    Console().print(t)


def _stage_order(label: str) -> int:
    from ipsec_lab.algorithms import STAGES

    return STAGES.index(label) if label in STAGES else len(STAGES)


def _print_table(rows: list[dict[str, Any]], env: dict[str, Any], load: dict[str, Any]) -> None:
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    noise = any(r.get("ratio_is_noise") for r in rows)
    t = Table(
        title="ipsec-lab engine benchmark (one core, median of "
        f"{plural(load['repetitions'], 'repetition')})",
        caption="min-max: ns per packet over the repetitions; ratio = raw aws-lc-rs crypto on "
        "the same bytes / ours, measured in this run"
        + ("; noise: ours timed faster than the raw crypto of the same bytes, which it cannot "
           "be — the two timings are within their noise" if noise else ""),
    )  # fmt: skip
    for col in [
        "suite",
        "mode",
        "op",
        "size B",
        "ns/pkt",
        "min-max",
        "Mpps",
        "Gbit/s",
        "µs/kB",
        "raw ns",
        "ratio",
    ]:
        t.add_column(col, justify="left" if col in ("suite", "mode", "op") else "right")
    for r in rows:
        t.add_row(
            r["suite"],
            r["mode"],
            r["op"],
            str(r["size"]),
            *_ns(r),
            f"{r['mpps']:.2f}",
            f"{r['gbps']:.2f}",
            f"{r['us_per_kb']:.3f}",
            f"{r['raw_ns_per_packet']:.0f}",
            f"noise ({r['ratio_to_raw']:.2f})" if r.get("ratio_is_noise")
            else f"{r['ratio_to_raw']:.2f}",
        )  # fmt: skip
    c = Console()
    c.print(t)
    if line := _busy_line(load):
        c.print(line)
    c.print(
        f"[dim]{env['cpu']} · {env['cpus']} CPUs · Linux {env['kernel']} · git {env['git']}[/dim]"
    )


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bench",
        help="time ESP seal/open per suite and packet size against raw crypto",
        description=(
            "Time the engine's ESP seal and open for each suite and IP packet size on one "
            "core, beside the raw aws-lc-rs cipher/AEAD + MAC cost of the same bytes "
            "measured in the same run. Reports ns/packet, Mpps, Gbit/s, CPU effort in µs "
            "per kB (1024 B) and ratio_to_raw = raw ns / our ns (1.0 = no framing cost; "
            "above 1.0 is flagged as noise). Each case is measured --repeat times: the "
            "median, with min-max. The CPU other processes use meanwhile is measured: over "
            "a quarter of a CPU, the run is flagged BUSY (and `busy` in the JSON). The "
            "default run takes about 25 s."
        ),
    )
    b.add_argument(
        "--suite",
        action="append",
        type=suite_arg,
        metavar="PROPOSAL",
        help="proposal such as aes128gcm16 or aes128-sha256 (repeatable; "
        f"default: {', '.join(_native.default_suites())}). The legacy 3des, des and md5 "
        "(broken or weak, for reproducing older studies) run only when named here",
    )
    b.add_argument(
        "--size",
        action="append",
        type=positive_size,
        metavar="BYTES",
        help="inner IP packet size (repeatable; default: "
        f"{' '.join(map(str, _native.DEFAULT_SIZES))})",
    )
    b.add_argument(
        "--mode",
        action="append",
        choices=["tunnel", "transport"],
        help="ESP mode (repeatable; default: tunnel)",
    )
    b.add_argument(
        "--op",
        action="append",
        choices=["seal", "open"],
        help="operation (repeatable; default: both)",
    )
    b.add_argument(
        "--budget-ms",
        type=whole(1),
        default=30,
        metavar="MS",
        help="time for each measurement in each repetition, split over the trials (default: 30)",
    )
    b.add_argument(
        "--repeat",
        type=whole(1),
        default=3,
        metavar="N",
        help="repetitions of the whole benchmark, spread over time: the median and min-max "
        "of each case (default: 3)",
    )
    b.add_argument(
        "--trials",
        type=whole(1),
        default=5,
        help="trials per measurement; the median is kept (default: 5)",
    )
    b.add_argument(
        "--config",
        action="append",
        metavar="CONFIG",
        help="time a whole configuration instead of one ESP suite: esp:…, ah:INTEG, or a "
        "bundle such as ah:sha1+esp:aes128 or ipcomp+esp:aes128-sha1 (repeatable; default "
        "size 1420)",
    )
    b.add_argument(
        "--data",
        action="append",
        choices=["text", "random"],
        help="payload of --config packets: English text (compressible) or random bytes "
        "(repeatable; default: text)",
    )
    b.add_argument(
        "--study1",
        action="store_true",
        help="study 1's eight configurations sealed at 1420 B, each one's CPU effort beside "
        "the paper's, relative to enc + SHA-1",
    )
    b.add_argument(
        "--stages",
        action="store_true",
        help="also run every case with per-stage timing on: report ns per packet by stage "
        "(the model's t_fix and per-byte terms) and what timing costs (doubles the run)",
    )
    b.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    b.set_defaults(func=_bench)
