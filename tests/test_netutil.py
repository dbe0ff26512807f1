"""The tests' own pcap reader (netutil.ip_packets, which the micro-VM's interop tests use
instead of scapy, slow under TCG) against scapy's reading of the same files."""

from __future__ import annotations

from pathlib import Path

import pytest
from scapy.all import AH, ESP, IP, UDP, CookedLinux, Dot1Q, Ether, IPv6, Raw, rdpcap, wrpcap

from netutil import ip_packets

# explicit addresses everywhere: nothing here resolves or sends anything
MACS = {"src": "02:00:00:00:00:02", "dst": "02:00:00:00:00:01"}


def _frames(link: str) -> list:
    inner = [
        IP(src="192.0.2.1", dst="192.0.2.2") / ESP(spi=0x1001, seq=7) / Raw(b"x" * 1400),
        IP(src="192.0.2.2", dst="192.0.2.1") / UDP(sport=4500, dport=4500) / Raw(b"\0" * 3),
        # a short packet (its frame padded to 60 bytes) and one with IP options
        IP(src="192.0.2.1", dst="192.0.2.2", proto=51) / Raw(b"ah"),
        IP(src="192.0.2.1", dst="192.0.2.2", options=b"\x01\x01\x01\x00") / Raw(b"opt"),
        IPv6(src="2001:db8::1", dst="2001:db8::2") / ESP(spi=5, seq=1) / Raw(b"y" * 900),
        IPv6(src="2001:db8::2", dst="2001:db8::1") / AH(spi=9, seq=2) / Raw(b"z" * 10),
    ]
    if link == "ethernet":
        return [Ether(**MACS) / p for p in inner] + [Ether(**MACS, type=0x0806) / Raw(b"arp")]
    if link == "vlan":
        return [Ether(**MACS) / Dot1Q(vlan=7) / p for p in inner]
    return [CookedLinux(proto=0x0800 if IP in p else 0x86DD) / p for p in inner]


@pytest.mark.parametrize("link", ["ethernet", "vlan", "cooked"])
def test_ip_packets_reads_what_scapy_reads(tmp_path: Path, link: str) -> None:
    pcap = tmp_path / "c.pcap"
    wrpcap(str(pcap), _frames(link))
    want = []
    for p in rdpcap(str(pcap)):
        if IP in p:
            ip = p[IP]
            want.append((ip.src, ip.dst, ip.proto, bytes(ip.payload)[: ip.len - ip.ihl * 4]))
        elif IPv6 in p:
            want.append((p[IPv6].src, p[IPv6].dst, p[IPv6].nh, bytes(p[IPv6].payload)))
    got = ip_packets(pcap)
    assert got == want and len(got) == 6
    assert got[2][3] == b"ah"  # the Ethernet padding is not payload


def test_a_capture_cut_short_is_refused(tmp_path: Path) -> None:
    pcap = tmp_path / "c.pcap"
    wrpcap(str(pcap), _frames("ethernet"))
    pcap.write_bytes(pcap.read_bytes()[:-5])
    with pytest.raises(AssertionError, match="cut short"):
        ip_packets(pcap)


@pytest.mark.root
def test_a_transfer_between_namespaces_checks_every_byte_and_fails_named(tmp_path: Path) -> None:
    """`transfer`'s two ends are sockets made inside their nodes' namespaces: the bytes go
    over the testbed's link, every stream arrives whole, the test's thread never leaves its
    namespace, and a sink nothing answers at fails in its time, naming the ends."""
    import socket

    from ipsec_lab.testbed import pair
    from ipsec_lab.testbed.build import Testbed
    from netutil import socket_in, transfer

    def netns() -> str:
        return str(Path("/proc/thread-self/ns/net").readlink())

    here = netns()
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    with Testbed(pair(), tmp_path / "tb") as tb:
        (w,) = tb.topo.wires
        b = w.b_addr.split("/")[0]
        before = tb.run("hostA", ["cat", f"/sys/class/net/{w.a_if}/statistics/tx_bytes"])
        transfer(tb, ("hostA", ""), ("hostB", b), data, timeout=30, streams=3)
        after = tb.run("hostA", ["cat", f"/sys/class/net/{w.a_if}/statistics/tx_bytes"])
        assert int(after) - int(before) > 3 * len(data.read_bytes())  # over the link
        assert netns() == here  # this thread never moved
        # 198.51.100.9 is on no link: the connect times out, and says so
        with pytest.raises(AssertionError, match=r"\('hostA', ''\) -> \('hostB', '198.51.100.9'\)"):
            transfer(tb, ("hostA", ""), ("hostB", "198.51.100.9"), data, timeout=2)
        assert netns() == here
        # nothing was left listening: the port is free in hostB (whose address a socket
        # made in this namespace could not bind)
        with socket_in(tb.ns("hostB"), socket.AF_INET) as s:
            s.bind((b, 5301))


