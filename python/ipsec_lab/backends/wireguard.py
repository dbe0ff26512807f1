"""WireGuard as the tunnel under test — the comparison engineers make most: should this
link run IPsec or WireGuard? Its configuration is its one suite, `wireguard`
(Noise_IKpsk2 handshake, ChaCha20-Poly1305 transport); any other is refused, as the
IPsec backends refuse `wireguard`.

`wireguard`: the Linux kernel's WireGuard (a `wireguard` device per tunnel end, made with
`ip link` in its gateway's namespace and keyed with `wg`), where the kernel has the module:
Debian's kernel does (the micro-VM here, `--vm`), this machine's development kernel does
not, and the backend says so.

`wireguard-go`: Debian's user-space WireGuard on a TUN device (runs on kernels without
WireGuard), one process per tunnel end in its gateway's namespace, keyed with `wg` over
its UAPI socket. Debian ships 0.0.20220316, which predates upstream's 2023 batching and
offload work: every row's backend version says so, so that nobody reads its figures as
today's wireguard-go.

`boringtun`: Cloudflare's user-space WireGuard in Rust (`boringtun-cli` from crates.io),
the same way: a process per end on a TUN device, keyed with `wg` over the same UAPI.

Per run each end gets a fresh X25519 key pair from `wg genkey` (the private key only in
a 0600 file of the run's); the two ends hand-shake before `start` returns (a keepalive
starts it, and one every 25 s keeps the session up), so no measurement pays for a
handshake. Devices are named `ipl<testbed token>w<n>`: their control sockets in
/var/run/wireguard are the machine's, and the name says whose. The interface's MTU is
the path's less WireGuard's overhead (60 bytes over IPv4: outer IP, UDP, the data
message's 16-byte header and 16-byte tag), so no full-size packet is fragmented after
sealing.

Many tunnels (the scenario's `tunnels = [N]`, testbed/tunnels.py) are WireGuard's way: N
peers. gwA is the hub, one device with a peer per site, peer i's allowed-ips the i-th
tunnel's destination (the server's subnet, then one address of FAR each) — cryptokey
routing picks the peer; gwB plays the N sites, a device each with gwA as its one peer
(a site has a key pair of its own, and one device holds one key). The sites past the
first only receive (the spread flow goes client to server): no routes or rules of their
own; the hub's peers past the first are set PEERS_PER_SET to a `wg set`. gwB's devices
bound N (MOST_SITES; the user-space WireGuards', a process each, lower).

Routing fails closed: the remote network is routed into the WireGuard device from a
table of the run's own (an `ip rule` for the remote network), beside an `unreachable`
route of a higher metric in the same table — if wireguard-go dies and its device goes,
the traffic meets the unreachable route, never the gateway's plain route. WireGuard's
own UDP carries a firewall mark whose rule looks up the main table first, so host-to-host
tunnels (whose endpoint is inside the remote network) do not route it into itself.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import platform
import re
import shlex
import shutil
import time
from dataclasses import dataclass

from ipsec_lab.backends.base import Unsupported, no_rekey, private_dir
from ipsec_lab.model.transforms import (
    WIREGUARD,
    Layout,
    parse_configuration,
    wireguard_overhead,
)
from ipsec_lab.testbed import Tunnel
from ipsec_lab.testbed import tunnels as many
from ipsec_lab.testbed.build import LabError, probe
from ipsec_lab.testbed.interface import Process, Testbed, on_hosts
from ipsec_lab.testbed.links import link_mtu

PORT = 51820  # the first end's UDP port; the run's n-th end listens on PORT + n
PORT_STEP, PORT_TRIES = 100, 20  # past a port in use (the host's own WireGuard's)
FWMARK = "0x4c4157"  # on WireGuard's own UDP: routed by the main table
TABLE = 230  # the run's n-th end's routes: table TABLE + n
RULE_PREF = 1000  # its rules: the mark's at RULE_PREF + 2n, the remote network's + 1
UNREACHABLE_METRIC = 4096  # below the device's route: what remains if the device goes
HANDSHAKE_S = 15.0  # the most the first handshake may take
KEEPALIVE_S = "25"  # keeps the session up between a backend's runs (as wg-quick users do)
HANDSHAKE_PER_PEER_S = 0.05  # and per peer past the first (N tunnels)
# N tunnels: gwB runs a device (and a key pair) per site, so the lab's bound is on
# devices, not on the hub's peers (the kernel's WireGuard takes far more)
MOST_SITES = 1024
MOST_SITES_WHY = "gwB plays every site, a WireGuard device each: the lab's bound, not WireGuard's"
NO_HOSTS_TUNNELS = "the hub and its sites are tested on namespaces only so far"
PEERS_PER_SET = 128  # peers in one `wg set` (its command line stays far below ARG_MAX)


def key_pair(tb: Testbed, node: str, dev: str) -> tuple[str, str]:
    """A fresh X25519 key pair made on `node` by `wg genkey`, in one command there: the
    private key goes straight into a file of the run's, 0600 from its first byte (here:
    the run's 0700 directory; on a real host: the run's directory there, the command
    passing the work directory's check first) — never to the lab, into an argument or a
    log; (that file's path, the public key in WireGuard's base64)."""
    if on_hosts(tb):
        path = f"{tb.workdir(node)}/wireguard-{dev}.key"
    else:
        path = str(private_dir(tb.rundir / "wireguard") / f"{dev}.key")
    q = shlex.quote(path)
    said = tb.run(node, ["sh", "-c", f"umask 077 && wg genkey > {q} && wg pubkey < {q}"]).split()
    try:
        ok = len(said) == 1 and len(base64.b64decode(said[0], validate=True)) == 32
    except ValueError:
        ok = False
    if not ok:
        raise LabError(f"{node}: wg made no 32-byte public key (said {said!r})")
    return path, said[0]


def check_configuration(configuration: str, backend: str) -> None:
    if not parse_configuration(configuration).wireguard:
        raise Unsupported(
            f"{backend} runs WireGuard's one suite: configuration `{WIREGUARD}` "
            f"(not {configuration})"
        )


def shaken_peers(out: str) -> set[tuple[str, str]]:
    """(device, peer's public key) of each line of `wg show all latest-handshakes` (device,
    key, time) or `wg show all transfer` (device, key, rx bytes, tx bytes) with a number
    other than 0: a handshake time, or data a session carried."""
    return {(f[0], f[1]) for f in (ln.split() for ln in out.splitlines())
            if len(f) in (3, 4) and all(x.isdigit() for x in f[2:])
            and any(int(x) > 0 for x in f[2:])}  # fmt: skip


@dataclass
class End:
    """One tunnel end: its node, device, port, table and rules' preference."""

    node: str
    dev: str
    port: int
    table: int
    pref: int
    mine: str  # the local network (its traffic selector)
    theirs: str  # the remote network, routed into the device
    extra: tuple[str, ...] = ()  # more remote networks routed into it (the hub's FAR)
    routed: bool = True  # False: a site past the first, which only receives (no routes)
    proc: Process | None = None
    public: str = ""
    outer_family: tuple[str, ...] = ()  # `ip`'s family words of its endpoint's addresses


