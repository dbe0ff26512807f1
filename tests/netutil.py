"""Helpers the root tests share (the host's and those run inside the micro-VM): a file
sent over TCP between two nodes of a testbed, checked by SHA-256 on arrival."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ipsec_lab.backends.ours import stats
from ipsec_lab.testbed import netns
from ipsec_lab.testbed.build import Testbed, tail
from ipsec_lab.testbed.interface import READY_S
from ipsec_lab.testbed.ready import wait_for_text

T = TypeVar("T")


def poll_until(what: str, ready: Callable[[], T], timeout: float = 10, every: float = 0.05) -> T:
    """Wait for an event, not for a time: `ready()` again and again until it returns
    something true (its value is returned), failing after `timeout` seconds with `what`
    (the event awaited) and what `ready()` said last."""
    deadline = time.monotonic() + timeout
    while not (got := ready()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last: {got!r}")
        time.sleep(every)
    return got


def fresh_stats(sock: Path) -> dict[str, Any]:
    """ipsec-gw's counters (at its stats socket `sock`) once they hold everything it
    handled before this call: each direction's worker has published twice since (the
    first publication's snapshot may predate the call; the second's cannot). Workers
    publish every 100 ms."""
    first = stats(sock)

    def fresh() -> dict[str, Any] | None:
        st = stats(sock)
        done = all(st[d]["published"] >= first[d]["published"] + 2 for d in DIRECTIONS)
        return st if done else None

    return poll_until("the gateway's workers to publish their counters twice", fresh)


DIRECTIONS = ("outbound", "inbound")


def running(comm: str, arg: str = "") -> list[int]:
    """PIDs of the processes named `comm` (whichever namespace they run in) whose
    arguments include `arg` (any, when empty)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != comm:
                continue
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if not arg or arg.encode() in argv:
            found.append(int(d.name))
    return found


def socket_in(ns: str, family: int) -> socket.socket:
    """A TCP socket made inside network namespace `ns` (/run/netns/NS, made by `ip netns
    add`); it stays there for its life, whichever thread uses it. A thread of its own
    enters the namespace and makes it (`ipsec_lab.testbed.netns.within`): the caller's
    thread never moves."""
    return netns.within(ns, lambda: socket.socket(family, socket.SOCK_STREAM))


def transfer(
    tb: Testbed,
    src: tuple[str, str],
    dst: tuple[str, str],
    data: Path,
    timeout: float = 60,
    streams: int = 1,
) -> None:
    """Send the bytes of `data` from node `src[0]` to node `dst[0]` (at address `dst[1]`)
    over `streams` TCP connections at once, each carrying all of it, and check that every
    byte arrived unchanged on each (SHA-256: a packet a gateway joined wrongly goes up with
    a checksum the kernel trusts, so TCP would not catch it).

    Both ends are sockets of this process made inside their nodes' namespaces
    (`socket_in`): no program is started. (Under TCG in the micro-VM a Python start
    costs 3.5 s, and a receiver and a sender process were 14 of an interop case's ~40.)"""
    payload = data.read_bytes()
    family = socket.AF_INET6 if ":" in dst[1] else socket.AF_INET
    digests: list[str] = []
    errors: list[BaseException] = []
    made: list[socket.socket] = []

    def rx(listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(timeout)
                h = hashlib.sha256()
                while b := conn.recv(1 << 16):
                    h.update(b)
                digests.append(h.hexdigest())
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    def tx(s: socket.socket) -> None:
        try:
            s.connect((dst[1], 5301))
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except BaseException as e:
            errors.append(e)

    try:
        listener = socket_in(tb.ns(dst[0]), family)
        made.append(listener)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.settimeout(timeout)
        listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 5301))
        listener.listen(streams)
        senders = [socket_in(tb.ns(src[0]), family) for _ in range(streams)]
        made += senders
        for s in senders:
            s.settimeout(timeout)
        threads = [threading.Thread(target=rx, args=(listener,)) for _ in range(streams)]
        threads += [threading.Thread(target=tx, args=(s,)) for s in senders]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 2 * timeout
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0))
        stuck = sum(t.is_alive() for t in threads)
        assert not stuck, f"{src} -> {dst}: {stuck} of its ends still busy after {2 * timeout} s"
    finally:
        for s in made:  # a thread still in a call on one returns with an error
            s.close()
    assert not errors, f"{src} -> {dst}: {errors!r}"
    want = hashlib.sha256(payload).hexdigest()
    assert digests == [want] * streams, (src, dst)


# What the outer link carries, without the link's own chatter: IPv4, and IPv6 but not
# neighbour discovery (ICMPv6) or MLD reports (behind a hop-by-hop header).
OUTER_FILTER = "ip or (ip6 and not icmp6 and not ip6 proto 0)"


