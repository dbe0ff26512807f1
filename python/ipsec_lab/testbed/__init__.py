"""Topologies as data: nodes, wires, addresses, routes, the tunnels IPsec makes and the
flows traffic takes. Building one (namespaces, veth, tc) is `testbed.build`.

Addresses: inner subnets 10.x, outer links in the documentation ranges (RFC 5737), so a
capture shows at a glance which side of a gateway a packet is on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Wire:
    """A veth pair between two nodes. `shaped` wires get the link profile on both ends."""

    a: str
    a_if: str
    a_addr: str  # address/prefix
    b: str
    b_if: str
    b_addr: str
    shaped: bool = False
    mtu: int = 1500
    # Each end's key in a hosts file (`inside`, `outside`, …): which of a real host's
    # interfaces plays this end (ipsec_lab.hosts).
    a_side: str = "outside"
    b_side: str = "outside"


@dataclass(frozen=True)
class Tunnel:
    """What the IPsec backend protects: between two IPsec nodes' outer addresses, the
    traffic from `left_ts` to `right_ts` (tunnel mode; host-to-host when the selectors are
    the hosts' own /32s)."""

    left: str
    right: str
    left_outer: str
    right_outer: str
    left_ts: str
    right_ts: str

    def seen_from(self, node: str) -> End:
        """The tunnel as one of its ends, `node`, configures it: its own outer address and
        selector first, the peer's second (each backend's configuration mirrors so)."""
        if node not in (self.left, self.right):
            raise ValueError(f"{node} is not an end of the tunnel {self.left}-{self.right}")
        if node == self.left:
            return End(True, self.left, self.right, self.left_outer, self.right_outer,
                       self.left_ts, self.right_ts)  # fmt: skip
        return End(False, self.right, self.left, self.right_outer, self.left_outer,
                   self.right_ts, self.left_ts)  # fmt: skip


@dataclass(frozen=True)
class End:
    """A tunnel from one end (`Tunnel.seen_from`): `left` whether it is the left end."""

    left: bool
    node: str
    peer: str
    outer: str  # its own outer address
    peer_outer: str
    ts: str  # its own traffic selector (the traffic it sends from)
    peer_ts: str


@dataclass(frozen=True)
class Flow:
    """Where a workload's traffic goes: from a program on `source` to one on `sink`."""

    name: str
    source: str
    sink: str
    sink_addr: str
    wire_end: str  # `node/ifname` whose counters are this flow's wire load (outer side)
    slow: bool = False  # the source is the slow (CPU-limited) client of study 4
    # over how many tunnels the flow is spread: the sink's address and, past 1, that many
    # less one of `testbed.tunnels.FAR` (the line testbed's many-tunnel form)
    destinations: int = 1


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: tuple[str, ...]
    wires: tuple[Wire, ...]
    routes: tuple[tuple[str, str, str], ...]  # (node, destination, via)
    forwarding: tuple[str, ...]  # nodes that route between their interfaces
    ipsec_nodes: tuple[str, ...]  # where the backend runs
    limited_nodes: tuple[str, ...]  # whose IPsec (and, for clients, traffic) gets the CPU quota
    tunnels: tuple[Tunnel, ...]
    flows: tuple[Flow, ...]

    def shaped_ends(self) -> list[tuple[str, str]]:
        """(node, interface) of every end of every shaped wire."""
        out: list[tuple[str, str]] = []
        for w in self.wires:
            if w.shaped:
                out += [(w.a, w.a_if), (w.b, w.b_if)]
        return out


# The gateways' link is a real link's 1500 bytes: the IPsec under test must fit its
# packets to it (ours: `mtu = "auto"`, the path's less the SAs' overhead; the kernel's
# xfrm does the same), as on the hosts users measure. A link's `mtu` key changes it (1600
# lets a whole 1500-byte inner packet plus IPsec through, for a study that needs that).
OUTER_MTU = 1500
INNER_MTU = 1500


def _addr(cidr: str) -> str:
    return cidr.split("/", 1)[0]


def pair() -> Topology:
    """Study 1: two hosts on one link, each doing its own IPsec (host-to-host)."""
    a, b = "192.0.2.1/24", "192.0.2.2/24"
    return Topology(
        name="pair",
        nodes=("hostA", "hostB"),
        wires=(Wire("hostA", "eth0", a, "hostB", "eth0", b, shaped=True),),
        routes=(),
        forwarding=(),
        ipsec_nodes=("hostA", "hostB"),
        limited_nodes=("hostA", "hostB"),
        tunnels=(Tunnel("hostA", "hostB", _addr(a), _addr(b), f"{_addr(a)}/32", f"{_addr(b)}/32"),),
        flows=(Flow("hostA-hostB", "hostA", "hostB", _addr(b), "hostA/eth0"),),
    )


def line() -> Topology:
    """Studies 2 and 3: client - gwA - gwB - server; the gateways' link is the shaped one."""
    return Topology(
        name="line",
        nodes=("client", "gwA", "gwB", "server"),
        wires=(
            Wire(
                "client",
                "eth0",
                "10.1.0.2/24",
                "gwA",
                "lan",
                "10.1.0.1/24",
                a_side="inside",
                b_side="inside",
            ),
            Wire("gwA", "wan", "192.0.2.1/24", "gwB", "wan", "192.0.2.2/24", True, OUTER_MTU),
            Wire(
                "gwB",
                "lan",
                "10.2.0.1/24",
                "server",
                "eth0",
                "10.2.0.2/24",
                a_side="inside",
                b_side="inside",
            ),
        ),
        routes=(
            ("client", "default", "10.1.0.1"),
            ("server", "default", "10.2.0.1"),
            # Plain forwarding's path (backend none); an IPsec backend's own routes or
            # policies take the protected traffic before these are consulted.
            ("gwA", "10.2.0.0/24", "192.0.2.2"),
            ("gwB", "10.1.0.0/24", "192.0.2.1"),
        ),
        forwarding=("gwA", "gwB"),
        ipsec_nodes=("gwA", "gwB"),
        limited_nodes=("gwA", "gwB"),
        tunnels=(Tunnel("gwA", "gwB", "192.0.2.1", "192.0.2.2", "10.1.0.0/24", "10.2.0.0/24"),),
        flows=(Flow("client-server", "client", "server", "10.2.0.2", "gwA/wan"),),
    )


def clients() -> Topology:
    """Study 4: a server with a fast and a slow client, each on its own shaped link, each
    client doing host-to-host IPsec with the server."""
    s1, f = "192.0.2.1/24", "192.0.2.2/24"
    s2, w = "198.51.100.1/24", "198.51.100.2/24"
    return Topology(
        name="clients",
        nodes=("server", "fast", "slow"),
        wires=(
            Wire("fast", "eth0", f, "server", "eth0", s1, shaped=True, b_side="to_fast"),
            Wire("slow", "eth0", w, "server", "eth1", s2, shaped=True, b_side="to_slow"),
        ),
        routes=(),
        forwarding=(),
        ipsec_nodes=("server", "fast", "slow"),
        limited_nodes=("slow",),
        tunnels=(
            Tunnel("fast", "server", _addr(f), _addr(s1), f"{_addr(f)}/32", f"{_addr(s1)}/32"),
            Tunnel("slow", "server", _addr(w), _addr(s2), f"{_addr(w)}/32", f"{_addr(s2)}/32"),
        ),
        flows=(
            Flow("fast-server", "fast", "server", _addr(s1), "fast/eth0"),
            Flow("slow-server", "slow", "server", _addr(s2), "slow/eth0", slow=True),
        ),
    )


TOPOLOGIES = {"pair": pair, "line": line, "clients": clients}


def topology(name: str) -> Topology:
    return TOPOLOGIES[name]()


@dataclass(frozen=True)
class Link:
    """A link profile: shaping applied on both ends of the topology's shaped link(s)."""

    name: str
    rate_mbit: float | None = None  # None: unshaped
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    reorder_pct: float = 0.0
    duplicate_pct: float = 0.0
    # the MTU of the shaped wire's ends (None: the topology's own — 1500, a real link's)
    mtu: int | None = None

    @property
    def needs_netem(self) -> bool:
        return any(
            (self.delay_ms, self.jitter_ms, self.loss_pct, self.reorder_pct, self.duplicate_pct)
        )


# Presets. wifi-2mbit is 802.11 at its 2 Mbit/s DSSS rate, as study 4's wireless LAN: 2 ms
# each way with 1 ms jitter (channel access and the link-layer ACK of one frame at 2 Mbit/s
# take ~1-3 ms), and 0.2 % residual loss (what is left after 802.11's own retries on a
# fair indoor link). Reordering is not in the profile: 802.11 delivers in order.
LINK_PRESETS: dict[str, Link] = {
    "unshaped": Link("unshaped"),
    "ethernet-10": Link("ethernet-10", rate_mbit=10),
    "ethernet-100": Link("ethernet-100", rate_mbit=100),
    "gigabit": Link("gigabit", rate_mbit=1000),
    "wifi-2mbit": Link("wifi-2mbit", rate_mbit=2, delay_ms=2, jitter_ms=1, loss_pct=0.2),
}
