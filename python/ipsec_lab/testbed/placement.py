"""Where each role of a campaign on one machine runs: the traffic (generator, sink, probes,
iperf3, the applications' clients and servers) on one set of CPUs, the IPsec under test
(ours' processes, strongSwan's charon, the gateways' kernel receive work) on another.

On one machine every role shares its cores unless placed, and the faster generator then
takes the gateway's core: measured on 2 cores, `ours`' 64-B NDR went 15.2 → 42.7 Mbit/s
with only the gateways kept to CPU 1. FD.io CSIT pins the device's workers and the
traffic generator to separate cores for the same reason.

Processes are pinned by their affinity (inherited by what they start); the kernel's
receive work on each node's interfaces is steered with RPS (`rps_cpus` of every receive
queue: a veth's packets are then processed on those CPUs, not the sender's). What a
process's affinity cannot reach — a timer's softirq, the sender's own transmit path — is
the kernel's to place: a placed run is separated, not isolated."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ipsec_lab.testbed import Topology

MODES = ("auto", "off")


@dataclass(frozen=True)
class Placement:
    """`mode`: `auto` (chosen per machine), `gateway` (the scenario's `[gateway] cpus`
    for the IPsec, the rest for traffic), `off` (nothing placed), `hosts` (real hosts:
    their own). `why`: a sentence for `check` and the rows' notes."""

    mode: str
    traffic: tuple[int, ...] = ()
    dut: tuple[int, ...] = ()
    why: str = ""

    @property
    def placed(self) -> bool:
        return bool(self.traffic and self.dut)

    @property
    def shared(self) -> bool:
        """Whether the IPsec under test may run on a CPU the traffic runs on (on real
        hosts each role has its own machine: not shared)."""
        if self.mode == "hosts":
            return False
        return not self.placed or bool(set(self.traffic) & set(self.dut))

    def record(self) -> dict[str, object]:
        """What every row of the run says of it."""
        return {
            "placement": self.mode,
            "traffic_cpus": list(self.traffic),
            "dut_cpus": list(self.dut),
            "dut_shared_cores": self.shared,
        }

    def describe(self) -> str:
        if self.mode == "hosts":
            return "placement: the hosts' own (each role on its own machine)"
        if not self.placed:
            return f"placement: off — every role shares every CPU ({self.why})"
        line = f"placement: traffic on CPU {_cpus(self.traffic)}, IPsec on CPU {_cpus(self.dut)}"
        if self.shared:
            line += " — they overlap: the IPsec shares a core with the traffic"
        return f"{line} ({self.why})" if self.why else line


def _cpus(cpus: Sequence[int]) -> str:
    return ",".join(map(str, cpus))


def cpu_mask(cpus: Sequence[int]) -> str:
    """`cpus` as the hexadecimal mask sysfs takes (`rps_cpus`), in 32-bit words."""
    bits = 0
    for c in cpus:
        bits |= 1 << c
    words = []
    while True:
        words.append(f"{bits & 0xFFFFFFFF:08x}")
        bits >>= 32
        if not bits:
            break
    return ",".join(reversed(words))


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or a taskset's, not the machine's
    count)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def choose(mode: str, gateway_cpus: Sequence[int] = (), cpus: Sequence[int] | None = None,
           quota: float | None = None) -> Placement:  # fmt: skip
    """The placement of a campaign on this machine. `auto`: with `[gateway] cpus` the
    IPsec there and the traffic on the other allowed CPUs; else on 2-3 CPUs the traffic on
    the first and the IPsec on the rest, on 4 or more a quarter for traffic (the generator
    is one process per flow set, iperf3 two). One CPU, or a CPU quota above what the
    IPsec's CPUs would hold: off."""
    have = tuple(cpus) if cpus is not None else allowed_cpus()
    if mode == "off":
        return Placement("off", why='the scenario\'s placement = "off"')
    if gateway_cpus:
        dut = tuple(gateway_cpus)
        rest = tuple(c for c in have if c not in dut)
        if not rest:
            return Placement("gateway", dut, dut, why="[gateway] cpus takes every CPU")
        return Placement("gateway", rest, dut, why="[gateway] cpus")
    if len(have) < 2:
        return Placement("off", why=f"{len(have)} CPU allowed")
    n = max(1, len(have) // 4)
    traffic, dut = have[:n], have[n:]
    if quota and quota > len(dut):
        # pinned, the IPsec could not use the quota it was given
        return Placement("off", why=f"[gateway] cpu_quota {quota:g} is more than the "
                                    f"{len(dut)} CPU(s) placement would leave it")  # fmt: skip
    return Placement("auto", traffic, dut, why=f"{len(have)} CPUs")


def placement_of(mode: str, gateway_cpus: Sequence[int], quota: float | None,
                 on_hosts: bool) -> Placement:  # fmt: skip
    """A scenario's placement (its `placement`, `[gateway] cpus` and `cpu_quota`): the
    hosts' own on real hosts, else chosen for this machine's CPUs."""
    if on_hosts:
        return Placement("hosts")
    return choose(mode, gateway_cpus, quota=quota)


class _Runs(Protocol):
    def run(self, node: str, argv: Sequence[str], timeout: float = 60, check: bool = True,
            limited: bool = False) -> str: ...  # fmt: skip


def steer(tb: _Runs, topo: Topology, p: Placement) -> None:
    """The kernel's receive work on each wire end on its node's role's CPUs (RPS): a
    gateway's forwarding and IPsec on the IPsec's, the client's and server's stacks on
    the traffic's. Without it a veth's packets are processed on the CPU that sent them —
    the generator's."""
    for w in topo.wires:
        for node, ifname in ((w.a, w.a_if), (w.b, w.b_if)):
            cpus = p.dut if node in topo.ipsec_nodes else p.traffic
            queues = Path("/sys/class/net", ifname, "queues")
            tb.run(node, ["sh", "-c", 'for q in "$1"/rx-*; do echo "$2" > "$q/rps_cpus"; done',
                          "sh", str(queues), cpu_mask(cpus)])  # fmt: skip
