"""The UDP traffic generator of the udp, imix, rfc2544, latency and soak workloads: the
lab's own UDP sender (`udp-gso`, `udpsend.py`: many datagrams per system call, UDP GSO
above 120 k packets/s) or netsniff-ng's `trafgen` (Debian `netsniff-ng`) where a paced
generator can go, else iperf3 (`choose`). Below: why a paced one, and how pacing works —
the paced generators themselves are in `paced`.

iperf3's UDP sender writes one datagram per system call: at 64 B it runs out of packets
a second before a gateway does, and an RFC 2544 search through the gateway then measures
iperf3. trafgen builds the frames itself (Ethernet, IPv4, UDP) and hands them to the
kernel at the source's test interface through a packet socket; `-n` bounds the count.
`benchmarks/generator_ndr.py` measures both here.

Pacing is the kernel's, not trafgen's. trafgen's own rate (`-b Npps`) sends a second's
packets back to back and then sleeps out the second (its SHAPER_PKTS): at 1000 packets/s
a 500-packet TUN queue in the gateway lost half of every trial. Its gap (`-t`) sleeps
per packet and topped out at 45 k packets/s here, below iperf3. So a paced trial gives the
flow a token bucket (tc `tbf`) at the offered rate on the source's test interface — in an
`htb` class of its own, everything else (a latency probe) in another class served first —
and trafgen writes into it through the qdisc (`--qdisc-path`, one send at a time): the
socket's send buffer (~270 frames) pushes back on trafgen while the bucket lets the frames
out at the rate — 200 000 packets at 100 k/s came out in 2.03 s, 1000 ± 2 per 10 ms, none
dropped at the bucket. The bucket's own count is what left the source; its drops do not
count as sent. Flat out (no rate), trafgen goes past the qdisc through its TX_RING.

Nothing receives the packets: the sink counts the flow's 5-tuple with an nftables counter
at its input hook (then drops them, so no ICMP "port unreachable" flows back), so no
user-space receiver sits in the path and stray packets do not count. A gateway that
coalesces a flow's datagrams into one UDP GSO buffer before the sink (ours) is counted by
the payload bytes that arrived (`delivered`).

Where trafgen cannot go: it writes frames below the source's IP stack, so a source that
does its own IPsec (host-to-host, the `pair` and `clients` topologies) would not see them
and they would leave in clear. There only iperf3 is used (`choose` says why).

On one machine the generator's work competes with the gateways' differently: trafgen
pins itself to CPU 0, and the bucket's timer moves the packets on (and the forwarding
they cause) in softirq there, which no scheduler moves aside; iperf3's sends are its own
process's time. A gateway worker sharing CPU 0 then falls behind its TUN queue sooner:
ours at 64 B lost 1.2 % at 70 Mbit/s with its gateways free to use either CPU and
nothing with them kept to CPU 1 (its NDR: about 54 Mbit/s with trafgen, 88 with
iperf3). On real hosts the generator has a machine of its own.

trafgen is run with `--no-sock-mem` and `--notouch-irq`: by default it rewrites the
machine's socket-memory sysctls and its NIC's IRQ affinity, neither of them the lab's to
change on a host it does not own (and a namespace cannot write the first).
"""

from __future__ import annotations

import shlex
import shutil
from typing import Protocol

from ipsec_lab.testbed import Flow
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed, on_hosts
from ipsec_lab.traffic import Row
from ipsec_lab.traffic.iperf import IperfGenerator
from ipsec_lab.traffic.paced import Trafgen, UdpGso
from ipsec_lab.traffic.workload import Workload


class Generator(Protocol):
    """What a UDP workload asks of its generator."""

    name: str

    def trial(self, size: int, rate_mbit: float, seconds: float) -> Row:
        """Offer `rate_mbit` of `size`-byte IP packets for `seconds`: a row with `size`,
        `offered_mbps`, `sent_mbps` (what the sender managed), `sender_packets`,
        `sent_packets`, `lost_packets`, `loss_pct`, `payload_bytes`, `seconds`, `mbps`
        (inner IP packet bits delivered per second) and `generator`."""
        ...

    def mix(self, sizes: tuple[tuple[int, int], ...], rate_mbit: float, seconds: float) -> Row:
        """A mix of (size, packets in each round) at `rate_mbit` in all."""
        ...

    def close(self) -> None: ...


