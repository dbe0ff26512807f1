"""`ipsec-lab bench`: time the engine's seal and open per suite, configuration and
packet size on one core, beside the raw crypto of the same bytes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ipsec_lab import _native
from ipsec_lab.cli.args import positive_size, suite_arg


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
        for timed in passes:
            if args.json or not sys.stderr.isatty():
                results.append(
                    bench.run(
                        args.suite, args.size, args.mode, args.op, args.budget_ms, args.trials,
                        stages=timed,
                    )
                )  # fmt: skip
                continue
            from rich.progress import Progress

            with Progress(transient=True) as prog:
                label = "stage timing on" if timed else "benchmark"
                task = prog.add_task(f"{label}, ~{estimate_s:.0f} s in all", total=cases)

                def tick(done: int, total: int, task: Any = task) -> None:
                    prog.update(task, completed=done, total=total)

                results.append(
                    bench.run(
                        args.suite, args.size, args.mode, args.op, args.budget_ms, args.trials,
                        tick, stages=timed,
                    )
                )  # fmt: skip
        if args.stages:
            rows = bench.with_stage_split(results[0], results[1], _native.stage_off_cost_ns())
        else:
            rows = results[0]
    except ValueError as e:
        print(f"ipsec-lab bench: {e}", file=sys.stderr)
        return 2
    env = environment.describe()
    if args.json:
        json.dump({"results": rows, "environment": env}, sys.stdout, indent=1)
        print()
        return 0
    _print_table(rows, env)
    if args.stages:
        _print_stages(rows)
    return 0


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
    env = environment.describe()
    try:
        if args.study1:
            doc: dict[str, Any] = bench.study1(
                args.budget_ms, args.trials, (args.size or [1420])[0]
            )
        else:
            rows = bench.run_configs(
                args.config, args.size or [1420], args.op or ["seal", "open"],
                args.data or ["text"], args.budget_ms, args.trials, stages=args.stages,
            )  # fmt: skip
            for r in rows:
                if "stages" in r:
                    bench.add_model_terms(r)
            doc = {"results": rows}
    except ValueError as e:
        print(f"ipsec-lab bench: {e}", file=sys.stderr)
        return 2
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
        t = Table(title="ipsec-lab configuration benchmark (one core, median of trials)")
        for col in ["config", "data", "op", "size B", "ns/pkt", "Mbit/s", "µs/kB", "wire B"]:
            t.add_column(col, justify="left" if col in ("config", "data", "op") else "right")
        for r in doc["results"]:
            t.add_row(
                r["config"], r["payload"], r["op"], str(r["size"]), f"{r['ns_per_packet']:.0f}",
                f"{r['mbps']:.0f}", f"{r['us_per_kb']:.3f}", str(r["wire_len"]),
            )  # fmt: skip
    c = Console()
    c.print(t)
    if args.stages and not args.study1:
        _print_stages(doc["results"])
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


def _print_table(rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    t = Table(
        title="ipsec-lab engine benchmark (one core, median of trials)",
        caption="ratio = raw aws-lc-rs crypto on the same bytes / ours, measured in this run",
    )
    for col in [
        "suite",
        "mode",
        "op",
        "size B",
        "ns/pkt",
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
            f"{r['ns_per_packet']:.0f}",
            f"{r['mpps']:.2f}",
            f"{r['gbps']:.2f}",
            f"{r['us_per_kb']:.3f}",
            f"{r['raw_ns_per_packet']:.0f}",
            f"{r['ratio_to_raw']:.2f}",
        )
    c = Console()
    c.print(t)
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
            "per kB (1024 B) and ratio_to_raw = raw ns / our ns (1.0 = no framing cost). "
            "The default run takes about 30 s."
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
        type=int,
        default=80,
        metavar="MS",
        help="time for each measurement, split over the trials (default: 80)",
    )
    b.add_argument(
        "--trials",
        type=int,
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
