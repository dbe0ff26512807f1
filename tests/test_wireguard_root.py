"""wireguard-go and boringtun, the lab's user-space WireGuard backends, with real traffic:
client - gwA - gwB - server in namespaces (and host to host on `pair`), checked by
tests/wgcheck.py — a file carried whole, tcpdump on the outer link, the packets' sizes
against the model's, a dead tunnel process failing closed, nothing left after — and a
campaign beside IPsec and the kernel's WireGuard. Needs root (CI runs as root)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ipsec_lab.backends.userspace_wireguard import (
    BORINGTUN_VERSION,
    Boringtun,
    WireguardGo,
    _UserSpace,
    versioned,
)
from ipsec_lab.backends.wireguard import _WireGuard, kernel_has_wireguard
from ipsec_lab.testbed.build import Testbed
from wgcheck import WIRE, carries_a_file_whole, fails_closed

pytestmark = pytest.mark.root


USER_SPACE = {"wireguard-go": WireguardGo, "boringtun": Boringtun}


@pytest.mark.parametrize("topo", WIRE)
@pytest.mark.parametrize("backend", USER_SPACE)
def test_a_user_space_wireguard_carries_a_file_whole_with_only_wireguard_on_the_link(
    tmp_path: Path, topo: str, backend: str
) -> None:
    pids, version = carries_a_file_whole(tmp_path, topo, USER_SPACE[backend]())
    assert len(pids) == 2  # one process per end, metered apart
    if backend == "wireguard-go":
        assert version == versioned(version.split(" (")[0])
        assert version.startswith("wireguard-go v")
    else:  # what the Makefile installed, said by the program itself
        assert version == f"boringtun-cli {BORINGTUN_VERSION}", version


@pytest.mark.parametrize("backend", USER_SPACE)
def test_a_dead_user_space_wireguard_fails_closed(tmp_path: Path, backend: str) -> None:
    def kill(tb: Testbed, wg: _WireGuard) -> str:
        gw_a = next(e for e in wg._ends if e.node == "gwA")
        assert gw_a.proc is not None
        os.killpg(gw_a.proc.pid, signal.SIGKILL)  # a process the test's backend started
        gw_a.proc.wait(10)
        assert isinstance(wg, _UserSpace)
        return rf"{wg.program} gwA \(ipl\w+\) exited"

    fails_closed(tmp_path, USER_SPACE[backend](), kill)


def test_a_campaign_compares_ipsec_and_wireguard_on_one_testbed(tmp_path: Path) -> None:
    """`ipsec-lab run` as a user runs it: ours-udp and then wireguard-go on the same
    testbed (what ours left once blackholed WireGuard's traffic), each only with its
    own configurations — the others stored as skipped with the reason — and the kernel's
    WireGuard where this kernel has it, else skipped with why, as `check` says first."""
    import json

    from conftest import cli

    f = tmp_path / "peers.toml"
    f.write_text('topology = "line"\nbackends = ["none", "ours-udp", "wireguard-go", '
                 '"boringtun", "wireguard"]\n'
                 'configurations = ["esp:aes128gcm16", "wireguard"]\nwarmup_s = 0\n'
                 '[[workloads]]\nkind = "tcp"\nseconds = 2\n')  # fmt: skip
    has, said = kernel_has_wireguard()
    groups = json.loads(cli("check", str(f), "--json").stdout)["groups"]
    kernels = {g["configuration"]: g for g in groups if g["backend"] == "wireguard"}
    assert kernels["wireguard"]["status"] == ("run" if has else "skip"), kernels
    if not has:
        assert "makes no WireGuard devices" in kernels["wireguard"]["reason"]
        assert "--vm" in kernels["wireguard"]["reason"] and said in kernels["wireguard"]["reason"]
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(p.stdout)["runs"]
    status = {(r["backend"], r["configuration"]): r for r in runs}
    done = (("none", "none"), ("ours-udp", "esp:aes128gcm16"), ("wireguard-go", "wireguard"),
            ("boringtun", "wireguard"))  # fmt: skip
    for key in done:
        assert status[key]["status"] == "done", status[key]
        assert status[key]["results"][0]["mbps"] > 10, key
    assert "runs IPsec; `wireguard` is WireGuard's" in status["ours-udp", "wireguard"]["reason"]
    assert "WireGuard's one suite" in status["wireguard-go", "esp:aes128gcm16"]["reason"]
    kernel = status["wireguard", "wireguard"]
    assert kernel["status"] == ("done" if has else "skipped"), kernel
    if not has:  # the same reason as check's, stored with the run
        assert kernel["reason"] == kernels["wireguard"]["reason"], kernel
    for name in USER_SPACE:
        wg = status[name, "wireguard"]
        assert wg["results"][0]["ipsec_cpu_s"] > 0  # its processes' CPU, metered apart
        assert wg["results"][0]["inner_mtu"] == wg["results"][0]["link_mtu"] - 60
    # The report's peers view, read as a person reads it (headless Chromium's DOM): one row
    # per tunnel, none first, each rate the run's, each version and where it ran.
    import re
    import shutil
    import subprocess

    from ipsec_lab.metrics import BY_KEY

    cid = json.loads(p.stdout)["campaign"]
    out = tmp_path / "report"
    cli("report", str(cid), "--lab", str(tmp_path / "lab"), "--out", str(out), check=True)
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (the Makefile installs it)"
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", (out / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    view = dom.split("Peers side by side (unshaped, client-server)</h3>")[1].split("</table>")[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in view.split("<tr>")[2:]]
    assert [r[:2] for r in rows] == [list(k) for k in done], rows
    for r, key in zip(rows, done):
        run = status[key]
        assert r[2].startswith(BY_KEY["mbps"].show(run["results"][0]["mbps"]) + " ("), r
        assert r[-2] == run["backend_version"], r
        assert r[-1].startswith("host, Linux "), r
    assert all(r[4] != "—" for r in rows[1:]), rows  # each user-space tunnel's own CPU
