"""`ipsec-lab hosts check`: what the lab needs of each real host, before any traffic."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from ipsec_lab.units import plural

if TYPE_CHECKING:
    from ipsec_lab.traffic.workload import Workload


def _check(args: argparse.Namespace) -> int:
    from ipsec_lab import hosts as hostsfile
    from ipsec_lab import scenario
    from ipsec_lab.hosts import check
    from ipsec_lab.testbed import topology

    try:
        hosts = hostsfile.load(args.file)
        backends: tuple[str, ...] = ()
        workloads: tuple[Workload, ...] = ()
        topo = hosts.topology
        if args.scenario:
            sc = scenario.load(args.scenario)
            backends, workloads, topo = sc.backends, sc.workloads, sc.topology
        name = topo or check._guess(hosts)
        hosts.for_topology(topology(name), backend_external="external" in backends
                           or not args.scenario)  # fmt: skip
    except (hostsfile.HostsError, scenario.ScenarioError) as e:
        print(f"ipsec-lab hosts check: {e}", file=sys.stderr)
        return 2
    rows = check.run_checks(hosts, name, backends, workloads)
    failed = [r for r in rows if r.status == "fail"]
    if args.json:
        json.dump({"file": args.file, "topology": name, "ready": not failed,
                   "checks": check.as_json(rows)}, sys.stdout, indent=1)  # fmt: skip
        print()
    else:
        from rich.table import Table

        from ipsec_lab.tables import WholeConsole as Console

        t = Table(title=f"hosts of {args.file} (topology {name})")
        for col in ("host", "check", "status", "detail"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r.host, r.check, r.status, r.detail)
        Console().print(t)
        warned = sum(r.status == "warn" for r in rows)
        if failed and sys.stdout.isatty() and sys.stderr.isatty():
            # one screen: the table above has each problem's detail; say it once
            hosts_ = ", ".join(dict.fromkeys(r.host for r in failed))
            print(f"not ready: {plural(len(failed), 'problem')} ({hosts_}; the fail rows above)",
                  file=sys.stderr)  # fmt: skip
        elif failed:  # stderr apart from the table (a pipe, a log): each problem in full
            print(f"not ready: {plural(len(failed), 'problem')}:", file=sys.stderr)
            for r in failed:
                print(f"  {r.host}: {r.check}: {r.detail}", file=sys.stderr)
        else:
            print(f"ready ({plural(warned, 'warning')})" if warned else "ready")
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    h = sub.add_parser(
        "hosts",
        help="real hosts as a testbed: check a hosts file's machines",
        description="Commands for testbeds of real hosts reached over SSH (a hosts file maps "
        "each node of a topology to a machine: see docs/hosts.md and examples/hosts/*.toml).",
    )
    hs = h.add_subparsers(dest="hosts_command", metavar="COMMAND", required=True)
    c = hs.add_parser(
        "check",
        help="check every host before any traffic; exit 1 naming every problem",
        description="Connect to every host of FILE (OpenSSH, your ~/.ssh/config applies) and "
        "check: reachable, root or passwordless sudo, each tool the scenario needs with its "
        "version and the Debian package that has it, kernel modules, the test interfaces "
        "(present, up, not the SSH session's, MTU), the clock, the work directory. Prints "
        "a table (or --json); exit 0 when ready, 1 with every problem named, 2 for a bad file.",
    )
    c.add_argument("file", help="hosts file (TOML)")
    c.add_argument("--scenario", metavar="FILE",
                   help="check for this scenario's topology, backends and workloads "
                   "(default: the tools every run needs)")  # fmt: skip
    c.add_argument("--json", action="store_true", help="the checks as JSON")
    c.set_defaults(func=_check)
