"""What the tests share: the `ipsec-lab` runner as a user runs it (a subprocess), and the
rule that a test marked `root` runs as root or fails — never skips (CI runs them as root,
and a skipped root test would count as passing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def cli(
    *args: str,
    timeout: float = 300,
    check: bool = False,
    columns: int | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`ipsec-lab ARGS` in a fresh process, in a pipe: its status, stdout and stderr.
    `columns` sets the width a table would take in a terminal of that many columns."""
    e = {**os.environ, **(env or {})}
    if columns is not None:
        e |= {"COLUMNS": str(columns), "LINES": "40"}
    return subprocess.run([sys.executable, "-m", "ipsec_lab.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=check, env=e)  # fmt: skip


@pytest.fixture(autouse=True)
def _root_tests_run_as_root(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("root") and os.geteuid() != 0:
        pytest.fail("a root test (namespaces, TUN, xfrm): run it as root, as CI does")
