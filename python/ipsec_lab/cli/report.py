"""`ipsec-lab report`: the HTML report (and CSV/JSON) of study campaigns or your own."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ipsec_lab.cli.args import LAB_HELP, lab_dir


def write_report(lab: Path, ids: list[int] | None, out: str | None) -> Path:
    """Write the report of the chosen (or newest) study campaigns to `out`, by default
    LAB/report; return the HTML's path."""
    from ipsec_lab import campaign_report, ceiling, report, reproduce
    from ipsec_lab.store import Store

    store = Store(lab / "results.sqlite")
    try:
        camps = {int(c["id"]): c for c in store.campaigns()}
        names = {i: c["name"] for i, c in camps.items()}
        for i in ids or []:
            if i not in names:
                raise ValueError(f"no campaign {i} in {store.path}")
        own = [i for i in ids or [] if reproduce.parse_name(names[i]) is None]
        study_ids = [i for i in ids or [] if i not in own]
        chosen = reproduce.latest_campaigns(store, study_ids) if (study_ids or not ids) else {}
        if not chosen and not own:
            raise ValueError(
                f"no study campaigns in {store.path}: run `ipsec-lab reproduce` first, or "
                "name campaigns (`ipsec-lab results` lists them)"
            )
        analyses = reproduce.analyse(store, chosen) + [
            campaign_report.analyse(
                i,
                names[i],
                store.runs(i, samples=True),
                camps[i]["scenario_path"],
                lab,
                ceiling.earlier(store, i),
                json.loads(camps[i]["environment"] or "{}"),
            )
            for i in own
        ]
        newest = max([c for roles in chosen.values() for c in roles.values()] + own)
        camp = store.campaign(newest)
        env = json.loads(camp["environment"]) if camp else {}
    finally:
        store.close()
    return report.write(analyses, env, lab, Path(out) if out else lab / "report")


def _report(args: argparse.Namespace) -> int:
    lab = lab_dir(args)
    if not (lab / "results.sqlite").exists():
        print(f"ipsec-lab report: no results in {lab / 'results.sqlite'} (run "
              "`ipsec-lab reproduce` first)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        page = write_report(lab, args.campaign or None, args.out)
    except ValueError as e:
        print(f"ipsec-lab report: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(page.with_name("report.json").read_text())
    else:
        print(f"report: {page}")
        print(f"tables: {page.parent / 'tables'} (CSV), analyses: {page.with_name('report.json')}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write the HTML report (and CSV/JSON) of study campaigns or your own",
        description="Without CAMPAIGN: the newest campaign of each study and role in the "
        "lab. With CAMPAIGN ids: those — study reproductions beside their papers, any other "
        "campaign (from `ipsec-lab run`) as throughput, CPU effort, wire bytes and CPU load "
        "per backend x configuration x link, several side by side. Writes OUT/report.html "
        "(self-contained: plots inline, opens offline), OUT/report.json and OUT/tables/*.csv.",
    )
    p.add_argument("campaign", nargs="*", type=int, help="campaign ids (see `ipsec-lab results`)")
    p.add_argument("--lab", metavar="DIR", help=LAB_HELP)
    p.add_argument("--out", metavar="DIR", help="output directory (default LAB/report)")
    p.add_argument("--json", action="store_true", help="print report.json to stdout as well")
    p.set_defaults(func=_report)
