"""Path MTU like a real gateway (RFC 4301 §8): with `mtu = "auto"` ipsec-gw's TUN device
offers the path MTU less the SAs' overhead, so on a real 1500-byte link nothing sealed
is fragmented — a DF packet too big for the SA gets ICMP "fragmentation needed" with
that MTU (scapy reads it), a non-DF one is fragmented before it is sealed and arrives
whole, a TCP transfer leaves no fragment on the outer link (tcpdump), and a reload
follows a changed outer MTU. The MTU expected is the model's (`model.overhead`, worked
from RFC 4303's layout in Python), not the gateway's own arithmetic. Needs root."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours, gateway_binary
from ipsec_lab.model.overhead import largest_inner
from ipsec_lab.model.transforms import Layout, parse_configuration
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.interface import READY_S
from ipsec_lab.testbed.links import link_mtu
from ipsec_lab.testbed.ready import wait_for_text
from netutil import capture, count, poll_until, transfer

# (the gateways' link in `tunnel`: 1500 bytes, a real link's)
from test_gateway_traffic_root import gateway_built, inside_v6, tunnel, with_v6

__all__ = ["gateway_built"]  # an autouse fixture: the gateway is built

pytestmark = pytest.mark.root

# an outer IPv4 packet that is a fragment: more fragments set, or an offset
FRAGMENTS = "ip[6:2] & 0x3fff != 0"


def whole(configuration: str, udp_encap: bool, wire: int) -> int:
    """The model's largest inner packet that fits `wire` whole (tunnel mode, IPv4)."""
    lay = Layout(udp_encap=udp_encap)
    return largest_inner(parse_configuration(configuration), wire, lay)


def probe(tb: Testbed, size: int, df: bool) -> dict[str, object]:
    """From the client, one UDP packet of `size` bytes (IP header included) to the
    server, DF set or not; what came back (scapy: an ICMP error's type, code and MTU)."""
    script = (
        "import json, sys\n"
        "from scapy.all import IP, UDP, ICMP, Raw, sr1, conf\n"
        "conf.verb = 0\n"
        "n, df = int(sys.argv[1]), sys.argv[2] == '1'\n"
        "p = IP(dst='10.2.0.2', flags='DF' if df else 0) / UDP(sport=40000, dport=9)"
        " / Raw(b'm' * (n - 28))\n"
        "r = sr1(p, timeout=3)\n"
        "out = {}\n"
        "if r is not None and ICMP in r:\n"
        "    out = {'type': r[ICMP].type, 'code': r[ICMP].code, 'mtu': r[ICMP].nexthopmtu,"
        " 'from': r[IP].src}\n"
        "print(json.dumps(out))\n"
    )
    out = tb.run("client", [sys.executable, "-c", script, str(size), "1" if df else "0"],
                 timeout=60)  # fmt: skip
    got: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return got


CASES = [("esp:aes128gcm16", False), ("esp:aes128gcm16", True), ("esp:aes128-sha1", False)]


@pytest.mark.parametrize(("configuration", "udp_encap"), CASES, ids=str)
def test_a_df_packet_over_the_sas_mtu_gets_fragmentation_needed_with_that_mtu(
    tmp_path: Path, configuration: str, udp_encap: bool
) -> None:
    with tunnel(tmp_path, configuration, udp_encap=udp_encap) as (tb, gw):
        want = whole(configuration, udp_encap, 1500)
        assert link_mtu(tb, "gwA", "ipsec0") == want == gw.inner_mtu()
        assert link_mtu(tb, "gwB", "ipsec0") == want
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
        assert f"MTU {want} = path MTU 1500 less the SAs' overhead" in log, log
        # one byte over: refused with the MTU that fits (RFC 1191), by gwA
        got = probe(tb, want + 1, df=True)
        assert got == {"type": 3, "code": 4, "mtu": want, "from": "10.1.0.1"}, got
        # at the MTU: it crosses the tunnel whole — the server, with nothing on port 9,
        # answers "port unreachable" from its own address
        got = probe(tb, want, df=True)
        assert got == {"type": 3, "code": 3, "mtu": 0, "from": "10.2.0.2"}, got


@pytest.mark.parametrize(("configuration", "udp_encap"), CASES, ids=str)
def test_without_df_a_full_size_packet_is_fragmented_before_sealing_and_arrives_whole(
    tmp_path: Path, configuration: str, udp_encap: bool
) -> None:
    """A 1500-byte datagram without DF and a 1 MiB TCP transfer: the outer link carries
    no IP fragment; the datagram arrives at the server whole (1472 bytes of payload)."""
    receiver = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.bind(('10.2.0.2', 9)); s.settimeout(10); print('bound', flush=True); "
        "print(len(s.recvfrom(65535)[0]), flush=True)"
    )
    with tunnel(tmp_path, configuration, udp_encap=udp_encap) as (tb, _):
        with capture(tb, "gwA", "wan", "outer") as pcap:
            rx = tb.spawn("server", [sys.executable, "-u", "-c", receiver], "receiver")
            assert wait_for_text(tb.rundir / "receiver.log", "bound", rx, READY_S)
            assert probe(tb, 1500, df=False) == {}  # no ICMP error: the receiver has it
            rx.wait(15)
            data = tb.rundir / "data.bin"
            data.write_bytes(bytes(range(256)) * 4096)
            transfer(tb, ("client", ""), ("server", "10.2.0.2"), data, 30)
        assert (tb.rundir / "receiver.log").read_text().split() == ["bound", "1472"]
    # the transfer's packets are there: 1 MiB is some 750 ESP packets; in UDP, sent with
    # GSO, tcpdump on the veth sees each send of up to 64 KiB once (UDP GSO cuts it into
    # whole datagrams of the segment size, never IP fragments)
    if udp_encap:
        assert count(pcap, "udp port 4500") > 16
    else:
        assert count(pcap, "esp") > 700
    assert count(pcap, FRAGMENTS) == 0


