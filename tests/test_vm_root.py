"""Tests that run inside the micro-VM (a Debian kernel with ESP, AH, IPComp and netem,
booted by virtme-ng; under TCG here): ours against the kernel's IPsec. The host side boots
the VM once and runs tests/vm/*.py and two campaigns inside it; their outcomes decide."""

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


CLIENTS = """\
name = "vm-clients"
topology = "clients"                   # a server and two clients, host-to-host each
backends = ["xfrm", "xfrm-udp", "strongswan-kernel", "ours", "wireguard"]
configurations = ["esp:aes128gcm16", "wireguard"]   # each backend skips the other
repetitions = 1
warmup_s = 0.2

[[links]]
preset = "unshaped"

[[workloads]]
kind = "tcp"
seconds = 1
"""


# the VM's steps, in two lanes at once, then the latency test alone (the fixture below)
# (the figures that balance them: in_the_vm's comment)
LANES = (("hosts", "every", "impairment"), ("interop", "clients"))
STEPS = (*LANES[0], *LANES[1], "latency")


@pytest.fixture(scope="module")
def in_the_vm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One boot for every VM test (under TCG a boot and its lab start cost a minute): the
    interop and impairment tests, then two campaigns, each as a person runs them in the
    VM (`ipsec-lab run`, as `--vm` does; the `--vm` command line itself is checked in
    tests/test_vm.py), each writing its log and exit status for its test below."""
    d = tmp_path_factory.mktemp("vm")
    (d / "clients.toml").write_text(CLIENTS)
    pytest_bin = str(Path(sys.executable).parent / "pytest")
    exe = str(Path(sys.executable).parent / "ipsec-lab")

    def tests(name: str, n: int, *files: str, k: str = "") -> str:
        sel = f" -k {k!r}" if k else ""
        paths = " ".join(str(REPO / "tests/vm" / f"{f}.py") for f in files or (name,))
        # -p no:hypothesispytest: hypothesis's plugin imports all of hypothesis at the
        # session's end, and pytest rewrites the asserts of its ~75 modules first (the
        # venv is read-only in the VM: nothing is cached): 104 of a one-case session's
        # 118 s under TCG, measured by cProfile. No test in the VM uses hypothesis.
        return (f"{pytest_bin} -q -p no:cacheprovider -p no:hypothesispytest --durations={n} "
                f"--basetemp={d / name} {paths}{sel}")  # fmt: skip

    steps = {
        # with, in the same session (a Python start costs seconds under TCG), the
        # kernel's N tunnels: strongSwan's set up at once and timed, and xfrm's
        # (tests/vm/tunnels.py; 121 s alone in the VM)
        "interop": tests("interop", 6, "interop", "tunnels"),
        "every": f"{exe} run {REPO / 'scenarios/vm.toml'} --lab {d / 'lab-every'}",
        "clients": f"{exe} run {d / 'clients.toml'} --lab {d / 'lab-clients'}",
        # the kernel's IPsec on real hosts over sshd (tests/vm/hosts.py)
        "hosts": tests("hosts", 3),
        "impairment": tests("impairment", 3, k="not latency"),
        "latency": tests("latency", 1, "impairment", k="latency"),
        # (tests/vm/wireguard.py, the kernel's WireGuard with captures, passes alone in the
        # VM but not in CI's lane beside the unit tests: its capture of a 4 MiB transfer
        # held fewer than 1,000 data messages twice. Not run here until that is found;
        # the clients campaign below runs the kernel's WireGuard.)
    }

    def step(name: str) -> str:  # each log ends with its exit status and time, for CI
        log = d / f"{name}.log"
        return (f"t=$(date +%s); {steps[name]} > {log} 2>&1; echo rc=$? >> {log}; "
                f'echo "took $(($(date +%s) - t)) s" >> {log}')  # fmt: skip

    # Two lanes at once: under TCG a step keeps about one of the VM's two vCPUs busy
    # (one Python process sets up, starts and waits on the next), so the interop cases
    # and the campaigns share the VM's time. Their namespaces, cgroups, work directories
    # and stores are each their own; the campaigns' runs may be flagged as on a busy
    # machine, which none of these tests asserts against. The latency test runs alone
    # after both: its medians must land within milliseconds of netem's delay. (Measured
    # so, in seconds: interop 703, clients 175, every 392, hosts 680, impairment 106: the
    # VM's whole run 20 min against 24.8 one step after the other. At stop 52's CI, with a
    # new ssh session per host command: interop 1,033, clients 177, impairment 182 | every
    # 522, hosts 1,179; the hosts' commands now go through a kept shell (hosts/shell.py,
    # 7 x fewer ms a command on this machine), so impairment moves to the hosts' lane.
    # At stop 54's CI, the interop cases' ends sockets of the test process: interop 530,
    # clients 249 | every 472, hosts 716, impairment 92, so the longest step and the
    # short ones share a lane: 1,057 s against 1,002.)
    # At stop 59's CI: hosts 666, clients 285 | interop 571, every 351, impairment 118;
    # at stop 60's: hosts 462, clients 245 | interop 404, every 294, impairment 88. The
    # longest step (hosts) with the second longest campaign (every), the rest beside:
    # with those figures 1,017 | 974 s and 756 | 737 s, against 951 | 1,040 and 707 | 786.
    # Stop 62 added the tunnels (121 s alone) to the second lane; now in the interop
    # step's session, with impairment beside hosts (LANES), at stop 63's CI: hosts 520,
    # every 264, impairment 60 | interop 584, clients 202; latency 40 (844 | 786 s).
    # a script file: the VM's command travels on the kernel's command line, which holds
    # 2 KiB at most (the steps' paths would not fit; the VM then hangs at boot)
    script = d / "steps.sh"
    script.write_text("".join(
        "(" + "; ".join(step(n) for n in lane) + ") &\n" for lane in LANES
    ) + "wait\n" + step("latency") + "\n")  # fmt: skip
    # a bound: one after the other, beside cargo test and the fuzzers, the steps took
    # 2,362 s once (interop and impairment 1,138, every 267, clients 140, hosts 817)
    rc = vm.run(["sh", str(script)], [d], timeout=3300)
    assert rc == 0, f"the VM did not run (rc {rc})"
    return d


def _log(d: Path, name: str) -> str:
    log = d / f"{name}.log"
    return log.read_text() if log.exists() else ""


def test_ours_and_the_kernels_ipsec_in_the_vm(
    in_the_vm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Interop (24 cases, both ways, and a replayed capture), impairment (netem: ours
    and xfrm), and the N tunnels of strongSwan and xfrm. Each step's time goes to CI's
    log whatever the outcome (the lanes above are balanced by these figures)."""
    took = {n: re.findall(r"took (\d+) s", _log(in_the_vm, n)) for n in STEPS}
    with capsys.disabled():
        print("\nthe VM's steps, s: " + ", ".join(f"{n} {t[-1] if t else '?'}"
                                                  for n, t in took.items()))  # fmt: skip
    for name, n in (("interop", 25 + 4), ("impairment", 3), ("latency", 1)):
        text = _log(in_the_vm, name)
        assert "rc=0" in text, text[-4000:]
        m = re.search(r"(\d+) passed", text)
        assert m and int(m.group(1)) == n and "failed" not in text, text[-4000:]


