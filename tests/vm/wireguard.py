"""The Linux kernel's WireGuard (backend `wireguard`), run INSIDE the micro-VM (the
host's kernel has no wireguard module). NOT in CI's VM lanes for now: alone in the VM all
four pass, but twice in CI's lane beside the unit tests the `line` case's capture of a
4 MiB transfer held fewer than 1,000 data messages, cause not yet found. By hand:
`vm.run(["sh", "-c", ".venv/bin/pytest tests/vm/wireguard.py"], [dir])` as root.
It checks: a file carried whole with only WireGuard on the outer link, between gateways
(`line`) and host to host (`pair`), the packets' sizes against the model's, a deleted
device failing closed and nothing left after — the same checks as wireguard-go's on the
host (tests/wgcheck.py)."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from ipsec_lab.backends.wireguard import Wireguard, _WireGuard, kernel_has_wireguard
from ipsec_lab.testbed.build import Testbed

sys.path.insert(0, str(Path(__file__).parents[1]))
from wgcheck import WIRE, carries_a_file_whole, fails_closed


def test_this_kernel_makes_wireguard_devices() -> None:
    assert kernel_has_wireguard() == (True, "")


@pytest.mark.parametrize("topo", WIRE)
def test_the_kernels_wireguard_carries_a_file_whole(tmp_path: Path, topo: str) -> None:
    pids, version = carries_a_file_whole(tmp_path, topo, Wireguard())
    assert pids == []  # the kernel's work: no process of its own
    assert version == f"Linux {platform.release()} WireGuard"


def test_a_deleted_wireguard_device_fails_closed(tmp_path: Path) -> None:
    def kill(tb: Testbed, wg: _WireGuard) -> str:
        gw_a = next(e for e in wg._ends if e.node == "gwA")
        tb.run("gwA", ["ip", "link", "del", "dev", gw_a.dev])
        return rf"gwA's device {gw_a.dev} is gone"

    fails_closed(tmp_path, Wireguard(), kill)
