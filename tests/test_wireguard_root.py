"""wireguard-go, the lab's WireGuard backend, with real traffic: client - gwA - gwB -
server in namespaces, a file carried whole, tcpdump on the gateways' link, the packets'
sizes against the model's, a dead wireguard-go failing closed, and nothing left after.
Needs root (CI runs as root)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from ipsec_lab.backends.wireguard import FWMARK, UAPI_DIR, WireguardGo, versioned
from ipsec_lab.model.transforms import parse_configuration, wire_size
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.links import link_mtu
from netutil import capture, count, holds, transfer

pytestmark = pytest.mark.root

MARKER = b"WIREGUARD-LAB-PLANTED-MARKER-0123456789-"
PINGS = (36, 100, 1000)  # ICMP payload bytes: inner IP packets of 64, 128 and 1028 bytes


def planted(tb: Testbed, mib: int) -> Path:
    data = tb.rundir / "planted.bin"
    line = len(MARKER) + 9
    data.write_bytes(b"".join(MARKER + b"%08d\n" % i for i in range(mib * 1024 * 1024 // line)))
    return data


def ping(tb: Testbed, size: int, check: bool = True) -> str:
    flow = tb.topo.flows[0]
    return tb.run(flow.source, ["ping", "-c", "1", "-W", "2", "-s", str(size), flow.sink_addr],
                  timeout=10, check=check)  # fmt: skip


# Where the tunnel's outer packets cross: between the gateways (line), between the hosts
# themselves (pair: host to host, the endpoint inside the remote network — WireGuard's
# own UDP must take the main table, not the tunnel).
WIRE = {"line": ("gwA", "wan"), "pair": ("hostA", "eth0")}


@pytest.mark.parametrize("topo", WIRE)
def test_wireguard_go_carries_a_file_whole_with_only_wireguard_on_the_link(
    tmp_path: Path, topo: str
) -> None:
    node, iface = WIRE[topo]
    with Testbed(topology(topo), tmp_path / "run") as tb:
        wg = WireguardGo()
        link = link_mtu(tb, node, iface)
        try:
            with capture(tb, node, iface, "handshake") as hs:
                wg.start(tb, "wireguard")  # returns once both ends have a session
                for n in PINGS:
                    ping(tb, n)
            data = planted(tb, 4)
            with capture(tb, node, iface, "bulk") as bulk:
                flow = tb.topo.flows[0]
                transfer(tb, (flow.source, ""), (flow.sink, flow.sink_addr), data, 60)
            ends = list(wg._ends)
            mtu, pids, version = wg.inner_mtu(), wg.pids(), wg.version()
            assert wg.died() is None
        finally:
            wg.stop(tb)
        # nothing of the run's is left in the gateways: rules, tables, devices, sockets
        for e in ends:
            rules = tb.run(e.node, ["ip", "rule", "show"])
            assert f"lookup {e.table}" not in rules and FWMARK not in rules, rules
            assert tb.run(e.node, ["ip", "route", "show", "table", str(e.table)]).strip() == ""
            assert e.dev not in tb.run(e.node, ["ip", "-o", "link", "show"])
            assert not (UAPI_DIR / f"{e.dev}.sock").exists()
            assert e.proc is not None and e.proc.poll() is not None
        assert "0 received" not in ping(tb, 56)  # the plain path is the testbed's again
    assert len(pids) == 2 and mtu == link - 60  # the link's MTU less WireGuard's 60
    assert version == versioned(version.split(" (")[0]) and version.startswith("wireguard-go v")
    # On the wire only WireGuard: UDP 51820 to 51820, the handshake's
    # initiation (type 1) and response (2) and transport data (4), never the payload.
    for pcap in (hs, bulk):
        assert count(pcap, "ip and not (udp port 51820)") == 0
        assert not holds(pcap, MARKER[:16]) and not holds(pcap, b"PLANTED")
    assert count(hs, "udp[8] = 1") >= 1 and count(hs, "udp[8] = 2") >= 1
    assert count(bulk, "udp[8] = 4") > 1000
    assert data.read_bytes().count(MARKER) > 1000  # it was there to be seen
    # Each ping's request and reply crossed as one data message of the model's size
    # (the whitepaper's: outer IP, UDP, 16-byte header, the packet padded to 16, tag).
    from scapy.all import IP, UDP, rdpcap

    lengths = [p[IP].len for p in rdpcap(str(hs)) if UDP in p and bytes(p[UDP].payload)[:1]
               == b"\x04" and len(p[UDP].payload) > 32]  # fmt: skip
    wg_cfg = parse_configuration("wireguard")
    for n in PINGS:
        assert lengths.count(wire_size(wg_cfg, 28 + n)) == 2, (n, lengths)


def test_a_dead_wireguard_go_fails_closed(tmp_path: Path) -> None:
    """wireguard-go killed: its device goes, the remote network meets the run's
    unreachable route — no packet for it leaves in clear — and `died` says so."""
    with Testbed(topology("line"), tmp_path / "run") as tb:
        wg = WireguardGo()
        try:
            wg.start(tb, "wireguard")
            gw_a = next(e for e in wg._ends if e.node == "gwA")
            assert gw_a.proc is not None
            os.killpg(gw_a.proc.pid, signal.SIGKILL)  # a process the test's backend started
            gw_a.proc.wait(10)
            assert re.search(r"wireguard-go gwA \(ipl\w+\) exited", wg.died() or "")
            with capture(tb, "gwA", "wan", "dead") as pcap:
                out = ping(tb, 56, check=False)
            assert " 0 received" in out or "unreachable" in out.lower()
        finally:
            wg.stop(tb)
        assert "1 received" in ping(tb, 56)  # stopped: the testbed's plain path again
    assert count(pcap, "icmp") == 0 and count(pcap, "ip") == 0


def test_a_campaign_compares_ipsec_and_wireguard_on_one_testbed(tmp_path: Path) -> None:
    """`ipsec-lab run` as a user runs it: ours-udp and then wireguard-go on the same
    testbed (what ours left once blackholed WireGuard's traffic), each only with its
    own configurations — the others stored as skipped with the reason."""
    import json

    from conftest import cli

    f = tmp_path / "peers.toml"
    f.write_text('topology = "line"\nbackends = ["none", "ours-udp", "wireguard-go"]\n'
                 'configurations = ["esp:aes128gcm16", "wireguard"]\nwarmup_s = 0\n'
                 '[[workloads]]\nkind = "tcp"\nseconds = 2\n')  # fmt: skip
    p = cli("run", str(f), "--lab", str(tmp_path / "lab"), "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(p.stdout)["runs"]
    status = {(r["backend"], r["configuration"]): r for r in runs}
    for key in (("none", "none"), ("ours-udp", "esp:aes128gcm16"), ("wireguard-go", "wireguard")):
        assert status[key]["status"] == "done", status[key]
        assert status[key]["results"][0]["mbps"] > 10, key
    assert "runs IPsec; `wireguard` is WireGuard's" in status["ours-udp", "wireguard"]["reason"]
    assert "WireGuard's one suite" in status["wireguard-go", "esp:aes128gcm16"]["reason"]
    wg = status["wireguard-go", "wireguard"]
    assert wg["results"][0]["ipsec_cpu_s"] > 0  # its processes' CPU, metered apart
    assert wg["results"][0]["inner_mtu"] == wg["results"][0]["link_mtu"] - 60