def campaign(d: Path, name: str) -> dict[str, Any]:
    """The campaign step `name` ran in the VM: it exited 0; its `results --json`."""
    text = _log(d, name)
    assert "rc=0" in text, text[-4000:]
    exe = str(Path(sys.executable).parent / "ipsec-lab")
    r = subprocess.run([exe, "results", "1", "--lab", str(d / f"lab-{name}"), "--json"],
                       capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    data: dict[str, Any] = json.loads(r.stdout)
    return data


def test_a_campaign_of_every_backend_runs_in_the_vm(in_the_vm: Path) -> None:
    """scenarios/vm.toml in the VM: none, xfrm, strongSwan and ours, two configurations,
    unshaped and 802.11 (netem), every run measured, into the host's store, each
    recording that it ran in a VM."""
    data = campaign(in_the_vm, "every")
    assert data["counts"] == {"planned": 14, "done": 14, "failed": 0, "skipped": 0}
    assert data["campaign"]["environment"]["vm"].startswith(("tcg", "kvm"))
    rates = {(x["backend"], x["link"]) for x in data["runs"] if x["status"] == "done"}
    assert {b for b, _ in rates} == {"none", "xfrm", "strongswan", "ours"}
    assert {link for _, link in rates} == {"unshaped", "wifi-2mbit"}


def test_the_kernels_ipsec_on_the_clients_topology_in_the_vm(in_the_vm: Path) -> None:
    """The server holds one tunnel per client (two SAs of one SPI each way, told apart by
    their addresses; for WireGuard a device and port each): xfrm, xfrm with ESP in UDP,
    strongSwan on the kernel, ours and the kernel's WireGuard all carry both clients'
    flows, WireGuard's devices at the link's MTU less its 60 bytes."""
    data = campaign(in_the_vm, "clients")
    assert data["counts"] == {"planned": 20, "done": 10, "failed": 0, "skipped": 10}
    done = [x for x in data["runs"] if x["status"] == "done"]
    flows = {(x["backend"], x["flow"]) for x in done if x["results"][0]["mbps"] > 1}
    backends = ("xfrm", "xfrm-udp", "strongswan-kernel", "ours", "wireguard")
    assert flows == {(b, f) for b in backends for f in ("fast-server", "slow-server")}, flows
    for x in done:
        if x["backend"] == "wireguard":
            v = x["backend_version"]
            assert v.startswith("Linux ") and v.endswith(" WireGuard"), v
            res = x["results"][0]
            assert res["inner_mtu"] == res["link_mtu"] - 60, res


def test_the_kernels_ipsec_on_real_hosts_over_ssh_in_the_vm(in_the_vm: Path) -> None:
    """tests/vm/hosts.py: xfrm, xfrm-udp and strongswan-kernel on four sshd hosts, a
    host's own SA kept and one that clashes never replaced, nothing left."""
    text = _log(in_the_vm, "hosts")
    assert "rc=0" in text and "1 passed" in text, text[-4000:]
