"""Real hosts as a testbed: a hosts file maps each node of a scenario's topology to a
machine the lab reaches through OpenSSH, and names the interface (and address) that
plays each end of the topology's wires.

    # examples/hosts/line.toml: client - gwA - gwB - server on four machines
    workdir = "/var/lib/ipsec-lab"        # the lab's files on each host (the default)
    [client]
    ssh = "root@203.0.113.10"             # any ssh destination; ~/.ssh/config applies
    inside = { interface = "eth1", address = "10.1.0.2/24" }
    [gwA]
    ssh = "lab@203.0.113.11"              # not root: commands go through `sudo -n`
    inside  = { interface = "eth1", address = "10.1.0.1/24" }
    outside = { interface = "eth2", address = "192.0.2.1/24", present = true }

An interface's `address` may be left out (the lab uses the topology's own and adds it),
given (the lab adds it, and removes it at the end), or given with `present = true` (it is
already there: the lab neither adds nor removes it). A node with no `ssh` is a machine
the lab does not drive: with backend `external`, the gateways under test (the lab then
only needs their addresses, for its routes).

Which keys a node takes is the topology's (`Wire.a_side` / `b_side`): `pair` — hostA
and hostB `outside`; `line` — client `inside`, gwA and gwB `inside` and `outside`, server
`inside`; `clients` — fast and slow `outside`, the server `to_fast` and `to_slow`.

`workdir` is where the lab keeps each run's files on a host (one directory per run and
node, removed at the end): the lab runs commands as root from there, so it must be a
directory only root (or the login user) can write, as must every directory above it
(`hosts.workdir` checks that on the host, at the start and before each use); the default
`/var/lib/ipsec-lab` is made 0700 by root.

This module only reads and checks; `hosts.ssh` is the transport, `hosts.testbed` the
testbed built on them, `hosts.check` what `ipsec-lab hosts check` asks of each host,
`hosts.workdir` the work directory's check.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ipsec_lab.hosts.workdir import DEFAULT_WORKDIR, valid_workdir
from ipsec_lab.testbed import TOPOLOGIES, Flow, Topology, Tunnel, topology

TOP_KEYS = ("topology", "workdir", "ssh_config", "dut")
NODE_KEYS = ("ssh", "ipsec_gw", "workdir")
IFACE_KEYS = ("interface", "address", "present")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


class HostsError(ValueError):
    """A hosts file that cannot be used: `str()` names the file, the key and what is wrong."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {key}: {message}")
        self.source = source
        self.key = key


@dataclass(frozen=True)
class Iface:
    """One end of a topology's wire on a real host."""

    interface: str
    address: str | None = None  # address/prefix; None: the topology's own
    present: bool = False  # the address is already there: neither added nor removed


@dataclass(frozen=True)
class Host:
    node: str  # the topology's name for it (client, gwA, …)
    ssh: str | None  # ssh destination; None: not driven by the lab (an external DUT)
    sides: dict[str, Iface] = field(default_factory=dict)
    ipsec_gw: str | None = None  # an ipsec-gw already on the host, instead of pushing ours
    workdir: str = DEFAULT_WORKDIR


@dataclass(frozen=True)
class Hosts:
    source: str
    topology: str | None
    hosts: dict[str, Host]
    ssh_config: str | None = None
    dut: dict[str, str] = field(default_factory=dict)  # what an external DUT is

    def driven(self) -> list[Host]:
        """The hosts the lab reaches through ssh."""
        return [h for h in self.hosts.values() if h.ssh]

    def for_topology(self, topo: Topology, backend_external: bool = False) -> None:
        """Raise HostsError unless this file maps every node and wire end of `topo`;
        a node without `ssh` is allowed only as an IPsec node under backend `external`."""
        if self.topology and self.topology != topo.name:
            raise HostsError(
                self.source, "topology", f"this file is for {self.topology!r}, the scenario "
                f"uses {topo.name!r}"
            )  # fmt: skip
        for node in topo.nodes:
            if node not in self.hosts:
                raise HostsError(self.source, node, f"missing: topology {topo.name!r} needs "
                                 f"{', '.join(topo.nodes)}")  # fmt: skip
            h = self.hosts[node]
            for side in sides_of(topo, node):
                if side not in h.sides:
                    raise HostsError(self.source, f"{node}.{side}",
                                     "missing: which interface plays this end")  # fmt: skip
            if h.ssh is None and not (backend_external and node in topo.ipsec_nodes):
                why = (" (only an external DUT may be)" if node not in topo.ipsec_nodes else
                       ": the lab configures the scenario's IPsec on it. A gateway the lab "
                       "does not configure (no ssh, as here) is backend external: run a "
                       'scenario with backends = ["external"]')  # fmt: skip
                raise HostsError(self.source, f"{node}.ssh", f"missing: the lab drives "
                                 f"this host{why}")  # fmt: skip
            for side in sides_of(topo, node) if h.ssh is None else ():
                if h.sides[side].address is None:
                    raise HostsError(self.source, f"{node}.{side}.address", "missing: the "
                                     "lab does not drive this host, so give the address it "
                                     "has there (the other hosts route through it)")  # fmt: skip
        extra = sorted(set(self.hosts) - set(topo.nodes))
        if extra:
            raise HostsError(self.source, extra[0], f"not a node of topology {topo.name!r} "
                             f"({', '.join(topo.nodes)})")  # fmt: skip


