"""The lab on real hosts, reached only through OpenSSH: four namespaces each running
`sshd` (tests/sshlab.py), named by the aliases of an ssh_config. `hosts check` before any
traffic; a campaign metered per host; a host whose sshd dies mid-campaign; Ctrl-C; and
after every test, the hosts hold nothing the lab added. Needs root (CI runs as root)."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netutil import poll_until, running
from sshlab import SshLab

pytestmark = pytest.mark.root

LAB = [sys.executable, "-m", "ipsec_lab.cli"]

SCENARIO = """
name = "on real hosts"
topology = "line"
backends = ["none"]
repetitions = {reps}
warmup_s = 0.3
[[links]]
preset = "ethernet-100"
[[workloads]]
kind = "tcp"
seconds = {seconds}
{more}
"""
RFC2544 = """
[[workloads]]
kind = "rfc2544"
size = 512
trial_s = 1
max_rate_mbit = 100
resolution_mbit = 10
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[SshLab]:
    with SshLab() as sl:
        yield sl


def _scenario(tmp: Path, reps: int = 1, seconds: float = 2, more: str = "",
              backends: str = "", configurations: str = "") -> Path:  # fmt: skip
    """The scenario file; `backends` / `configurations`: TOML lists in place of none's."""
    f = tmp / "scenario.toml"
    text = SCENARIO.format(reps=reps, seconds=seconds, more=more)
    if backends:
        text = text.replace('backends = ["none"]', f"backends = {backends}\n"
                            f"configurations = {configurations}")  # fmt: skip
    f.write_text(text)
    return f


def _ready(hosts: Path, sc: Path) -> dict[tuple[str, str], dict[str, str]]:
    """`hosts check --scenario` said ready: its rows by (host, check)."""
    p = _lab("hosts", "check", str(hosts), "--scenario", str(sc), "--json")
    assert p.returncode == 0, p.stdout
    return {(r["host"], r["check"]): r for r in json.loads(p.stdout)["checks"]}