def test_a_fixed_mtu_over_the_path_fragments_after_sealing(tmp_path: Path) -> None:
    """The contrast, so the test above could fail: `mtu = 1500` on a 1500-byte link (what
    the lab configured before `auto`) leaves every full-size ESP-in-UDP packet as two
    fragments. (In plain ESP the raw socket refuses such a packet instead — a transfer
    then stalls: tried, it timed out.)"""

    def fixed(node: str, text: str) -> str:
        return text.replace('mtu = "auto"', "mtu = 1500", 1)

    with tunnel(tmp_path, "esp:aes128gcm16", udp_encap=True, edit=fixed) as (tb, _):
        assert link_mtu(tb, "gwA", "ipsec0") == 1500
        with capture(tb, "gwA", "wan", "outer") as pcap:
            data = tb.rundir / "data.bin"
            data.write_bytes(bytes(range(256)) * 1024)
            transfer(tb, ("client", ""), ("server", "10.2.0.2"), data, 30)
    assert count(pcap, FRAGMENTS) > 100


def test_auto_follows_a_changed_outer_mtu_at_reload(tmp_path: Path) -> None:
    with tunnel(tmp_path, "esp:aes128gcm16") as (tb, gw):
        before = whole("esp:aes128gcm16", False, 1500)
        assert link_mtu(tb, "gwA", "ipsec0") == before
        tb.run("gwA", ["ip", "link", "set", "dev", "wan", "mtu", "1400"])
        gw._procs["gwA"].send_signal(signal.SIGHUP)
        after = whole("esp:aes128gcm16", False, 1400)
        log = tb.rundir / "ipsec-gw-gwA.log"
        poll_until("gwA to take the path's MTU",
                   lambda: f"MTU {before} -> {after}" in log.read_text(), timeout=20)  # fmt: skip
        assert f"TUN ipsec0 MTU {before} -> {after} = path MTU 1400" in log.read_text()
        assert link_mtu(tb, "gwA", "ipsec0") == after
        # the gateway still carries traffic, now in smaller packets
        data = tb.rundir / "data.bin"
        data.write_bytes(bytes(range(256)) * 1024)
        transfer(tb, ("client", ""), ("server", "10.2.0.2"), data, 30)
        # gwB's path did not change: its TUN keeps its MTU
        assert link_mtu(tb, "gwB", "ipsec0") == before
        # a path too small for the SAs: the reload is refused, the running MTU stays
        tb.run("gwA", ["ip", "link", "set", "dev", "wan", "mtu", "600"])
        gw._procs["gwA"].send_signal(signal.SIGHUP)
        poll_until("gwA to refuse the reload", lambda: "leaves 546" in log.read_text(), timeout=20)
        assert "reload refused, the running config stays" in log.read_text()
        assert "path MTU to 192.0.2.2 is 600 bytes, which leaves 546" in log.read_text()
        assert link_mtu(tb, "gwA", "ipsec0") == after


def test_a_path_too_small_for_the_sas_is_refused_at_start_leaving_nothing(tmp_path: Path) -> None:
    from ipsec_lab.testbed.build import LabError

    with Testbed(topology("line"), tmp_path / "run") as tb:
        for node in ("gwA", "gwB"):
            tb.run(node, ["ip", "link", "set", "dev", "wan", "mtu", "600"])
        gw = Ours()
        try:
            with pytest.raises(LabError) as e:
                gw.start(tb, "esp:aes128gcm16")
        finally:
            gw.stop(tb)
        # 600 - 20 - 8 - 8 - 16 = 548 = inner + 2 -> 546, under IPv4's 576
        assert (
            "gateway.mtu" in str(e.value)
            and "path MTU to 192.0.2.2 is 600 bytes" in str(e.value)
            and "leaves 546 for inner packets (sa out)" in str(e.value)
        ), e.value
        links = tb.run("gwA", ["ip", "-j", "link", "show"])
        assert "ipsec0" not in links  # no TUN device made


def _check(tb: Testbed, conf: Path, node: str = "gwA") -> subprocess.CompletedProcess[str]:
    """`ipsec-gw --config CONF --check` in `node`, as a user checks a gateway's config."""
    argv = tb.in_ns(node, [str(gateway_binary()), "--config", str(conf), "--check"])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("configuration", "udp_encap"), CASES, ids=str)