def _has(tb: Testbed, node: str, tool: str) -> bool:
    """Whether `tool` is there for programs in `node` (a real host: asked over SSH)."""
    if not on_hosts(tb):  # the namespaces share this machine's programs
        return shutil.which(tool) is not None
    out = tb.run(node, ["sh", "-c", f"command -v {shlex.quote(tool)} || true"], timeout=15)
    return bool(out.strip())


def _python_for_udpsend(tb: Testbed, node: str) -> bool:
    """Whether `node`'s python3 runs udpsend.py: 3.8 or later (it uses `:=`), with ctypes
    (python3-minimal has none), as the lab runs it (`-I -S`)."""
    probe = "import sys, ctypes, argparse, json; sys.exit(sys.version_info < (3, 8))"
    out = tb.run(node, ["sh", "-c", 'python3 -I -S -c "$1" 2>/dev/null && echo ok || true',
                        "sh", probe], timeout=30)  # fmt: skip
    return out.strip() == "ok"


def refusal(tb: Testbed, flow: Flow, name: str) -> str | None:
    """Why the paced generator `name` (trafgen, udp-gso) cannot drive `flow` on this
    testbed (None: it can). Both are paced by a bucket on the source's test interface
    and counted at the sink: a source that does its own (host-to-host) IPsec would have
    the bucket on its IPsec's device — and trafgen's frames, written below its IP stack,
    would leave in clear."""
    if flow.source in tb.topo.ipsec_nodes:
        if name == "trafgen":
            return (f"trafgen writes frames below {flow.source}'s IP stack, where its own "
                    "(host-to-host) IPsec would not see them")  # fmt: skip
        return (f"{name} is paced on the source's test interface, which on {flow.source} "
                "is its own (host-to-host) IPsec's")  # fmt: skip
    if name == "trafgen" and flow.destinations > 1:
        return (f"the lab's trafgen packets have one destination, not the "
                f"{flow.destinations} tunnels' (udp-gso spreads them)")  # fmt: skip
    if name == "trafgen" and not _has(tb, flow.source, "trafgen"):
        return f"no trafgen on {flow.source} (Debian package netsniff-ng)"
    if name == "udp-gso" and on_hosts(tb) and not _python_for_udpsend(tb, flow.source):
        return (f"no Python 3.8 or later with ctypes on {flow.source} for the lab's UDP "
                "sender (Debian package python3)")  # fmt: skip
    if not _has(tb, flow.sink, "nft"):
        return f"no nft on {flow.sink} to count the flow (Debian package nftables)"
    return None


# auto's order: the fastest paced sender first (benchmarks/generator_ndr.py measures them)
PACED = ("udp-gso", "trafgen")


def choose(tb: Testbed, flow: Flow, want: str) -> tuple[str, str]:
    """The generator for `flow` (`want`: auto, udp-gso, trafgen or iperf3) and why:
    auto takes the first of PACED that can go, iperf3 elsewhere; a paced one asked for
    where it cannot go is an error naming why."""
    if flow.destinations > 1 and want in ("iperf3", "auto") and refusal(tb, flow, "udp-gso"):
        raise LabError(f"a flow over {flow.destinations} tunnels needs udp-gso: "
                       + (refusal(tb, flow, "udp-gso") or ""))  # fmt: skip
    if flow.destinations > 1 and want == "iperf3":
        raise LabError(f"iperf3 sends to one address, not over {flow.destinations} tunnels")
    if want == "iperf3":
        return "iperf3", "asked for"
    if want in PACED:
        why = refusal(tb, flow, want)
        if why is not None:
            raise LabError(f"generator {want}: {why}")
        return want, "asked for"
    whys = []
    for name in PACED:
        why = refusal(tb, flow, name)
        if why is None:
            return name, "the fastest here"
        if why not in whys:
            whys.append(why)
    return "iperf3", "; ".join(whys)


def make(tb: Testbed, flow: Flow, want: str, flows: int = 1) -> Generator:
    """The generator `choose` picks, ready (its servers or counters set up)."""
    name, why = choose(tb, flow, want)
    if name == "trafgen":
        return Trafgen(tb, flow, flows, why)
    if name == "udp-gso":
        return UdpGso(tb, flow, flows, why)
    return IperfGenerator(tb, flow, why)


def for_workload(tb: Testbed, flow: Flow, w: Workload) -> Generator:
    """The workload's generator (`make`: auto, trafgen or iperf3), ready."""
    return make(tb, flow, w.generator, w.flows)


def noted(row: Row, gen: Generator) -> Row:
    """A row with what generated it, and why that one."""
    row["generator"] = gen.name
    why = getattr(gen, "why", "")
    if why:
        row["generator_note"] = why
    return row
