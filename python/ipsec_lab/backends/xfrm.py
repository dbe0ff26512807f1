"""The Linux kernel's IPsec (xfrm), keyed by hand: states and policies made fresh per run
with `ip xfrm`, in each IPsec node of the testbed.

What it installs, per tunnel and direction (RFC 4301 §4.4: an SPD entry and the SAs of
the SAD it points to):

- an SA per layer — ESP, AH, IPComp (DEFLATE, CPI 2) — with keys drawn fresh for the run
  (the same key lengths as `ours`: AES-GCM, GMAC and ChaCha20-Poly1305 keys carry their
  4-byte salt), a 32-packet replay window (the largest the kernel takes without ESN);
  AH over IPv4 with `flag align4` (RFC 4302's 32-bit alignment: Linux otherwise pads to
  64 bits and refuses from anyone else an AH whose ICV is not a multiple of 8 bytes);
- output, input and (on gateways, for forwarded traffic) forward policies whose
  templates list the layers innermost first, as strongSwan installs them: a bundle's
  innermost layer is in tunnel mode and builds the outer header, the layers outside it
  are in transport mode (IPComp tunnel + ESP transport gives IP / ESP / IPComp / inner,
  the same packets as ours). Inbound IPComp templates are optional (`level use`): a
  datagram too small to compress arrives without IPComp (RFC 3173 §2.2).

The commands go to the kernel through `ip -batch` from a file only root can read, so the
keys never appear in a command line, `commands.log` or a process list; the file is the
run's record of exactly what was installed (`ip -n NODE -batch FILE` replays it).

Detection adds one ESP state in a scratch namespace: a kernel without ESP answers
"Requested type not found" (as this project's development machines do); each layer's
module is probed so.

On real hosts (`--hosts`) the same batch is pushed to each gateway (0600, in the run's
directory there) and run there; the host's own kernel is the probe: a refused state
makes the configuration skipped on that host, with the host named. The lab never
flushes a host's xfrm: it refuses a host already holding one of its SAs or policies,
writes the delete of each state and policy it adds to the host's ledger before adding
it, and deletes exactly those when it stops (`undo_commands`).
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ipsec_lab.algorithms import CIPHERS, INTEGRITIES
from ipsec_lab.backends.base import Processless, Unsupported, exited, private_dir, private_file
from ipsec_lab.backends.sa_plan import (
    IPCOMP_CPI,
    NO_BUNDLES,
    SPI,
    Layer,
    Layers,
    fresh_keys,
    layers,
)
from ipsec_lab.testbed import Tunnel
from ipsec_lab.testbed.build import LabError, probe, tail
from ipsec_lab.testbed.interface import READY_S, OnHosts, Process, Testbed, on_hosts
from ipsec_lab.testbed.ready import wait_for_text
from ipsec_lab.testbed.tunnels import refusal as tunnels_refusal
from ipsec_lab.testbed.tunnels import selectors

if TYPE_CHECKING:
    from ipsec_lab.hosts import Hosts

REPLAY_WINDOW = 32
NAT_T_PORT = 4500  # RFC 3948 §2: ESP in UDP, to and from 4500
NO_AH_IN_UDP = "AH cannot be carried in UDP (RFC 3948 encapsulates ESP only)"
# Policy priorities (lower wins): the bypass for IPv6 neighbour discovery before the
# policies that protect the rest
ND_PRIORITY, PRIORITY = 100, 1000
# Probe states: a throwaway key of the right length for each kind of SA
_PROBES = {
    "esp": ["proto", "esp", "spi", "0x100", "mode", "tunnel",
            "aead", "rfc4106(gcm(aes))", "0x" + "11" * 20, "128"],
    "ah": ["proto", "ah", "spi", "0x101", "mode", "tunnel",
           "auth-trunc", "hmac(sha1)", "0x" + "22" * 20, "96"],
    "comp": ["proto", "comp", "spi", "0x102", "mode", "tunnel", "comp", "deflate"],
}  # fmt: skip


@functools.cache
def kernel_has(kind: str) -> tuple[bool, str]:
    """Whether the kernel's xfrm has `kind` (esp, ah, comp); probed once per process."""
    return probe(
        f"xfrm{kind}",
        [],
        ["ip", "xfrm", "state", "add", "src", "192.0.2.1", "dst", "192.0.2.2", *_PROBES[kind]],
    )