def test_check_says_the_tun_mtu_the_path_gives_and_refuses_what_start_refuses(
    tmp_path: Path, configuration: str, udp_encap: bool
) -> None:
    """`--check` on the gateway's host works `auto` out as the start does: the TUN MTU
    for the 1500-byte path (the model's), a refusal (exit 2, the key named) once the path
    is 600 bytes — a config that passes its check starts; and a fixed MTU over what the
    path carries sealed is warned of, at the check and at the start."""
    with tunnel(tmp_path, configuration, udp_encap=udp_encap) as (tb, gw):
        conf = gw.configs["gwA"]
        mtu = whole(configuration, udp_encap, 1500)
        r = _check(tb, conf)
        assert r.returncode == 0, r.stderr
        assert f"TUN MTU {mtu} = path MTU 1500 less the SAs' overhead" in r.stderr, r.stderr
        assert "warning" not in r.stderr
        fixed = tmp_path / "fixed.toml"
        fixed.write_text(conf.read_text().replace('mtu = "auto"', "mtu = 1500", 1))
        fixed.chmod(0o600)
        r = _check(tb, fixed)
        assert r.returncode == 0, r.stderr
        said = (f"gateway.mtu = 1500 is more than the path MTU to 192.0.2.2 (1500 bytes) "
                f"carries sealed ({mtu})")  # fmt: skip
        assert said in r.stderr and "TUN MTU 1500" in r.stderr, r.stderr
        assert ("fragmented" if udp_encap else "refused by the raw socket") in r.stderr
        fits = tmp_path / "fits.toml"
        fits.write_text(conf.read_text().replace('mtu = "auto"', f"mtu = {mtu}", 1))
        fits.chmod(0o600)
        r = _check(tb, fits)
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        tb.run("gwA", ["ip", "link", "set", "dev", "wan", "mtu", "600"])
        r = _check(tb, conf)
        assert r.returncode == 2, r.stderr
        assert "gateway.mtu" in r.stderr and "path MTU to 192.0.2.2 is 600 bytes" in r.stderr

    # the fixed MTU's warning at the start too, in the gateway's log
    def over(node: str, text: str) -> str:
        return text.replace('mtu = "auto"', "mtu = 1500", 1)

    with tunnel(tmp_path / "again", configuration, udp_encap=udp_encap, edit=over) as (tb, _):
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
        assert "warning: " in log and "gateway.mtu = 1500 is more than the path MTU" in log, log


def probe_v6(tb: Testbed, size: int) -> dict[str, object]:
    """From the client, one IPv6 UDP packet of `size` bytes (header included) to the
    server (IPv6 routers never fragment: too big is answered); what came back (scapy:
    an ICMPv6 error's type, code, MTU and sender)."""
    script = (
        "import json, sys\n"
        "from scapy.all import IPv6, UDP, Raw, sr1, conf\n"
        "from scapy.layers.inet6 import ICMPv6PacketTooBig, ICMPv6DestUnreach\n"
        "conf.verb = 0\n"
        "n = int(sys.argv[1])\n"
        "p = IPv6(dst='fd00:2::2') / UDP(sport=40000, dport=9) / Raw(b'm' * (n - 48))\n"
        "r = sr1(p, timeout=3)\n"
        "out = {}\n"
        "if r is not None and ICMPv6PacketTooBig in r:\n"
        "    out = {'type': 2, 'mtu': r[ICMPv6PacketTooBig].mtu, 'from': r[IPv6].src}\n"
        "elif r is not None and ICMPv6DestUnreach in r:\n"
        "    out = {'type': 1, 'code': r[ICMPv6DestUnreach].code, 'from': r[IPv6].src}\n"
        "print(json.dumps(out))\n"
    )
    out = tb.run("client", [sys.executable, "-c", script, str(size)], timeout=60)
    got: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return got


def test_an_ipv6_packet_over_the_sas_mtu_gets_packet_too_big_with_that_mtu(
    tmp_path: Path,
) -> None:
    """IPv6 inside, IPv4 outside, a 1500-byte outer link: a packet one byte over the TUN's
    MTU (the model's, IPv4 outer) gets ICMPv6 "packet too big" (RFC 4443 §3.2) from gwA
    carrying that MTU, so the sender's path MTU adapts (RFC 8201); one at the MTU crosses
    whole — the server's "port unreachable" answers it."""
    mtu = whole("esp:aes128gcm16", False, 1500)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        inside_v6(tb)
        gw = Ours(edit=with_v6)
        gw.start(tb, "esp:aes128gcm16")
        try:
            assert link_mtu(tb, "gwA", "ipsec0") == mtu
            with capture(tb, "gwA", "wan", "outer") as pcap:
                over = probe_v6(tb, mtu + 1)
                at = probe_v6(tb, mtu)
        finally:
            gw.stop(tb)
    assert over == {"type": 2, "mtu": mtu, "from": "fd00:1::1"}, over
    assert at == {"type": 1, "code": 4, "from": "fd00:2::2"}, at
    assert count(pcap, "esp") >= 2 and count(pcap, FRAGMENTS) == 0