@contextmanager
def capture(
    tb: Testbed, node: str, iface: str, name: str, bpf: str = OUTER_FILTER
) -> Iterator[Path]:
    """tcpdump on `node`'s `iface` (what `bpf` passes: by default the outer link's IP
    traffic) while the block runs; yields the pcap's path."""
    pcap = tb.rundir / f"{name}.pcap"
    argv = ["tcpdump", "-i", iface, "-U", "--immediate-mode", "-B", "32768", "-n", "-w", str(pcap)]
    p = tb.spawn(node, [*argv, bpf], name)
    log = tb.rundir / f"{name}.log"
    assert wait_for_text(log, "listening on", p, READY_S), tail(log)
    try:
        yield pcap
    finally:
        # What the kernel handed tcpdump's socket reaches the file (-U: at once), but a
        # tcpdump still behind its ring when stopped loses the rest: wait until the file
        # has stopped growing (no event says tcpdump is done), bounded. (It did not cure
        # the kernel WireGuard VM step's short captures in CI: see tests/vm/wireguard.py.)
        drained(pcap)
        tb.stop(p)


def drained(pcap: Path, still_s: float = 0.3, most_s: float = 30.0) -> None:
    """Until `pcap` has not grown for `still_s` (at most `most_s`)."""
    deadline = time.monotonic() + most_s
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        size = pcap.stat().st_size if pcap.exists() else 0
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= still_s:
            return
        time.sleep(0.05)


def count(pcap: Path, bpf: str) -> int:
    """The packets of `pcap` a BPF filter matches, as tcpdump reads them. A 2 s TCP
    capture between the gateways holds some 200,000 packets: scapy dissects them in tens
    of seconds, tcpdump's filter in about one."""
    p = subprocess.run(["tcpdump", "-r", str(pcap), "-nn", "-q", bpf], capture_output=True,
                       text=True, check=True, timeout=300)  # fmt: skip
    return len(p.stdout.splitlines())


def holds(path: Path, needle: bytes) -> bool:
    """Whether the bytes of `path` contain `needle` anywhere (a pcap: in any packet),
    read in chunks that overlap by the needle's length."""
    keep = b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            if needle in keep + chunk:
                return True
            keep = chunk[-len(needle) :]
    return False


def ip_packets(pcap: Path) -> list[tuple[str, str, int, bytes]]:
    """(source, destination, protocol, payload) of every IPv4 or IPv6 packet of a
    tcpdump capture (Ethernet or Linux cooked frames), read with struct: under TCG scapy
    took seconds a capture (tests/test_netutil.py checks this against scapy). IPv6's
    `protocol` is its header's next header (the captures the tests read carry no
    extension headers: OUTER_FILTER leaves hop-by-hop out)."""
    import ipaddress
    import struct

    data = pcap.read_bytes()
    magic = data[:4]
    order = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
             b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}.get(magic)  # fmt: skip
    assert order, f"{pcap}: not a pcap file"
    (link,) = struct.unpack(order + "I", data[20:24])
    header = {1: 14, 113: 16}.get(link & 0xFFFF)  # Ethernet, Linux cooked (SLL)
    assert header, f"{pcap}: link type {link} is neither Ethernet nor Linux cooked"
    out = []
    at = 24
    while at + 16 <= len(data):
        caplen, length = struct.unpack(order + "II", data[at + 8 : at + 16])
        frame = data[at + 16 : at + 16 + caplen]
        at += 16 + caplen
        assert caplen == length == len(frame), f"{pcap}: a packet cut short"
        ethertype = struct.unpack(">H", frame[header - 2 : header])[0]
        ip = frame[header:]
        while ethertype in (0x8100, 0x88A8) and len(ip) >= 4:  # 802.1Q / 802.1ad tags
            ethertype, ip = struct.unpack(">H", ip[2:4])[0], ip[4:]
        if ethertype == 0x0800 and len(ip) >= 20:
            ihl, total = (ip[0] & 0x0F) * 4, struct.unpack(">H", ip[2:4])[0]
            src, dst = ipaddress.IPv4Address(ip[12:16]), ipaddress.IPv4Address(ip[16:20])
            out.append((str(src), str(dst), ip[9], ip[ihl:total]))
        elif ethertype == 0x86DD and len(ip) >= 40:
            n = struct.unpack(">H", ip[4:6])[0]
            src, dst = ipaddress.IPv6Address(ip[8:24]), ipaddress.IPv6Address(ip[24:40])
            out.append((str(src), str(dst), ip[6], ip[40 : 40 + n]))
    return out
