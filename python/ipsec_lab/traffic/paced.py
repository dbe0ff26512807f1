"""The paced UDP generators — trafgen and the lab's UDP sender (udp-gso) — behind one base:
a sender on the flow's source, the lab's token bucket on its test interface pacing it, an
nftables counter on the sink counting what arrived. How they are chosen, and why the
pacing is the kernel's: `generator`'s docstring."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipsec_lab.testbed import Flow, tunnels
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed, on_hosts
from ipsec_lab.testbed.links import STOCK_QDISCS, root_qdisc
from ipsec_lab.traffic import BACKGROUND_NICE, IPV4_UDP, Row, niced, steady, udpsend

# The sink's counter: an nftables table of the lab's in the sink node.
NFT_TABLE = "ipsec_lab_sink"
SINK_PORT = 5299  # the flows' UDP destination port (iperf3's are 5201…)
SOURCE_PORT = 40000  # the first UDP source port; flow i uses SOURCE_PORT + i
# After the sender stops, what is still in the path arrives: the sink's count is read
# once it stays the same for QUIET_S, for at most SETTLE_MAX_S (RFC 2544 §23 waits 2 s),
# read every SETTLE_EVERY_S (one command in the sink: a few ms here) so the wait ends
# QUIET_S after the last packet arrived. (cProfile of `reproduce tisovsky2013 --quick`:
# 0.29 s a trial with reads QUIET_S apart, 0.27 s so; most of it is an overloaded
# gateway's queue still draining into the sink.)
QUIET_S = 0.1
SETTLE_EVERY_S = 0.02
SETTLE_MAX_S = 2.0
# A trial's delivered rate counts what arrived by the bucket's last packet and this long
# after (in flight on a path without a queue of its own; iperf3's rows allow the same).
IN_FLIGHT_S = 0.02
# A trial's sender fell short of the rate asked when it sent less than this share of it
# in the time asked (it could not go faster): the search then reports it generator-bound.
SHORT_OF_RATE = 0.95
MIN_IP_SIZE = IPV4_UDP  # an IPv4 UDP packet with no payload
ETHERNET = 14  # the frame header trafgen writes before each IP packet (no FCS)
# The pacing bucket's depth: what a late timer may send at once to catch up — this much
# time's traffic, but never more than so many frames (nor less than two). tbf sends while
# it holds tokens and then sleeps on a timer; a timer that fires late (its softirq pushed
# to ksoftirqd on a busy machine) loses the time beyond the bucket's depth for good. With
# a depth of 20 µs (two frames at a low rate), 15 Mbit/s of 1000-B packets was let out at
# 0.89-0.92 x its rate for whole trials, the bucket's counter (polled every few ms beside
# it) never standing still for 30 ms and its queue holding up to 93 packets; a search at
# 20 Mbit/s ended "generator-bound" in CI. 5 ms absorbs such lateness; 32 frames keeps a
# 64-B stream at 200 k packets/s from leaving in bursts of more than 0.16 ms. The limit:
# far above what the socket's push-back lets into it.
PACING_BURST_S = 5e-3
PACING_BURST_FRAMES = 32
PACING_LIMIT_BYTES = 8 << 20
# udp-gso sends UDP GSO messages only above this packet rate: each message the bucket
# cuts delays the other traffic leaving the source's interface (irtt's probes beside
# 12 Mbit/s of 64-B packets, 23 k/s: RTT p50 775 µs with GSO, 336 µs a datagram a
# message; beside 80 Mbit/s 559 and 193 µs), and a datagram a message, 64 a call, keeps
# up to about 160 k packets/s here (82 Mbit/s of 64 B, paced) — GSO takes it to ~690 k.
GSO_ABOVE_PPS = 120_000
PACING_HANDLE = 30  # the bucket's qdisc handle (30:), in class 1:3 of an htb root 1:
OTHERS_RATE = "100gbit"  # the rest of the source's traffic: not held back

# --- trafgen -------------------------------------------------------------------------------


def _mac(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", text):
        raise LabError(f"not a MAC address: {text!r}")
    return text


def _address(text: str, node: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise LabError(f"{node}: its route gave {text[:60]!r}, not an IP address") from None


def packets(sizes: tuple[tuple[int, int], ...], dmac: str, smac: str, saddr: str,
            daddr: str, flows: int = 1) -> str:  # fmt: skip
    """trafgen's packet configuration of a mix: (IP size, packets per round), one round's
    packets interleaved — one of each size in turn while it has any left (7:4:1 goes
    S M L S M S M S M S S S) — each an Ethernet frame with an IPv4 UDP packet of that size
    from `saddr` to `daddr`, without DF (a gateway fragments what its tunnel cannot
    carry whole, as the lab's UDP workloads ask) and with an IP ID that counts up (each
    fragmented datagram its own); with several `flows` the source port steps through
    SOURCE_PORT… packet by packet. trafgen computes the IP and UDP checksums of each."""
    order = udpsend.interleaved(sizes)
    last = SOURCE_PORT + flows - 1
    sport = str(SOURCE_PORT) if flows == 1 else f"dinc({SOURCE_PORT}, {last})"
    lines = []
    for size in order:
        if size < MIN_IP_SIZE:
            raise LabError(f"trafgen: a {size}-byte IPv4 UDP packet is shorter than its "
                           f"headers ({MIN_IP_SIZE} B)")  # fmt: skip
        lines.append(f"{{ eth(da={dmac}, sa={smac}), ipv4(saddr={saddr}, daddr={daddr}, "
                     f"ttl=64, id=dinc(1, 65535)), udp(sp={sport}, dp={SINK_PORT}), "
                     f"fill(0x41, {size - IPV4_UDP}) }}")  # fmt: skip
    return "\n".join(lines) + "\n"


def delivered(buffers: int, ip_bytes: int, sizes: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(packets, IP packet bytes) that reached the sink, from its counter's (buffers,
    bytes). A gateway that coalesces the datagrams of a flow before the sink (ours
    writes them into its TUN device as one UDP GSO buffer: RFC 768 datagrams with one
    IP and UDP header for them all, segmented again on delivery) hands the sink's input
    hook one buffer for several packets, with one set of headers: the counter's bytes
    less one header per buffer are exactly the UDP payload that arrived. One size: that
    payload / the size's payload is the packets. A mix: the packets are estimated at the
    mix's mean payload (exact where nothing was coalesced: one buffer, one packet)."""
    payload = ip_bytes - IPV4_UDP * buffers
    n = sum(c for _, c in sizes)
    mean = sum((s - IPV4_UDP) * c for s, c in sizes) / n
    if mean <= 0:  # no payload: nothing to coalesce
        return buffers, ip_bytes
    packets = round(payload / mean) if len(sizes) > 1 else payload // round(mean)
    packets = max(packets, buffers)
    return packets, payload + IPV4_UDP * packets


