"""`ipsec-lab clean`: remove what a crashed lab run left behind (only what the lab made)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _clean(args: argparse.Namespace) -> int:
    from ipsec_lab.testbed.build import clean

    if args.hosts:
        return _clean_hosts(args.hosts)
    if os.geteuid() != 0:
        print("ipsec-lab clean: needs root (it removes network namespaces)", file=sys.stderr)
        return 2
    done = clean()
    for d in done:
        print(f"removed {d}")
    if not done:
        print("nothing left over")
    return 0


def _clean_hosts(path: str) -> int:
    """Undo, on every host of the file, what killed runs left (their ledgers); 1 if a
    host could not be reached or a run directory was refused (another user could have
    written it: it is named, with its owner, mode and the fix)."""
    from ipsec_lab import hosts
    from ipsec_lab.hosts.ledger import clean_hosts
    from ipsec_lab.hosts.ssh import SshError

    try:
        done, refused = clean_hosts(hosts.load(path))
    except hosts.HostsError as e:
        print(f"ipsec-lab clean: {e}", file=sys.stderr)
        return 2
    except SshError as e:
        print(f"ipsec-lab clean: {e}", file=sys.stderr)
        return 1
    for d in done:
        print(f"undid {d}")
    if not done and not refused:
        print("nothing left over on the hosts")
    for r in refused:
        print(f"ipsec-lab clean: refused: {r}", file=sys.stderr)
    return 1 if refused else 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "clean",
        help="remove namespaces, processes and cgroups a crashed lab run left",
        description="Removes only what the lab made: namespaces named ipl-*, the processes "
        "inside them, and cgroups named ipsec-lab-*. With --hosts FILE: on each host of "
        "the file, undoes what killed runs left there (addresses, routes, qdiscs, offload "
        "and sysctl settings, processes, files), from the ledger each run keeps on the host "
        "— only a ledger in a directory no one but root (or the login user) can write, up "
        "to /; any other is named and left alone, and the exit status is 1.",
    )
    c.add_argument("--hosts", metavar="FILE",
                   help="clean the real hosts of this hosts file instead (over SSH)")  # fmt: skip
    c.set_defaults(func=_clean)
