"""`ipsec-lab reproduce`: run a seed study (or all four) and write the report."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ipsec_lab.cli.args import LAB_HELP, add_vm_arguments, in_vm, lab_dir
from ipsec_lab.cli.output import run_with_progress
from ipsec_lab.cli.report import write_report

STUDY_HELP = {
    "ferrante2005": "study 1: eight configurations at 100 and 10 Mbit/s, today's CPU and "
    "one limited to the paper's regime (throughput, CPU effort and load, wire bytes)",
    "tisovsky2013": "study 2: loss-free rates at 128/1280 B, the model fitted, checked at "
    "64/512/1420 B, t_fix and R_alg beside the Cisco 1841's",
    "freeswan": "study 3: cycles per byte (forwarding, IPsec without crypto, "
    "authentication, 3DES) and the MHz-per-Mbit/s table",
    "hadjichristofi2003": "study 4: HTTP and SMTP transfers, slow and fast client, % "
    "increase in load, transactions and time",
}


# --quick measured at stop 60 (one run, a quiet machine: 130 / 126 / 16 / 32 s)
TIMES = (
    "full: about 7 / 16 / 1.5 / 6 minutes (31 in all); --quick: about 130 / 125 / 15 / 30 s "
    "(5 minutes in all)"
)


def _backends(args: argparse.Namespace) -> tuple[str, ...] | str:
    from ipsec_lab.backends import IPSEC_NAMES

    names = args.compare.split(",") if args.compare else [args.backend]
    names = [n.strip() for n in names if n.strip()]
    for n in names:
        if n not in IPSEC_NAMES:
            known = ", ".join(IPSEC_NAMES)
            flag = "--compare" if args.compare else "--backend"
            return f"{flag}: unknown IPsec backend {n!r} (known: {known})"
    if not names:
        return "--compare: give backends separated by commas, e.g. ours,strongswan"
    return tuple(dict.fromkeys(names))


def _reproduce(args: argparse.Namespace) -> int:
    from ipsec_lab import reproduce, studies
    from ipsec_lab.testbed.build import LabError, require_root

    if args.vm:
        return in_vm(args, "reproduce")
    which = list(studies.NAMES) if args.study == "all" else [args.study]
    backends = _backends(args)
    if isinstance(backends, str):
        print(f"ipsec-lab reproduce: {backends}", file=sys.stderr)
        return 2
    hosts = None
    if args.hosts and args.if_changed:
        print("ipsec-lab reproduce: --if-changed compares this machine's build, not the "
              "hosts' programs: with --hosts, use --resume", file=sys.stderr)  # fmt: skip
        return 2
    if args.hosts:
        from ipsec_lab import hosts as hostsfile

        hosts = {}
        try:
            for f in args.hosts:
                h = hostsfile.load(f)
                topo = h.topology
                if topo is None:
                    why = "missing: with reproduce, each hosts file says which topology it maps"
                    raise hostsfile.HostsError(f, "topology", why)
                hosts[topo] = h
        except hostsfile.HostsError as e:
            print(f"ipsec-lab reproduce: {e}", file=sys.stderr)
            return 2
    else:
        try:
            require_root()
        except LabError as e:
            print(f"ipsec-lab reproduce: {e}", file=sys.stderr)
            return 2
    lab = lab_dir(args)
    quiet = args.json or not sys.stderr.isatty()
    results: list[reproduce.StudyRun] = []
    rc = 0

    def announce(study: str, role: str, c: Any) -> None:
        print(f"{study} ({role}): campaign {c.id}, {len(c.pending())} runs", file=sys.stderr)

    t0 = time.monotonic()
    for name in which:

        def run(c: Any, n: str = name) -> None:
            run_with_progress(c, quiet, f"{n} ")

        try:
            results.append(
                reproduce.run_study(
                    name,
                    lab,
                    args.quick,
                    backends,
                    args.resume,
                    run,
                    announce,
                    hosts,
                    args.if_changed,
                )
            )
        except KeyboardInterrupt as e:
            print("ipsec-lab reproduce: interrupted; finished runs are kept — continue with "
                  "the same command and --resume", file=sys.stderr)  # fmt: skip
            from ipsec_lab.signals import interrupted_status

            return interrupted_status(e)
        except LabError as e:
            print(f"ipsec-lab reproduce: {name}: {e}", file=sys.stderr)
            print("(continue later with the same command and --resume)", file=sys.stderr)
            rc = 1
            break
        r = results[-1]
        skipped = "".join(f"; {k} skipped: {v}" for k, v in r.skipped.items())
        skipped += "".join(f"; {k}: finished campaign kept" for k in r.reused)
        skipped += "".join(
            f"; {k} (campaign {r.campaigns[k]}): {n} runs FAILED" for k, n in r.failed.items()
        )
        print(f"{name}: done in {r.seconds:.0f} s{skipped}", file=sys.stderr)
        if r.failed:
            rc = 1
    page = None
    if not args.no_report and results:
        page = write_report(lab, None, args.out)
    out = {
        "lab": str(lab),
        "seconds": round(time.monotonic() - t0, 1),
        "studies": [
            {
                "study": r.study,
                "campaigns": r.campaigns,
                "skipped": r.skipped,
                "reused": r.reused,
                "failed": r.failed,
                "seconds": round(r.seconds, 1),
            }
            for r in results
        ],
        "report": str(page) if page else None,
    }
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
    elif page:
        print(f"report: {page}")
    if any(r.failed for r in results):
        print("ipsec-lab reproduce: some runs failed (see above, the report's reading and "
              "`ipsec-lab results ID`); retry them with the same command and --resume",
              file=sys.stderr)  # fmt: skip
    return rc


def add_parser(sub: Any) -> None:
    from ipsec_lab import studies

    r = sub.add_parser(
        "reproduce",
        help="run a seed study (or all) on this machine and write the report",
        description=(
            "Run a seed study's experiment on real testbeds (as `ipsec-lab run` does: "
            "namespaces, shaped links, our gateway or another IPsec, every result in "
            "LAB/results.sqlite), then write the report beside the paper's figures. Needs "
            "root. Studies:\n"
            + "\n".join(f"  {k}: {v}" for k, v in STUDY_HELP.items())
            + f"\nTime on a 2-core machine, in study order — {TIMES}."
        ),
    )
    r.add_argument("study", choices=[*studies.NAMES, "all"], metavar="STUDY",
                   help=f"which study ({', '.join(studies.NAMES)}), or all")  # fmt: skip
    r.add_argument("--quick", action="store_true",
                   help="a reduced run for a first look (fewer configurations, sizes and "
                   "seconds; all four studies in about 5 minutes)")  # fmt: skip
    g = r.add_mutually_exclusive_group()
    from ipsec_lab.backends import IPSEC_NAMES, described

    g.add_argument(
        "--backend",
        default="ours",
        metavar="B",
        help=f"the IPsec under test (default ours): {described(IPSEC_NAMES)}",
    )
    g.add_argument("--compare", metavar="B1,B2",
                   help="run the same study on several backends side by side, e.g. "
                   f"ours,strongswan (any of {', '.join(IPSEC_NAMES)})")  # fmt: skip
    r.add_argument("--lab", metavar="DIR", help=LAB_HELP)
    r.add_argument("--hosts", metavar="FILE", action="append",
                   help="run on real hosts (docs/hosts.md): a hosts file per topology the "
                   "studies use (pair: study 1, line: 2 and 3, clients: 4), each with its "
                   "`topology`; repeat it; studies with none are skipped")  # fmt: skip
    again = r.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="keep finished campaigns, continue unfinished ones, run the rest",
    )
    again.add_argument(
        "--if-changed",
        action="store_true",
        help="measure only what this build has not measured here: a campaign of the same "
        "scenario that this very build (the lab's code, its engine and ipsec-gw, byte for "
        "byte) finished on this machine is used as it is (`make run` passes it); not with "
        "--hosts, whose programs it cannot see",
    )
    r.add_argument("--out", metavar="DIR", help="where the report goes (default LAB/report)")
    r.add_argument("--no-report", action="store_true", help="only run; write no report")
    r.add_argument("--json", action="store_true",
                   help="print the campaigns, timings and report path as JSON")  # fmt: skip
    add_vm_arguments(r)
    r.set_defaults(func=_reproduce)
