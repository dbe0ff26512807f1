"""Many tunnels on the `line` testbed (issue 44's tunnel-count axis): N tunnels between
the gateways, each protecting a prefix pair of its own, the traffic spread over all N.

Tunnel 0 is the topology's own (the client's subnet to the server's, 10.1.0.0/24 to
10.2.0.0/24): one tunnel is exactly the testbed as it always was, and the latency probes
and iperf3 keep going through it. Tunnel i > 0 protects the client's subnet and one
address of FAR (10.128.0.0/16, the (i-1)-th): a hub reaching thousands of remote sites.
The server takes all of FAR as its own (a `local` route: Linux's "AnyIP"), gwB routes FAR
to it, gwA routes it to gwB for plain forwarding (an IPsec backend's routes take it into
the tunnel first), and the client to gwA (on namespaces its default route does). A flow
spread over N destinations sends to the server's address and the first N-1 of FAR in
turn, so each datagram goes through the tunnel of its destination.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shlex

from ipsec_lab.testbed import Flow, Tunnel
from ipsec_lab.testbed.build import LabError
from ipsec_lab.testbed.interface import Testbed, on_hosts

FAR = "10.128.0.0/16"
# the most a scenario or benchmark asks for (FAR holds 65,536; CSIT's axis goes on past
# 10,000, where this machine's two cores would take minutes to set up each count)
MOST_TUNNELS = 4096


def far_address(i: int) -> str:
    """The i-th address of FAR (i from 0): tunnel i + 1's destination."""
    net = ipaddress.ip_network(FAR)
    if not 0 <= i < net.num_addresses:
        raise ValueError(f"FAR holds {net.num_addresses} addresses, not {i + 1}")
    return str(net.network_address + i)


def selectors(tunnel: Tunnel, n: int) -> list[tuple[str, str]]:
    """(left, right) traffic selectors of each of `n` tunnels: the topology's own, then
    the left's subnet to one address of FAR each."""
    if not 1 <= n <= MOST_TUNNELS:
        raise ValueError(f"tunnels must be from 1 to {MOST_TUNNELS}, not {n}")
    return [(tunnel.left_ts, tunnel.right_ts)] + [
        (tunnel.left_ts, f"{far_address(i)}/32") for i in range(n - 1)
    ]


def spread(flow: Flow, n: int) -> Flow:
    """`flow` over `n` tunnels: a flow of its own (its name says so: its rows, ratios and
    ceilings are never taken for the one tunnel's), sent to each tunnel's destination."""
    if n == 1:
        return flow
    return dataclasses.replace(flow, name=f"{flow.name} over {n} tunnels", destinations=n)


def base_name(flow: Flow) -> str:
    """The topology's flow a spread one was made from (`spread`)."""
    return flow.name.split(" over ", 1)[0]


def destinations(flow: Flow) -> list[str]:
    """Where a flow spread over `flow.destinations` tunnels sends: the sink's own address,
    then the first destinations - 1 addresses of FAR."""
    return [flow.sink_addr] + [far_address(i) for i in range(flow.destinations - 1)]


def nft_destinations(flow: Flow) -> str:
    """The flow's destinations as an nftables match's value: the address, or a set of it
    and FAR's range."""
    d = destinations(flow)
    if len(d) == 1:
        return d[0]
    return f"{{ {d[0]}, {d[1]} }}" if len(d) == 2 else f"{{ {d[0]}, {d[1]}-{d[-1]} }}"


def refusal(topology: str, n: int) -> str | None:
    """Why `n` tunnels cannot be set up on `topology`, or None."""
    if n == 1:
        return None
    if topology != "line":
        return f"{n} tunnels: the line topology only (its gateways carry the tunnels)"
    return None


# FAR's routes besides the IPsec's own (module docstring): node, the route (`ip route`'s
# words after add/del), and what `ip route show` prints of it once there
FAR_ROUTES = (
    # on namespaces the client's default route; real hosts' default routes are theirs
    ("client", (FAR, "via", "10.1.0.1"), f"{FAR} via 10.1.0.1 "),
    ("server", ("local", FAR, "dev", "lo"), f"local {FAR} dev lo"),
    ("gwB", (FAR, "via", "10.2.0.2"), f"{FAR} via 10.2.0.2 "),
    ("gwA", (FAR, "via", "192.0.2.2"), f"{FAR} via 192.0.2.2 "),
)


def route_far(tb: Testbed, n: int) -> None:
    """The routes FAR's tunnels need besides the IPsec's own: the client's to gwA, the
    server's local route, gwB's to the server, gwA's to gwB. They stay for the testbed's
    life, where nothing but a spread flow goes: on namespaces removed with them; on real
    hosts each added only where the host has no route of FAR, its delete in the host's
    ledger first (a route of FAR the host has already, not as the lab's, is refused,
    never replaced)."""
    why = refusal(tb.topo.name, n)
    if why:
        raise LabError(why)
    if n == 1:
        return
    on = tb if on_hosts(tb) else None
    for node, route, shown in FAR_ROUTES:
        if on is None:
            tb.run(node, ["ip", "route", "replace", *route])
            continue
        if not on.driven(node):
            continue
        # in any table: one in main would be shadowed by a local route, and the other
        # way round
        have = on.run(node, ["ip", "route", "show", "table", "all", "exact", FAR]).strip()
        if have:
            if (have.splitlines()[0] + " ").startswith(shown):
                continue  # there already, as the lab wants it: not ours to remove
            raise LabError(f"{node} already routes {FAR} ({have.splitlines()[0]}): the lab "
                           f"will not replace a route it did not make; {n} tunnels need "
                           "that range (testbed/tunnels.py FAR) free on the hosts")  # fmt: skip
        on.record(node, f"route {' '.join(route)} ({n} tunnels)",
                  shlex.join(["ip", "route", "del", *route]))  # fmt: skip
        on.run(node, ["ip", "route", "add", *route])
