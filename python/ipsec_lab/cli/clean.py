"""`ipsec-lab clean`: remove what a crashed lab run left behind (only what the lab made)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


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


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "clean",
        help="remove namespaces, processes and cgroups a crashed lab run left",
        description="Removes only what the lab made: namespaces named ipl-*, the processes "
        "inside them, and cgroups named ipsec-lab-*.",
    )
    c.set_defaults(func=_clean)
