"""Tests that run inside the micro-VM (a Debian kernel with ESP, AH, IPComp and netem,
booted by virtme-ng; under TCG here): ours against the kernel's IPsec. The host side boots
the VM once and runs tests/vm/interop.py inside it; the inner run's outcome decides."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab import vm

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[1]


def test_ours_and_the_kernels_ipsec_in_the_vm(tmp_path: Path) -> None:
    """Interop (24 cases, both ways, and a replayed capture) and impairment (netem: ours
    and xfrm)."""
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
    assert m and int(m.group(1)) == 28 and "failed" not in text, text[-4000:]


def campaign_in_vm(scenario: Path, lab: Path, timeout: float) -> dict[str, Any]:
    """`ipsec-lab run SCENARIO --vm` into `lab`; its campaign's `results --json`."""
    exe = str(Path(sys.executable).parent / "ipsec-lab")
    p = subprocess.run([exe, "run", str(scenario), "--vm", "--lab", str(lab)],
                       capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    r = subprocess.run([exe, "results", "1", "--lab", str(lab), "--json"],
                       capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_a_campaign_of_every_backend_runs_in_the_vm(tmp_path: Path) -> None:
    """scenarios/vm.toml with --vm: none, xfrm, strongSwan and ours, two configurations,
    unshaped and 802.11 (netem), every run measured, into the host's store, each
    recording that it ran in a VM."""
    data = campaign_in_vm(REPO / "scenarios/vm.toml", tmp_path / "lab", 1200)
    assert data["counts"] == {"planned": 14, "done": 14, "failed": 0, "skipped": 0}
    assert data["campaign"]["environment"]["vm"].startswith(("tcg", "kvm"))
    rates = {(x["backend"], x["link"]) for x in data["runs"] if x["status"] == "done"}
    assert {b for b, _ in rates} == {"none", "xfrm", "strongswan", "ours"}
    assert {link for _, link in rates} == {"unshaped", "wifi-2mbit"}


CLIENTS = """\
name = "vm-clients"
topology = "clients"                   # a server and two clients, host-to-host each
backends = ["xfrm", "xfrm-udp", "strongswan-kernel", "ours"]
configurations = ["esp:aes128gcm16"]
repetitions = 1
warmup_s = 0.2

[[links]]
preset = "unshaped"

[[workloads]]
kind = "tcp"
seconds = 1
"""


def test_the_kernels_ipsec_on_the_clients_topology_in_the_vm(tmp_path: Path) -> None:
    """The server holds one tunnel per client (two SAs of one SPI each way, told apart by
    their addresses): xfrm, xfrm with ESP in UDP, strongSwan on the kernel and ours all
    carry both clients' flows."""
    scenario = tmp_path / "clients.toml"
    scenario.write_text(CLIENTS)
    data = campaign_in_vm(scenario, tmp_path / "lab", 900)
    assert data["counts"] == {"planned": 8, "done": 8, "failed": 0, "skipped": 0}
    flows = {(x["backend"], x["flow"]) for x in data["runs"] if x["results"][0]["mbps"] > 1}
    backends = ("xfrm", "xfrm-udp", "strongswan-kernel", "ours")
    assert flows == {(b, f) for b in backends for f in ("fast-server", "slow-server")}, flows
