"""What every WireGuard backend must show with real traffic, in namespaces: a file
carried whole with only WireGuard on the outer link (the handshake's types 1 and 2,
transport data, type 4; never the payload), each packet of the model's size, its device
at the link's MTU less WireGuard's, a dead tunnel failing closed, and nothing of the run's
left after. Used by tests/test_wireguard_root.py (wireguard-go, on this machine) and
tests/vm/wireguard.py (the kernel's WireGuard, in the micro-VM)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ipsec_lab.backends.userspace_wireguard import UAPI_DIR, Boringtun
from ipsec_lab.backends.wireguard import FWMARK, _WireGuard
from ipsec_lab.model.transforms import parse_configuration, wire_size
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.links import link_mtu
from netutil import capture, count, holds, transfer

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


def carries_a_file_whole(tmp_path: Path, topo: str, wg: _WireGuard) -> tuple[list[int], str]:
    """`wg` between the ends of `topo`, a 4 MiB file carried; (its PIDs, its version)
    while it ran."""
    node, iface = WIRE[topo]
    with Testbed(topology(topo), tmp_path / "run") as tb:
        link = link_mtu(tb, node, iface)
        try:
            with capture(tb, node, iface, "handshake") as hs:
                wg.start(tb, "wireguard")  # returns once both ends have a session
                for n in PINGS:
                    ping(tb, n)
            keys_made_fresh_and_private(tb, wg)
            data = planted(tb, 4)
            with capture(tb, node, iface, "bulk") as bulk:
                flow = tb.topo.flows[0]
                transfer(tb, (flow.source, ""), (flow.sink, flow.sink_addr), data, 60)
            ends = list(wg._ends)
            for e in ends:  # a host's own traffic leaves by its address (host to host)
                host = "/" not in e.mine or e.mine.endswith(("/32", "/128"))
                route = tb.run(e.node, ["ip", "route", "show", "table", str(e.table), "dev", e.dev])
                assert (f"src {e.mine.split('/')[0]}" in route) == host, (e.mine, route)
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
            assert e.proc is None or e.proc.poll() is not None
        assert "0 received" not in ping(tb, 56)  # the plain path is the testbed's again
    assert mtu == link - 60  # the link's MTU less WireGuard's 60
    # On the wire only WireGuard: UDP between the two ends' ports, the handshake's
    # initiation (type 1) and response (2) and transport data (4), never the payload.
    a, b = ends[0].port, ends[1].port
    wg_udp = f"udp and ((src port {a} and dst port {b}) or (src port {b} and dst port {a}))"
    for pcap in (hs, bulk):
        assert count(pcap, f"ip and not ({wg_udp})") == 0
        assert not holds(pcap, MARKER[:16]) and not holds(pcap, b"PLANTED")
    assert count(hs, "udp[8] = 1") >= 1 and count(hs, "udp[8] = 2") >= 1
    assert count(bulk, "udp[8] = 4") > 1000
    assert data.read_bytes().count(MARKER) > 1000  # it was there to be seen
    # Each ping's request and reply crossed as one data message of the model's size
    # (the whitepaper's: outer IP, UDP, 16-byte header, the packet padded to 16, tag) —
    # boringtun's unpadded (0.7.1 sends the packet as it is: up to 15 bytes less)
    from scapy.all import IP, UDP, rdpcap

    lengths = [p[IP].len for p in rdpcap(str(hs)) if UDP in p and bytes(p[UDP].payload)[:1]
               == b"\x04" and len(p[UDP].payload) > 32]  # fmt: skip
    wg_cfg = parse_configuration("wireguard")
    for n in PINGS:
        want = wire_size(wg_cfg, 28 + n) if not isinstance(wg, Boringtun) else 28 + n + 60
        assert lengths.count(want) == 2, (n, want, lengths)
    return pids, version


def keys_made_fresh_and_private(tb: Testbed, wg: _WireGuard) -> None:
    """Each end's private key: a file of the run's, 0600 in a 0700 directory, its public
    key as another X25519 (the cryptography package's) derives it, the one the device
    holds — and every key of the run its own."""
    import base64
    import stat

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    seen = set()
    for e in wg._ends:
        f = tb.rundir / "wireguard" / f"{e.dev}.key"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert stat.S_IMODE(f.parent.stat().st_mode) == 0o700
        private = f.read_text().strip()
        k = X25519PrivateKey.from_private_bytes(base64.b64decode(private))
        assert base64.b64encode(k.public_key().public_bytes_raw()).decode() == e.public
        assert device_public_key(tb, wg, e.node, e.dev) == e.public
        seen |= {private, e.public}
    assert len(seen) == 2 * len(wg._ends)


def device_public_key(tb: Testbed, wg: _WireGuard, node: str, dev: str) -> str:
    """The public key device `dev` holds, as the device itself says: `wg show` (which
    derives it from the private key the device returns), or for boringtun — whose UAPI
    returns `own_public_key` instead of the private key, so `wg` shows none — its UAPI
    socket's own answer to `get=1`, in hex."""
    import base64
    import socket

    if not isinstance(wg, Boringtun):
        return tb.run(node, ["wg", "show", dev, "public-key"]).strip()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(UAPI_DIR / f"{dev}.sock"))
        s.sendall(b"get=1\n\n")
        text = b""
        while not text.endswith(b"\n\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            text += chunk
    said = dict(ln.split("=", 1) for ln in text.decode().splitlines() if "=" in ln)
    assert said.get("errno") == "0", text
    return base64.b64encode(bytes.fromhex(said["own_public_key"])).decode()


Kill = Callable[[Testbed, _WireGuard], str]


def fails_closed(tmp_path: Path, wg: _WireGuard, kill: Kill) -> None:
    """One end's tunnel killed by `kill` (which says what `died` must then say): its
    device goes, the remote network meets the run's unreachable route — no packet for it
    leaves in clear — and `died` says so; stopped, the plain path is the testbed's again."""
    with Testbed(topology("line"), tmp_path / "run") as tb:
        try:
            wg.start(tb, "wireguard")
            said = kill(tb, wg)
            assert re.search(said, wg.died() or ""), wg.died()
            with capture(tb, "gwA", "wan", "dead") as pcap:
                out = ping(tb, 56, check=False)
            assert " 0 received" in out or "unreachable" in out.lower()
        finally:
            wg.stop(tb)
        assert "1 received" in ping(tb, 56)  # stopped: the testbed's plain path again
    assert count(pcap, "icmp") == 0 and count(pcap, "ip") == 0