def _family(prefix: str) -> list[str]:
    """`ip`'s words for the family of an address or prefix."""
    return ["-6"] if ":" in prefix else []


def _first_address(prefix: str) -> str:
    """An address inside `prefix` to route or ping: its first host's (or its only one)."""
    net = ipaddress.ip_network(prefix, strict=False)
    return str(net.network_address + (1 if net.num_addresses > 1 else 0))


def _remote(e: End) -> tuple[str, ...]:
    """The remote networks `e` routes into its device."""
    return (e.theirs, *e.extra)


def _rules(e: End, op: str) -> list[tuple[list[str], str]]:
    """`e`'s policy rules, `ip rule add` or `del` (`op`) by their whole selectors, each
    with what it is: WireGuard's own marked UDP looks up the main table first; each remote
    network, the end's table (its device's route, the unreachable one behind it)."""
    mark = ["ip", *e.outer_family, "rule", op, "fwmark", FWMARK, "lookup", "main", "pref",
            str(e.pref)]  # fmt: skip
    return [(mark, "fwmark rule")] + [
        (["ip", *_family(net), "rule", op, "to", net, "lookup", str(e.table), "pref",
          str(e.pref + 1)], "rule" if net == e.theirs else f"rule for {net}")
        for net in _remote(e)
    ]  # fmt: skip


