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

from ipsec_lab.backends.base import Unsupported, private_dir
from ipsec_lab.model.transforms import (
    WIREGUARD,
    Layout,
    parse_configuration,
    wireguard_overhead,
)
from ipsec_lab.testbed import Tunnel
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
    proc: Process | None = None
    public: str = ""
    outer_family: tuple[str, ...] = ()  # `ip`'s family words of its endpoint's addresses


def _family(prefix: str) -> list[str]:
    """`ip`'s words for the family of an address or prefix."""
    return ["-6"] if ":" in prefix else []


RULES_WHAT = ("fwmark rule", "rule")


def _rules(e: End, op: str) -> list[list[str]]:
    """`e`'s two policy rules, `ip rule add` or `del` (`op`) by their whole selectors:
    WireGuard's own marked UDP looks up the main table first; the remote network, the
    end's table (its device's route, the unreachable one behind it)."""
    return [
        ["ip", *e.outer_family, "rule", op, "fwmark", FWMARK, "lookup", "main", "pref",
         str(e.pref)],
        ["ip", *_family(e.theirs), "rule", op, "to", e.theirs, "lookup", str(e.table), "pref",
         str(e.pref + 1)],
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

    def __init__(self) -> None:
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
    def _free(tb: Testbed, e: End, ports: set[int]) -> None:
        """Refuse to start where the rules' preferences or the routing table `e` needs are
        taken — on a real host, the host's own: the lab adds to a host, never replaces —
        and move its UDP port past any in use (the host's own WireGuard's, another end's
        of this run: `ports`)."""
        taken = []
        for fam in ([], ["-6"]):  # (a host without IPv6 answers nothing for -6)
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
            busy = e.port in ports or tb.run(e.node, ["ss", "-Hlun", f"sport = :{e.port}"],
                                             check=False).strip()  # fmt: skip
            if not busy:
                ports.add(e.port)
                return
            e.port += PORT_STEP
        raise LabError(f"{e.node}: no free UDP port for WireGuard end {e.dev} "
                       f"({PORT_TRIES} tried from {PORT}, every {PORT_STEP})")  # fmt: skip

    @staticmethod
    def _routed(tb: Testbed, e: End) -> None:
        """The remote network does reach the device: a rule of the host's own ahead of the
        run's (a lower preference, matching it) would send it by another table — on a
        gateway with the plain route, in clear. Refused, naming what the kernel chose."""
        net = ipaddress.ip_network(e.theirs, strict=False)
        probe_addr = str(net.network_address + (1 if net.num_addresses > 1 else 0))
        got = json.loads(tb.run(e.node, ["ip", "-j", "route", "get", probe_addr]) or "[]")
        dev = got[0].get("dev") if got else None
        if dev != e.dev:
            raise LabError(f"{e.node}: traffic for {e.theirs} would not enter WireGuard end "
                           f"{e.dev} but {dev or got} (a rule of the host's own ahead of the "
                           f"lab's at preference {e.pref + 1}? `ip rule show` there): "
                           "refused rather than measured in clear")  # fmt: skip

    def _ends_of(self, tb: Testbed) -> list[tuple[End, End, Tunnel]]:
        token = tb.token
        pairs: list[tuple[End, End, Tunnel]] = []
        n = 0
        for t in tb.topo.tunnels:
            ends = []
            for side in (t.seen_from(t.left), t.seen_from(t.right)):
                # numbered across the run, not per node: two nodes on one machine (real
                # hosts) never share a table, a rule's preference or a port. wireguard-go's
                # UAPI socket's directory is the machine's: a name of the testbed's (the
                # kernel's devices take the same names)
                ends.append(End(side.node, f"ipl{token}w{n}", PORT + n, TABLE + n,
                                RULE_PREF + 2 * n, side.ts, side.peer_ts))  # fmt: skip
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
        for a, b, _ in pairs:
            for e in (a, b):
                self._free(tb, e, ports)
                self._ends.append(e)
                keys[e.dev], e.public = key_pair(tb, e.node, e.dev)
        self._version = versions({e.node: self._node_version(tb, e.node) for e in self._ends})
        self._devices(tb, self._ends)
        for a, b, t in pairs:
            for e, peer, addr, peer_addr in ((a, b, t.left_outer, t.right_outer),
                                             (b, a, t.right_outer, t.left_outer)):  # fmt: skip
                # a peer set only once gets its lasting keepalive now (the left end's)
                keep = KEEPALIVE_S if not self.modifies_peers and e is a else None
                self._up(tb, e, peer, addr, peer_addr, keys[e.dev], keep)
        for e in self._ends:
            self._routed(tb, e)
        for a, b, _ in pairs:  # both ends listen: the left one's keepalive starts it
            if self.modifies_peers:
                tb.run(a.node, ["wg", "set", a.dev, "peer", b.public, "persistent-keepalive",
                                "1"])  # fmt: skip
            else:
                self._kick(tb, a)
        # the keepalive started it; every KEEPALIVE_S seconds it keeps the session up, so
        # no later run of this backend pays for a handshake either
        for a, b, _ in pairs:
            self._handshake(tb, a, b)

    def _node_version(self, tb: Testbed, node: str) -> str:
        raise NotImplementedError

    def _up(self, tb: Testbed, e: End, peer: End, addr: str, peer_addr: str,
            key: str, keepalive: str | None = None) -> None:  # fmt: skip
        """Device `e` up at the path's MTU less WireGuard's overhead, keyed to `peer` (with
        a persistent `keepalive` in seconds, if given), the remote network routed into it
        (failing closed)."""
        route = json.loads(tb.run(e.node, ["ip", "-j", "route", "get", peer_addr]) or "[]")
        if not route or "dev" not in route[0]:
            raise LabError(f"{e.node}: no route to its WireGuard peer {peer_addr} ({route})")
        out_dev = str(route[0]["dev"])
        version = 6 if ":" in peer_addr else 4
        mtu = link_mtu(tb, e.node, out_dev) - wireguard_overhead(Layout(outer=version))
        tb.run(e.node, ["ip", "link", "set", "dev", e.dev, "mtu", str(mtu), "up"])
        endpoint = f"[{peer_addr}]:{peer.port}" if version == 6 else f"{peer_addr}:{peer.port}"
        keep = ["persistent-keepalive", keepalive] if keepalive else []
        tb.run(e.node, ["wg", "set", e.dev, "listen-port", str(e.port), "fwmark", FWMARK,
                        "private-key", key, "peer", peer.public, "endpoint", endpoint,
                        "allowed-ips", e.theirs, *keep])  # fmt: skip
        fam = _family(e.theirs)
        table = str(e.table)
        flush = ["ip", *fam, "route", "flush", "table", table]  # a table that was empty
        self._do(tb, e.node, ["ip", *fam, "route", "replace", "unreachable", e.theirs, "metric",
                              str(UNREACHABLE_METRIC), "table", table], flush,
                 f"WireGuard {e.dev}'s routing table {table}")  # fmt: skip
        # a host's own traffic (host to host: `mine` is its address) leaves with that
        # address, not the one the kernel would pick for a device without any (the first
        # interface's: a real host's management NIC, which the peer's allowed-ips drop)
        mine = ipaddress.ip_network(e.mine, strict=False)
        src = ["src", str(mine.network_address)] if mine.num_addresses == 1 else []
        tb.run(e.node, ["ip", *fam, "route", "replace", e.theirs, "dev", e.dev, *src, "table",
                        table])  # fmt: skip
        e.outer_family = tuple(_family(addr))
        for add, delete, what in zip(_rules(e, "add"), _rules(e, "del"), RULES_WHAT):
            self._do(tb, e.node, add, delete, f"WireGuard {e.dev}'s {what}")
        if on_hosts(tb):  # undone newest first: the device down before its rules go
            tb.record(e.node, f"WireGuard {e.dev} down before its rules go",
                      shlex.join(["ip", "link", "set", "dev", e.dev, "down"]))  # fmt: skip

    @staticmethod
    def _kick(tb: Testbed, e: End) -> None:
        """One packet from `e`'s node into its tunnel (a ping to the remote network's
        first address, answered or not): a session's first packet starts the handshake."""
        net = ipaddress.ip_network(e.theirs, strict=False)
        to = str(net.network_address + (1 if net.num_addresses > 1 else 0))
        tb.run(e.node, ["ping", "-c", "1", "-W", "1", to], check=False)

    def _handshake(self, tb: Testbed, a: End, b: End) -> None:
        """Wait (bounded) until both ends have a session, then slow the keepalive that
        started it to one every KEEPALIVE_S seconds (the session stays up between a
        backend's runs; a 32-byte packet each time, nothing beside a measurement)."""
        deadline = time.monotonic() + HANDSHAKE_S
        while True:
            done = all(self._shaken(tb, e) for e in (a, b))
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not done:
            logs = "".join(f"\n--- {e.node} ---\n{self._log(tb, e)}" for e in (a, b))
            raise LabError(f"{self.name}: {a.node} and {b.node} did not hand-shake within "
                           f"{HANDSHAKE_S:g} s{logs}")  # fmt: skip
        if self.modifies_peers:
            tb.run(a.node, ["wg", "set", a.dev, "peer", b.public, "persistent-keepalive",
                            KEEPALIVE_S])  # fmt: skip

    @staticmethod
    def _shaken(tb: Testbed, e: End) -> bool:
        out = tb.run(e.node, ["wg", "show", e.dev, "latest-handshakes"], check=False)
        return any(int(f[1]) > 0 for f in (ln.split() for ln in out.splitlines()) if len(f) == 2)

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
            fam = _family(e.theirs)
            for argv in [*reversed(_rules(e, "del")),
                         ["ip", *fam, "route", "flush", "table", str(e.table)]]:  # fmt: skip
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
        got = [link_mtu(tb, e.node, e.dev) for e in self._ends if tb is not None]
        return min(got) if got else None

    def host_pids(self) -> dict[str, list[int]]:
        return {}

    def set_up_figures(self) -> dict[str, float | int | str]:
        return {}  # its start's time is all (the runner's `setup_s`)

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        return {}  # neither counts packets where the lab can read them per process


@functools.cache
def kernel_has_wireguard() -> tuple[bool, str]:
    """Whether this kernel makes WireGuard devices (the `wireguard` module, loaded on
    demand); probed once per process in a scratch namespace."""
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
        """Which device went (deleted under the run): its traffic met the unreachable
        route, not the tunnel."""
        tb = self._tb
        if tb is None:
            return None
        gone = [f"{e.node}'s device {e.dev} is gone" for e in self._ends
                if not re.search(rf"^\d+: {re.escape(e.dev)}:", tb.run(
                    e.node, ["ip", "-o", "link", "show"], check=False), re.M)]  # fmt: skip
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
