"""`ipsec-lab results`: the campaigns in a lab, or one campaign's summary, JSON or CSV."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from ipsec_lab import metrics
from ipsec_lab.cli.args import LAB_HELP, lab_dir
from ipsec_lab.cli.output import print_failures, print_summary


def _results(args: argparse.Namespace) -> int:
    from ipsec_lab import ceiling, runner
    from ipsec_lab.store import Store

    db = lab_dir(args) / "results.sqlite"
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
    summary = runner.summarize(runs, ceiling.earlier(store, args.campaign))
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


def _planned(camp: Any) -> int | None:
    """How many runs the campaign's scenario plans (None if it no longer parses)."""
    from ipsec_lab import preflight, scenario

    try:
        return len(preflight.plan(scenario.parse(camp["scenario_text"], camp["scenario_path"])))
    except Exception:
        return None


def _csv(runs: list[dict[str, Any]]) -> None:
    w = csv.DictWriter(sys.stdout, fieldnames=metrics.CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for r in runs:
        base = {**r, "run_id": r["id"]}
        for x in r["results"] or [{}]:
            w.writerow({**base, **x})


def add_parser(sub: Any) -> None:
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