def kernel_has_esp() -> tuple[bool, str]:
    return kernel_has("esp")


def unsupported_by_kernel_xfrm(ls: Layers) -> str | None:
    """Why the kernel cannot run these layers at all (whatever its modules), or None."""
    if ls.ipcomp and not ls.esp:
        return "the lab keys IPComp in the kernel only in a bundle with ESP (ipcomp+esp:…)"
    if ls.ah and INTEGRITIES[ls.ah.integrity].kernel is None:
        i = INTEGRITIES[ls.ah.integrity]
        return f"the kernel has no AH with {i.title} ({i.rfc} AH is not in Linux)"
    if ls.esp and ls.esp.integrity != "null" and INTEGRITIES[ls.esp.integrity].kernel is None:
        return f"the kernel has no ESP integrity {ls.esp.integrity}"
    return None


@dataclass(frozen=True)
class Keys:
    """Fresh keys of one tunnel: (protocol, "lr"|"rl") -> (encryption hex, integrity hex)."""

    keys: dict[tuple[str, str], tuple[str, str]]

    @staticmethod
    def fresh(ls: Layers) -> Keys:
        return Keys(fresh_keys(ls))  # the lengths ours takes: both ends share them


def _auth(name: str, key: str) -> list[str]:
    i = INTEGRITIES[name]
    assert i.kernel is not None  # refused by unsupported_by_kernel_xfrm
    return ["auth-trunc", i.kernel, f"0x{key}", str(i.kernel_trunc_bits)]


def _algorithms(x: Layer, enc: str, integ: str) -> list[str]:
    """The `ip xfrm state` algorithm arguments of one ESP or AH layer (the kernel's crypto
    API names from the engine's algorithm table)."""
    if x.protocol == "ah":
        return _auth(x.integrity, integ)
    c = CIPHERS[x.encryption]
    if c.aead:
        return ["aead", c.kernel, f"0x{enc}", str(8 * c.icv)]  # 16-byte ICV, never cut
    args = ["enc", c.kernel, f"0x{enc}" if enc else '""']
    if x.integrity != "null":
        args += _auth(x.integrity, integ)
    return args


def _plain(prefix: str) -> str:
    return prefix.split("/")[0]


def _host_route(prefix: str) -> bool:
    return prefix.endswith("/128" if ":" in prefix else "/32")


