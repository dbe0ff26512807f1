"""The lab's UDP sender (generator udp-gso, `traffic/udpsend.py`) as the program it is:
run over loopback into a socket of this test, every datagram is counted and read back —
its size, its flow's source port, the mix's order — whether it went as a UDP GSO
message cut by the kernel or a message of its own. No root needed."""

from __future__ import annotations

import ctypes
import errno
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ipsec_lab.traffic import udpsend

SCRIPT = Path(udpsend.__file__)


class Sink:
    """A UDP socket on loopback that reads every datagram into `got` (source port,
    payload length, first byte) until told to stop (`wait`, once the sender has ended),
    then until nothing more comes for IDLE_S. (It stopped at its first 0.5 s without a
    datagram once, before a sender started beside the micro-VM under CI took that long
    to start: 0 of 150 read.)"""

    IDLE_S = 0.5

    def __init__(self, addr: str = "127.0.0.1", port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((addr, port))
        self.sock.settimeout(self.IDLE_S)
        self.port = self.sock.getsockname()[1]
        self.got: list[tuple[int, int, int]] = []
        self._done = threading.Event()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        # bounded: after `wait` says the sender ended, by the first idle IDLE_S; before,
        # by wait's own bound on the thread (a sender's count is finite)
        while True:
            try:
                data, (_, port) = self.sock.recvfrom(65536)
            except TimeoutError:
                if self._done.is_set():
                    return
                continue
            self.got.append((port, len(data), data[0] if data else -1))

    def wait(self) -> list[tuple[int, int, int]]:
        """What was read, the sender having ended (call it after the sender returns)."""
        self._done.set()
        self._t.join(30)
        self.sock.close()
        return self.got


def _free_ports(n: int) -> int:
    """A first port with the n after it free for UDP here (binds and lets go)."""
    for base in range(42000, 60000, 97):
        socks = []
        try:
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("0.0.0.0", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free UDP ports")


def _run(sink: Sink, sizes: str, count: int, flows: int = 1, *extra: str) -> dict[str, object]:
    sport = _free_ports(flows)
    p = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--dst", "127.0.0.1",
                        "--dport", str(sink.port), "--sport", str(sport), "--flows", str(flows),
                        "--sizes", sizes, "--count", str(count), *extra],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    out["sport"] = sport
    return out  # type: ignore[no-any-return]


@pytest.mark.parametrize("extra", [(), ("--no-gso",), ("--gso-over", "2000")])
@pytest.mark.parametrize("size", [29, 64, 576, 1500])
def test_every_datagram_arrives_at_its_size(size: int, extra: tuple[str, ...]) -> None:
    """A count that is no multiple of a GSO message (the rest goes a datagram each):
    exactly that many datagrams arrive, each of the size's payload and the sender's fill."""
    sink = Sink()
    count = 150
    out = _run(sink, f"{size}x1", count, 1, *extra)
    got = sink.wait()
    assert out["sent"] == count
    assert len(got) == count, (len(got), out)
    assert {n for _, n, _ in got} == {size - udpsend.IPV4_UDP}
    assert {b for _, _, b in got} == {ord("A")}
    assert {p for p, _, _ in got} == {out["sport"]}
    # GSO where a message of the size exceeds the bucket's depth given (never for a
    # 1-byte payload: a message would hold fewer frames than the depth's)
    want_gso = "--no-gso" not in extra and udpsend.segments(size, int(dict(
        zip(extra[::2], extra[1::2])).get("--gso-over", 0))) > 0  # fmt: skip
    assert out["gso"] is want_gso, out
    # one system call carries many datagrams either way
    assert int(out["calls"]) < count / 4, out  # type: ignore[call-overload]


@pytest.mark.parametrize("flows", [1, 3])
def test_a_mix_goes_interleaved_and_flows_take_turns(flows: int) -> None:
    """7:4:1 of 40, 576 and 1500 bytes in trafgen's interleaving (S M L S M S M S M S S S),
    whole rounds in every call (the shares stay exact); with three flows each source port
    gets a call's whole rounds in turn, in order (loopback reorders nothing)."""
    sink = Sink()
    rounds = 13  # more than one call's (5 rounds a call), no multiple of it
    out = _run(sink, "40x7,576x4,1500x1", 12 * rounds, flows)
    got = sink.wait()
    assert out["sent"] == 12 * rounds and len(got) == 12 * rounds and out["gso"] is False
    round_ = [40, 576, 1500, 40, 576, 40, 576, 40, 576, 40, 40, 40]
    by_port: dict[int, list[int]] = {}
    for port, n, _ in got:
        by_port.setdefault(port, []).append(n + udpsend.IPV4_UDP)
    sport = int(out["sport"])  # type: ignore[call-overload]
    assert sorted(by_port) == list(range(sport, sport + flows))
    for sizes in by_port.values():
        assert len(sizes) % 12 == 0 and sizes == round_ * (len(sizes) // 12), sizes
    if flows == 3:  # a call's 5 rounds each in turn: 13 rounds go 5, 5, 3
        assert sorted(len(v) // 12 for v in by_port.values()) == [3, 5, 5]


@pytest.mark.parametrize("extra", [("--no-gso",), ()], ids=["a-datagram-a-message", "gso"])
def test_more_destinations_take_turns_a_message_each(extra: tuple[str, ...]) -> None:
    """`--more-dsts` (the many-tunnel testbed's spread): four loopback addresses, one
    port; each message goes to the next address, so each gets a quarter — a datagram at a
    time, or a GSO message's 64 at a time — and every datagram arrives at its size."""
    first = Sink("127.0.0.10")
    sinks = [first] + [Sink(f"127.0.0.{11 + i}", first.port) for i in range(3)]
    count = 4 * 64 * 3
    sport = _free_ports(1)
    p = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--dst", "127.0.0.10",
                        "--more-dsts", "127.0.0.11:3", "--dport", str(first.port), "--sport",
                        str(sport), "--sizes", "64x1", "--count", str(count), *extra],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    got = [s.wait() for s in sinks]
    assert out["sent"] == count and out["gso"] is (extra == ()), out
    assert [len(g) for g in got] == [count // 4] * 4, [len(g) for g in got]
    assert all({n for _, n, _ in g} == {64 - udpsend.IPV4_UDP} for g in got)


def test_every_flow_goes_to_every_destination() -> None:
    """Two flows, two destinations, GSO: each flow's turn is one GSO message, and each
    flow takes the destinations in turn on its own (with one cursor for all, flow 0's
    messages all went to the first destination and flow 1's to the second)."""
    first = Sink("127.0.0.20")
    sinks = [first, Sink("127.0.0.21", first.port)]
    sport = _free_ports(2)
    count = 64 * 8
    argv = [
        "--dst",
        "127.0.0.20",
        "--more-dsts",
        "127.0.0.21:1",
        "--dport",
        str(first.port),
        "--sport",
        str(sport),
        "--flows",
        "2",
        "--sizes",
        "64x1",
        "--count",
        str(count),
    ]
    p = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *argv], capture_output=True,
                       text=True, timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)["gso"], p.stderr
    got = [s.wait() for s in sinks]
    pairs = {(d, port): sum(1 for x, _, _ in g if x == port) for d, g in enumerate(got)
             for port in (sport, sport + 1)}  # fmt: skip
    assert pairs == {k: count // 4 for k in pairs}, pairs


def test_more_destinations_are_counted_from_the_first_and_checked() -> None:
    assert udpsend.spread("10.2.0.2", "10.128.0.255:3") == [
        "10.2.0.2", "10.128.0.255", "10.128.1.0", "10.128.1.1"]  # fmt: skip
    for bad in ("10.128.0.0:0", "10.128.0.0:70000", "255.255.255.255:2", "10.128.0.0:x"):
        with pytest.raises((ValueError, OSError)):
            udpsend.spread("10.2.0.2", bad)


def test_segments_exceed_the_buckets_depth_or_none_are_made() -> None:
    """A GSO message holds up to 64 datagrams (under 64 KiB) and its frames (IP + 14
    each) always exceed the pacing bucket's depth, which is what makes the bucket cut it;
    where they cannot, no GSO at all."""
    assert udpsend.segments(64, 0) == 64
    assert udpsend.segments(64, 64 * 78 - 1) == 64
    assert udpsend.segments(64, 64 * 78) == 0  # 64 frames would not exceed the depth
    assert udpsend.segments(1500, 0) == (65_507 - 8) // 1472
    assert udpsend.segments(28, 0) == 0  # no payload to segment
    for size in range(29, 1501, 37):
        for depth in (0, 1514, 2496, 9014, 48_448):
            k = udpsend.segments(size, depth)
            assert k == 0 or (k * (size + 14) > depth and k * (size - 28) <= 65_499), (size, depth)


@pytest.mark.parametrize("bad", [["--sizes", "20x1"], ["--count", "0"], ["--flows", "0"]])
def test_bad_arguments_are_refused_with_a_message(bad: list[str]) -> None:
    args = {"--dst": "127.0.0.1", "--dport": "9", "--sport": "0", "--sizes": "64x1",
            "--count": "1", "--flows": "1"}  # fmt: skip
    args[bad[0]] = bad[1]
    argv = [x for kv in args.items() for x in kv]
    p = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), *argv], capture_output=True,
                       text=True, timeout=30, check=False)  # fmt: skip
    assert p.returncode != 0 and p.stderr.strip(), p
    assert "Traceback" not in p.stderr