class Paced:
    """A sender on the flow's source, paced by the lab's token bucket there, and an
    nftables counter on its sink: what trafgen and the lab's UDP sender share. `send`
    is each sender's own."""

    name = ""
    # a load beside latency probes (`beside_probes`): the sender's nice value
    niceness = 0

    def __init__(self, tb: Testbed, flow: Flow, flows: int = 1, why: str = "") -> None:
        self.tb, self.flow, self.flows, self.why = tb, flow, max(1, flows), why
        src = flow.source
        # The way the kernel would send to the sink: the interface, the next hop.
        route = json.loads(tb.run(src, ["ip", "-j", "route", "get", flow.sink_addr]))[0]
        self.dev = str(route["dev"])
        self.saddr = str(route.get("prefsrc") or "")
        self.hop = str(route.get("gateway") or flow.sink_addr)
        if not self.saddr:
            raise LabError(f"{src} has no source address towards {flow.sink_addr}")
        # what the host's routing table says goes into nft's rule and trafgen's packet
        # file (languages of their own): addresses only, as a MAC is only a MAC (_mac)
        self.saddr, self.hop = _address(self.saddr, src), _address(self.hop, src)
        link = json.loads(tb.run(src, ["ip", "-j", "link", "show", "dev", self.dev]))[0]
        if link.get("link_type") != "ether":  # the bucket counts Ethernet frames
            raise LabError(f"{self.name}: {src}'s {self.dev} is not Ethernet "
                           f"({link.get('link_type')})")  # fmt: skip
        self.mtu = int(link.get("mtu", 1500))
        self.smac = _mac(str(link["address"]))
        # trafgen writes the next hop's MAC into its frames; for udp-gso the kernel must
        # have it before the first datagram (an unresolved hop holds only 200 KiB of
        # them: the rest is lost, uncounted)
        self.dmac = self._neighbour(self.hop)
        self._counter_added = False
        self._paced = False
        self.burst = 0  # the bucket's depth in bytes, once paced
        self._add_counter()  # last: nothing after it can fail and leave it behind

    def _neighbour(self, hop: str) -> str:
        """The next hop's MAC, as the source's kernel resolves it (one ping fills the
        neighbour table; the reply is not needed, the resolution is)."""
        src = self.flow.source
        for _ in range(3):
            self.tb.run(src, ["ping", "-c", "1", "-W", "1", "-I", self.dev, hop],
                        timeout=10, check=False)  # fmt: skip
            out = json.loads(self.tb.run(src, ["ip", "-j", "neigh", "show", hop, "dev", self.dev]))
            for n in out:
                if n.get("lladdr") and "FAILED" not in n.get("state", []):
                    return _mac(str(n["lladdr"]))
            time.sleep(0.2)
        raise LabError(f"{src} cannot resolve the next hop {hop}'s MAC on {self.dev}")

    def send(self, sizes: tuple[tuple[int, int], ...], pps: int | None, count: int,
             timeout: float) -> tuple[int, float, float]:  # fmt: skip
        """Send `count` packets of the mix at `pps` (None: flat out, unpaced);
        (packets that left the source, seconds from the first packet until the last
        leaves the source, seconds of that still to come)."""
        raise NotImplementedError

    # --- the sink's counter ------------------------------------------------------------

    def _match(self) -> str:
        last = SOURCE_PORT + self.flows - 1
        sport = str(SOURCE_PORT) if self.flows == 1 else f"{SOURCE_PORT}-{last}"
        return (f"ip saddr {self.saddr} ip daddr {tunnels.nft_destinations(self.flow)} "
                f"udp sport {sport} udp dport {SINK_PORT}")  # fmt: skip

    def _add_counter(self) -> None:
        t, sink = NFT_TABLE, self.flow.sink
        if on_hosts(self.tb):  # a real host: the ledger first
            self.tb.record(sink, f"nftables table inet {t}", shlex.join(["nft", "delete", "table",
                                                                "inet", t]))  # fmt: skip
        self.tb.run(sink, [
            "nft", f"add table inet {t}; add counter inet {t} received; "
            f"add chain inet {t} input {{ type filter hook input priority -300; }}; "
            f"add rule inet {t} input {self._match()} counter name received drop",
        ])  # fmt: skip
        self._counter_added = True

    def received(self) -> tuple[int, int]:
        """(buffers, bytes) the sink's counter has seen so far: see `delivered`."""
        out = json.loads(self.tb.run(self.flow.sink, ["nft", "-j", "list", "counter", "inet",
                                                      NFT_TABLE, "received"]))  # fmt: skip
        for item in out.get("nftables", []):
            c = item.get("counter")
            if c:
                return int(c["packets"]), int(c["bytes"])
        raise LabError(f"{self.flow.sink}: the flow's nftables counter is gone")

    def _settled(self, first: tuple[int, int] | None = None) -> tuple[int, int]:
        """The sink's count once the path has emptied (bounded wait); `first`: a count
        read just now."""
        return steady(self.received, QUIET_S, SETTLE_EVERY_S, SETTLE_MAX_S, first=first)

    def beside_probes(self) -> None:
        """From now on the load beside latency probes: the sender at the lowest CPU
        priority (nice BACKGROUND_NICE), so on the traffic CPUs the probes — the
        instrument — never wait for the load's own process. (Beside 30 Mbit/s of 64-B
        packets through plain forwarding, placed, 3 runs each: irtt's RTT p99 4.1-4.8 ms
        with the sender at nice 0 — this kernel (PREEMPT_NONE, HZ 250) let a woken
        probe wait for the sender's tick — and 0.73-1.0 ms at nice 19, the load sending
        0.5 % less; the row says what it sent.)"""
        self.niceness = BACKGROUND_NICE

    def _niced(self, argv: list[str]) -> list[str]:
        return niced(argv, self.niceness)

    # --- pacing: a token bucket on the source's test interface -------------------------------

    def _pace(self, bytes_per_s: float, frame: int) -> None:
        """A token bucket at `bytes_per_s` (frames: IP packet + 14) for the flow alone on
        the source's test interface: an `htb` root whose default class, unlimited and
        served first, takes everything else (a latency probe never waits behind the
        generator's own backlog), and whose class 1:3, at the rate, the flow's packets (a
        u32 filter on its UDP destination port), into a tbf that paces them (htb alone
        sends a class's backlog in bursts of its quantum). At first after checking the
        interface has the kernel's default qdisc (never one the lab did not make), and on
        a real host with its undo in the ledger."""
        src, dev = self.flow.source, self.dev
        bits = f"{bytes_per_s * 8:.0f}bit"
        if not self._paced:
            kind = root_qdisc(self.tb, src, dev)
            if kind not in STOCK_QDISCS:
                raise LabError(f"{src}: {dev} has its own root qdisc ({kind}): trafgen's "
                               "pacing needs the kernel's default there, which the lab can "
                               "put back")  # fmt: skip
            if on_hosts(self.tb):
                # the device's name is the host's (its routing table's): quoted, as
                # every ledger line's values are (Linux allows `;` and `$(…)` in one)
                self.tb.record(src, f"{self.name}'s pacing qdisc on {dev}",
                       shlex.join(["tc", "qdisc", "del", "dev", dev, "root"]))  # fmt: skip
            self._paced = True
            quantum = str(self.mtu + ETHERNET)
            for argv in (
                ["qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1"],
                ["class", "replace", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                 "rate", OTHERS_RATE, "quantum", quantum, "prio", "0"],
                ["class", "replace", "dev", dev, "parent", "1:", "classid", "1:3", "htb",
                 "rate", bits, "quantum", quantum, "prio", "1"],
                ["filter", "replace", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                 "1", "u32", "match", "ip", "dport", str(SINK_PORT), "0xffff", "flowid", "1:3"],
            ):  # fmt: skip
                self.tb.run(src, ["tc", *argv])
        # the class twice as fast as the bucket: the tbf alone paces (two buckets at one
        # rate in a row let out less than it — 1.5 % less, measured)
        twice = f"{bytes_per_s * 16:.0f}bit"
        self.tb.run(src, ["tc", "class", "change", "dev", dev, "parent", "1:", "classid",
                          "1:3", "htb", "rate", twice, "ceil", twice, "quantum",
                          str(self.mtu + ETHERNET), "prio", "1"])  # fmt: skip
        # a bucket below the device's MTU is refused by the kernel's complaint in its log
        depth = min(bytes_per_s * PACING_BURST_S, PACING_BURST_FRAMES * frame)
        burst = max(self.mtu + ETHERNET, 2 * frame, round(depth))
        self.burst = burst
        self.tb.run(src, ["tc", "qdisc", "replace", "dev", dev, "parent", "1:3", "handle",
                          f"{PACING_HANDLE}:", "tbf", "rate", bits, "burst", str(burst),
                          "limit", str(PACING_LIMIT_BYTES)])  # fmt: skip

    def _unpace(self) -> None:
        if self._paced:
            self._paced = False
            self.tb.run(self.flow.source, ["tc", "qdisc", "del", "dev", self.dev, "root"],
                        check=False)  # fmt: skip

    def bucket(self) -> dict[str, Any]:
        """The pacing bucket's qdisc as `tc -s -j` shows it (its packets: what of the
        flow left the source; its drops: what never did)."""
        out = self.tb.run(self.flow.source, ["tc", "-s", "-j", "qdisc", "show", "dev",
                                             self.dev])  # fmt: skip
        for q in json.loads(out or "[]"):
            if q.get("kind") == "tbf" and q.get("handle") == f"{PACING_HANDLE}:":
                return q  # type: ignore[no-any-return]
        raise LabError(f"{self.flow.source}: {self.dev} is not paced (no tbf of the lab's)")

    def sent(self) -> int:
        """Packets of the flow the pacing bucket has let out so far."""
        return int(self.bucket().get("packets", 0))

    def left_so_far(self) -> int:
        """Packets of the flow the bucket has let out so far (0: no bucket yet)."""
        try:
            return self.sent()
        except LabError:
            return 0

    def until_sending(self, since: int, alive: Callable[[], bool], within: float) -> None:
        """Until the bucket has let out more than `since` packets: a send started in
        another thread is under way (a program's start takes seconds over SSH or under
        the micro-VM's emulation: a fixed lead would measure before the load). Returns
        at once when `alive()` turns false (the sender's thread ended: its caller reads
        why); LabError when nothing left within `within` s."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and alive():
            if self.left_so_far() > since:
                return
            time.sleep(0.05)
        if alive():
            raise LabError(f"{self.name} on {self.flow.source} sent nothing within {within:g} s")

    def _start(self, sizes: tuple[tuple[int, int], ...], pps: int | None) -> dict[str, Any]:
        """Before a send: the bucket at `pps` (None: no bucket); its counts now."""
        if pps is None:
            self._unpace()
            return {}
        mean = sum(s * n for s, n in sizes) / sum(n for _, n in sizes)
        self._pace(pps * (mean + ETHERNET), max(s for s, _ in sizes) + ETHERNET)
        return self.bucket()

    def _finish(self, sent: int, took: float, pps: int | None,
                before: dict[str, Any]) -> tuple[int, float, float]:  # fmt: skip
        """`send`'s answer from what the sender says it handed over in `took` seconds:
        the sender's time ends when it handed over its last packet, a socket buffer's
        worth before the bucket let it out — what the bucket still holds then leaves at
        the bucket's rate; what the bucket dropped never left."""
        if pps is None:
            return sent, took, 0.0
        after = self.bucket()
        sent -= int(after.get("drops", 0)) - int(before.get("drops", 0))
        out_now = int(after.get("packets", 0)) - int(before.get("packets", 0))
        rest = max(sent - out_now, 0) / pps  # what the bucket still holds
        return sent, took + rest, rest

    def _row(self, sizes: tuple[tuple[int, int], ...], rate_mbit: float,
             seconds: float) -> Row:  # fmt: skip
        mean = sum(s * n for s, n in sizes) / sum(n for _, n in sizes)
        pps = max(1, round(rate_mbit * 1e6 / (8 * mean)))
        count = max(1, round(pps * seconds))
        p0, b0 = self.received()
        sent, took, rest = self.send(sizes, pps, count, timeout=seconds * 3 + 30)
        t1 = time.monotonic()
        # The bucket lets nothing out faster than the rate: the packets took at least
        # count / pps to leave; longer, and the generator could not keep the bucket busy
        # (generator-bound).
        took = max(took, count / pps)
        # What the path delivered while the trial offered it (RFC 2285's forwarding
        # rate): read when the bucket has let the last packet out. What an overloaded
        # gateway still holds in its queues arrives after: not lost, but not forwarded
        # in the trial's time either (counted in, a 0.1-CPU gateway's 500-packet TUN
        # queue drained into a 1 s trial made its rate at overload 50 % too high).
        time.sleep(max(t1 + rest + IN_FLIGHT_S - time.monotonic(), 0.0))
        pw, bw = self.received()
        in_window, window_bytes = delivered(pw - p0, bw - b0, sizes)
        p1, b1 = self._settled((pw, bw))
        got, ip_bytes = delivered(p1 - p0, b1 - b0, sizes)
        sent_bytes = sent * mean  # a mix's rounds are whole but for its last one
        lost = max(sent - got, 0)
        return {
            "offered_mbps": rate_mbit,
            "sent_mbps": sent_bytes * 8 / took / 1e6,
            "sender_packets": sent,
            "sent_packets": sent,
            "lost_packets": lost,
            "loss_pct": 100.0 * lost / sent if sent else 100.0,
            # a packet counted twice (duplicated on the way) is not payload twice
            "extra_packets": max(got - sent, 0),
            "payload_bytes": max(ip_bytes - got * IPV4_UDP, 0),
            "seconds": took,
            # inner IP packet bits delivered in the trial's time
            "mbps": min(window_bytes, ip_bytes) * 8 / took / 1e6,
            "late_packets": max(got - in_window, 0),  # arrived after the trial's time
            "generator": self.name,
        }

    def trial(self, size: int, rate_mbit: float, seconds: float) -> Row:
        return {"size": size, **self._row(((size, 1),), rate_mbit, seconds)}

    def mix(self, sizes: tuple[tuple[int, int], ...], rate_mbit: float, seconds: float) -> Row:
        return self._row(sizes, rate_mbit, seconds)

    def flat_out(self, size: int, count: int) -> Row:
        """`count` packets as fast as trafgen goes (its TX_RING, one core): what the
        generator can do here, and what reached the sink."""
        p0, b0 = self.received()
        sent, took, _ = self.send(((size, 1),), None, count, timeout=count / 1e4 + 30)
        p1, b1 = self._settled()
        took = max(took, 1e-6)
        got, _ = delivered(p1 - p0, b1 - b0, ((size, 1),))
        return {"size": size, "sender_packets": sent, "received_packets": got,
                "sent_pps": sent / took, "seconds": took,
                "sent_mbps": sent * size * 8 / took / 1e6, "generator": self.name}  # fmt: skip

    def close(self) -> None:
        self._unpace()
        if self._counter_added:
            self._counter_added = False
            self.tb.run(self.flow.sink, ["nft", "delete", "table", "inet", NFT_TABLE],
                        check=False)  # fmt: skip