def commands(
    node: str,
    tunnel: Tunnel,
    ls: Layers,
    keys: Keys,
    forward: bool,
    *,
    udp_encap: bool = False,
    esn: bool = False,
    replay_window: int = REPLAY_WINDOW,
    after_seq: int = 0,
    j: int = 0,
    many: bool = False,
) -> list[str]:
    """The `ip -batch` lines (`xfrm …`) for `node`'s end of `tunnel`: its SAs both ways and its
    policies (out; in, and fwd when it forwards for a subnet). Host-to-host tunnels (the
    selectors are the hosts' own /32s or /128s) use transport mode unless the layers are a
    bundle with IPComp (IPComp's tunnel mode then carries the packet).

    `udp_encap`: ESP in UDP, port 4500 both ways (RFC 3948; the receiving end needs a
    socket with UDP_ENCAP on 4500, `encap_socket`). `esn`: 64-bit sequence numbers (RFC 4303
    §2.2.1). `after_seq`: the SAs start as if `after_seq` packets had been sent and
    received (outbound numbering resumes above it, the inbound window's top is at it) —
    to cross 2^32 in a test of ESN. `j`: the tunnel's number between the same two
    gateways (testbed/tunnels.py): its SAs' SPIs are SPI + (j << 16), as ours' are, and
    with `many` (one of several) its states and templates carry reqid j + 1."""
    end = tunnel.seen_from(node)
    left, me, peer = end.left, _plain(end.outer), _plain(end.peer_outer)
    mine, theirs = end.ts, end.peer_ts
    way = {"out": "lr" if left else "rl", "in": "rl" if left else "lr"}
    host_to_host = _host_route(tunnel.left_ts) and not ls.ipcomp
    if udp_encap and ls.ah:
        raise Unsupported(NO_AH_IN_UDP)
    # Innermost first: IPComp, ESP, AH. The innermost builds the outer header (tunnel
    # mode); those outside it are transport mode (RFC 4301 §4.5 bundles).
    stack: list[tuple[str, Layer | None]] = []
    if ls.ipcomp:
        stack.append(("comp", None))
    if ls.esp:
        stack.append(("esp", ls.esp))
    if ls.ah:
        stack.append(("ah", ls.ah))
    mode = ["transport" if host_to_host or i else "tunnel" for i in range(len(stack))]
    lines: list[str] = []
    for direction in ("out", "in"):
        src, dst = (me, peer) if direction == "out" else (peer, me)
        for (proto, x), m in zip(stack, mode, strict=True):
            head = f"xfrm state add src {src} dst {dst}"
            if x is None:
                lines.append(f"{head} proto comp spi {IPCOMP_CPI} mode {m} comp deflate")
                continue
            enc, integ = keys.keys[(proto, way[direction])]
            spi = SPI[(proto, way[direction])] + (j << 16)
            algs = " ".join(_algorithms(x, enc, integ))
            # Linux pads AH to 8 bytes over IPv4 too unless told `align4`; RFC 4302
            # §3.3.3.2.1 says 4 (ours does): without it HMAC-SHA-256's 28-byte AH is
            # refused (XfrmInStateProtoError) — found by the interop tests in the VM.
            flags = ["align4"] * (proto == "ah" and ":" not in src) + ["esn"] * esn
            # a tunnel's inner packets may be of the other family (v6 in v4, v4 in v6):
            # with af-unspec the SA's selector takes either, as strongSwan installs them
            flags += ["af-unspec"] * (m == "tunnel")
            extra = f" flag {' '.join(flags)}" if flags else ""
            extra += f" reqid {j + 1}" if j or many else ""
            if after_seq:
                if after_seq >> 32 and not esn:
                    raise ValueError("sequence numbers above 2^32 need ESN")
                lo, hi = after_seq & 0xFFFFFFFF, after_seq >> 32
                seq = "replay-seq" if direction == "in" else "replay-oseq"
                extra += f" {seq} {lo:#x}" + (f" {seq}-hi {hi:#x}" if esn else "")
            if udp_encap and proto == "esp":
                extra += f" encap espinudp {NAT_T_PORT} {NAT_T_PORT} 0.0.0.0"
            lines.append(
                f"{head} proto {proto} spi {spi:#x} mode {m} replay-window {replay_window} "
                f"{algs}{extra}"
            )
    dirs = [("out", mine, theirs, me, peer), ("in", theirs, mine, peer, me)]
    if forward:
        dirs.append(("fwd", theirs, mine, peer, me))
    for d, src, dst, tsrc, tdst in dirs:
        tmpls = []
        for (proto, _), m in zip(stack, mode, strict=True):
            # ip-xfrm(8): tmpl [src] [dst] [proto] [spi] [mode] [reqid] [level]
            cpi = f" spi {IPCOMP_CPI}" if proto == "comp" else ""
            t = f"tmpl src {tsrc} dst {tdst} proto {proto}{cpi} mode {m}"
            # N tunnels between the same two gateways: a template without a reqid takes
            # any state of its addresses, protocol and mode, so every tunnel's policy
            # would use one SA (found by tests/vm/tunnels.py: 1,024 datagrams to 256
            # tunnels, one SPI); the reqid ties each policy to its own tunnel's states
            t += f" reqid {j + 1}" if j or many else ""
            if proto == "comp" and d != "out":
                t += " level use"
            tmpls.append(t)
        lines.append(
            f"xfrm policy add dir {d} src {src} dst {dst} priority {PRIORITY} " + " ".join(tmpls)
        )
    if host_to_host and ":" in me:
        # IPv6 hosts find each other with neighbour solicitations and advertisements sent
        # to and from their unicast addresses — the very selectors above. Linux drops
        # such ICMPv6 in clear against an IPsec policy (icmpv6_rcv's policy check): the
        # hosts would never reach each other. ND stays outside IPsec (RFC 4301 §5.2
        # lets a policy bypass it; RFC 3756 §3.4 on why it is rarely protected).
        for d, src, dst in (("out", mine, theirs), ("in", theirs, mine)):
            for icmp_type in (135, 136):
                lines.append(
                    f"xfrm policy add dir {d} src {src} dst {dst} proto ipv6-icmp "
                    f"type {icmp_type} priority {ND_PRIORITY}"
                )
    return lines