def _lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def test_hosts_check_says_ready_then_names_a_missing_tool_and_the_ssh_interface(
    lab: SshLab, tmp_path: Path
) -> None:
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    p = _lab("hosts", "check", str(hosts), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ready"] and doc["topology"] == "line"
    reach = {r["host"]: r for r in doc["checks"] if r["check"] == "reachable"}
    assert set(reach) == {"client", "gwA", "gwB", "server"}
    assert all(r["status"] == "ok" and "as root" in r["detail"] for r in reach.values())
    iperf = [r for r in doc["checks"] if r["check"] == "tool iperf3"]
    assert {r["host"] for r in iperf} == {"client", "server"}  # the traffic ends only
    assert all(r["detail"].startswith("iperf 3") for r in iperf)
    # the gateways' link: what MTU the tunnel will offer on it, not a warning (RFC 4303's
    # layout: 1500 - 20 - 8 - 8 - 16 = 1448 = inner + 2; in UDP 8 bytes less)
    (wan,) = [r for r in doc["checks"] if r["host"] == "gwA" and "inner MTU" in r["detail"]]
    assert wan["status"] == "ok" and wan["detail"].startswith(
        "up, MTU 1500: the tunnel's inner MTU will be 1446 B (esp:aes128gcm16; 1438 B in UDP)"
    ), wan

    # iperf3 gone from the server (in its sshd's mount namespace only)
    pid = str(lab.sshd_pid("server"))
    subprocess.run(["nsenter", "-t", pid, "-m", "mount", "--bind", "/dev/null",
                    "/usr/bin/iperf3"], check=True)  # fmt: skip
    try:
        p = _lab("hosts", "check", str(hosts))
    finally:
        subprocess.run(["nsenter", "-t", pid, "-m", "umount", "/usr/bin/iperf3"], check=True)
    assert p.returncode == 1
    assert "server: tool iperf3: missing (TCP, UDP, IMIX and RFC 2544 traffic): install " \
        "Debian package iperf3" in p.stderr  # fmt: skip
    assert p.stderr.count("missing") == 1, p.stderr

    # the interface the SSH session uses named as a test interface
    ssh_if = tmp_path / "ssh-if.toml"
    text = hosts.read_text()
    client = '[client]\nssh = "client"\ninside = { interface = '
    assert client + '"eth1"' in text
    ssh_if.write_text(text.replace(client + '"eth1"', client + '"mgmt0"'))
    p = _lab("hosts", "check", str(ssh_if))
    assert p.returncode == 1
    assert "client: inside mgmt0: carries the lab's SSH session" in p.stderr
    assert lab.residue() == {}


def test_a_campaign_on_real_hosts_meters_each_host_and_leaves_nothing(
    lab: SshLab, tmp_path: Path
) -> None:
    """none, ours and ours-udp x two configurations x TCP and an RFC 2544 search, on the
    four hosts: every run done, CPU per host, the wire's ESP overhead, nothing left."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, more=RFC2544, backends='["none", "ours", "ours-udp"]',
                   configurations='["esp:aes128gcm16", "esp:aes128-sha1"]')  # fmt: skip
    checks = _ready(hosts, sc)
    assert checks[("gwA", "user ipsec-gw")]["status"] == "ok"
    assert checks[("gwB", "tool nft")]["status"] == "ok"
    assert ("client", "user ipsec-gw") not in checks  # a traffic end runs no gateway
    # the search's generator and its sink counter, each where it runs
    assert checks[("client", "tool trafgen")]["status"] == "ok"
    assert checks[("client", "tool python3")]["status"] == "ok"  # udp-gso's, auto's first
    assert checks[("server", "tool nft")]["status"] == "ok"

    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json",
             timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(p.stdout)["runs"]
    assert len(runs) == 10
    assert all(r["status"] == "done" for r in runs), [r["reason"] for r in runs]
    rows = {(r["backend"], r["configuration"], r["workload"][:3]): r["results"][0] for r in runs}
    for (backend, cfg, kind), row in rows.items():
        # a 100 Mbit/s tbf link between the gateways (on gwA's and gwB's eth2)
        if kind == "tcp" or (backend == "none" and not row["generator_bound"]):
            assert 50 < row["mbps"] <= 100, (backend, cfg, kind, row["mbps"])
        else:
            # A search's figure is what the path carries without loss, on 2 cores that
            # four hosts, two gateways, trafgen and all the forwarding share: ours' NDR
            # came out at 50-69 Mbit/s here, and in about one run of three trafgen sent
            # only 36-47 when asked for 50 (both tries short: the forwarding's softirq
            # runs on its core), on bb1b29a's build too (issue 40). Whichever, the row
            # says how its search ended, and a generator-bound one gives only what the
            # path carried, lossless, of what was sent.
            s = row["search"]
            assert 25 < row["mbps"] <= 100, (backend, cfg, s, row["mbps"])
            assert (
                s == "passed at the highest rate asked for"
                or re.fullmatch(r"bracket [\d.]+\.\.[\d.]+ within 10", s)
                or (row["generator_bound"] and s.startswith("generator-bound"))
            ), (backend, cfg, s)
            assert row["best_trial_loss_pct"] == 0, (backend, cfg, s)
        # each host's CPU from its own /proc/stat; the row's effort is the DUT's
        assert set(row["hosts_cpu"]) == {"client", "gwA", "gwB", "server"}
        dut = sum(row["hosts_cpu"][g]["cpu_busy_s"] for g in ("gwA", "gwB"))
        assert row["effort_us_per_kb"] == pytest.approx(dut * 1e6 / (row["payload_bytes"] / 1024))
        assert row["wire_up_bytes"] > row["payload_bytes"]
        if backend != "none":
            # the gateways' own processes, read from their /proc on gwA and gwB
            assert set(row["hosts_ipsec"]) == {"gwA", "gwB"}, (backend, cfg, kind)
            # at most about the machine's busy time (in the rig each host's /proc/stat is
            # this one machine's): /proc/stat samples at each tick, a process's CPU time is
            # its exact run time, so a gateway that works between ticks comes out up to
            # ~10 % above the sampled total (measured here: ours-udp's searches, 2.2 s
            # against 2.0 s)
            busy = row["hosts_cpu"]["gwA"]["cpu_busy_s"]
            assert 0 < row["ipsec_cpu_s"] <= 1.25 * busy + 0.05, (backend, cfg, kind)
            assert row["ipsec_effort_us_per_kb"] > 0 and row["ipsec_rss_end_bytes"] > 1 << 20
        else:
            assert "hosts_ipsec" not in row

    def per_payload(r: dict) -> float:
        return (r["wire_up_bytes"] + r["wire_down_bytes"]) / r["payload_bytes"]

    # the searches ran the fastest paced generator on the client (udp-gso: the hosts have
    # python3), paced there, counted on the server
    assert all(rows[k]["generator"] == "udp-gso" for k in rows if k[2] == "rfc")
    client = [json.loads(x)["what"] for x in (next((tmp_path / "lab").glob(
        "campaign-*/*/hosts")) / "client.ledger").read_text().splitlines()]  # fmt: skip
    assert "udp-gso's pacing qdisc on eth1" in client
    # 512-byte packets: ESP's header, IV, padding and ICV (and UDP's 8 bytes) on the wire
    plain = per_payload(rows[("none", "none", "rfc")])
    for b in ("ours", "ours-udp"):
        for cfg in ("esp:aes128gcm16", "esp:aes128-sha1"):
            assert per_payload(rows[(b, cfg, "rfc")]) > plain + 0.05, (b, cfg)
    # what the lab did on each host is in the run directory: its ledger and environment
    run_dir = next((tmp_path / "lab").glob("campaign-*/*/hosts"))
    whats = [json.loads(x)["what"] for x in (run_dir / "gwA.ledger").read_text().splitlines()]
    assert "address 192.0.2.1/24 on eth2" in whats
    assert any(w.startswith("sysctl net.ipv4.ip_forward (was 0)") for w in whats)
    assert "qdisc on eth2" in whats and "ipsec-gw gwA's guard" in whats
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["gwA"]["interfaces"]["eth2"]["mtu"] == 1500
    assert env["gwA"]["interfaces"]["eth2"]["driver"] == "veth"
    # and in the campaign's stored environment, where `results` and the report read it
    p = _lab("results", "1", "--lab", str(tmp_path / "lab"), "--json")
    stored = json.loads(p.stdout)["campaign"]["environment"]
    assert stored["hosts"] == env and stored["hosts_file"] == str(hosts)
    assert (run_dir / "gwA" / "ipsec-gw-gwA.log").exists()  # the gateway's log came back
    assert lab.residue() == {}


def test_a_host_that_cannot_be_reached_is_named_and_nothing_is_left_elsewhere(
    lab: SshLab, tmp_path: Path
) -> None:
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    hosts.write_text(hosts.read_text().replace('ssh = "server"', 'ssh = "nosuch.invalid"'))
    p = _lab("hosts", "check", str(hosts))
    assert p.returncode == 1
    assert "server: reachable: server (nosuch.invalid): cannot connect: ssh: Could not " \
        "resolve hostname nosuch.invalid" in p.stderr  # fmt: skip
    sc = _scenario(tmp_path)
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 1
    (run,) = json.loads(p.stdout)["runs"]
    assert run["status"] == "failed"
    assert "server (nosuch.invalid): cannot connect" in run["reason"]
    assert lab.residue() == {}


def test_a_route_or_qdisc_the_lab_did_not_make_is_never_replaced(
    lab: SshLab, tmp_path: Path
) -> None:
    """The user's own route to a test network, or their own root qdisc on a shaped
    interface: the run fails naming it, and the host keeps it as it was."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path)
    client, gwa = lab.hosts["client"].ns, lab.hosts["gwA"].ns
    own = [["ip", "-n", client, "link", "add", "own0", "type", "veth", "peer", "name", "own1"],
           ["ip", "-n", client, "link", "set", "own1", "up"],
           ["ip", "-n", client, "link", "set", "own0", "up"],
           ["ip", "-n", client, "route", "add", "10.2.0.0/24", "dev", "own0"]]  # fmt: skip
    for argv in own:
        subprocess.run(argv, check=True)
    try:
        before = lab.state(lab.hosts["client"])
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "a"), "--json")
        assert p.returncode == 1
        (run,) = json.loads(p.stdout)["runs"]
        assert "client already routes 10.2.0.0/24 (10.2.0.0/24 dev own0" in run["reason"]
        assert lab.state(lab.hosts["client"]) == before
    finally:
        subprocess.run(["ip", "-n", client, "link", "del", "own0"], check=True)
    tc = ["ip", "netns", "exec", gwa, "tc", "qdisc"]
    subprocess.run([*tc, "add", "dev", "eth2", "root", "handle", "1:", "tbf", "rate", "1gbit",
                    "burst", "32k", "latency", "10ms"], check=True)  # fmt: skip
    try:
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "b"), "--json")
        assert p.returncode == 1
        (run,) = json.loads(p.stdout)["runs"]
        assert "gwA: eth2 has its own root qdisc (tbf)" in run["reason"]
        kinds = subprocess.run([*tc, "show", "dev", "eth2", "root"], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        assert kinds.startswith("qdisc tbf 1: root") and "rate 1Gbit" in kinds
    finally:
        subprocess.run([*tc, "del", "dev", "eth2", "root"], check=True)
    assert lab.residue() == {}


TUNNELS = """
name = "many tunnels on real hosts"
topology = "line"
backends = ["ours"]
configurations = ["esp:aes128gcm16"]
tunnels = [16]
repetitions = 1
warmup_s = 0.2
[[links]]
preset = "ethernet-100"
[[workloads]]
kind = "udp"
size = 200
rate_mbit = 20
seconds = 1
"""


def test_many_tunnels_on_real_hosts_carry_a_spread_flow_and_leave_nothing(
    lab: SshLab, tmp_path: Path
) -> None:
    """16 tunnels through ours on the four hosts: the routes of FAR (the server's local
    route, the gateways' to it) added through the hosts' ledgers, every datagram of the
    flow spread over the 16 destinations delivered, and nothing left. A route of FAR
    the server has already is refused, never replaced, and the host keeps it."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = tmp_path / "tunnels.toml"
    sc.write_text(TUNNELS)
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "a"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = json.loads(p.stdout)["runs"]
    assert run["status"] == "done", run["reason"]
    row = run["results"][0]
    assert run["flow"] == "client-server over 16 tunnels" and row["tunnels"] == 16, row
    # the sink counts the server's address and all of FAR: every datagram arrived (to
    # 15 of FAR's addresses through their own tunnels, none of which exists without
    # the routes on gwA, gwB and the server)
    assert row["sent_packets"] == 12_500 and row["lost_packets"] == 0, row
    run_dir = next((tmp_path / "a").glob("campaign-*/*/hosts"))
    for node, route in (("client", "10.128.0.0/16 via 10.1.0.1"),
                        ("server", "local 10.128.0.0/16 dev lo"),
                        ("gwB", "10.128.0.0/16 via 10.2.0.2"),
                        ("gwA", "10.128.0.0/16 via 192.0.2.2")):  # fmt: skip
        whats = [json.loads(x)["what"] for x in (run_dir / f"{node}.ledger").read_text()
                 .splitlines()]  # fmt: skip
        assert f"route {route} (16 tunnels)" in whats, (node, whats)
    assert lab.residue() == {}

    server = lab.hosts["server"].ns
    own = ["ip", "-n", server, "route", "add", "blackhole", "10.128.0.0/16"]  # a null route
    subprocess.run(own, check=True)
    try:
        before = lab.state(lab.hosts["server"])
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "b"), "--json")
        assert p.returncode == 1
        (run,) = json.loads(p.stdout)["runs"]
        assert "server already routes 10.128.0.0/16 (blackhole 10.128.0.0/16)" in run[
            "reason"], run["reason"]  # fmt: skip
        assert lab.state(lab.hosts["server"]) == before
    finally:
        subprocess.run(["ip", "-n", server, "route", "del", "blackhole", "10.128.0.0/16"],
                       check=True)  # fmt: skip
    assert lab.residue() == {}


def _wait_done(db: Path, n: int, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    """Until `n` runs of the campaign are stored."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"ipsec-lab exited early: {proc.stderr.read() if proc.stderr else ''}"
            )
        if db.exists():
            with sqlite3.connect(db) as c:
                try:
                    k = c.execute("select count(*) from runs where status = 'done'").fetchone()[0]
                except sqlite3.OperationalError:
                    k = 0
            if k >= n:
                return
        time.sleep(0.2)
    raise AssertionError(f"{n} runs not done in {timeout} s")