class _WireGuard:
    """What both WireGuards share: ends, keys, the handshake, fail-closed routing and a
    stop that undoes it. A subclass makes each end's device (`_devices`) and takes them
    down (`_down`)."""

    name = "wireguard"
    # whether `wg set` may change a peer once made (boringtun 0.7.1's cannot: its UAPI
    # thread panics, "Modifying existing peers is not yet supported", and the device's
    # control socket answers nothing after): each peer is then set once, its keepalive
    # with it, and a packet sent into the tunnel starts the handshake
    modifies_peers = True
    # whether the UAPI's handshake time is the time since it (boringtun's: 0 for a second,
    # as never): a session then shows in the peer's data bytes (`shaken_peers`)
    handshake_since = False

    def __init__(self, tunnels: int = 1) -> None:
        self.tunnels = tunnels  # between the line testbed's gateways (module docstring)
        self._ends: list[End] = []
        self._tb: Testbed | None = None
        self._version = ""  # what the nodes ran, once started
        self.on_hosts = False  # real hosts: their tools and kernels, not this machine's

    def use_hosts(self, hosts: object) -> None:
        self.on_hosts = True

    def check(self, configuration: str) -> None:
        check_configuration(configuration, self.name)
        if not self.on_hosts and shutil.which("wg") is None:
            raise Unsupported("no wg here (Debian package wireguard-tools; `make deps`)")

    @staticmethod
    def _do(tb: Testbed, node: str, argv: list[str], undo: list[str], what: str) -> None:
        """Run `argv` on `node`; on a real host, first write down in its ledger how to undo
        it (the teardown and `clean --hosts` undo it should the lab not reach `stop`)."""
        if on_hosts(tb):
            tb.record(node, what, shlex.join(undo))
        tb.run(node, argv)

    @staticmethod
    def _free(tb: Testbed, e: End, ports: set[int], listening: set[int]) -> None:
        """Refuse to start where the rules' preferences or the routing table `e` needs are
        taken — on a real host, the host's own: the lab adds to a host, never replaces —
        and move its UDP port past any in use (the host's own WireGuard's: `listening`,
        its node's UDP ports; another end's of this run: `ports`)."""
        taken = []
        for fam in ([], ["-6"]) if e.routed else ():  # (no IPv6 on a host: nothing for -6)
            for ln in tb.run(e.node, ["ip", *fam, "rule", "show"], check=False).splitlines():
                if ln.split(":")[0].strip() in (str(e.pref), str(e.pref + 1)):
                    taken.append(f"rule {ln.strip()}")
            if out := tb.run(e.node, ["ip", *fam, "route", "show", "table", str(e.table)],
                             check=False).strip():  # fmt: skip
                taken.append(f"table {e.table}: {out.splitlines()[0]}")
        if taken:
            raise LabError(f"{e.node}: WireGuard end {e.dev} needs rule preferences "
                           f"{e.pref}-{e.pref + 1} and routing table {e.table}, and they are "
                           "in use: " + "; ".join(taken))  # fmt: skip
        for _ in range(PORT_TRIES):
            if e.port not in ports and e.port not in listening:
                ports.add(e.port)
                return
            e.port += PORT_STEP
        raise LabError(f"{e.node}: no free UDP port for WireGuard end {e.dev} "
                       f"({PORT_TRIES} tried from {PORT}, every {PORT_STEP})")  # fmt: skip

    @staticmethod
    def _listening(tb: Testbed, node: str) -> set[int]:
        """The UDP ports something listens on at `node` (one `ss` for all its ends)."""
        got = set()
        for ln in tb.run(node, ["ss", "-Hlun"], check=False).splitlines():
            f = ln.split()
            port = f[3].rpartition(":")[2] if len(f) > 3 else ""
            if port.isdigit():
                got.add(int(port))
        return got

    @staticmethod
    def _routed(tb: Testbed, e: End) -> None:
        """Each remote network does reach the device: a rule of the host's own ahead of
        the run's (a lower preference, matching it) would send it by another table — on a
        gateway with the plain route, in clear. Refused, naming what the kernel chose."""
        for theirs in _remote(e):
            got = json.loads(
                tb.run(e.node, ["ip", "-j", "route", "get", _first_address(theirs)]) or "[]"
            )
            dev = got[0].get("dev") if got else None
            if dev != e.dev:
                raise LabError(f"{e.node}: traffic for {theirs} would not enter WireGuard end "
                               f"{e.dev} but {dev or got} (a rule of the host's own ahead of "
                               f"the lab's at preference {e.pref + 1}? `ip rule show` there): "
                               "refused rather than measured in clear")  # fmt: skip

    def _ends_of(self, tb: Testbed) -> list[tuple[End, End, Tunnel]]:
        """(left end, right end, tunnel) of each pair of peers: the topology's tunnels,
        or with N tunnels the hub on the left and a site of its for each (module
        docstring) — the hub the same End in every pair."""
        token = tb.token

        def end(
            n: int,
            node: str,
            mine: str,
            theirs: str,
            extra: tuple[str, ...] = (),
            routed: bool = True,
        ) -> End:
            # numbered across the run, not per node: two nodes on one machine (real
            # hosts) never share a table, a rule's preference or a port. wireguard-go's
            # UAPI socket's directory is the machine's: a name of the testbed's (the
            # kernel's devices take the same names)
            return End(
                node,
                f"ipl{token}w{n}",
                PORT + n,
                TABLE + n,
                RULE_PREF + 2 * n,
                mine,
                theirs,
                extra,
                routed,
            )

        if self.tunnels > 1:
            why = many.refusal(tb.topo.name, self.tunnels)
            if why:
                raise LabError(why)
            (t,) = tb.topo.tunnels
            left = t.seen_from(t.left)
            hub = end(0, left.node, left.ts, left.peer_ts, extra=(many.FAR,))
            return [(hub, end(1 + i, t.right, rts, lts, routed=i == 0), t)
                    for i, (lts, rts) in enumerate(many.selectors(t, self.tunnels))]  # fmt: skip
        pairs: list[tuple[End, End, Tunnel]] = []
        n = 0
        for t in tb.topo.tunnels:
            ends = []
            for side in (t.seen_from(t.left), t.seen_from(t.right)):
                ends.append(end(n, side.node, side.ts, side.peer_ts))
                n += 1
            pairs.append((ends[0], ends[1], t))
        return pairs

    def _devices(self, tb: Testbed, ends: list[End]) -> None:
        raise NotImplementedError

    def _down(self, tb: Testbed, e: End) -> None:
        raise NotImplementedError

    def _log(self, tb: Testbed, e: End) -> str:
        return ""

    def start(self, tb: Testbed, configuration: str) -> None:
        self.check(configuration)
        self._tb = tb
        pairs = self._ends_of(tb)
        keys: dict[str, str] = {}
        ports: set[int] = set()
        listening: dict[str, set[int]] = {}
        for a, b, _ in pairs:
            for e in (a, b):
                if e.dev in keys:
                    continue  # the hub, again
                if e.node not in listening:
                    listening[e.node] = self._listening(tb, e.node)
                self._free(tb, e, ports, listening[e.node])
                self._ends.append(e)
                keys[e.dev], e.public = key_pair(tb, e.node, e.dev)
        self._version = versions({e.node: self._node_version(tb, e.node) for e in self._ends})
        self._devices(tb, self._ends)
        # each end's peers: its pairs' other ends (the hub's, every site)
        peers: dict[str, list[End]] = {}
        for a, b, _ in pairs:
            peers.setdefault(a.dev, []).append(b)
            peers.setdefault(b.dev, []).append(a)
        upped: set[str] = set()
        for a, b, t in pairs:
            for e, addr, peer_addr in ((a, t.left_outer, t.right_outer),
                                       (b, t.right_outer, t.left_outer)):  # fmt: skip
                if e.dev in upped:
                    continue
                upped.add(e.dev)
                # a peer set only once gets its lasting keepalive now (the left end's)
                keep = KEEPALIVE_S if not self.modifies_peers and e is a else None
                self._up(tb, e, peers[e.dev], addr, peer_addr, keys[e.dev], keep)
        for e in self._ends:
            if e.routed:
                self._routed(tb, e)
        lefts = {a.dev: a for a, _, _ in pairs}.values()  # the hub once
        for a in lefts:  # both ends listen: the left one's keepalive starts it
            if self.modifies_peers:
                self._keepalive(tb, a, peers[a.dev], "1")
            else:
                self._kick(tb, a, peers[a.dev])
        # the keepalive started it; every KEEPALIVE_S seconds it keeps the session up, so
        # no later run of this backend pays for a handshake either
        self._handshake(tb, [(a, b) for a, b, _ in pairs])
        if self.modifies_peers:
            for a in lefts:
                self._keepalive(tb, a, peers[a.dev], KEEPALIVE_S)

    @staticmethod
    def _set_peers(tb: Testbed, e: End, words: list[list[str]]) -> None:
        """`wg set` on `e`'s device with each peer's `words` ("peer", its key, …),
        PEERS_PER_SET peers to a command."""
        for i in range(0, len(words), PEERS_PER_SET):
            tb.run(
                e.node, ["wg", "set", e.dev, *(w for p in words[i : i + PEERS_PER_SET] for w in p)]
            )

    def _keepalive(self, tb: Testbed, e: End, peers: list[End], seconds: str) -> None:
        """Every one of `e`'s peers' persistent keepalive to `seconds`."""
        self._set_peers(tb, e, [["peer", p.public, "persistent-keepalive", seconds] for p in peers])

    def _node_version(self, tb: Testbed, node: str) -> str:
        raise NotImplementedError

    def _up(self, tb: Testbed, e: End, peers: list[End], addr: str, peer_addr: str,
            key: str, keepalive: str | None = None) -> None:  # fmt: skip
        """Device `e` up at the path's MTU less WireGuard's overhead, keyed to `peers`, all
        at `peer_addr` (with a persistent `keepalive` in seconds, if given): the first with
        `e`'s remote network as its allowed-ips, each other its own network (the hub's
        sites: cryptokey routing picks the peer); the remote networks routed into it
        (failing closed) unless `e` only receives."""
        route = json.loads(tb.run(e.node, ["ip", "-j", "route", "get", peer_addr]) or "[]")
        if not route or "dev" not in route[0]:
            raise LabError(f"{e.node}: no route to its WireGuard peer {peer_addr} ({route})")
        out_dev = str(route[0]["dev"])
        version = 6 if ":" in peer_addr else 4
        mtu = link_mtu(tb, e.node, out_dev) - wireguard_overhead(Layout(outer=version))
        tb.run(e.node, ["ip", "link", "set", "dev", e.dev, "mtu", str(mtu), "up"])
        keep = ["persistent-keepalive", keepalive] if keepalive else []

        def peer_words(peer: End, allowed: str) -> list[str]:
            at = f"[{peer_addr}]:{peer.port}" if version == 6 else f"{peer_addr}:{peer.port}"
            return ["peer", peer.public, "endpoint", at, "allowed-ips", allowed, *keep]

        tb.run(e.node, ["wg", "set", e.dev, "listen-port", str(e.port), "fwmark", FWMARK,
                        "private-key", key, *peer_words(peers[0], e.theirs)])  # fmt: skip
        self._set_peers(tb, e, [peer_words(p, p.mine) for p in peers[1:]])
        e.outer_family = tuple(_family(addr))
        if not e.routed:
            return
        table = str(e.table)
        # a host's own traffic (host to host: `mine` is its address) leaves with that
        # address, not the one the kernel would pick for a device without any (the first
        # interface's: a real host's management NIC, which the peer's allowed-ips drop)
        mine = ipaddress.ip_network(e.mine, strict=False)
        src = ["src", str(mine.network_address)] if mine.num_addresses == 1 else []
        for theirs in _remote(e):
            fam = _family(theirs)
            flush = ["ip", *fam, "route", "flush", "table", table]  # a table that was empty
            self._do(tb, e.node, ["ip", *fam, "route", "replace", "unreachable", theirs,
                                  "metric", str(UNREACHABLE_METRIC), "table", table], flush,
                     f"WireGuard {e.dev}'s routing table {table} ({theirs})")  # fmt: skip
            tb.run(e.node, ["ip", *fam, "route", "replace", theirs, "dev", e.dev,
                            *(src if theirs == e.theirs else []), "table", table])  # fmt: skip
        for (add, what), (delete, _) in zip(_rules(e, "add"), _rules(e, "del")):
            self._do(tb, e.node, add, delete, f"WireGuard {e.dev}'s {what}")
        if on_hosts(tb):  # undone newest first: the device down before its rules go
            tb.record(e.node, f"WireGuard {e.dev} down before its rules go",
                      shlex.join(["ip", "link", "set", "dev", e.dev, "down"]))  # fmt: skip

    @staticmethod
    def _kick(tb: Testbed, e: End, peers: list[End]) -> None:
        """One packet from `e`'s node into the tunnel to each of `peers` (a ping to the
        first address of the peer's network, answered or not; all at once, one command):
        a session's first packet starts the handshake."""
        to = [_first_address(net) for net in [e.theirs] + [p.mine for p in peers[1:]]]
        pings = " ".join(f"ping -c 1 -W 1 {a} >/dev/null 2>&1 &" for a in to)
        tb.run(e.node, ["sh", "-c", f"{pings} wait"], check=False)

    def _handshake(self, tb: Testbed, pairs: list[tuple[End, End]]) -> None:
        """Wait (bounded: HANDSHAKE_S, and HANDSHAKE_PER_PEER_S for each pair past the
        first) until both ends of every pair have a session (each node asked once a poll,
        `wg show all`)."""
        limit = HANDSHAKE_S + HANDSHAKE_PER_PEER_S * (len(pairs) - 1)
        deadline = time.monotonic() + limit
        nodes = list(dict.fromkeys(e.node for pair in pairs for e in pair))
        while True:
            shaken: set[tuple[str, str]] = set()
            for node in nodes:
                shaken |= self._shaken(tb, node, self.handshake_since)
            waiting = [
                (a, b)
                for a, b in pairs
                if (a.dev, b.public) not in shaken or (b.dev, a.public) not in shaken
            ]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if waiting:
            a, b = waiting[0]
            logs = "".join(f"\n--- {e.node} ---\n{self._log(tb, e)}" for e in (a, b))
            more = f" (and {len(waiting) - 1} more of {len(pairs)} pairs)"
            more = more if len(waiting) > 1 else ""
            raise LabError(f"{self.name}: {a.node} ({a.dev}) and {b.node} ({b.dev}) did not "
                           f"hand-shake within {limit:g} s{more}{logs}")  # fmt: skip

    @staticmethod
    def _shaken(tb: Testbed, node: str, since: bool = False) -> set[tuple[str, str]]:
        """(device, peer's public key) of each peer with a session on `node`: a handshake
        time, or (`since`: `handshake_since`) that or data bytes sent or received."""
        whats = ["latest-handshakes"] + ["transfer"] * since  # the time, late, if a ping was lost
        return {p for w in whats for p in shaken_peers(tb.run(node, ["wg", "show", "all", w],
                                                               check=False))}  # fmt: skip

    def stop(self, tb: Testbed) -> None:
        """Every device taken down first (the unreachable routes then hold the remote
        networks closed), then each end's rules and table removed — by their whole
        selectors, so only the run's own — each step tried whatever the last did."""
        errors: list[str] = []
        for e in self._ends:
            try:
                self._down(tb, e)
            except Exception as x:  # every step is tried; all are reported
                errors.append(f"taking down {e.dev} on {e.node}: {x}")
        for e in self._ends:
            if not e.routed:
                continue  # it made no rules or routes
            flushes = [
                ["ip", *fam, "route", "flush", "table", str(e.table)]
                for fam in dict.fromkeys(tuple(_family(n)) for n in _remote(e))
            ]
            for argv in [*reversed([r for r, _ in _rules(e, "del")]), *flushes]:
                try:
                    tb.run(e.node, argv, check=False)
                except Exception as x:
                    errors.append(f"{e.node}: {' '.join(argv)}: {x}")
        self._ends.clear()
        if errors:
            raise LabError(f"{self.name} did not stop cleanly: " + "; ".join(errors))

    def inner_mtu(self) -> int | None:
        """The smallest MTU of the running WireGuard devices, read from them."""
        tb = self._tb
        got = [link_mtu(tb, e.node, e.dev) for e in self._ends if tb is not None and e.routed]
        return min(got) if got else None

    def host_pids(self) -> dict[str, list[int]]:
        return {}

    def set_up_figures(self) -> dict[str, float | int | str]:
        return {}  # its start's time is all (the runner's `setup_s`)

    def rekey(self, tb: Testbed, dry: bool = False) -> dict[str, float | int | str]:
        raise no_rekey(self.name)  # WireGuard makes new session keys itself, every 2 min

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        return {}  # neither counts packets where the lab can read them per process