def many_commands(node: str, tunnel: Tunnel, ls: Layers, keys: list[Keys], forward: bool,
                  *, udp_encap: bool = False) -> list[str]:  # fmt: skip
    """`commands` for `len(keys)` tunnels between the line's gateways, each with its own
    keys: one, `tunnel` itself; more (testbed/tunnels.py), tunnel 0 the topology's own and
    tunnel j its left subnet to the (j-1)-th address of FAR, its SPIs + (j << 16)."""
    if len(keys) == 1:
        return commands(node, tunnel, ls, keys[0], forward, udp_encap=udp_encap)
    if ls.bundle:
        raise Unsupported(NO_BUNDLES)
    ends = [dataclasses.replace(tunnel, left_ts=a, right_ts=b)
            for a, b in selectors(tunnel, len(keys))]  # fmt: skip
    return [line for j, (e, k) in enumerate(zip(ends, keys, strict=True))
            for line in commands(node, e, ls, k, forward, udp_encap=udp_encap, j=j,
                                 many=True)]  # fmt: skip


def undo_commands(lines: list[str]) -> list[str]:
    """The `ip xfrm` commands that delete exactly what the `commands` lines add: each
    state by its (src, dst, protocol, SPI), each policy by its direction and selector
    (RFC 4301 §4.4.1: an SPD entry is found by its selectors; its priority is no part of
    that). Used on hosts the lab does not own, where a flush would take the host's own
    IPsec with it."""
    out = []
    for line in lines:
        w = line.split()
        if w[:3] == ["xfrm", "state", "add"]:
            f = {w[i]: w[i + 1] for i in range(3, len(w) - 1, 2) if w[i] in
                 ("src", "dst", "proto", "spi")}  # fmt: skip
            out.append(shlex.join(["ip", "xfrm", "state", "delete", "src", f["src"], "dst",
                                   f["dst"], "proto", f["proto"], "spi", f["spi"]]))  # fmt: skip
        elif w[:3] == ["xfrm", "policy", "add"]:
            sel = w[3 : w.index("priority")]  # dir D src S dst T [proto P type N]
            out.append(shlex.join(["ip", "xfrm", "policy", "delete", *sel]))
        else:
            raise ValueError(f"not an xfrm state or policy line: {line!r}")
    return out


# Many tunnels on a real host: what the lab checks there first (`_present`) and undoes
# after are one shell line of N x 5 commands each, past ARG_MAX's 128 KiB a word beyond
# a few hundred tunnels
NO_HOSTS_TUNNELS = (
    "the check for the host's own states and the undo of N tunnels' are "
    "one shell line each: many tunnels on namespaces (--vm here) only, so far"
)


def _present(undo: list[str]) -> str:
    """A shell line printing each of `undo`'s states and policies the host already has."""
    out = []
    for u in undo:
        what = u.removeprefix("ip xfrm ").replace(" delete ", " ", 1)  # state src … spi …
        out.append(f"{u.replace(' delete ', ' get ', 1)} >/dev/null 2>&1 && "
                   f"echo {shlex.quote(what)}")  # fmt: skip
    return "; ".join(out) + "; true"


# What a kernel without a layer's module answers when asked for a state of it
_NO_TYPE = ("Requested type not found", "Protocol not supported", "No such file or directory")