def test_an_icmp_error_for_an_earlier_datagram_does_not_end_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connected UDP socket reports an ICMP error (port unreachable: a sink without its
    counter; host unreachable: a gateway's route) that came back for an earlier datagram
    on a later send, which then sends nothing: the sender counts it and goes on until
    every datagram went (before, the first such report ended it: `Connection refused`).
    Over loopback to a port nobody listens on, a report lands at the start of a call
    whenever it came between two calls on that socket: here, a call that fails so first."""
    real = udpsend._libc()
    failed: list[int] = []

    class Libc:
        def sendmmsg(self, fd: int, msgs: object, n: int, flags: int) -> int:
            if len(failed) < 3:  # the first three calls: the report, nothing sent
                failed.append(fd)
                ctypes.set_errno(errno.ECONNREFUSED)
                return -1
            return int(real.sendmmsg(fd, msgs, n, flags))

    monkeypatch.setattr(udpsend, "_libc", Libc)
    sink = Sink()
    out = udpsend.send("127.0.0.1", sink.port, _free_ports(2), 2, [(100, 1)], 300, False)
    got = sink.wait()
    assert out["sent"] == 300 and out["icmp_errors"] == 3 and len(got) == 300, out
    assert len(failed) == 3


def test_a_sender_that_sends_nothing_or_runs_too_long_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A route that went away answers every call with an error: the sender gives up after
    STALL_S without a datagram sent, naming how far it got, instead of spinning as root
    for ever; and a count that cannot be sent in `--deadline` seconds ends there (exit 1,
    a message, no traceback): the lab's bound ends only the shell that started it."""

    class Gone:
        def sendmmsg(self, fd: int, msgs: object, n: int, flags: int) -> int:
            ctypes.set_errno(errno.EHOSTUNREACH)
            return -1

    monkeypatch.setattr(udpsend, "_libc", Gone)
    monkeypatch.setattr(udpsend, "STALL_S", 0.2)
    with pytest.raises(udpsend.Stalled, match=r"nothing sent for 0\.2 s \(0 of 100 sent"):
        udpsend.send("127.0.0.1", 9, _free_ports(1), 1, [(64, 1)], 100, False)
    monkeypatch.undo()
    sink = Sink()
    p = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--dst", "127.0.0.1",
                        "--dport", str(sink.port), "--sport", str(_free_ports(1)), "--sizes",
                        "64x1", "--count", str(10**9), "--no-gso", "--deadline", "0.5"],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    sink.wait()
    assert p.returncode == 1 and "past its deadline of 0.5 s" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    # and this kernel takes UDP GSO (4.18 and later), found by its socket option
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        assert udpsend.has_gso(s)