def test_a_host_that_drops_mid_campaign_fails_its_run_and_the_others_are_restored(
    lab: SshLab, tmp_path: Path
) -> None:
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, reps=3, seconds=3)
    db = tmp_path / "lab" / "results.sqlite"
    proc = subprocess.Popen([*LAB, "run", str(sc), "--hosts", str(hosts), "--lab",
                             str(tmp_path / "lab"), "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_done(db, 1, proc)
        poll_until("the second run's traffic", lambda: running("iperf3", "-c"), timeout=60)
        lab.kill_sshd("server")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    runs = json.loads(out)["runs"]
    assert runs[0]["status"] == "done"
    failed = [r for r in runs if r["status"] == "failed"]
    assert failed and all("server" in r["reason"] for r in failed), [r["reason"] for r in runs]
    assert "could not restore every host" in err and "clean --hosts" in err
    # the hosts still reachable hold nothing of the lab's
    left = lab.residue()
    assert set(left) <= {"server"}, left
    # the server comes back: `clean --hosts` undoes what its ledger holds
    lab.start_sshd(lab.hosts["server"])
    p = _lab("clean", "--hosts", str(hosts))
    assert p.returncode == 0, p.stderr
    if "server" in left:
        assert "undid server: " in p.stdout
    assert lab.residue() == {}
    p = _lab("clean", "--hosts", str(hosts))
    assert p.returncode == 0 and "nothing left over on the hosts" in p.stdout


def _ctrl_c_as_a_terminal() -> None:
    """A background job of a non-interactive shell (as CI runs) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: give the child the default
    back, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_restores_every_host_and_keeps_finished_runs(lab: SshLab, tmp_path: Path) -> None:
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, reps=3, seconds=3)
    db = tmp_path / "lab" / "results.sqlite"
    argv = [*LAB, "run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_a_terminal)  # fmt: skip
    try:
        _wait_done(db, 1, proc)
        poll_until("the second run's traffic", lambda: running("iperf3", "-c"), timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "finished runs are kept" in err
    with sqlite3.connect(db) as c:
        done = c.execute("select count(*) from runs where status = 'done'").fetchone()[0]
    assert done >= 1
    assert lab.residue() == {}


def test_an_external_dut_is_measured_and_never_logged_in_to(lab: SshLab, tmp_path: Path) -> None:
    """The DUT: ipsec-gw on gwA and gwB, set up by this test behind the lab's back; the
    hosts file gives them no `ssh`. The lab drives the client and server only, and the
    gateways' own counters show the traffic went through their ESP."""
    from ipsec_lab import hosts as hostsfile
    from ipsec_lab.backends.ours import Ours, gateway_binary
    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import Testbed

    hosts = lab.hosts_toml(tmp_path / "hosts.toml", drive=("client", "server"))
    hosts.write_text(hosts.read_text() + '[dut]\nmodel = "ipsec-gw"\nproposal = "aes128gcm16"\n')
    placed = hostsfile.place(topology("line"), hostsfile.load(hosts))

    class Dut(Testbed):  # the lab's own tools, on the SshLab's namespaces
        def ns(self, node: str) -> str:
            return lab.hosts[node].ns

    dut = Dut(placed, tmp_path / "dut")
    dut.rundir.mkdir(mode=0o700)
    for w in placed.wires:
        for node, ifname, addr in ((w.a, w.a_if, w.a_addr), (w.b, w.b_if, w.b_addr)):
            if node in ("gwA", "gwB"):
                dut.run(node, ["ip", "addr", "add", addr, "dev", ifname])
    for node in ("gwA", "gwB"):
        dut.run(node, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    gw = Ours()
    gw.start(dut, "esp:aes128gcm16")
    try:
        sc = tmp_path / "scenario.toml"
        sc.write_text(
            SCENARIO.format(reps=1, seconds=2, more="").replace(
                'backends = ["none"]',
                'backends = ["external"]\nconfigurations = ["esp:aes128gcm16"]',
            )
        )
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
        assert p.returncode == 0, p.stderr[-3000:]
        (run,) = json.loads(p.stdout)["runs"]
        assert run["status"] == "done" and run["backend"] == "external"
        assert run["backend_version"] == "external DUT: model ipsec-gw, proposal aes128gcm16"
        row = run["results"][0]
        assert row["mbps"] > 10
        sealed = gw.plane_clock()
        assert sealed["gwA"][1] > 1000 and sealed["gwB"][1] > 1000, sealed
        # the DUT's CPU is not the lab's to read: no effort figure, and the row says why
        assert row["effort_us_per_kb"] is None and "gwA, gwB not metered" in row["cpu_note"]
        assert set(row["hosts_cpu"]) == {"client", "server"}
        assert not list((tmp_path / "lab").glob("campaign-*/*/hosts/gw*.ledger"))
    finally:
        gw.stop(dut)
        binary = gateway_binary()
        for key, conf in gw.configs.items():
            dut.run(key, [str(binary), "--config", str(conf), "--release"], check=False)
        for node in ("gwA", "gwB"):
            dut.run(node, ["sysctl", "-qw", "net.ipv4.ip_forward=0"])
            for ifname in ("eth1", "eth2"):
                dut.run(node, ["ip", "addr", "flush", "dev", ifname, "scope", "global"])
        dut.teardown()
    assert lab.residue() == {}


def test_strongswan_on_real_hosts_runs_the_hosts_own_charon(lab: SshLab, tmp_path: Path) -> None:
    """strongswan-libipsec (this kernel has no ESP; the kernel plane runs in the VM's
    tests/vm/hosts.py): each gateway's own charon, configured in the run's directory
    there and driven by swanctl there, negotiates IKEv2 and carries the traffic; the
    PSK never leaves the run's files, and nothing is left."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, backends='["strongswan-libipsec"]',
                   configurations='["esp:aes128gcm16"]')  # fmt: skip
    checks = _ready(hosts, sc)
    assert checks[("gwA", "tool /usr/lib/ipsec/charon")]["status"] == "ok"
    assert checks[("gwB", "charon")]["detail"] == "none running: IKE's ports are free"
    assert checks[("gwB", "/dev/net/tun")]["status"] == "ok"
    assert ("client", "charon") not in checks

    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = json.loads(p.stdout)["runs"]
    assert run["status"] == "done", run["reason"]
    assert "kernel-libipsec, on the hosts" in run["backend_version"]
    row = run["results"][0]
    assert 20 < row["mbps"] <= 100
    assert row["wire_up_bytes"] > row["payload_bytes"]
    assert set(row["hosts_ipsec"]) == {"gwA", "gwB"}  # charon (libipsec's ESP) per gateway
    assert row["ipsec_cpu_s"] > 0
    # charon's own log came back: IKE_SA and CHILD_SA established over the test link
    logs = next((tmp_path / "lab").glob("campaign-*/*/hosts/gwA"))
    ike = (logs / "charon-gwA-ike.log").read_text()
    assert "IKE_SA t0[1] established between 192.0.2.1[192.0.2.1]...192.0.2.2" in ike
    assert "CHILD_SA c0{1} established" in ike and "TS 10.1.0.0/24 === 10.2.0.0/24" in ike
    # the PSK is in the run's files on the hosts only, never in what came back
    assert not any(f.name == "swanctl.conf" for f in (tmp_path / "lab").rglob("*")
                   if "hosts" in f.parts)  # fmt: skip
    assert lab.residue() == {}


def test_wireguard_on_real_hosts_keys_each_host_and_leaves_nothing(
    lab: SshLab, tmp_path: Path
) -> None:
    """wireguard-go and boringtun on the gateway hosts, driven over ssh: each one's process
    on each host (the host's own program, on its PATH), keys
    made there (never on this side), the handshake done, TCP carried at the link's rate,
    its CPU from each host's /proc, what it added in each host's ledger and nothing left;
    a port the host's own WireGuard holds is passed over, never shared; a rule of the
    host's own that would route the remote network around the tunnel is refused by name;
    the kernel's WireGuard, where the hosts' kernel (this one) has no module, is skipped
    with why."""
    from ipsec_lab.backends.userspace_wireguard import BORINGTUN_VERSION, UAPI_DIR
    from ipsec_lab.backends.wireguard import PORT, kernel_has_wireguard

    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, backends='["wireguard-go", "boringtun", "wireguard"]',
                   configurations='["wireguard"]')  # fmt: skip
    has = kernel_has_wireguard()[0]
    p = _lab("hosts", "check", str(hosts), "--scenario", str(sc), "--json")
    assert p.returncode == (0 if has else 1), p.stdout  # a module a backend needs: fail
    rows = {(r["host"], r["check"]): r for r in json.loads(p.stdout)["checks"]}
    assert rows[("gwA", "tool wireguard-go")]["status"] == "ok"
    assert rows[("gwB", "tool boringtun-cli")]["status"] == "ok"
    assert rows[("gwB", "tool wg")]["status"] == "ok"
    assert rows[("gwA", "module wireguard")]["status"] == ("ok" if has else "fail")
    assert ("client", "module wireguard") not in rows  # a traffic end makes no tunnel

    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    runs = {r["backend"]: r for r in json.loads(p.stdout)["runs"]}
    go = runs["wireguard-go"]
    assert go["status"] == "done", go["reason"]
    assert go["backend_version"].startswith("wireguard-go v")
    assert go["backend_version"].endswith("(on the hosts)")
    row = go["results"][0]
    assert 50 < row["mbps"] <= 100  # the 100 Mbit/s link, not wireguard-go, bounds it
    assert row["inner_mtu"] == row["link_mtu"] - 60
    assert set(row["hosts_ipsec"]) == {"gwA", "gwB"} and row["ipsec_cpu_s"] > 0
    bt = runs["boringtun"]
    assert bt["status"] == "done", bt["reason"]
    assert bt["backend_version"] == f"boringtun-cli {BORINGTUN_VERSION} (on the hosts)", bt
    row = bt["results"][0]
    assert 50 < row["mbps"] <= 100 and row["inner_mtu"] == row["link_mtu"] - 60, row
    assert set(row["hosts_ipsec"]) == {"gwA", "gwB"} and row["ipsec_cpu_s"] > 0
    if not has:
        kernel = runs["wireguard"]
        assert kernel["status"] == "skipped", kernel
        assert "gwA's kernel makes no WireGuard devices" in kernel["reason"], kernel["reason"]
    whats = [json.loads(x)["what"] for d in (tmp_path / "lab").glob("campaign-*/*/hosts")
             if (d / "gwA.ledger").exists()
             for x in (d / "gwA.ledger").read_text().splitlines()]  # fmt: skip
    assert any(w.startswith("WireGuard ipl") and w.endswith("'s fwmark rule") for w in whats)
    assert any(w.startswith("wireguard-go ipl") and "control socket" in w for w in whats)
    assert any(w.startswith("boringtun ipl") and "control socket" in w for w in whats)
    # the private keys stayed on the hosts: nothing that came back holds one
    assert not [f for f in (tmp_path / "lab").rglob("*.key")]
    assert not list(UAPI_DIR.glob("ipl*.sock"))  # the hosts' sockets (this machine's)
    assert lab.residue() == {}

    # gwB's own WireGuard (a socket on the port the lab's end there would take): the lab's
    # moves past it, the host's is untouched; then a rule of gwA's own ahead of the lab's
    # that sends the remote network by the main table (in clear): refused, naming it
    sc = _scenario(tmp_path, backends='["wireguard-go"]', configurations='["wireguard"]')
    port = PORT + 1  # the run's second end: gwB's
    holder = subprocess.Popen(["ip", "netns", "exec", lab.hosts["gwB"].ns, sys.executable,
                               "-c", f"import socket,time; s=socket.socket(socket.AF_INET, "
                               f"socket.SOCK_DGRAM); s.bind(('0.0.0.0', {port})); "
                               "print('bound', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    own_rule = "rule add to 10.2.0.0/24 lookup main pref 500"
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "bound"
        lab.hosts["gwB"].baseline = lab.state(lab.hosts["gwB"])
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab2"),
                 "--json")  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        (run,) = json.loads(p.stdout)["runs"]
        assert run["status"] == "done" and 50 < run["results"][0]["mbps"] <= 100, run
        gwb = [x for x in (next((tmp_path / "lab2").glob("campaign-*/*")) / "commands.log")
               .read_text().splitlines() if x.startswith("[gwB] wg set")]  # fmt: skip
        assert any(f"listen-port {port + 100} " in x for x in gwb), gwb
        assert holder.poll() is None  # the host's own socket still holds its port
        assert lab.residue() == {}

        subprocess.run(["ip", "-n", lab.hosts["gwA"].ns, *own_rule.split()], check=True)
        lab.hosts["gwA"].baseline = lab.state(lab.hosts["gwA"])
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab3"),
                 "--json")  # fmt: skip
        (run,) = json.loads(p.stdout)["runs"]
        assert p.returncode == 1 and run["status"] == "failed", run
        assert "gwA: traffic for 10.2.0.0/24 would not enter WireGuard end ipl" in run["reason"]
        assert "refused rather than measured in clear" in run["reason"]
        assert lab.residue() == {}  # the host's own rule kept, the lab's gone
    finally:
        holder.kill()  # the test's own process
        holder.wait(10)
        subprocess.run(["ip", "-n", lab.hosts["gwA"].ns, *own_rule.replace("add", "del").split()],
                       capture_output=True, check=False)  # fmt: skip
        for h in ("gwA", "gwB"):
            lab.hosts[h].baseline = lab.state(lab.hosts[h])


def test_a_user_with_passwordless_sudo_drives_the_gateways_and_one_without_is_named(
    lab: SshLab, tmp_path: Path
) -> None:
    """The gateways reached as `lab`, a user with passwordless sudo (Debian's sudo, a
    sudoers.d line, in the hosts' own /etc): every root step goes through `sudo -n`,
    ours runs and everything it added is undone. A user without sudo is refused by
    `hosts check` and by `run`, named, before anything is touched."""
    assert Path("/usr/bin/sudo").exists(), "the Makefile installs sudo"
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    text = hosts.read_text()
    for gw in ("gwA", "gwB"):
        text = text.replace(f'ssh = "{gw}"', f'ssh = "lab@{gw}"')
    hosts.write_text(text)
    sc = _scenario(tmp_path, backends='["ours"]', configurations='["esp:aes128gcm16"]')
    reach = {h: r["detail"] for (h, c), r in _ready(hosts, sc).items() if c == "reachable"}
    assert reach["gwA"] == "ssh lab@gwA as lab (sudo -n)" and reach["client"].endswith("as root")
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = json.loads(p.stdout)["runs"]
    assert run["status"] == "done", run["reason"]
    assert run["results"][0]["mbps"] > 20
    assert lab.residue() == {}

    hosts.write_text(text.replace('ssh = "lab@gwB"', 'ssh = "nosudo@gwB"'))
    p = _lab("hosts", "check", str(hosts))
    assert p.returncode == 1
    assert "gwB: reachable: gwB (nosudo@gwB): user nosudo has no passwordless sudo" in p.stderr
    p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab2"), "--json")
    assert p.returncode == 1
    (run,) = json.loads(p.stdout)["runs"]
    assert "user nosudo has no passwordless sudo" in run["reason"]
    assert lab.residue() == {}


def test_http_smtp_and_text_transfers_on_real_hosts(lab: SshLab, tmp_path: Path) -> None:
    """Study 4's HTTP and SMTP transfers and study 1's English-text TCP, on the hosts:
    the files, nginx's config, the mails and the corpus pushed through ssh to the host
    that uses them (each host sees only its own files), the servers the hosts' own
    (nginx, aiosmtpd from Debian's python3-aiosmtpd), through ours."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = _scenario(tmp_path, seconds=1, backends='["ours"]', configurations='["esp:aes128gcm16"]',
                   more="""
[[workloads]]
kind = "http"
files = ["10K", "1M"]
[[workloads]]
kind = "smtp"
files = ["10K"]
[[workloads]]
kind = "tcp"
data = "text"
seconds = 1
""")  # fmt: skip
    checks = {k: r["status"] for k, r in _ready(hosts, sc).items()}
    assert checks[("server", "tool nginx")] == "ok" and checks[("server", "tool aiosmtpd")] == "ok"
    assert checks[("client", "tool curl")] == "ok" and checks[("client", "tool python3")] == "ok"
    # A module in the login's directory, where ssh starts each command: root's python3
    # there imported it (`python3 -c` puts its directory first on sys.path), so whoever
    # could write that directory ran code as root. The lab's python3 runs with -I now.
    planted = lab.dir / "home" / "socket.py"
    planted.write_text("raise SystemExit('imported from the login directory')\n")
    try:
        p = _lab("run", str(sc), "--hosts", str(hosts), "--lab", str(tmp_path / "lab"),
                 "--json", timeout=600)  # fmt: skip
    finally:
        planted.unlink()
    assert p.returncode == 0, p.stderr[-3000:]
    runs = {r["workload"]: r for r in json.loads(p.stdout)["runs"]}
    assert all(r["status"] == "done" for r in runs.values()), [r["reason"] for r in runs.values()]
    http = {row["label"]: row for row in runs["http"]["results"]}
    assert http["http-1MB"]["file_bytes"] == 1 << 20 and http["http-1MB"]["mbps"] > 5
    # the server's reply came back through the tunnel: more bytes down than the file
    assert http["http-1MB"]["wire_down_bytes"] > 1 << 20
    (mail,) = runs["smtp"]["results"]
    assert mail["transfers"] == 7 and mail["wire_up_bytes"] > 7 * 10_000
    text = next(r for k, r in runs.items() if k.startswith("tcp") and r["results"][0].get("data"))
    assert text["results"][0]["data"] == "text" and text["results"][0]["payload_bytes"] > 1 << 20
    assert lab.residue() == {}


SAME_ON_BOTH = """
name = "namespaces or hosts"
topology = "line"
backends = ["none", "ours-udp"]
configurations = ["esp:aes128gcm16"]
repetitions = 2
warmup_s = 0.3
placement = "off"  # the hosts' roles are their own (unplaced): so are the namespaces'
[[links]]
name = "shaped"
rate_mbit = 400
[[workloads]]
kind = "tcp"
seconds = 2
"""


def test_the_same_scenario_on_namespaces_and_on_hosts_measures_the_same(
    lab: SshLab, tmp_path: Path
) -> None:
    """One scenario, 1500-byte links, on the namespace testbed and on the four sshd hosts:
    each backend's tunnel offers the same inner MTU and fits the same packets whole, puts
    the same bytes on the wire per byte of payload (a testbed that fragmented, or sized
    the tunnel otherwise, would not), and carries TCP within 10 % — on a link shaped
    below what either carries, so the figure is the testbeds' and not this machine's
    noise (unshaped, two runs apart on one testbed differ by up to 20 % here)."""
    hosts = lab.hosts_toml(tmp_path / "hosts.toml")
    sc = tmp_path / "same.toml"
    sc.write_text(SAME_ON_BOTH)
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for where, extra in (("namespaces", []), ("hosts", ["--hosts", str(hosts)])):
        p = _lab("run", str(sc), "--lab", str(tmp_path / where), "--json", *extra, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        for r in json.loads(p.stdout)["runs"]:
            assert r["status"] == "done", r["reason"]
            rows.setdefault((where, r["backend"]), []).append(r["results"][0])

    def per_payload(x: dict[str, Any]) -> float:
        return (x["wire_up_bytes"] + x["wire_down_bytes"]) / x["payload_bytes"]

    for backend in ("none", "ours-udp"):
        ns, on_hosts = rows[("namespaces", backend)], rows[("hosts", backend)]
        for key in ("link_mtu", "inner_mtu", "largest_whole_inner"):
            assert {x.get(key) for x in ns} == {x.get(key) for x in on_hosts}, (backend, key)
        assert ns[0]["link_mtu"] == 1500
        if backend == "ours-udp":  # the TUN's MTU: the link's less ESP in UDP's overhead
            assert ns[0]["inner_mtu"] == ns[0]["largest_whole_inner"] < 1500
        a, b = (statistics.median(per_payload(x) for x in xs) for xs in (ns, on_hosts))
        assert a == pytest.approx(b, rel=0.01), (backend, a, b)
        a, b = (statistics.median(x["mbps"] for x in xs) for xs in (ns, on_hosts))
        assert a == pytest.approx(b, rel=0.10), (backend, a, b)
        assert 300 < a <= 400, (backend, a)  # the link's rate, not a stall
    assert lab.residue() == {}