# The kernel opens ESP in UDP only on a socket that asked for it (UDP_ENCAP =
# UDP_ENCAP_ESPINUDP, linux/udp.h): one per node, bound to 4500 in the outer family, held
# open for the run. It never reads a datagram (the kernel takes ESP off it before the
# socket's queue); a non-ESP datagram on 4500 would queue unread and be dropped when full.
# The socket also gets a bypass policy each way (IP_XFRM_POLICY / IPV6_XFRM_POLICY with an
# allow-all `xfrm_userpolicy_info`, as charon puts on its own sockets): the kernel checks
# the input policy on the UDP datagram *before* taking the ESP out of it, and between two
# hosts in transport mode the policy's selectors (the hosts' /32s, any protocol) cover the
# datagram itself — without the bypass every one is dropped (XfrmInTmplMismatch).
_ENCAP_SOCKET = """
import signal, socket, struct, sys
v6 = ':' in sys.argv[1]
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 4500))
s.setsockopt(socket.IPPROTO_UDP, 100, 2)  # UDP_ENCAP, UDP_ENCAP_ESPINUDP
level, name = (socket.IPPROTO_IPV6, 35) if v6 else (socket.IPPROTO_IP, 17)
for direction in (0, 1):  # XFRM_POLICY_IN, XFRM_POLICY_OUT; action 0 = XFRM_POLICY_ALLOW
    policy = bytearray(168)  # sizeof(struct xfrm_userpolicy_info)
    struct.pack_into('=H', policy, 40, socket.AF_INET6 if v6 else socket.AF_INET)  # sel.family
    policy[160] = direction  # .dir
    s.setsockopt(level, name, bytes(policy))
print('encap socket ready', flush=True)
signal.pause()
"""


def encap_socket(tb: Testbed, node: str, addr: str) -> Process:
    """Hold a UDP_ENCAP_ESPINUDP socket on `addr`:4500 in `node` (stopped by tb.stop);
    on a real host with the host's own python3."""
    name = f"encap-{node}-{addr.replace(':', '_')}"
    on = tb if on_hosts(tb) else None
    python = "python3" if on else sys.executable
    p = tb.spawn(node, [python, "-I", "-c", _ENCAP_SOCKET, addr], name)
    if on is not None:
        deadline = time.monotonic() + READY_S  # the host's python3 may start from a cold disk
        while "encap socket ready" not in (said := on.log_tail(node, name)):
            if p.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"no ESP-in-UDP socket on {node}: {said.strip()[-500:]}")
            time.sleep(0.1)
        return p
    log = tb.rundir / f"{name}.log"
    if not wait_for_text(log, "encap socket ready", p, READY_S):
        raise LabError(f"no ESP-in-UDP socket in {node}: {tail(log)}")
    return p


