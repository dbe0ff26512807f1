"""What the tests share: the `ipsec-lab` runner as a user runs it (a subprocess), and the
rule that a test marked `root` runs as root or fails — never skips (CI runs them as root,
and a skipped root test would count as passing)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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
    p = subprocess.run([sys.executable, "-m", "ipsec_lab.cli", *args], capture_output=True,
                       text=True, timeout=timeout, env=e)  # fmt: skip
    if check and p.returncode != 0:
        # What the command said, not only its status: a failure in CI is read from the log.
        pytest.fail(f"ipsec-lab {' '.join(args)}: exit {p.returncode}\n"
                    f"stderr: {p.stderr[-4000:]}\nstdout: {p.stdout[-2000:]}")  # fmt: skip
    return p


# Root modules whose fixtures span the module (one campaign, one VM boot): they check
# what they leave once, at the module's end.
MODULE_TIDY = {"test_reproduce_root", "test_vm_root"}


@pytest.fixture(autouse=True)
def _root_tests_run_as_root(request: pytest.FixtureRequest) -> None:
    if not request.node.get_closest_marker("root"):
        return
    if os.geteuid() != 0:
        pytest.fail("a root test (namespaces, TUN, xfrm): run it as root, as CI does")
    if request.module.__name__ not in MODULE_TIDY:
        request.getfixturevalue("no_leftovers")


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """Nothing a root test made outlives it: no lab namespace or cgroup it added, no
    process started with a path of its own (every root test has it, by the fixture
    above)."""
    import psutil

    from ipsec_lab.testbed.build import leftovers

    before = set(leftovers()[0])
    yield
    names, groups = leftovers()
    assert set(names) <= before, f"namespaces left: {set(names) - before}"
    assert not groups, f"cgroups left: {groups}"
    mine = [
        p.info["pid"]
        for p in psutil.process_iter(["pid", "cmdline"])
        if any(str(tmp_path) in a for a in (p.info["cmdline"] or []))
    ]
    assert not mine, f"processes of this test left: {mine}"
