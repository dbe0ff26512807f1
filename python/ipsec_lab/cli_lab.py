"""`ipsec-lab run | results | clean`: the lab's commands."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

from ipsec_lab import metrics

DEFAULT_LAB = "lab"
LAB_HELP = f"lab directory holding results.sqlite (default: $IPSEC_LAB_DIR or ./{DEFAULT_LAB})"


def _lab_dir(args: argparse.Namespace) -> Path:
    """The lab directory, absolute: every path the lab hands to another program (nginx's
    `-c`/`-p`, charon's and ipsec-gw's configs, tcpdump's capture) derives from it, and a
    relative one means something else to each of them."""
    return Path(args.lab or os.environ.get("IPSEC_LAB_DIR") or DEFAULT_LAB).resolve()


def in_vm(args: argparse.Namespace, command: str) -> int:
    """Run this very command (`--vm` taken off, the lab directory made explicit) in a
    micro-VM whose kernel has IPsec and netem; the lab directory (and `--out`) are
    shared writable, so the results land in this machine's store."""
    from ipsec_lab import vm

    lab = _lab_dir(args)
    rw = [lab] + ([Path(args.out).resolve()] if getattr(args, "out", None) else [])
    inner = vm.strip_vm_args(sys.argv[1:])
    if "--lab" in inner:
        i = inner.index("--lab")
        inner[i + 1 : i + 2] = [str(lab)]
    else:
        inner += ["--lab", str(lab)]
    exe = str(Path(sys.argv[0]).resolve())
    try:
        return vm.run([exe, *inner], rw, kernel=args.vm_kernel)
    except vm.VmError as e:
        print(f"ipsec-lab {command}: {e}", file=sys.stderr)
        return 2


def add_vm_arguments(p: Any) -> None:
    p.add_argument(
        "--vm",
        action="store_true",
        help="run inside a micro-VM (virtme-ng) booted with a kernel that has "
        "ESP, AH, IPComp and netem, for kernels that lack them; KVM where it "
        "works, else emulated (TCG: correct, not fast; figures not comparable)",
    )
    p.add_argument("--vm-kernel", metavar="PATH",
                   help="the kernel --vm boots (default: the newest /boot/vmlinuz-* with "
                   "those modules)")  # fmt: skip


def _run(args: argparse.Namespace) -> int:
    from ipsec_lab import runner, scenario
    from ipsec_lab.testbed.build import LabError, require_root

    if args.vm:
        return in_vm(args, "run")

    try:
        sc = scenario.load(args.scenario)
    except scenario.ScenarioError as e:
        print(f"ipsec-lab run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _print_forecast(sc, args)
    try:
        require_root()
    except LabError as e:
        print(f"ipsec-lab run: {e}", file=sys.stderr)
        return 2
    lab = _lab_dir(args)
    if args.resume:
        stop = _nothing_to_resume(sc, lab, args.scenario)
        if stop is not None:
            return stop
    from ipsec_lab import meters, preflight

    for w in preflight.slower_warnings(sc.backends):
        print(f"warning: {w}", file=sys.stderr)
    busy = meters.other_cpu(seconds=1.0)
    if busy > meters.BUSY_CPUS:
        print(
            f"warning: other processes are using {busy:.2f} CPUs: every CPU figure of this "
            "campaign includes their work; each run is checked again and flagged if so",
            file=sys.stderr,
        )
    try:
        campaign = runner.Campaign(sc, lab, resume=args.resume)
    except OSError as e:
        print(f"ipsec-lab run: cannot open the lab directory {lab}: {e}", file=sys.stderr)
        return 2
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
    if campaign.progress.failed:
        print(
            f"ipsec-lab run: {campaign.progress.failed} runs failed (reasons below and in "
            f"`ipsec-lab results {campaign.id}`); retry them with "
            f"`ipsec-lab run --resume {args.scenario}`",
            file=sys.stderr,
        )
        rc = 1
    runs = campaign.store.runs(campaign.id)
    summary = runner.summarize(runs)
    if args.json:
        json.dump({"campaign": campaign.id, "summary": summary, "runs": runs}, sys.stdout, indent=1)
        print()
    else:
        print_summary(summary, f"campaign {campaign.id}: {sc.name}")
        print_failures(runs)
    return rc


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


def _print_forecast(sc: Any, args: argparse.Namespace) -> int:
    from ipsec_lab import preflight

    doc = preflight.forecast(sc)
    doc["lab"] = str(_lab_dir(args))
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        print()
        return 0
    from rich.table import Table

    from ipsec_lab.tables import WholeConsole as Console

    c = Console()
    print(f"scenario {sc.source}: {sc.name!r} — topology {sc.topology}, "
          f"{sc.repetitions} repetition(s) of each run")  # fmt: skip
    for b, r in doc["backends"].items():
        if r["runs_as"] != b or r["why"]:
            print(f"  backend {b} → {r['runs_as']} ({r['why']})")
    t = Table(title="what will run", caption="about: estimated time of these runs on a "
              "2-core machine (traffic, warm-up, set-up)")  # fmt: skip
    for col in ("link", "backend", "configuration", "runs", "about", "what happens"):
        t.add_column(col, justify="right" if col in ("runs", "about") else "left")
    for g in doc["groups"]:
        what = {"run": "runs", "skip": "skipped: ", "unknown": "unknown: "}[g["status"]]
        shown = (
            g["backend"]
            if g["resolved"] == g["backend"]
            else f"{g['backend']} → " + g["resolved"].removeprefix("strongswan-")
        )
        t.add_row(g["link"], shown, g["configuration"], str(g["runs"]),
                  preflight.duration(g["seconds"]), what + (g["reason"] or ""))  # fmt: skip
    c.print(t)
    print(f"{doc['runs']} runs: {doc['will_run']} will run, {doc['skipped']} skipped"
          + (f", {doc['unknown']} unknown" if doc["unknown"] else "")
          + f"; about {preflight.duration(doc['estimated_s'])}; results into "
          f"{doc['lab']}/results.sqlite")  # fmt: skip
    for w in doc["warnings"]:
        print(f"warning: {w}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ipsec_lab import scenario

    try:
        sc = scenario.load(args.scenario)
    except scenario.ScenarioError as e:
        print(f"ipsec-lab check: {e}", file=sys.stderr)
        return 2
    return _print_forecast(sc, args)


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
    here = Path(__file__).resolve()
    for d in (here.parents[2] / "scenarios", here.parent / "scenarios"):
        if d.is_dir():
            return d
    return None


def run_with_progress(campaign: Any, quiet: bool, title: str = "") -> None:
    """Run a campaign, with a live rich progress bar (count, ETA, current run) on stderr
    unless `quiet`, and a line on stderr for each run as it ends (done with its figures,
    failed or skipped with the reason's first line)."""
    last = [""]
    if quiet:

        def plain(p: Any) -> None:
            if p.last and p.last != last[0]:
                last[0] = p.last
                print(f"{title}[{p.done}/{p.total}] {p.last}", file=sys.stderr, flush=True)

        campaign.on_progress = plain
        campaign.run()
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(title + "{task.completed}/{task.total}"),
        BarColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        transient=True,
        console=Console(stderr=True),
    ) as prog:
        task = prog.add_task("", total=campaign.progress.total)

        def show(p: Any) -> None:
            if p.last and p.last != last[0]:
                last[0] = p.last
                style = (
                    "red"
                    if p.last.startswith("failed")
                    else ("yellow" if p.last.startswith("skipped") else "")
                )
                line = escape(p.last)
                prog.console.print(f"[{style}]{line}[/{style}]" if style else line)
            prog.update(task, completed=p.done, description=escape(p.current))

        campaign.on_progress = show
        show(campaign.progress)
        campaign.run()


def counts_line(campaign: Any) -> str:
    """planned / done / failed / skipped, in words, for the end of a run."""
    p = campaign.progress
    ok = p.done - p.failed - p.skipped
    return f"{p.total} runs planned: {ok} done, {p.failed} failed, {p.skipped} skipped" + (
        f", {p.total - p.done} not run" if p.total > p.done else ""
    )


def print_summary(summary: list[dict[str, Any]], title: str) -> None:
    from ipsec_lab.tables import WholeConsole as Console

    Console().print(summary_table(summary, title))


def summary_table(summary: list[dict[str, Any]], title: str) -> Any:
    """The summary an engineer reads: rate (or, for HTTP/SMTP, transfer time) median and
    range, its CV over repetitions, ratios to no IPsec, CPU effort, wire bytes per
    payload byte, TCP retransmits, and why a cell is empty."""
    from rich.table import Table

    t = Table(title=title, caption=metrics.SUMMARY_CAPTION)
    for col in ("backend", "configuration", "link", "flow", "measurement"):
        t.add_column(col, no_wrap=True)
    t.add_column("n", justify="right")
    for c in metrics.COLUMNS:
        t.add_column(c.header, justify="right")
    t.add_column("note")
    for r in summary:
        head = (r.get("backend_label", r["backend"]), r["configuration"], r["link"], r["flow"],
                r["measurement"])  # fmt: skip
        if r.get("skipped") is not None or r.get("failed") is not None:
            why = (
                "skipped: " + r["skipped"]
                if r.get("skipped") is not None
                else ("FAILED: " + r["failed"])
            )
            t.add_row(*head, "0", *[""] * len(metrics.COLUMNS), why)
            continue
        t.add_row(*head, str(r["n"]), *metrics.cells(r), r.get("note", ""))
    return t


def _results(args: argparse.Namespace) -> int:
    from ipsec_lab import runner
    from ipsec_lab.store import Store

    db = _lab_dir(args) / "results.sqlite"
    if not db.exists():
        print(f"ipsec-lab results: no results in {db} (run a scenario first)", file=sys.stderr)
        return 2
    store = Store(db)
    if args.campaign is None:
        rows = [
            {k: r[k] for k in ("id", "name", "status", "started", "n_runs", "n_done",
                               "n_failed", "n_skipped")}
            for r in store.campaigns()
        ]  # fmt: skip
        if args.json:
            json.dump(rows, sys.stdout, indent=1)
            print()
            return 0
        from rich.table import Table

        from ipsec_lab.tables import WholeConsole as Console

        t = Table(title=f"campaigns in {db}")
        for c in ("id", "name", "status", "runs", "done", "failed", "skipped"):
            t.add_column(c, justify="right" if c in ("id", "runs", "done", "failed",
                                                      "skipped") else "left")  # fmt: skip
        for r in rows:
            t.add_row(str(r["id"]), r["name"], r["status"], str(r["n_runs"]), str(r["n_done"]),
                      str(r["n_failed"]), str(r["n_skipped"]))  # fmt: skip
        Console().print(t)
        return 0
    camp = store.campaign(args.campaign)
    if camp is None:
        print(f"ipsec-lab results: no campaign {args.campaign} in {db}", file=sys.stderr)
        return 2
    runs = store.runs(args.campaign)
    summary = runner.summarize(runs)
    n = runner.counts(runs, _planned(camp))
    if args.json:
        json.dump(
            {"campaign": dict(camp) | {"environment": json.loads(camp["environment"])},
             "counts": n, "summary": summary, "runs": runs},
            sys.stdout, indent=1,
        )  # fmt: skip
        print()
    elif args.csv:
        _csv(runs)
    else:
        print_summary(summary, f"campaign {camp['id']}: {camp['name']} ({camp['status']})")
        print(
            f"{n['planned']} runs planned: {n['done']} done, {n['failed']} failed, "
            f"{n['skipped']} skipped"
        )
        print_failures(runs)
    return 0


def print_failures(runs: list[dict[str, Any]]) -> None:
    """Each failed run with its whole reason (the programs' log tails included)."""
    for r in runs:
        if r["status"] == "failed":
            print(f"\nFAILED: {r['backend']} {r['configuration']} | {r['link']} | "
                  f"{r['workload']} {r['flow']} #{r['repetition']}\n{r['reason']}")  # fmt: skip


def _planned(camp: Any) -> int | None:
    """How many runs the campaign's scenario plans (None if it no longer parses)."""
    from ipsec_lab import runner, scenario

    try:
        return len(runner.plan(scenario.parse(camp["scenario_text"], camp["scenario_path"])))
    except Exception:
        return None


def _csv(runs: list[dict[str, Any]]) -> None:
    w = csv.DictWriter(sys.stdout, fieldnames=metrics.CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in runs:
        base = {**r, "run_id": r["id"]}
        for x in r["results"] or [{}]:
            w.writerow({**base, **x})


def _clean(args: argparse.Namespace) -> int:
    from ipsec_lab.testbed.build import clean

    if os.geteuid() != 0:
        print("ipsec-lab clean: needs root (it removes network namespaces)", file=sys.stderr)
        return 2
    done = clean()
    for d in done:
        print(f"removed {d}")
    if not done:
        print("nothing left over")
    return 0


def add_parsers(sub: Any) -> None:
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
    r.add_argument("--json", action="store_true", help="print the runs and summary as JSON")
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
    s = sub.add_parser(
        "results",
        help="list campaigns, or print one campaign's table / JSON / CSV",
        description="Without CAMPAIGN: the campaigns in the lab directory. With one: its "
        "summary (median and min-max over repetitions, ratios to the no-IPsec baseline).",
    )
    s.add_argument("campaign", nargs="?", type=int, help="campaign id (see the list)")
    s.add_argument("--lab", metavar="DIR", help=LAB_HELP)
    g = s.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="everything, as JSON")
    g.add_argument("--csv", action="store_true", help="one row per measurement, as CSV")
    s.set_defaults(func=_results)
    c = sub.add_parser(
        "clean",
        help="remove namespaces, processes and cgroups a crashed lab run left",
        description="Removes only what the lab made: namespaces named ipl-*, the processes "
        "inside them, and cgroups named ipsec-lab-*.",
    )
    c.set_defaults(func=_clean)