def sides_of(topo: Topology, node: str) -> list[str]:
    """The hosts-file keys of `node`'s wire ends, in wire order."""
    out: list[str] = []
    for w in topo.wires:
        for n, side in ((w.a, w.a_side), (w.b, w.b_side)):
            if n == node and side not in out:
                out.append(side)
    return out


def all_nodes() -> dict[str, list[str]]:
    """Every node name any topology has, with the keys it takes there."""
    out: dict[str, list[str]] = {}
    for name in TOPOLOGIES:
        topo = topology(name)
        for n in topo.nodes:
            out.setdefault(n, [])
            out[n] += [s for s in sides_of(topo, n) if s not in out[n]]
    return out


def _str(r: dict[str, Any], key: str, where: str, src: str) -> str | None:
    v = r.get(key)
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise HostsError(src, f"{where}{key}", f"must be a non-empty string, not {v!r}")
    return v


def _iface(v: Any, where: str, src: str) -> Iface:
    if not isinstance(v, dict):
        raise HostsError(src, where, 'must be a table: { interface = "eth1", address = … }')
    for k in v:
        if k not in IFACE_KEYS:
            raise HostsError(src, f"{where}.{k}", f"unknown key (known: {', '.join(IFACE_KEYS)})")
    name = v.get("interface")
    if not isinstance(name, str) or not _IFNAME.match(name):
        raise HostsError(src, f"{where}.interface", f"must be an interface name, not {name!r}")
    addr = v.get("address")
    if addr is not None:
        try:
            ipaddress.ip_interface(addr)
        except ValueError:
            raise HostsError(src, f"{where}.address", f"{addr!r} is not an address/prefix "
                             "(e.g. 10.1.0.2/24)") from None  # fmt: skip
        if "/" not in addr:
            raise HostsError(src, f"{where}.address", f"{addr!r} needs its prefix length, "
                             f"e.g. {addr}/24")  # fmt: skip
    present = v.get("present", False)
    if not isinstance(present, bool):
        raise HostsError(src, f"{where}.present", f"must be true or false, not {present!r}")
    if present and addr is None:
        raise HostsError(src, f"{where}.present", "says the address is there: give `address`")
    return Iface(name, addr, present)


def parse(text: str, source: str = "<hosts>") -> Hosts:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HostsError(source, "toml", str(e)) from None
    known = all_nodes()
    topo_name = doc.get("topology")
    if topo_name is not None and topo_name not in TOPOLOGIES:
        raise HostsError(source, "topology", f"must be one of {', '.join(TOPOLOGIES)}, "
                         f"not {topo_name!r}")  # fmt: skip
    workdir = _str(doc, "workdir", "", source) or DEFAULT_WORKDIR
    if why := valid_workdir(workdir):
        raise HostsError(source, "workdir", why)
    hosts: dict[str, Host] = {}
    for key, v in doc.items():
        if key in TOP_KEYS:
            continue
        if key not in known:
            raise HostsError(source, key, f"unknown key: a node ({', '.join(known)}) or one "
                             f"of {', '.join(TOP_KEYS)}")  # fmt: skip
        if not isinstance(v, dict):
            raise HostsError(source, key, "must be a table ([client], [gwA], …)")
        sides: dict[str, Iface] = {}
        for k, sv in v.items():
            if k in NODE_KEYS:
                continue
            if k not in known[key]:
                raise HostsError(source, f"{key}.{k}", "unknown key (known: "
                                 f"{', '.join([*NODE_KEYS, *known[key]])})")  # fmt: skip
            sides[k] = _iface(sv, f"{key}.{k}", source)
        ssh = _str(v, "ssh", f"{key}.", source)
        if ssh is not None and (ssh.startswith("-") or any(c.isspace() for c in ssh)):
            raise HostsError(source, f"{key}.ssh", f"{ssh!r} is not an ssh destination")
        gw = _str(v, "ipsec_gw", f"{key}.", source)
        wd = _str(v, "workdir", f"{key}.", source) or workdir
        if why := valid_workdir(wd):
            raise HostsError(source, f"{key}.workdir", why)
        hosts[key] = Host(key, ssh, sides, gw, wd)
    dut = doc.get("dut", {})
    if not isinstance(dut, dict) or not all(isinstance(x, str) for x in dut.values()):
        raise HostsError(source, "dut", "must be a table of strings (what the DUT is)")
    ssh_config = _str(doc, "ssh_config", "", source)
    if ssh_config is not None and source != "<hosts>" and not Path(ssh_config).is_absolute():
        ssh_config = str(Path(source).resolve().parent / ssh_config)
    return Hosts(source, topo_name, hosts, ssh_config, dict(dut))