@pytest.mark.root
def test_a_testbeds_counters_and_sysctls_are_its_nodes_read_from_a_thread_there(
    tmp_path: Path,
) -> None:
    """`Testbed.counters` and `Testbed.sysctl` start no program (`testbed.netns`): each
    wire end's counters lie between two of ours around `ip -s link`'s, and grow with a
    transfer; a sysctl set in one node is that node's alone; a bad key or an unknown
    namespace is an error that names it."""
    import json
    import threading

    from ipsec_lab.testbed import netns, pair
    from ipsec_lab.testbed.build import LabError, Testbed
    from netutil import transfer

    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 1024)  # 256 KiB
    host_pmtu = Path("/proc/sys/net/ipv4/ip_no_pmtu_disc").read_text()
    with Testbed(pair(), tmp_path / "tb") as tb:
        (w,) = tb.topo.wires
        transfer(tb, ("hostA", ""), ("hostB", w.b_addr.split("/")[0]), data, timeout=30)
        first = tb.counters()
        ips = {}
        for node, ifname in ((w.a, w.a_if), (w.b, w.b_if)):
            (link,) = json.loads(tb.run(node, ["ip", "-j", "-s", "link", "show", "dev", ifname]))
            st = link["stats64"]
            ips[f"{node}/{ifname}"] = {f"{d}_{k}": st[d][k] for d in ("rx", "tx")
                                       for k in ("bytes", "packets")}  # fmt: skip
        second = tb.counters()
        assert set(first) == set(ips) == {f"{w.a}/{w.a_if}", f"{w.b}/{w.b_if}"}
        for end, got in ips.items():
            for k, v in got.items():
                assert first[end][k] <= v <= second[end][k], (end, k)
        sent = f"{w.a}/{w.a_if}"
        # (veth segments nothing: a packet here may be a 64-KiB TSO one)
        n = len(data.read_bytes())
        assert first[sent]["tx_bytes"] > n and first[sent]["tx_packets"] >= n // 65536

        tb.sysctl("hostA", "net.ipv4.ip_no_pmtu_disc", "1")
        values = [tb.run(n, ["sysctl", "-n", "net.ipv4.ip_no_pmtu_disc"]).strip()
                  for n in ("hostA", "hostB")]  # fmt: skip
        assert values == ["1", "0"]
        with pytest.raises(LabError, match=r"sysctl net\.ipv4\.no_such_key=1 in hostB: "):
            tb.sysctl("hostB", "net.ipv4.no_such_key", "1")
        # the machine's own settings are not a node's to change
        with pytest.raises(
            LabError, match=r"kernel\.hostname=x in hostA: not a network namespace's own sysctl"
        ):
            tb.sysctl("hostA", "kernel.hostname", "x")
        log = (tmp_path / "tb" / "commands.log").read_text()
        assert f"ip netns exec {tb.ns('hostA')} sysctl -qw net.ipv4.ip_no_pmtu_disc=1\n" in log
        with pytest.raises(FileNotFoundError, match="ipl-none-such"):
            netns.within("ipl-none-such", netns.net_dev)
    assert Path("/proc/sys/net/ipv4/ip_no_pmtu_disc").read_text() == host_pmtu
    # every thread that entered a namespace ended
    assert not [t for t in threading.enumerate() if t.name.startswith("in-ipl-")]
    for bad in ("", "/etc/passwd", "net/../../etc"):
        with pytest.raises(ValueError, match="not a sysctl key"):
            netns.sysctl_path(bad)
    # sysctl(8)'s two spellings of a name holding a dot (a VLAN's interface)
    for key in ("net/ipv4/conf/eth0.1/forwarding", "net.ipv4.conf.eth0/1.forwarding"):
        assert netns.sysctl_path(key) == "/proc/sys/net/ipv4/conf/eth0.1/forwarding"


def test_work_on_a_thread_of_its_own_returns_raises_and_times_out_in_the_caller() -> None:
    """`netns.on_thread`: what it returns or raises reaches the caller's thread, and a
    work past its bound is a TimeoutError naming it (the caller's thread is not held)."""
    import os
    import threading
    import time

    from ipsec_lab.testbed import netns

    me = threading.get_ident()
    assert netns.on_thread(threading.get_ident, "ident") != me

    def refuse() -> None:
        raise PermissionError("no")

    with pytest.raises(PermissionError, match="no"):
        netns.on_thread(refuse, "refuse")
    with pytest.raises(TimeoutError, match=r"slow: not done within 0\.05 s"):
        netns.on_thread(lambda: time.sleep(2), "slow", timeout=0.05)
    # CPUs set on that thread are its own (and its children's), never the caller's
    before = os.sched_getaffinity(0)
    one = min(before)

    def move() -> set[int]:
        os.sched_setaffinity(0, {one})
        return os.sched_getaffinity(0)

    assert netns.on_thread(move, "placed") == {one}
    assert os.sched_getaffinity(0) == before
    # a CPU this process may not use: the kernel's refusal, in the caller's thread
    with pytest.raises(OSError):
        netns.on_thread(lambda: os.sched_setaffinity(0, {max(before) + 4096}), "placed")


@pytest.mark.root
def test_a_command_past_its_time_ends_without_waiting_for_what_it_left_running(
    tmp_path: Path,
) -> None:
    """`Testbed.run`'s bound holds when the command left a process holding its output
    (a shell line's `&`): the command is killed and the error raised at once, not when
    the process left behind closes the pipes."""
    import os
    import signal

    from ipsec_lab.testbed import pair
    from ipsec_lab.testbed.build import LabError, Testbed

    pidfile = tmp_path / "left.pid"
    with Testbed(pair(), tmp_path / "tb") as tb:
        line = f"sleep 120 & echo $! > {pidfile}; wait"
        with pytest.raises(LabError, match="timed out after 1 s"):
            tb.run("hostA", ["sh", "-c", line], timeout=1)
        pid = int(pidfile.read_text())
        try:
            assert Path(f"/proc/{pid}").exists(), "the process left behind was waited for"
        finally:
            os.kill(pid, signal.SIGKILL)