@functools.cache
def kernel_has_wireguard() -> tuple[bool, str]:
    """Whether this kernel makes WireGuard devices (its module); probed once, apart."""
    return probe("wgprobe", [], ["ip", "link", "add", "wgprobe0", "type", "wireguard"])


class Wireguard(_WireGuard):
    """The Linux kernel's WireGuard (5.6 and later; Debian's kernel has the module): a
    `wireguard` device per end made with `ip link`, keyed with `wg` over netlink. Its work
    is the kernel's — softirq and its own kernel threads, like xfrm's: no process of its
    own for the lab to meter apart."""

    name = "wireguard"

    def check(self, configuration: str) -> None:
        super().check(configuration)
        if self.on_hosts:
            return  # each host's kernel answers when the lab makes its device
        ok, said = kernel_has_wireguard()
        if not ok:
            raise Unsupported(
                f"this kernel ({platform.release()}) makes no WireGuard devices "
                f"({said or 'refused'}): run it in the micro-VM (--vm), whose Debian kernel "
                "has the wireguard module, or on a kernel that has it"
            )

    def _devices(self, tb: Testbed, ends: list[End]) -> None:
        for e in ends:  # in the node's namespace: its UDP socket is that namespace's too
            add = ["ip", "link", "add", "dev", e.dev, "type", "wireguard"]
            try:
                self._do(tb, e.node, add, ["ip", "link", "del", "dev", e.dev],
                         f"WireGuard device {e.dev}")  # fmt: skip
            except LabError as x:
                said = str(x)
                if on_hosts(tb) and ("Unknown device type" in said or "not supported" in said):
                    why = "no wireguard module: use wireguard-go there"
                    raise Unsupported(
                        f"{e.node}'s kernel makes no WireGuard devices ({why})"
                    ) from None
                raise

    def _down(self, tb: Testbed, e: End) -> None:
        tb.run(e.node, ["ip", "link", "del", "dev", e.dev], check=False)

    def pids(self) -> list[int]:
        return []

    def died(self) -> str | None:
        """Which device went (deleted under the run): its traffic met no tunnel."""
        tb = self._tb
        if tb is None:
            return None
        links = {
            node: tb.run(node, ["ip", "-o", "link", "show"], check=False)
            for node in dict.fromkeys(e.node for e in self._ends)
        }  # one ask a node
        gone = [
            f"{e.node}'s device {e.dev} is gone"
            for e in self._ends
            if not re.search(rf"^\d+: {re.escape(e.dev)}:", links[e.node], re.M)
        ]
        return "; ".join(gone) or None

    def _node_version(self, tb: Testbed, node: str) -> str:
        return f"Linux {tb.run(node, ['uname', '-r'], check=False).strip() or '?'}"

    def version(self) -> str:
        if self.on_hosts:
            return f"{self._version or 'Linux ?'} WireGuard (on the hosts)"
        return f"Linux {platform.release()} WireGuard"


def versions(by_node: dict[str, str]) -> str:
    """What the nodes said of their version: once where they agree, else each node's."""
    said = set(by_node.values())
    if len(said) <= 1:
        return next(iter(said), "")
    return "; ".join(f"{node}: {v}" for node, v in by_node.items())
