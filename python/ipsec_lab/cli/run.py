"""`ipsec-lab run`, `check` and `scenarios`: run a scenario on real testbeds, say what
it will run, list the shipped ones."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ipsec_lab.cli.args import LAB_HELP, add_vm_arguments, in_vm, lab_dir
from ipsec_lab.cli.output import counts_line, print_failures, print_summary, run_with_progress
from ipsec_lab.units import plural

QUICK_SOAK_MINUTES = 1.0  # `run --quick`: a soak's length


def _run(args: argparse.Namespace) -> int:
    from ipsec_lab import ceiling, runner, scenario
    from ipsec_lab.testbed.build import LabError, require_root

    if args.vm:
        return in_vm(args, "run")

    try:
        sc = scenario.load(args.scenario)
    except scenario.ScenarioError as e:
        print(f"ipsec-lab run: {e}", file=sys.stderr)
        return 2
    try:
        hosts = _hosts(sc, args)
    except ValueError as e:
        print(f"ipsec-lab run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _print_forecast(sc, args, hosts)
    if hosts is None:
        try:
            require_root()
        except LabError as e:
            print(f"ipsec-lab run: {e}", file=sys.stderr)
            return 2
    lab = lab_dir(args)
    if args.resume:
        stop = _nothing_to_resume(sc, lab, args.scenario)
        if stop is not None:
            return stop
    from ipsec_lab import meters, preflight

    for w in preflight.slower_warnings(sc.backends, hosts):
        print(f"warning: {w}", file=sys.stderr)
    busy = meters.other_cpu(seconds=1.0) if hosts is None else 0.0
    if busy > meters.BUSY_CPUS:
        print(
            f"warning: other processes are using {busy:.2f} CPUs: every CPU figure of this "
            "campaign includes their work; each run is checked again and flagged if so",
            file=sys.stderr,
        )
    try:
        campaign = runner.Campaign(sc, lab, resume=args.resume, hosts=hosts)
    except OSError as e:
        print(f"ipsec-lab run: cannot open the lab directory {lab}: {e}", file=sys.stderr)
        return 2
    if args.quick:
        campaign.soak_minutes = QUICK_SOAK_MINUTES
        if any(w.kind == "soak" for w in sc.workloads):
            print(f"--quick: each soak runs {QUICK_SOAK_MINUTES:g} minute, not its "
                  "`minutes`", file=sys.stderr)  # fmt: skip
    pending = len(campaign.pending())
    quiet = args.json or not sys.stderr.isatty()
    verb = "resuming campaign" if campaign.progress.done else "campaign"
    print(
        f"{verb} {campaign.id}: {sc.name} — {pending} of {campaign.progress.total} runs to "
        f"do; results in {lab / 'results.sqlite'}",
        file=sys.stderr,
    )
    rc = 0
    try:
        run_with_progress(campaign, quiet)
    except KeyboardInterrupt as e:
        from ipsec_lab.signals import Terminated, interrupted_status

        print(
            f"ipsec-lab run: interrupted{f' ({e})' if isinstance(e, Terminated) else ''}; "
            f"finished runs are kept — continue with `ipsec-lab run --resume {args.scenario}`",
            file=sys.stderr,
        )
        return interrupted_status(e)
    except LabError as e:
        print(f"ipsec-lab run: {e}", file=sys.stderr)
        print(f"(continue later with `ipsec-lab run --resume {args.scenario}`)", file=sys.stderr)
        rc = 1
    print(f"campaign {campaign.id}: {counts_line(campaign)}", file=sys.stderr)
    for w in campaign.warnings:
        print(f"ipsec-lab run: {w}", file=sys.stderr)
        rc = 1
    if campaign.progress.failed:
        where = "each failed run's `reason` in the JSON" if args.json else "below"
        print(
            f"ipsec-lab run: {campaign.progress.failed} runs failed (reasons: {where}, and "
            f"`ipsec-lab results {campaign.id}`); retry them with "
            f"`ipsec-lab run --resume {args.scenario}`",
            file=sys.stderr,
        )
        rc = 1
    runs = campaign.store.runs(campaign.id)
    summary = runner.summarize(runs, ceiling.earlier(campaign.store, campaign.id))
    if args.json:
        json.dump({"campaign": campaign.id, "summary": summary, "runs": runs}, sys.stdout, indent=1)
        print()
    else:
        print_summary(summary, f"campaign {campaign.id}: {sc.name}")
        print_failures(runs)
    return rc


def _hosts(sc: Any, args: argparse.Namespace) -> Any:
    """The hosts file the run goes on (--hosts, else the scenario's `hosts`), checked
    against the scenario's topology; None: namespaces of this machine. Raises HostsError
    (a ValueError) naming the file and key."""
    path = getattr(args, "hosts", None) or sc.hosts
    if not path:
        return None
    from ipsec_lab import hosts as hostsfile
    from ipsec_lab.testbed import topology

    h = hostsfile.load(path)
    h.for_topology(topology(sc.topology), backend_external="external" in sc.backends)
    hostsfile.place(topology(sc.topology), h)
    return h


def _nothing_to_resume(sc: Any, lab: Path, path: str) -> int | None:
    """`run --resume` with no unfinished campaign of this scenario: say so and why (an
    exit status), instead of silently starting a new one; None when there is one."""
    from ipsec_lab import runner
    from ipsec_lab.store import Store

    db = lab / "results.sqlite"
    if not db.exists():
        print(f"ipsec-lab run: nothing to resume: no results in {db}; start the campaign "
              f"with `ipsec-lab run {path}`", file=sys.stderr)  # fmt: skip
        return 2
    store = Store(db)
    try:

        def same(t: str) -> bool:
            return runner.same_scenario(t, sc)

        if store.resumable(sc.text, same) is not None:
            return None
        done = store.finished_with(sc.text, same)
        if done is not None:
            print(f"ipsec-lab run: nothing to resume: campaign {done} of this scenario "
                  f"finished every run (`ipsec-lab results {done} --lab {lab}` shows them); "
                  "run without --resume to measure again", file=sys.stderr)  # fmt: skip
            return 0
        named = [c["id"] for c in store.campaigns() if c["name"] == sc.name]
        why = (
            f"campaign {', '.join(map(str, named))} has this scenario's name but other "
            "runs (the file's backends, configurations, links or workloads changed since)"
            if named
            else "no campaign of this scenario"
        )
        print(f"ipsec-lab run: nothing to resume in {db}: {why}; run without --resume to "
              "start a new campaign", file=sys.stderr)  # fmt: skip
        return 2
    finally:
        store.close()


def _print_forecast(sc: Any, args: argparse.Namespace, hosts: Any = None) -> int:
    from ipsec_lab import preflight

    doc = preflight.forecast(sc, hosts)
    doc["lab"] = str(lab_dir(args))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    c = Console()
    print(f"scenario {sc.source}: {sc.name!r} — topology {sc.topology}, "
          f"{plural(sc.repetitions, 'repetition')} of each run")  # fmt: skip
    for b, r in doc["backends"].items():
        if r["runs_as"] != b or r["why"]:
            print(f"  backend {b} → {r['runs_as']} ({r['why']})")
    t = Table(title="what will run", caption="about: estimated time of these runs on a "
              "2-core machine (traffic, warm-up, set-up)")  # fmt: skip
    many = any(g["tunnels"] > 1 for g in doc["groups"])
    cols = ("link", "backend", "configuration", *(("tunnels",) if many else ()), "runs",
            "about", "what happens")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right" if col in ("tunnels", "runs", "about") else "left")
    for g in doc["groups"]:
        what = {"run": "runs", "skip": "skipped: ", "unknown": "unknown: "}[g["status"]]
        shown = (
            g["backend"]
            if g["resolved"] == g["backend"]
            else f"{g['backend']} → " + g["resolved"].removeprefix("strongswan-")
        )
        t.add_row(g["link"], shown, g["configuration"], *((str(g["tunnels"]),) if many else ()),
                  str(g["runs"]), preflight.duration(g["seconds"]),
                  what + (g["reason"] or ""))  # fmt: skip
    c.print(t)
    print(f"{doc['runs']} runs: {doc['will_run']} will run, {doc['skipped']} skipped"
          + (f", {doc['unknown']} unknown" if doc["unknown"] else "")
          + f"; about {preflight.duration(doc['estimated_s'])}; results into "
          f"{doc['lab']}/results.sqlite")  # fmt: skip
    for name, how in doc["generators"].items():
        print(f"generator of {name}: {how}")
    print(doc["placement"]["says"])
    for w in doc["warnings"]:
        print(f"warning: {w}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ipsec_lab import scenario

    try:
        sc = scenario.load(args.scenario)
        hosts = _hosts(sc, args)
    except ValueError as e:  # ScenarioError, HostsError
        print(f"ipsec-lab check: {e}", file=sys.stderr)
        return 2
    return _print_forecast(sc, args, hosts)


def _scenarios(args: argparse.Namespace) -> int:
    """The shipped scenarios, with where they are."""
    from ipsec_lab import scenario

    d = shipped_scenarios()
    rows = []
    for f in sorted(d.glob("*.toml")) if d else []:
        try:
            sc = scenario.load(f)
            rows.append({"path": str(f), "name": sc.name, "backends": list(sc.backends)})
        except scenario.ScenarioError as e:
            rows.append({"path": str(f), "name": f"(does not parse: {e})", "backends": []})
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    if not rows:
        print("ipsec-lab scenarios: no shipped scenarios found", file=sys.stderr)
        return 2
    for r in rows:
        print(f"{r['path']}\n    {r['name']} ({', '.join(r['backends'])})")
    return 0


def shipped_scenarios() -> Path | None:
    """The folder of the scenarios that come with ipsec-lab (the checkout's scenarios/)."""
    package = Path(__file__).resolve().parents[1]  # python/ipsec_lab
    for d in (package.parents[1] / "scenarios", package / "scenarios"):
        if d.is_dir():
            return d
    return None


def add_parser(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run a scenario (TOML) on real testbeds and store every result",
        description=(
            "Build the scenario's testbed in network namespaces, bring up each IPsec backend "
            "and configuration, send its workloads, meter throughput, CPU and wire, and "
            "commit each finished run to LAB/results.sqlite (LAB: --lab, else "
            "$IPSEC_LAB_DIR, else ./lab). Needs root. Ctrl-C keeps what finished; --resume "
            "continues. `ipsec-lab scenarios` lists the shipped examples; `ipsec-lab check "
            "FILE` (or --dry-run) says what will run first."
        ),
    )
    r.add_argument("scenario", help="scenario file (TOML); `ipsec-lab scenarios` lists "
                   "the shipped ones")  # fmt: skip
    r.add_argument("--resume", action="store_true",
                   help="continue the newest unfinished campaign of this scenario (one "
                   "that parses alike: comments may differ); says so if there is none")  # fmt: skip
    r.add_argument("--dry-run", action="store_true",
                   help="print what would run (as `ipsec-lab check`) and run nothing")  # fmt: skip
    r.add_argument("--lab", metavar="DIR", help=LAB_HELP)
    r.add_argument("--hosts", metavar="FILE",
                   help="run on real hosts over SSH instead of namespaces of this machine: a "
                   "hosts file mapping each node to a machine (docs/hosts.md; check it "
                   "first with `ipsec-lab hosts check FILE`); overrides the scenario's "
                   "`hosts`")  # fmt: skip
    r.add_argument("--json", action="store_true", help="print the runs and summary as JSON")
    r.add_argument("--quick", action="store_true",
                   help=f"soak workloads run {QUICK_SOAK_MINUTES:g} minute instead of their "
                   "`minutes` (30 by default): a look at the soak, not its verdict")  # fmt: skip
    add_vm_arguments(r)
    r.set_defaults(func=_run)
    k = sub.add_parser(
        "check",
        help="say what a scenario will run here, without running it",
        description="Check a scenario and print its campaign's plan: the runs per link, "
        "backend and configuration, each backend as it resolves on this machine "
        "(strongswan → strongswan-kernel or strongswan-libipsec), what will be skipped and "
        "why (e.g. no ESP in this kernel: use --vm), and about how long it takes. Runs "
        "nothing; as root it probes the kernel as the run would.",
    )
    k.add_argument("scenario", help="scenario file (TOML)")
    k.add_argument("--lab", metavar="DIR", help=LAB_HELP)
    k.add_argument("--hosts", metavar="FILE",
                   help="plan for these real hosts (as `run --hosts`)")  # fmt: skip
    k.add_argument("--json", action="store_true", help="the plan as JSON")
    k.set_defaults(func=_check)
    sc = sub.add_parser(
        "scenarios",
        help="list the scenarios that come with ipsec-lab, with their paths",
        description="The shipped scenario files (examples to copy and edit), each with "
        "its name and backends.",
    )
    sc.add_argument("--json", action="store_true", help="as JSON")
    sc.set_defaults(func=_scenarios)