class Xfrm(Processless):
    """`xfrm`: raw ESP; `xfrm-udp`: ESP in UDP on port 4500 (RFC 3948), as a gateway
    behind NAT sends it."""

    def __init__(self, udp_encap: bool = False, tunnels: int = 1) -> None:
        """`tunnels`: how many between the line testbed's gateways (testbed/tunnels.py),
        each its own SAs (fresh keys, SPIs + (j << 16)) and policies."""
        self.tunnels = tunnels
        self.nodes: list[str] = []
        self.udp_encap = udp_encap
        self.name = "xfrm-udp" if udp_encap else "xfrm"
        self.holders: dict[str, Process] = {}  # node-address -> holder
        self.on_hosts = False  # real hosts: their kernels, not this one, are probed
        self._undo: dict[str, list[str]] = {}  # real hosts: node -> deletes of what it added
        self._kernel = ""

    def use_hosts(self, hosts: Hosts) -> None:
        self.on_hosts = True

    def check(self, configuration: str) -> None:
        ls = layers(configuration, self.name)
        why = unsupported_by_kernel_xfrm(ls)
        if self.udp_encap and ls.ah:
            why = NO_AH_IN_UDP
        if self.tunnels > 1 and ls.bundle:
            why = NO_BUNDLES
        if why:
            raise Unsupported(why)
        if self.on_hosts:
            return  # each gateway host's kernel answers when the lab installs the SAs
        kinds = ["esp"] * bool(ls.esp) + ["ah"] * bool(ls.ah) + ["comp"] * ls.ipcomp
        for kind in kinds:
            ok, said = kernel_has(kind)
            if not ok:
                raise Unsupported(
                    f"this kernel ({platform.release()}) has no {kind.upper()} in xfrm "
                    f"({said or 'refused'}): run it in the micro-VM (--vm) or on a kernel "
                    "that has it, e.g. Debian's linux-image-amd64"
                )

    def start(self, tb: Testbed, configuration: str) -> None:
        self.check(configuration)
        ls = layers(configuration, self.name)
        d = private_dir(tb.rundir / "xfrm")
        on = tb if on_hosts(tb) else None
        if self.tunnels > 1 and (
            why := tunnels_refusal(tb.topo.name, self.tunnels)
            or (f"{self.tunnels} tunnels on real hosts: {NO_HOSTS_TUNNELS}" if on else None)
        ):
            raise LabError(f"xfrm: {why}")
        for i, t in enumerate(tb.topo.tunnels):
            # the topology's tunnel, or the N between the line's gateways: tunnel 0 is
            # the topology's own, the others its left subnet to one address of FAR each
            keys = [Keys.fresh(ls) for _ in range(self.tunnels)]
            for node in (t.left, t.right):
                lines = many_commands(node, t, ls, keys, node in tb.topo.forwarding,
                                      udp_encap=self.udp_encap)  # fmt: skip
                batch = d / f"{node}-t{i}.ip"
                private_file(batch, "\n".join(lines) + "\n")
                if on is not None:
                    self._install_on_host(on, node, f"t{i}", lines)
                else:
                    tb.run(node, ["ip", "-batch", str(batch)], timeout=60 + len(lines) / 100)
                if node not in self.nodes:
                    self.nodes.append(node)
                if self.udp_encap:
                    outer = t.left_outer if node == t.left else t.right_outer
                    key = f"{node}-{_plain(outer)}"
                    self.holders[key] = encap_socket(tb, node, _plain(outer))

    def _install_on_host(self, tb: OnHosts, node: str, name: str, lines: list[str]) -> None:
        """Install `lines` on real host `node`: refused if the host already has one of
        these states or policies (never replaced: it is not the lab's), each delete in
        the host's ledger before the add, the batch pushed 0600 and run there."""
        undo = undo_commands(lines)
        have = tb.run(node, ["sh", "-c", _present(undo)]).split("\n")
        have = [h for h in have if h.strip()]
        if have:
            raise LabError(f"{node} already has xfrm {have[0]}"
                           + (f" (and {len(have) - 1} more)" if len(have) > 1 else "")
                           + ": the lab will not replace IPsec it did not make; remove it or "
                           "give the hosts other addresses")  # fmt: skip
        if not self._kernel:
            self._kernel = tb.run(node, ["uname", "-r"]).strip()
        line = "; ".join(f"{u} 2>/dev/null" for u in undo) + "; true"
        tb.record(node, f"xfrm states and policies of tunnel {name}", line)
        self._undo.setdefault(node, []).append(line)
        path = tb.put(node, f"xfrm/{node}-{name}.ip", "\n".join(lines) + "\n")
        try:
            tb.run(node, ["ip", "-batch", path])
        except LabError as e:
            if any(x in str(e) for x in _NO_TYPE):
                raise Unsupported(f"{node}'s kernel ({self._kernel or '?'}) refused an SA of "
                                  f"this configuration: {str(e).splitlines()[-1].strip()} "
                                  "(its ESP, AH or IPComp module is missing: `ipsec-lab "
                                  "hosts check` lists them)") from None  # fmt: skip
            raise

    def stop(self, tb: Testbed) -> None:
        for p in self.holders.values():
            tb.stop(p)
        self.holders.clear()
        if self._undo:  # real hosts: exactly what the lab added, never a flush
            for node, lines in self._undo.items():
                for line in lines:
                    tb.run(node, ["sh", "-c", line], check=False)
            self._undo.clear()
        else:
            for node in self.nodes:
                tb.run(node, ["ip", "xfrm", "policy", "flush"], check=False)
                tb.run(node, ["ip", "xfrm", "state", "flush"], check=False)
        self.nodes.clear()

    def died(self) -> str | None:
        # without its socket, a node drops every ESP in UDP it is sent
        return exited(self.holders, "the ESP-in-UDP socket of")

    def version(self) -> str:
        if self.on_hosts:
            return f"Linux {self._kernel or '?'} xfrm (on the hosts)"
        return f"Linux {platform.release()} xfrm"


def batch_files(rundir: Path) -> list[Path]:
    """The `ip -batch` files a run installed (its record of states and policies)."""
    return sorted((rundir / "xfrm").glob("*.ip"))