class Trafgen(Paced):
    """netsniff-ng's trafgen on the flow's source: Ethernet frames it builds itself, on a
    packet socket below the source's IP stack (paced: one frame per system call)."""

    name = "trafgen"

    def __init__(self, tb: Testbed, flow: Flow, flows: int = 1, why: str = "") -> None:
        self._configs: dict[tuple[tuple[int, int], ...], str] = {}
        super().__init__(tb, flow, flows, why)

    def config(self, sizes: tuple[tuple[int, int], ...]) -> str:
        """The trafgen packet file of a mix (`packets`), pushed to the source once."""
        if sizes not in self._configs:
            text = packets(sizes, self.dmac, self.smac, self.saddr, self.flow.sink_addr,
                           self.flows)  # fmt: skip
            name = "-".join(f"{s}x{n}" for s, n in sizes)
            self._configs[sizes] = self.tb.file_for(self.flow.source, f"trafgen/{name}.cfg",
                                                    text.encode())  # fmt: skip
        return self._configs[sizes]

    def send(self, sizes: tuple[tuple[int, int], ...], pps: int | None, count: int,
             timeout: float) -> tuple[int, float, float]:  # fmt: skip
        argv = ["trafgen", "--dev", self.dev, "--conf", self.config(sizes), "--num", str(count),
                "--cpus", "1", "--no-sock-mem", "--notouch-irq"]  # fmt: skip
        before = self._start(sizes, pps)
        if pps is not None:
            # `--gap 0`: trafgen's packet-at-a-time path, whose send blocks while the
            # socket's buffer is full (its TX_RING's flush fails with EAGAIN instead);
            # flat out it goes past the qdisc through its TX_RING
            argv += ["--qdisc-path", "--gap", "0"]
        # trafgen makes a scratch file (`.tmp_mmap.*`, mapped shared, unlinked at once) in
        # its working directory: run it in a tmpfs (the micro-VM's root, where a lab
        # command's working directory is, is read-only, and its shared 9p directories
        # cannot be mapped so)
        argv = self._niced(["sh", "-c", 'cd /dev/shm 2>/dev/null || cd /tmp && exec "$@"', "sh",
                            *argv])  # fmt: skip
        out = self.tb.run(self.flow.source, argv, timeout=timeout)
        sent_m = re.search(r"(\d+) packets outgoing", out)
        took_m = re.search(r"(\d+) sec, (\d+) usec on CPU", out)
        if not sent_m or not took_m:
            raise LabError(f"trafgen on {self.flow.source} gave no count: {out[-400:]}")
        took = int(took_m.group(1)) + int(took_m.group(2)) / 1e6
        return self._finish(int(sent_m.group(1)), took, pps, before)


