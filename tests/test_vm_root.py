"""Tests that run inside the micro-VM (a Debian kernel with ESP, AH, IPComp and netem,
booted by virtme-ng; under TCG here): ours against the kernel's IPsec. The host side boots
the VM once and runs tests/vm/interop.py inside it; the inner run's outcome decides."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from ipsec_lab import vm

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[1]


def test_ours_and_the_kernels_ipsec_in_the_vm(tmp_path: Path) -> None:
    """Interop (11 configurations, both ways) and impairment (netem: ours and xfrm)."""
    if os.geteuid() != 0:
        pytest.fail("the VM tests need root (as CI runs them)")
    log = tmp_path / "inner.log"
    pytest_bin = str(Path(sys.executable).parent / "pytest")
    argv = [
        "sh", "-c",
        f"{pytest_bin} -q -p no:cacheprovider --basetemp={tmp_path / 'inner'} "
        f"{REPO / 'tests/vm/interop.py'} {REPO / 'tests/vm/impairment.py'} > {log} 2>&1; "
        f"echo rc=$? >> {log}",
    ]  # fmt: skip
    rc = vm.run(argv, [tmp_path], timeout=1500)
    text = log.read_text() if log.exists() else ""
    assert rc == 0, f"the VM did not run (rc {rc})"
    assert "rc=0" in text, text[-4000:]
    m = re.search(r"(\d+) passed", text)
    assert m and int(m.group(1)) == 14 and "failed" not in text, text[-4000:]
