"""strongSwan as the IPsec under test: charon in each IPsec node, a real IKEv2 exchange
with a pre-shared key made fresh for each run, configured through swanctl over charon's
VICI socket. Two data planes:

- `strongswan-kernel`: the SAs go into the kernel's xfrm (kernel-netlink) — the way most
  people deploy strongSwan; raw ESP, AH and IPComp as the kernel does them;
- `strongswan-libipsec`: kernel-libipsec, strongSwan's own ESP in user space on a TUN
  device, for kernels without IPsec;
- `strongswan`: the kernel one where the kernel has ESP, else libipsec (each run records
  which in its backend version).

Several charons on one machine: each runs in its node's network namespace and in a mount
namespace of its own with a private /run (charon's PID file path is fixed at build time),
reading a strongswan.conf of ours (STRONGSWAN_CONF) with its VICI socket in the run
directory. kernel-libipsec carries ESP in UDP only (RFC 3948, `encap = yes`): the wire
overhead is ESP's plus 8 bytes of UDP. It does no AH and no IPComp.

On real hosts (`--hosts`) each gateway runs the host's own charon and swanctl the same
way, its configuration pushed into the run's directory there (the PSK 0600) and swanctl
run there against that charon's VICI socket. The host's kernel decides `strongswan`'s
data plane. charon removes its SAs, policies and routes when the lab stops it (SIGTERM,
also from the ledger after a lost connection); for the kernel plane the ledger also
holds the deletes of the policies and SAs between the lab's own addresses, and a host
that already has such a policy is refused rather than changed.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ipsec_lab.backends.base import (
    Unsupported,
    exited,
    ipsec_configuration,
    no_rekey,
    private_dir,
    private_file,
)
from ipsec_lab.backends.charon_files import (
    IKE_SAS,
    SETUP_POLL_S,
    SETUP_S,
    SETUP_S_PER_TUNNEL,
    LogCount,
    charon_conf,
    swanctl_conf,
)
from ipsec_lab.testbed import Tunnel, build
from ipsec_lab.testbed.build import LabError, require_tools, tail
from ipsec_lab.testbed.interface import READY_S, OnHosts, Process, Testbed, on_hosts
from ipsec_lab.testbed.ready import wait_for_socket
from ipsec_lab.testbed.tunnels import refusal as tunnels_refusal

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

CHARON = "/usr/lib/ipsec/charon"
# libipsec's TUN device has a fixed 1400-byte MTU and reads packets into buffers of that
# size (raising the device MTU afterwards breaks it): TCP finds it by path-MTU discovery,
# and the lab sends UDP without DF so the gateway fragments larger packets.
TUN_MTU = 1400
# Why kernel-libipsec cannot carry the lab's N tunnels: it routes each outbound policy
# into its TUN device from an address of the gateway inside the CHILD_SA's local TS
# (kernel_libipsec_ipsec.c, install_route), and fails the CHILD_SA where there is none
# ("error installing route with policy"): gwB's local TS of tunnel i > 0 is one address
# of FAR, the server's (testbed/tunnels.py).
LIBIPSEC_NO_TUNNELS = (
    "strongSwan's kernel-libipsec sets up one tunnel here: it routes each CHILD_SA from "
    "an address of the gateway inside its local traffic selector, and the far tunnels' "
    "selectors (addresses of the server) hold none; strongswan-kernel (--vm) sets up many"
)
# The directories `swanctl --load-all` reads beside swanctl.conf
SWANCTL_DIRS = ("x509", "x509ca", "private", "pubkey", "rsa", "ecdsa", "pkcs8")
# N tunnels on real hosts: the set-up is timed from charon's log as this machine reads
# it (LogCount), which on a host is the host's file
NO_HOSTS_TUNNELS = (
    "its set-up is timed from charon's log as read on this machine: "
    "many tunnels on namespaces (--vm here) only, so far"
)


def kernel_proposals(
    configuration: str, backend: str = "strongswan"
) -> tuple[str | None, str | None, bool]:
    """(ESP proposal, AH proposal, IPComp) for charon on the kernel's xfrm: strongSwan's
    names are ours (`esp:aes128-sha1` -> `aes128-sha1`, `ah:sha256` -> `sha256`)."""
    c = ipsec_configuration(configuration, backend)
    if c.ah and c.ah.kernel is None:
        raise Unsupported(f"the kernel has no AH with {c.ah.title} ({c.ah.rfc} AH is not in Linux)")
    esp = ah = None
    for part in configuration.strip().lower().split("+"):
        proto, _, algs = part.partition(":")
        if proto == "esp":
            esp = algs
        elif proto == "ah":
            ah = algs
        elif proto not in ("ipcomp",):
            esp = part  # a bare suite is ESP's
    return esp, ah, c.ipcomp


def esp_proposal(configuration: str, backend: str = "strongswan") -> str:
    """`esp:aes128-sha1` -> strongSwan's ESP proposal `aes128-sha1`; refuses what
    kernel-libipsec cannot do."""
    c = ipsec_configuration(configuration, backend)
    if c.ah:
        raise Unsupported("strongSwan's kernel-libipsec does ESP only, no AH")
    if c.ipcomp:
        raise Unsupported("strongSwan's kernel-libipsec does no IPComp")
    assert c.esp is not None
    cipher, integ = c.esp
    if not cipher.libipsec:
        # libipsec: "failed to create ESP context: unsupported AEAD algorithm NULL_AES_GMAC"
        raise Unsupported(f"strongSwan's kernel-libipsec does not do ESP with {cipher.title}")
    if cipher.kind == "cbc" and integ.name == "null":
        # libipsec: "failed to create ESP context: unsupported integrity algorithm UNDEFINED"
        raise Unsupported("strongSwan's kernel-libipsec cannot do ESP encryption without integrity")
    return configuration.strip().lower().split(":", 1)[1]


# said wherever `strongswan` resolves to its user-space ESP
LIBIPSEC_SLOWER = (
    "strongSwan's user-space ESP (kernel-libipsec on a TUN device), not the kernel's: "
    "slower, and a different thing to measure; `--vm` runs the kernel's"
)


def resolve(hosts: Hosts | None = None) -> tuple[str, str]:
    """What `strongswan` (the data plane chosen where it runs) runs as here or on `hosts`,
    and why."""
    import os

    if hosts is not None:
        return (
            "strongswan",
            "kernel xfrm if the gateways' kernels have ESP, else libipsec (at start)",
        )
    if os.geteuid() != 0:
        return (
            "strongswan",
            "kernel xfrm if this kernel has ESP, else libipsec (probing needs root)",
        )
    from ipsec_lab.backends.xfrm import kernel_has

    ok, said = kernel_has("esp")
    if ok:
        return "strongswan-kernel", "this kernel has ESP in xfrm"
    return "strongswan-libipsec", f"this kernel has no ESP in xfrm ({said or 'refused'})"


class StrongSwan:
    name = "strongswan"

    def __init__(self, data_plane: str = "auto", tunnels: int = 1, ike_sas: str = "one") -> None:
        """`data_plane`: kernel, libipsec, or auto (the kernel where it has ESP).
        `tunnels`: how many between the line testbed's gateways, set up as `ike_sas`
        says (IKE_SAS)."""
        if ike_sas not in IKE_SAS:
            raise ValueError(f"ike_sas must be one of {', '.join(IKE_SAS)}, not {ike_sas!r}")
        self.tunnels = tunnels
        self.ike_sas = ike_sas
        self._set_up: dict[str, float | int | str] = {}
        self._procs: dict[str, Process] = {}
        self.data_plane = data_plane
        self.name = {"kernel": "strongswan-kernel", "libipsec": "strongswan-libipsec"}.get(
            data_plane, "strongswan"
        )
        self.on_hosts = False
        self._hosts_esp: bool | None = None  # `auto` on hosts: their kernels have ESP
        # real hosts: node -> (strongswan.conf, VICI socket, charon's log) there
        self._remote: dict[str, tuple[str, str, str]] = {}
        self._undo: dict[str, str] = {}  # real hosts, kernel plane: node -> deletes
        self._tb: Any = None

    def use_hosts(self, hosts: Hosts) -> None:
        self.on_hosts = True

    @property
    def kernel(self) -> bool:
        if self.data_plane == "auto":
            if self.on_hosts:
                return bool(self._hosts_esp)
            from ipsec_lab.backends.xfrm import kernel_has

            return kernel_has("esp")[0]
        return self.data_plane == "kernel"

    def check(self, configuration: str) -> None:
        if self.on_hosts:
            # the hosts' charon and kernels answer there (`hosts check`, and at start)
            if self.data_plane == "libipsec":
                esp_proposal(configuration, self.name)
            else:
                kernel_proposals(configuration, self.name)
            return
        ipsec_configuration(configuration, self.name)  # what it runs, before what it needs
        require_tools(CHARON, "swanctl", "unshare")
        if not self.kernel:
            esp_proposal(configuration, self.name)
            if self.tunnels > 1:
                raise Unsupported(f"{self.tunnels} tunnels: {LIBIPSEC_NO_TUNNELS}")
            return
        from ipsec_lab.backends.xfrm import kernel_has

        esp, ah, ipcomp = kernel_proposals(configuration, self.name)
        for kind, wanted in (("esp", esp), ("ah", ah), ("comp", ipcomp)):
            if not wanted:
                continue
            ok, said = kernel_has(kind)
            if not ok:
                raise Unsupported(
                    f"strongswan-kernel: this kernel has no {kind.upper()} in xfrm "
                    f"({said or 'refused'}): use strongswan-libipsec, or run with --vm"
                )

    @staticmethod
    def _log(tb: Testbed, node: str) -> Path:
        return tb.rundir / "strongswan" / node / "charon.log"

    def _swanctl(self, tb: Testbed, node: str, *args: str, timeout: float = 30) -> str:
        if on_hosts(tb) and node in self._remote:
            conf, vici, _ = self._remote[node]
            try:
                return tb.run(node, ["env", f"STRONGSWAN_CONF={conf}", "swanctl", *args,
                                     "--uri", f"unix://{vici}"], timeout=timeout)  # fmt: skip
            except LabError as e:
                logs = "".join(f"\n--- charon log tail, {n} ---\n{self._remote_log(tb, n)}"
                               for n in self._remote)  # fmt: skip
                raise LabError(f"strongswan on {node}: swanctl {' '.join(args)} failed: "
                               f"{str(e)[-1500:]}{logs}") from None  # fmt: skip
        d = tb.rundir / "strongswan" / node
        socks = build.of_namespaces(tb, "charon's VICI socket").sockets
        argv = ["swanctl", *args, "--uri", f"unix://{socks / (node + '.vici')}"]
        try:
            p = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={"STRONGSWAN_CONF": str(d / "strongswan.conf"), "PATH": "/usr/sbin:/usr/bin"},
                check=False,
            )
        except subprocess.TimeoutExpired:
            logs = "".join(f"\n--- charon log tail, {n} ---\n{tail(self._log(tb, n))}"
                           for n in tb.topo.ipsec_nodes)  # fmt: skip
            raise LabError(f"strongswan on {node}: swanctl {' '.join(args[:2])} gave no "
                           f"answer within {timeout:g} s{logs}") from None  # fmt: skip
        if p.returncode != 0:
            logs = "".join(
                f"\n--- charon log tail, {n} ---\n{tail(self._log(tb, n))}"
                for n in tb.topo.ipsec_nodes
            )
            raise LabError(
                f"strongswan on {node}: swanctl {' '.join(args)} failed:\n"
                f"{(p.stdout + p.stderr).strip()[-1500:]}{logs}"
            )
        return p.stdout

    @staticmethod
    def _remote_log(tb: OnHosts, node: str) -> str:
        text: str = tb.log_tail(node, f"charon-{node}-ike") or tb.log_tail(node, f"charon-{node}")
        return text

    def _start_on_host(self, tb: OnHosts, node: str, mine: list[Tunnel], esp: str | None,
                       ah: str | None, ipcomp: bool, kernel: bool, psk: str) -> None:  # fmt: skip
        """charon on real host `node`: its files in the run's directory there, the xfrm
        it will install guarded (kernel plane), then started as in a namespace."""
        wd = tb.workdir(node)
        d, log = f"{wd}/strongswan", f"{wd}/charon-{node}-ike.log"
        vici = f"{d}/charon.vici"
        tb.run(node, ["mkdir", "-p", "-m", "0700", d, *(f"{d}/{x}" for x in SWANCTL_DIRS)])
        conf = tb.put(node, "strongswan/strongswan.conf", charon_conf(vici, log, kernel))
        tb.put(node, "strongswan/swanctl.conf",
               swanctl_conf(node, mine, esp, psk, ah, ipcomp, kernel))  # fmt: skip
        if kernel:
            self._guard_xfrm(tb, node, mine)
        self._remote[node] = (conf, vici, log)
        self._procs[node] = tb.spawn(
            node,
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"mount -t tmpfs tmpfs /run && exec {CHARON}"],
            f"charon-{node}",
            env={"STRONGSWAN_CONF": conf},
        )  # fmt: skip

    def _guard_xfrm(self, tb: OnHosts, node: str, mine: list[Tunnel]) -> None:
        """Before charon puts SAs into a host's kernel: refuse a host that already has a
        policy between the lab's networks, and write to its ledger the deletes of every
        policy and SA charon may leave between the lab's addresses."""
        from ipsec_lab.backends.xfrm import _plain, _present

        undo: list[str] = []
        for t in mine:
            end = t.seen_from(node)
            me, peer, lts, rts = end.outer, end.peer_outer, end.ts, end.peer_ts
            pol = ["ip", "xfrm", "policy", "delete", "dir"]
            undo += [shlex.join([*pol, "out", "src", lts, "dst", rts]),
                     shlex.join([*pol, "in", "src", rts, "dst", lts]),
                     shlex.join([*pol, "fwd", "src", rts, "dst", lts])]  # fmt: skip
            sa = ["ip", "xfrm", "state", "deleteall", "src"]
            undo += [shlex.join([*sa, _plain(me), "dst", _plain(peer)]),
                     shlex.join([*sa, _plain(peer), "dst", _plain(me)])]  # fmt: skip
        policies = [u for u in undo if " policy " in u]
        have = [h for h in tb.run(node, ["sh", "-c", _present(policies)]).split("\n") if h]
        if have:
            raise LabError(f"{node} already has xfrm {have[0]}: the lab will not replace "
                           "IPsec it did not make; remove it or give the hosts other "
                           "addresses")  # fmt: skip
        line = "; ".join(f"{u} 2>/dev/null" for u in undo) + "; true"
        tb.record(node, "xfrm policies and SAs charon installs", line)
        self._undo[node] = line

    @staticmethod
    def _host_has_esp(tb: Any, nodes: list[str]) -> bool:
        """Whether every one of `nodes` has ESP in its kernel (loaded, or a module)."""
        line = "(test -d /sys/module/esp4 || modinfo -n esp4 >/dev/null 2>&1) && echo yes"
        return all(tb.run(n, ["sh", "-c", line], check=False).strip() == "yes" for n in nodes)

    def start(self, tb: Testbed, configuration: str) -> None:
        self.check(configuration)
        self._tb = tb
        on = tb if on_hosts(tb) else None
        topo = tb.topo
        if on is not None and self.data_plane == "auto":
            self._hosts_esp = self._host_has_esp(tb, list(topo.ipsec_nodes))
        kernel = self.kernel
        if kernel:
            esp, ah, ipcomp = kernel_proposals(configuration, self.name)
        else:
            esp, ah, ipcomp = esp_proposal(configuration, self.name), None, False
        psk = secrets.token_hex(32)  # fresh per run; written only to the run's own files
        if self.tunnels > 1:
            why = tunnels_refusal(topo.name, self.tunnels) or (
                f"{self.tunnels} tunnels on real hosts: {NO_HOSTS_TUNNELS}" if on else None
            )
            if why:
                raise LabError(f"strongswan: {why}")
        self._set_up = {}
        for node in topo.ipsec_nodes:
            if on is not None:
                mine = [t for t in topo.tunnels if node in (t.left, t.right)]
                self._start_on_host(on, node, mine, esp, ah, ipcomp, kernel, psk)
                continue
            d = private_dir(tb.rundir / "strongswan" / node)
            for sub in SWANCTL_DIRS:
                (d / sub).mkdir(exist_ok=True)  # swanctl --load-all looks for these
            conf = d / "strongswan.conf"
            vici = build.of_namespaces(tb, "charon's VICI socket").sockets / f"{node}.vici"
            conf.write_text(charon_conf(vici, d / "charon.log", kernel))
            mine = [t for t in topo.tunnels if node in (t.left, t.right)]
            initiates = self.tunnels > 1 and any(t.left == node for t in mine)
            private_file(d / "swanctl.conf", swanctl_conf(
                node, mine, esp, psk, ah, ipcomp, kernel, self.tunnels, self.ike_sas,
                initiates))  # fmt: skip
            vici.unlink(missing_ok=True)
            (d / "charon.log").unlink(missing_ok=True)  # its tail must be this run's
            self._procs[node] = tb.spawn(
                node,
                ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 f"mount -t tmpfs tmpfs /run && exec {CHARON}"],
                f"charon-{node}",
                env={"STRONGSWAN_CONF": str(conf)},
                limited=node in topo.limited_nodes, ipsec=True,
            )  # fmt: skip
        for node in topo.ipsec_nodes:
            if on is not None:
                rconf, rvici, _ = self._remote[node]
                probe = ["env", f"STRONGSWAN_CONF={rconf}", "swanctl", "--stats",
                         "--uri", f"unix://{rvici}"]  # fmt: skip
                if not on.wait_socket(node, rvici, probe, self._procs[node], 15):
                    raise LabError(f"strongswan: charon on {node} did not start (no VICI "
                                   f"socket {rvici}):\n{self._remote_log(on, node)}")  # fmt: skip
                continue
            vici = build.of_namespaces(tb, "charon's VICI socket").sockets / f"{node}.vici"
            if not wait_for_socket(vici, self._procs[node], timeout=READY_S):
                raise LabError(
                    f"strongswan: charon on {node} did not start (no VICI socket {vici}):\n"
                    f"{tail(tb.rundir / f'charon-{node}.log')}\n"
                    f"{tail(self._log(tb, node))}"
                )
        if self.tunnels > 1:
            self._set_up_many(tb)
            return
        for node in topo.ipsec_nodes:
            if on is not None:
                sw = self._remote[node][0].replace("strongswan.conf", "swanctl.conf")
            else:
                sw = str(tb.rundir / "strongswan" / node / "swanctl.conf")
            self._swanctl(tb, node, "--load-all", "--file", sw)
        for t in topo.tunnels:
            mine = [x for x in topo.tunnels if t.left in (x.left, x.right)]
            child = f"c{mine.index(t)}"
            self._swanctl(tb, t.left, "--initiate", "--child", child, "--timeout", "20")

    def stop(self, tb: Testbed) -> None:
        for p in self._procs.values():
            tb.stop(p)  # SIGTERM: charon deletes its SAs, policies and routes
        self._procs.clear()
        for node, line in self._undo.items():  # and what it may have left, on hosts
            tb.run(node, ["sh", "-c", line], check=False)
        self._undo.clear()
        self._remote.clear()

    def set_up_figures(self) -> dict[str, float | int | str]:
        """How its last start set its tunnels up (N > 1: `_set_up_many`'s figures)."""
        return dict(self._set_up)

    def rekey(self, tb: Testbed, dry: bool = False) -> dict[str, Any]:
        raise no_rekey(self.name)  # by IKE (a short rekey_time): to come

    def _set_up_many(self, tb: Testbed) -> None:
        """N tunnels up at once, timed (issue 44's IKE set-up rate): the responders'
        configurations loaded, then the initiator's, whose children start as they load
        (`start_action = start`); done when each charon's log has said every CHILD_SA
        established, and each charon's own list then holds N installed. The figures:
        the time from the initiator's load, tunnels per second, the IKE retransmits and
        failures the logs report, and the charons' CPU over the set-up."""
        from ipsec_lab.meters import process_cpu_ns

        topo, n = tb.topo, self.tunnels
        nodes = list(topo.ipsec_nodes)
        initiators = [x for x in nodes if any(t.left == x for t in topo.tunnels)]
        pids = self.pids()
        bound = SETUP_S + SETUP_S_PER_TUNNEL * n

        def load(node: str) -> None:
            conf = tb.rundir / "strongswan" / node / "swanctl.conf"
            # the initiator's load answers as charon gets round to it, beside the
            # set-up its first connections start: within the set-up's own bound
            self._swanctl(tb, node, "--load-all", "--file", str(conf), timeout=bound)

        for node in nodes:  # the responders first, waiting
            if node not in initiators:
                load(node)
        cpu0, t0 = process_cpu_ns(pids), time.monotonic()  # the initiators' load starts it
        for node in initiators:
            load(node)
        # every load below: a charon's log read from where the last read ended
        logs = {x: LogCount(self._log(tb, x)) for x in nodes}
        while True:
            for c in logs.values():
                c.read()
            up = min(c.established for c in logs.values())
            failed = max(c.failed for c in logs.values())  # each end says it of one
            if up >= n or up + failed >= n or time.monotonic() - t0 > bound:
                break
            if self.died():
                raise LabError(f"strongswan: {self.died()} while setting up {n} tunnels")
            time.sleep(SETUP_POLL_S)
        took = time.monotonic() - t0
        cpu = process_cpu_ns(pids) - cpu0
        retransmits = sum(c.retransmits for c in logs.values())
        if up < n:
            tails = "".join(f"\n--- charon log tail, {x} ---\n{tail(self._log(tb, x))}"
                            for x in nodes)  # fmt: skip
            raise LabError(
                f"strongswan: {up} of {n} CHILD_SAs established after {took:.1f} s "
                f"({failed} failed, {retransmits} IKE retransmits; IKE_SAs: {self.ike_sas})"
                f"{tails}")  # fmt: skip
        for node in nodes:  # each charon's own word, not the log's: N installed
            have = self._swanctl(tb, node, "--list-sas", "--raw", timeout=60 + n / 10)
            got = have.count("state=INSTALLED")
            if got != n:
                raise LabError(f"strongswan on {node}: {got} CHILD_SAs installed, not {n}, "
                               "though its log said all were established")  # fmt: skip
        self._set_up = {
            "ike_sas": self.ike_sas,
            "ike_setup_s": took,
            "tunnels_per_s": n / took if took > 0 else 0.0,
            "ike_retransmits": retransmits,
            "ike_cpu_s": cpu / 1e9,
        }

    def pids(self) -> list[int]:
        """This machine's charon processes (on real hosts, none here)."""
        if self._remote:
            return []
        return [p.pid for p in self._procs.values() if p.poll() is None]

    def host_pids(self) -> dict[str, list[int]]:
        """On real hosts: node -> the PID there of its running charon."""
        return {n: [p.pid] for n, p in self._procs.items() if n in self._remote
                and p.poll() is None}  # fmt: skip

    def plane_clock(self) -> dict[str, tuple[int, int]]:
        return {}  # kernel-libipsec's packets are not counted where the lab can read them

    def died(self) -> str | None:
        return exited(self._procs, "charon")

    def version(self) -> str:
        plane = "kernel xfrm" if self.kernel else "kernel-libipsec"
        if self._remote:
            node = next(iter(self._remote))
            said = self._tb.run(node, [CHARON, "--version"], check=False).strip()
            return f"{said or 'strongSwan'} ({plane}, on the hosts)"
        try:
            p = subprocess.run([CHARON, "--version"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return "strongSwan (unknown version)"
        return f"{p.stdout.strip() or 'strongSwan'} ({plane})"