class UdpGso(Paced):
    """The lab's UDP sender (`udpsend.py`) on the flow's source: datagrams of the
    source's own IP stack, many per system call — `sendmmsg` of a datagram a message,
    and above GSO_ABOVE_PPS of one size UDP GSO messages, which the same bucket as
    trafgen's paces and cuts into their datagrams. It needs a Python 3 there. Flat out
    (no bucket) it sends a message per datagram. `gso`: whether the last send used UDP
    GSO (the sender says)."""

    name = "udp-gso"
    gso = False
    # a latency or soak background goes without GSO: its messages cut at the bucket delay
    # the probes beside them (GSO_ABOVE_PPS); such a load reaches ~160 k packets/s here
    # at most, and its row says what it sent
    gso_allowed = True

    def beside_probes(self) -> None:
        super().beside_probes()
        self.gso_allowed = False

    def __init__(self, tb: Testbed, flow: Flow, flows: int = 1, why: str = "") -> None:
        self.script = tb.file_for(flow.source, "udpsend.py", _udpsend_source())
        self.python = tb.python(flow.source)
        super().__init__(tb, flow, flows, why)

    def send(self, sizes: tuple[tuple[int, int], ...], pps: int | None, count: int,
             timeout: float) -> tuple[int, float, float]:  # fmt: skip
        before = self._start(sizes, pps)
        mix = ",".join(f"{s}x{n}" for s, n in sizes)
        # -I -S: the standard library alone (no site, no user directories); a start
        # costs seconds under the micro-VM's emulation
        argv = [self.python, "-I", "-S", self.script, "--dst", self.flow.sink_addr,
                "--dport", str(SINK_PORT), "--sport", str(SOURCE_PORT), "--flows",
                str(self.flows), "--sizes", mix, "--count", str(count)]  # fmt: skip
        if self.flow.destinations > 1:  # one more per tunnel past the first
            argv += ["--more-dsts", f"{tunnels.far_address(0)}:{self.flow.destinations - 1}"]
        # Each GSO message must be cut into its datagrams before it leaves: the bucket
        # cuts what is larger than its depth and lets a smaller one out whole, which a
        # veth would carry on as one buffer. So every message is larger than the
        # bucket's depth; unpaced, none is a GSO message; nor below GSO_ABOVE_PPS.
        gso = self.gso_allowed and pps is not None and pps > GSO_ABOVE_PPS
        argv += ["--gso-over", str(self.burst)] if gso else ["--no-gso"]
        # its own bound too: the lab's ends only the shell that started it on a host
        argv += ["--deadline", f"{max(timeout - 5, 1):g}"]
        out = self.tb.run(self.flow.source, self._niced(argv), timeout=timeout)
        try:
            said = json.loads(out.strip().splitlines()[-1])
            sent, took = int(said["sent"]), float(said["seconds"])
            self.gso = bool(said["gso"])
        except (IndexError, ValueError, KeyError, TypeError):
            raise LabError(f"udp-gso on {self.flow.source} gave no count: {out[-400:]}") from None
        return self._finish(sent, took, pps, before)


def _udpsend_source() -> bytes:
    return Path(udpsend.__file__).read_bytes()
