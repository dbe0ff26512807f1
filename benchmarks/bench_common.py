"""What the gateway benchmarks share: a fresh `line` testbed with one backend up, one
iperf3 run through it, and the JSON they print."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ipsec_lab import environment
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.placement import Placement
from ipsec_lab.traffic import iperf, udp
from ipsec_lab.traffic.workload import Workload


@contextmanager
def tunnel(backend: Any, configuration: str, prefix: str,
           placement: Placement | None = None) -> Iterator[Testbed]:  # fmt: skip
    """A fresh `line` testbed (client - gwA - gwB - server) with `backend` up (its roles
    on `placement`'s CPUs, where one is given); both are
    taken down on leaving, even on failure. Its run directory (commands and logs) is
    removed after a run that went well and kept, its path printed, after one that
    failed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    ok = False
    try:
        with Testbed(topology("line"), root / "run", placement=placement) as tb:
            backend.start(tb, configuration)
            try:
                yield tb
            finally:
                backend.stop(tb)
        ok = True
    finally:
        if ok:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"the failed run's logs are kept in {root}", file=sys.stderr)


def mbps(tb: Testbed, workload: Workload) -> float:
    """One iperf3 run (TCP or UDP, as `workload` says) client -> server: Mbit/s."""
    run = iperf.tcp if workload.kind == "tcp" else udp.udp
    if workload.kind != "tcp":  # these benchmarks have always measured through iperf3
        workload = dataclasses.replace(workload, generator="iperf3")
    (row,) = run(tb, tb.topo.flows[0], workload, lambda _, f: f(), 0)
    return float(row["mbps"])


def emit(out: dict[str, Any]) -> int:
    """Print a benchmark's result, with what machine it ran on, as JSON on stdout."""
    out["environment"] = environment.describe()
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0
