"""Our gateway daemon `ipsec-gw` (crates/ipsec-gw) as the IPsec under test: one in each
IPsec node, with manual keys generated fresh for each run, its config written to the run
directory, its counters read from its stats socket."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipsec_lab.backends import ours_rekey, sa_plan
from ipsec_lab.backends.base import Unsupported, exited, private_dir, private_file
from ipsec_lab.backends.ours_rekey import Gateway, Rollover
from ipsec_lab.backends.sa_plan import (
    IPCOMP_CPI,
    NO_BUNDLES,
    SPI,
    Keys,
    Layer,
    Layers,
    fresh_keys,
)
from ipsec_lab.meters import process_cpu_ns
from ipsec_lab.testbed import Tunnel, build
from ipsec_lab.testbed import tunnels as many
from ipsec_lab.testbed.build import LabError, tail
from ipsec_lab.testbed.interface import READY_S, OnHosts, Process, Testbed, on_hosts
from ipsec_lab.testbed.links import link_mtu
from ipsec_lab.testbed.ready import wait_for_socket, wait_for_text

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

# A fixed TUN MTU for the tests that need one (interop in the VM, over 1600-byte links);
# the lab's own gateways take `mtu = "auto"`: the path's MTU less the SAs' overhead.
TUN_MTU = 1500


def gateway_binary() -> Path | None:
    """The ipsec-gw the lab runs: `$IPSEC_GW` when set (another build: an older commit's,
    to run the tests or a campaign against it), else this checkout's build, else one on
    $PATH."""
    if os.environ.get("IPSEC_GW"):
        return Path(os.environ["IPSEC_GW"])
    here = Path(__file__).resolve().parents[3]
    for p in (here / "target/release/ipsec-gw", here / "target/debug/ipsec-gw"):
        if p.exists():
            return p
    found = shutil.which("ipsec-gw")
    return Path(found) if found else None


def layers(configuration: str, backend: str = "ours") -> Layers:
    ls = sa_plan.layers(configuration, backend)
    if ls.ipcomp and not ls.esp:
        raise Unsupported("ipsec-gw carries IPComp inside ESP only (a bundle needs ESP)")
    return ls


# The user ipsec-gw runs as once set up (its config's default; the Makefile creates it).
GATEWAY_USER = "ipsec-gw"


def gateway_socket_dir(tb: build.Testbed) -> Path:
    """Where the gateways' stats sockets go: a directory of the testbed's socket
    directory that the gateway's user owns, group root, 0770 — the gateway binds its
    socket there while still uid 0 (with no capability to override file modes) and
    removes it when it stops, no longer root; the socket directory itself only
    passable."""
    import pwd

    d = tb.sockets / "gw"
    tb.sockets.chmod(0o711)
    d.mkdir(mode=0o770, exist_ok=True)
    d.chmod(0o770)
    try:
        pw = pwd.getpwnam(GATEWAY_USER)
    except KeyError:
        raise LabError(
            f"no user {GATEWAY_USER!r}, which ipsec-gw runs as: `make gateway` creates it"
        ) from None
    os.chown(d, pw.pw_uid, 0)
    return d


# The gateway's default `tun_queue` (its TUN device's queue, 500 packets: LONG_TUN_QUEUE
# in crates/ipsec-gw/src/config/gateway.rs, held equal by a test), recorded in each row.
TUN_QUEUE = 500


def gateway_config(
    node: str,
    tunnel: Tunnel,
    ls: Layers,
    keys: Keys,
    stats: Path,
    udp_encap: bool = False,
    stage_timing: bool = False,
    tun: str = "ipsec0",
    table: int = 220,
    mtu: int | None = None,
    mode: str = "tunnel",
    esn: bool = False,
    aqm: bool = False,
    more: Sequence[tuple[str, str, Keys]] = (),
    tun_queue: int | str | None = None,
) -> str:
    """One gateway's TOML. A single SA is named `out` / `in`; a bundle's SAs `esp-out`,
    `ah-out`, … and the bundles `out` / `in` (IPComp inside ESP, AH outside it). `esn`:
    64-bit sequence numbers (RFC 4303 §2.2.1) on every SA. `mtu` None: "auto" (the
    outer path's MTU less the SAs' overhead, so nothing sealed is fragmented). `aqm`:
    CoDel on the outer receive queues (docs/gateway.md, "Queues"); `tun_queue`: packets the
    TUN device queues (None: the gateway's default). `more`: further
    tunnels between the same gateways, each (left selector, right selector, its own
    keys), their SAs `out-J` / `in-J` (J from 1) under SPIs of their own, their right
    selectors routed into the TUN device on the left (`testbed.tunnels`)."""
    end = tunnel.seen_from(node)
    left, me, peer, mine, theirs = end.left, end.outer, end.peer_outer, end.ts, end.peer_ts
    way = {"out": "lr" if left else "rl", "in": "rl" if left else "lr"}
    if ls.bundle:
        mode = "tunnel"  # a bundle's ESP builds the outer header
    if more and ls.bundle:
        raise Unsupported(NO_BUNDLES)

    def sa(x: Layer, direction: str, j: int = 0, keys: Keys = keys) -> str:
        name = f"{x.protocol}-{direction}" if ls.bundle else direction
        name += f"-{j}" if j else ""
        enc, integ = keys[(x.protocol, way[direction])]
        return (
            f'[[sa]]\nname = "{name}"\ndirection = "{direction}"\n'
            f"spi = {SPI[(x.protocol, way[direction])] + (j << 16)}\n"
            f'protocol = "{x.protocol}"\nmode = "{mode}"\nencryption = "{x.encryption}"\n'
            f'integrity = "{x.integrity}"\nenc_key = "{enc}"\ninteg_key = "{integ}"\n'
            f"legacy = {str(x.legacy).lower()}\nesn = {str(esn).lower()}\n\n"
        )

    mtu_text = '"auto"' if mtu is None else str(mtu)
    routes = [theirs] + ([many.FAR] if more and left else [])
    text = (
        f'[gateway]\ntun = "{tun}"\nmtu = {mtu_text}\ntable = {table}\n'
        f'local = "{me}"\nremote = "{peer}"\n'
        f"routes = {json.dumps(routes)}\n"
        f'stats = "{stats}"\nudp_encap = {str(udp_encap).lower()}\n'
        f"stage_timing = {str(stage_timing).lower()}\n"
        + ("aqm = true\n" * aqm)
        + (f"tun_queue = {json.dumps(tun_queue)}\n" if tun_queue is not None else "")
        + "\n"
    )
    for direction in ("out", "in"):
        text += "".join(sa(x, direction) for x in ls.sas())
        if ls.bundle:
            assert ls.esp is not None
            text += f'[[bundle]]\nname = "{direction}"\ndirection = "{direction}"\n'
            text += f'esp = "esp-{direction}"\n'
            if ls.ah:
                text += f'ah = "ah-{direction}"\n'
            if ls.ipcomp:
                text += f"ipcomp_cpi = {IPCOMP_CPI}\n"
            text += "\n"
    ref = "bundle" if ls.bundle else "sa"

    def policies(mine: str, theirs: str, suffix: str = "") -> str:
        return (
            f'\n[[policy]]\ndirection = "out"\nsrc = "{mine}"\ndst = "{theirs}"\n'
            f'action = "protect"\n{ref} = "out{suffix}"\n'
            f'\n[[policy]]\ndirection = "in"\nsrc = "{theirs}"\ndst = "{mine}"\n'
            f'action = "protect"\n{ref} = "in{suffix}"\n'
        )

    text += policies(mine, theirs).lstrip("\n")
    for j, (lts, rts, ks) in enumerate(more, start=1):
        text += "".join(sa(x, d, j, ks) for d in ("out", "in") for x in ls.sas())
        text += policies(*((lts, rts) if left else (rts, lts)), f"-{j}")
    return text


# The most a stats answer may be (a gateway's counters of many SAs are a few MiB).
STATS_MAX_BYTES = 64 << 20


def stats(path: Path, timeout: float = 5) -> dict[str, Any]:
    """A running gateway's counters (its JSON), asked on its stats socket as `ipsec-gw
    stats` asks (crates/ipsec-gw/src/stats.rs `fetch`: the line "json", then the answer
    until the gateway closes): no program started (under the VM's emulation one costs
    a tenth of a second or more, and the gateway tests ask many times)."""
    deadline = time.monotonic() + timeout  # for the whole answer, not each read
    chunks: list[bytes] = []
    got = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(b"json\n")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                s.settimeout(left)
                if not (chunk := s.recv(1 << 16)):
                    break
                chunks.append(chunk)
                got += len(chunk)
                if got > STATS_MAX_BYTES:
                    raise OSError(f"an answer over {STATS_MAX_BYTES >> 20} MiB")
    except TimeoutError:  # the deadline, or a read that waited past it
        raise LabError(f"ipsec-gw stats: {path}: no whole answer within {timeout:g} s") from None
    except OSError as e:
        raise LabError(f"ipsec-gw stats: {path}: {e.strerror or e}") from None
    try:
        data: dict[str, Any] = json.loads(b"".join(chunks))
    except ValueError as e:
        raise LabError(f"ipsec-gw stats: {path}: not its JSON ({e})") from None
    return data


class Ours:
    name = "ours"

    def __init__(
        self,
        udp_encap: bool = False,
        stage_timing: bool = False,
        edit: Callable[[str, str], str] | None = None,
        mode: str = "transport",
        binary: Path | None = None,
        aqm: bool = False,
        tunnels: int = 1,
        tun_queue: int | str | None = None,
    ) -> None:
        """`edit(key, toml)` may change each generated config before it is used (tests
        use it for mismatched keys, lifetimes, extra policies). `mode`: of host-to-host
        tunnels (gateways always use tunnel mode). `binary`: another ipsec-gw build than
        the repository's (benchmarks/io_ceiling.py's). `tunnels`: how many between the
        line testbed's gateways (`testbed.tunnels`), each with its own fresh keys."""
        self.tunnels = tunnels
        self.binary = binary
        self.mode = mode
        self.udp_encap = udp_encap
        # ESP in UDP to port 4500 (RFC 3948), with UDP GSO/GRO: a backend of its own
        self.name = "ours-udp" if udp_encap else "ours"
        self.stage_timing = stage_timing
        self.aqm = aqm  # CoDel on the gateways' receive queues (`[gateway] aqm`)
        self._tun_queue = tun_queue  # the scenario's (None: the gateway's default)
        self.edit = edit
        self.configs: dict[str, Path] = {}
        self._procs: dict[str, Process] = {}
        self.sockets: dict[str, Path] = {}
        # gateways on real hosts: key -> (node, the binary's path there)
        self._remote: dict[str, tuple[str, str]] = {}
        # gateway key -> (node, its TUN device)
        self._tuns: dict[str, tuple[str, str]] = {}
        # gateway key -> (node, the binary it ran): what releases its guard at stop
        self._release: dict[str, tuple[str, str]] = {}
        self._tb: Testbed | None = None
        self._on: OnHosts | None = None  # the testbed, when it is of real hosts
        self._pairs: list[tuple[str, str]] = []  # each tunnel's two gateway keys
        self._bundled = False  # whether the running configuration is a bundle
        self._rollover: Rollover | None = None  # the `rekey` workload's, once it began

    def use_hosts(self, hosts: Hosts) -> None:
        """Nothing to note: on real hosts the testbed itself says where and how each
        gateway runs (`HostsTestbed.program`, its preset binary)."""

    def check(self, configuration: str) -> None:
        ls = layers(configuration, self.name)
        if ls.ah and self.udp_encap:
            raise Unsupported("AH cannot cross UDP encapsulation (RFC 3948 carries ESP only)")
        if ls.bundle and self.tunnels > 1:
            raise Unsupported(NO_BUNDLES)
        if self._binary() is None:
            raise Unsupported("ipsec-gw is not built (`make native` builds it)")

    def _binary(self) -> Path | None:
        return self.binary or gateway_binary()

    @property
    def tun_queue(self) -> int | str:
        """Each TUN device's queue, as the row records it: the scenario's, or the
        gateway's default."""
        return TUN_QUEUE if self._tun_queue is None else self._tun_queue

    def start(self, tb: Testbed, configuration: str) -> None:
        """One ipsec-gw per tunnel end: a node in several tunnels (the clients topology's
        server) runs one per tunnel, each with its own TUN device, routing table and outer
        address. Processes, configs and sockets are keyed by node, or `node-tN` then.
        On real hosts its binary, configs and sockets go to each host's run directory,
        and its guard is released when it stops."""
        self.check(configuration)
        ls = layers(configuration, self.name)
        self._bundled = ls.bundle
        binary = self._binary()
        assert binary is not None
        self._tb = tb
        self._on = on = tb if on_hosts(tb) else None
        if on is None:
            d = private_dir(tb.rundir / "ipsec-gw")
            socks = gateway_socket_dir(build.of_namespaces(tb, "ipsec-gw's stats socket"))
        ends = [(n, t) for t in tb.topo.tunnels for n in (t.left, t.right)]
        why = many.refusal(tb.topo.name, self.tunnels)
        if why:
            raise Unsupported(why)
        for i, t in enumerate(tb.topo.tunnels):
            keys = fresh_keys(ls)
            more = [(a, b, fresh_keys(ls)) for a, b in many.selectors(t, self.tunnels)[1:]]
            host_to_host = t.left_ts.endswith("/32")
            pair: list[str] = []
            for node in (t.left, t.right):
                mine = [x for n, x in ends if n == node]
                k = mine.index(t)
                key = node if len(mine) == 1 else f"{node}-t{i}"
                pair.append(key)
                if on is not None:
                    gw = on.program(node, binary, "ipsec-gw", on.ipsec_gw(node))
                    sock = Path(on.owned_dir(node, "gw", GATEWAY_USER)) / f"gw-{key}.sock"
                else:
                    gw, sock = str(binary), socks / f"gw-{key}.sock"
                text = gateway_config(
                    node, t, ls, keys, sock, self.udp_encap, self.stage_timing,
                    tun=f"ipsec{k}", table=220 + k, aqm=self.aqm, tun_queue=self._tun_queue,
                    mode=self.mode if host_to_host else "tunnel", more=more,
                )  # fmt: skip
                text = self.edit(key, text) if self.edit else text
                if on is not None:
                    conf = Path(on.put(node, f"ipsec-gw/{key}.toml", text))
                    release = [gw, "--config", str(conf), "--release"]
                    on.record(node, f"ipsec-gw {key}'s guard", shlex.join(release))
                    self._remote[key] = (node, gw)
                else:
                    conf = d / f"{key}.toml"
                    private_file(conf, text)
                self.configs[key] = conf
                self._release[key] = (node, str(gw))  # the binary that ran, for --release
                self.sockets[key] = sock
                self._tuns[key] = (node, f"ipsec{k}")
                # fresh keys, never used before: the one case for --init-state
                self._procs[key] = tb.spawn(
                    node,
                    [gw, "--config", str(conf), "--init-state"],
                    f"ipsec-gw-{key}",
                    limited=node in tb.topo.limited_nodes,
                    ipsec=True,
                )
            self._pairs.append((pair[0], pair[1]))
        for key, sock in self.sockets.items():
            if on is not None:
                node, gw = self._remote[key]
                probe = [gw, "stats", "--socket", str(sock), "--json"]
                up = on.wait_socket(node, str(sock), probe, self._procs[key], 10)
                why = on.log_tail(node, f"ipsec-gw-{key}")
            else:
                up = wait_for_socket(sock, self._procs[key], timeout=READY_S)
                why = tail(tb.rundir / f"ipsec-gw-{key}.log")
            if not up:
                raise LabError(f"ipsec-gw {key} did not start:\n{why}")

    def _stats(self, key: str) -> dict[str, Any]:
        """Gateway `key`'s counters, read where it runs."""
        if key not in self._remote:
            return stats(self.sockets[key])
        node, gw = self._remote[key]
        assert self._on is not None
        out = self._on.run(node, [gw, "stats", "--socket", str(self.sockets[key]), "--json"],
                           timeout=15)  # fmt: skip
        data: dict[str, Any] = json.loads(out)
        return data

    def stop(self, tb: Testbed) -> None:
        """Each gateway stopped, then its guard released: a stopped gateway leaves its
        guard (fail closed), but the lab stops it for good, and the next backend on the
        testbed (WireGuard's, another IPsec's) must find the gateways as `none` left them —
        the guard's rule to its blackholes would drop that backend's traffic."""
        for p in self._procs.values():
            tb.stop(p)
        for key, (node, gw) in self._release.items():
            tb.run(node, [gw, "--config", str(self.configs[key]), "--release"], check=False)
        self._release.clear()
        self._pairs.clear()
        self._rollover = None
        self._procs.clear()
        self.sockets.clear()
        self._remote.clear()
        self._tuns.clear()

    def rekey(self, tb: Testbed, dry: bool = False) -> dict[str, Any]:
        """Every SA of every tunnel rolled over to a fresh SPI and fresh keys while
        traffic flows, made before it breaks (`ours_rekey`: three reloads of both
        gateways, each step in every gateway's workers before the next); its figures.
        Gateways on this machine only so far."""
        if self._remote:
            raise Unsupported("rekey: ipsec-gw on real hosts is not rekeyed yet (namespaces only)")
        if self._bundled:
            raise Unsupported(ours_rekey.NO_BUNDLES)
        if dry:
            return {}
        if self._rollover is None:

            def gateway(key: str) -> Gateway:
                def listed() -> dict[str, set[int]]:
                    st = stats(self.sockets[key])
                    return {d: {int(sa["spi"], 16) for sa in st[d]["sas"]}
                            for d in ("outbound", "inbound")}  # fmt: skip

                def counts(spis: list[int]) -> int:
                    st = stats(self.sockets[key])
                    return sum(int(sa["packets"]) for sa in st["inbound"]["sas"]
                               if int(sa["spi"], 16) in spis)  # fmt: skip

                return Gateway(key, self.configs[key],
                               lambda sig: self.process(key).send_signal(sig), listed, counts,
                               tb.rundir / f"ipsec-gw-{key}.log")  # fmt: skip

            self._rollover = Rollover((gateway(a), gateway(b)) for a, b in self._pairs)
        return self._rollover.rekey()

    def inner_mtu(self) -> int | None:
        """The smallest MTU the running gateways' TUN devices offer their hosts (each
        chose its own from its path and SAs: `mtu = "auto"`), read from the devices."""
        tb = self._tb
        got = [link_mtu(tb, node, tun) for node, tun in self._tuns.values() if tb]
        return min(got) if got else None

    def pids(self) -> list[int]:
        """This machine's ipsec-gw processes (on real hosts, none here)."""
        return [p.pid for k, p in self._procs.items() if p.poll() is None and k not in self._remote]

    def host_pids(self) -> dict[str, list[int]]:
        """On real hosts: node -> the PIDs there of its running ipsec-gw processes."""
        out: dict[str, list[int]] = {}
        for key, (node, _) in self._remote.items():
            p = self._procs.get(key)
            if p is not None and p.poll() is None:
                out.setdefault(node, []).append(p.pid)
        return out

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        """Per running gateway: (its process's CPU ns, packets its SAs sealed or opened)
        — the counters as its workers last published them (every 100 ms while busy).
        An empty clock when any running gateway's counters cannot be read: a sum with
        one gateway missing would make a packet look cheaper than it is."""
        out: dict[str, tuple[int, int]] = {}
        for key, p in self._procs.items():
            if p.poll() is not None:
                continue
            try:
                st = self._stats(key)
            except (KeyError, LabError, OSError, subprocess.TimeoutExpired, ValueError):
                return {}
            # with those of the SAs reloads took away (a rekey's old ones): never backwards
            n = sum(int(sa["packets"]) for d in ("outbound", "inbound") for sa in st[d]["sas"])
            n += sum(int(st[d].get("removed_sas", {}).get("packets", 0))
                     for d in ("outbound", "inbound"))  # fmt: skip
            if self._on is not None and key in self._remote:
                ns = self._on.cpu_ns(self._remote[key][0], p.pid)
            else:
                ns = process_cpu_ns([p.pid])
            out[key] = (ns, n)
        return out

    def set_up_figures(self) -> dict[str, float | int | str]:
        return {}  # its start's time is all (the runner's `setup_s`)

    def died(self) -> str | None:
        return exited(self._procs, "ipsec-gw")

    def stage_ns(self) -> dict[str, int]:
        """Nanoseconds per stage summed over every running gateway and SA (all zero
        unless the backend was made with `stage_timing`)."""
        out: dict[str, int] = {}
        for key in self.sockets:
            st = self._stats(key)
            for direction in ("outbound", "inbound"):
                for sa in st[direction]["sas"]:
                    for stage, v in (sa.get("stages") or {}).items():
                        out[stage] = out.get(stage, 0) + int(v["ns"])
        return out

    def process(self, node: str) -> subprocess.Popen[bytes]:
        """Gateway `node`'s process on this machine (namespaces only)."""
        p = self._procs[node]
        assert isinstance(p, subprocess.Popen), "a gateway on a real host"
        return p

    def restart(self, tb: Testbed, key: str, sig: int = signal.SIGTERM) -> subprocess.Popen[bytes]:
        """Stop one gateway with `sig` (SIGKILL: a crash, no cleanup), start it again with
        the same config, and wait until it is up again (its log says so)."""
        p = self.process(key)
        p.send_signal(sig)
        p.wait(10)
        binary = self._binary()
        assert binary is not None
        conf = self.configs[key]
        node = key.split("-t")[0]
        name = f"ipsec-gw-{key}"
        self._procs[key] = q = tb.spawn(
            node, [str(binary), "--config", str(conf)], name,
            limited=node in tb.topo.limited_nodes, ipsec=True,
        )  # fmt: skip
        log = tb.rundir / f"{name}.log"
        if not wait_for_text(log, "ipsec-gw: up", q, READY_S):
            raise LabError(f"ipsec-gw {key} did not start again:\n{tail(log)}")
        return self.process(key)

    def version(self) -> str:
        binary = self._binary()
        if binary is None:
            return "ipsec-gw (not built)"
        p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=5)
        return p.stdout.strip() or "ipsec-gw"