def load(path: str | Path) -> Hosts:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise HostsError(str(p), "file", e.strerror or str(e)) from None
    return parse(text, str(p))


# --- the topology on these hosts --------------------------------------------------------


def _net(cidr: str) -> str:
    return str(ipaddress.ip_interface(cidr).network)


def _ip(cidr: str) -> str:
    return str(ipaddress.ip_interface(cidr).ip)


def place(topo: Topology, hosts: Hosts) -> Topology:
    """`topo` with the hosts' interface names and addresses: every wire end, route,
    tunnel and flow follows. A `default` route (the namespace testbed's client and
    server) becomes a route to each network the node is not on: the lab never touches a
    real host's default route (its SSH session may depend on it)."""
    addr: dict[str, str] = {}  # old address (no prefix) -> new
    net: dict[str, str] = {}  # old network -> new
    wires = []
    for w in topo.wires:
        ends = []
        for node, cidr, side in ((w.a, w.a_addr, w.a_side), (w.b, w.b_addr, w.b_side)):
            i = hosts.hosts[node].sides[side]
            new = i.address or cidr
            addr[_ip(cidr)] = _ip(new)
            net.setdefault(_net(cidr), _net(new))
            ends.append((i.interface, new))
        if _net(ends[0][1]) != _net(ends[1][1]):
            raise HostsError(hosts.source, f"{w.b}.{w.b_side}.address",
                             f"{ends[1][1]} is not in {w.a}.{w.a_side}'s network "
                             f"{_net(ends[0][1])}: the two ends of a link share one (give "
                             "both addresses, or neither)")  # fmt: skip
        wires.append(replace(w, a_if=ends[0][0], a_addr=ends[0][1], b_if=ends[1][0],
                             b_addr=ends[1][1]))  # fmt: skip

    def a(x: str) -> str:
        return addr.get(x, x)

    def n(x: str) -> str:
        """A selector or destination: a network, or one host's /32."""
        if x in net:
            return net[x]
        return a(x.removesuffix("/32")) + "/32" if x.endswith("/32") else x

    routes: list[tuple[str, str, str]] = []
    for node, dest, via in topo.routes:
        if dest == "default":
            mine = {_net(c) for w in wires for nd, c in ((w.a, w.a_addr), (w.b, w.b_addr))
                    if nd == node}  # fmt: skip
            others = [_net(c) for w in wires for c in (w.a_addr, w.b_addr)]
            for d in dict.fromkeys(others):
                if d not in mine:
                    routes.append((node, d, a(via)))
        else:
            routes.append((node, n(dest), a(via)))
    tunnels = tuple(
        Tunnel(t.left, t.right, a(t.left_outer), a(t.right_outer), n(t.left_ts), n(t.right_ts))
        for t in topo.tunnels
    )
    by_end = {(w.a, oi): w.a_if for w, ow in zip(wires, topo.wires) for oi in (ow.a_if,)}
    by_end |= {(w.b, oi): w.b_if for w, ow in zip(wires, topo.wires) for oi in (ow.b_if,)}

    def end(e: str) -> str:
        node, ifname = e.split("/", 1)
        return f"{node}/{by_end.get((node, ifname), ifname)}"

    flows = tuple(
        Flow(f.name, f.source, f.sink, a(f.sink_addr), end(f.wire_end), f.slow) for f in topo.flows
    )
    return replace(topo, wires=tuple(wires), routes=tuple(routes), tunnels=tunnels, flows=flows)
