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
from ipsec_lab.units import plural

MODES = ("auto", "off")


@dataclass(frozen=True)
class Placement:
    """`mode`: `auto` (chosen per machine), `gateway` (the scenario's `[gateway] cpus`
    for the IPsec, the rest for traffic), `off` (traffic unplaced; the IPsec on `[gateway]
    cpus` if given), `hosts` (real hosts: their own). `why`: a sentence for `check` and
    the rows' notes; `overlap`: why the roles meet on a CPU all the same (host-to-host
    topologies, trafgen's own pinning)."""

    mode: str
    traffic: tuple[int, ...] = ()
    dut: tuple[int, ...] = ()
    why: str = ""
    overlap: str = ""

    @property
    def placed(self) -> bool:
        return bool(self.traffic and self.dut)

    @property
    def shared(self) -> bool:
        """Whether the IPsec under test may run on a CPU the traffic runs on."""
        if self.overlap:
            return True
        if self.mode == "hosts":
            return False  # each role on a machine of its own
        return not self.placed or bool(set(self.traffic) & set(self.dut))

    def record(self) -> dict[str, object]:
        """What every row of the run says of it."""
        return {
            "placement": self.mode,
            "traffic_cpus": list(self.traffic),
            "dut_cpus": list(self.dut),
            "dut_shared_cores": self.shared,
            "shared_why": self.shared_why(),
        }

    def shared_why(self) -> str:
        """Why the IPsec shares the traffic's CPUs (empty when it does not)."""
        if not self.shared:
            return ""
        if self.overlap:
            return self.overlap
        if not self.placed:
            return f"placement off: {self.why}"
        return f"the traffic's and the IPsec's CPUs overlap: {self.why}"

    def describe(self) -> str:
        if self.mode == "hosts":
            line = "placement: the hosts' own (each role on its own machine)"
        elif not self.placed:
            pinned = f" (the IPsec pinned to CPU {_cpus(self.dut)})" if self.dut else ""
            line = f"placement: off — the traffic runs on every CPU{pinned}"
        else:
            line = (f"placement: traffic on CPU {_cpus(self.traffic)}, IPsec on CPU "
                    f"{_cpus(self.dut)}")  # fmt: skip
        return f"{line}; SHARED: {self.shared_why()}" if self.shared else line


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
           quota: float | None = None, trafgen: bool = False) -> Placement:  # fmt: skip
    """The placement of a campaign on this machine. `auto`: with `[gateway] cpus` the
    IPsec there and the traffic on the other allowed CPUs; else on 2-3 CPUs the traffic on
    the first and the IPsec on the rest, on 4 or more a quarter for traffic (the generator
    is one process per flow set, iperf3 two). One CPU, or a CPU quota above what the
    IPsec's CPUs would hold: off. `trafgen`: the campaign drives trafgen, whose worker
    pins itself to CPU 0 — shared when CPU 0 is not the traffic's."""
    have = tuple(cpus) if cpus is not None else allowed_cpus()
    if mode == "off":
        return Placement("off", dut=tuple(gateway_cpus), why='the scenario\'s placement = "off"')
    if gateway_cpus:
        dut = tuple(gateway_cpus)
        traffic = tuple(c for c in have if c not in dut)
        if not traffic:
            return Placement("gateway", dut, dut, why="[gateway] cpus takes every CPU")
        p = Placement("gateway", traffic, dut, why="[gateway] cpus")
    elif len(have) < 2:
        return Placement("off", why=f"{len(have)} CPU allowed")
    else:
        n = max(1, len(have) // 4)
        p = Placement("auto", have[:n], have[n:], why=f"{len(have)} CPUs")
        if quota and quota > len(p.dut):
            # pinned, the IPsec could not use the quota it was given
            why = (
                f"[gateway] cpu_quota {quota:g} is more than its {plural(len(p.dut), 'CPU')} placed"
            )
            return Placement("off", why=why)
    if trafgen and 0 not in p.traffic:
        return Placement(p.mode, p.traffic, p.dut, p.why,
                         overlap="trafgen pins its worker to CPU 0, not a traffic CPU")  # fmt: skip
    return p


HOST_TO_HOST = ("host to host: each host's kernel does its IPsec and its traffic's work "
                "alike (placement separates the IPsec's processes only)")  # fmt: skip


def placement_of(mode: str, gateway_cpus: Sequence[int], quota: float | None,
                 on_hosts: bool, host_to_host: bool = False,
                 trafgen: bool = False) -> Placement:  # fmt: skip
    """A scenario's placement (its `placement`, `[gateway] cpus` and `cpu_quota`): the
    hosts' own on real hosts, else chosen for this machine's CPUs. `host_to_host`: the
    traffic's ends are IPsec nodes themselves (`pair`, `clients`)."""
    p = Placement("hosts") if on_hosts else choose(mode, gateway_cpus, quota=quota,
                                                   trafgen=trafgen)  # fmt: skip
    if host_to_host and not p.overlap:
        return Placement(p.mode, p.traffic, p.dut, p.why, overlap=HOST_TO_HOST)
    return p


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
