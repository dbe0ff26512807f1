"""Ours against the Linux kernel's IPsec (xfrm), run INSIDE the micro-VM by
tests/test_vm_root.py (this file is not collected on the host, whose kernel has no ESP).

The left IPsec node runs ipsec-gw, the right one the kernel's xfrm with the same fresh
keys. In every case a file goes each way and must arrive with an equal SHA-256; the outer
link must carry nothing but the expected ESP, AH or ESP-in-UDP between the two outer
addresses and never the planted bytes; ours must count every packet through its SAs with
no drop. The cases cover every ESP suite both have, AH with each HMAC, the bundles, tunnel
and transport mode, IPv4 and IPv6 outside and inside (v6-in-v4, v4-in-v6), raw ESP and
ESP in UDP (RFC 3948), ESN crossing 2^32 (RFC 4303 §2.2.1) — and a replayed capture is
refused by both sides."""

from __future__ import annotations

import hashlib
import re
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab.backends import private_dir, private_file, xfrm
from ipsec_lab.backends.ours import (
    SPI,
    TUN_MTU,
    fresh_keys,
    gateway_binary,
    gateway_config,
    gateway_socket_dir,
    layers,
)
from ipsec_lab.testbed import Flow, Topology, Tunnel, Wire, pair
from ipsec_lab.testbed.build import Testbed
from ipsec_lab.testbed.ready import wait_for_socket

sys.path.insert(0, str(Path(__file__).parents[1]))
from netutil import capture, fresh_stats, ip_packets, transfer

MARKER = b"IPSEC-LAB-PLANTED-MARKER-0123456789-"
CLIENT, SERVER = ("client", "10.1.0.2"), ("server", "10.2.0.2")
ESN_START = (1 << 32) - 60  # both sides start 60 packets below 2^32: every SA crosses it


def line(inner: int, outer: int) -> Topology:
    """client - gwA - gwB - server with IPv`inner` inside and IPv`outer` on the gateways'
    link (4 and 4: the lab's `line`, but for the gateways' routes, `ours_and_xfrm`'s)."""
    lan = ("10.1.0", "10.2.0", "/24") if inner == 4 else ("2001:db8:1:", "2001:db8:2:", "/64")
    wan = ("192.0.2.1", "192.0.2.2", "/24") if outer == 4 else ("2001:db8::1", "2001:db8::2", "/64")
    a, b, p = lan
    c, s, ga, gb = f"{a}.2", f"{b}.2", f"{a}.1", f"{b}.1"
    if inner == 6:
        c, s, ga, gb = f"{a}:2", f"{b}:2", f"{a}:1", f"{b}:1"
    net = (f"{a}.0{p}", f"{b}.0{p}") if inner == 4 else (f"{a}:{p}", f"{b}:{p}")
    return Topology(
        name=f"line-{inner}in{outer}",
        nodes=("client", "gwA", "gwB", "server"),
        wires=(
            Wire("client", "eth0", c + p, "gwA", "lan", ga + p),
            Wire("gwA", "wan", wan[0] + wan[2], "gwB", "wan", wan[1] + wan[2], mtu=1600),
            Wire("gwB", "lan", gb + p, "server", "eth0", s + p),
        ),
        # the kernel's output needs a route before its policy takes the packet; the
        # gateways' routes are added by `ours_and_xfrm` (a device route across families)
        routes=(("client", "default", ga), ("server", "default", gb)),
        forwarding=("gwA", "gwB"),
        ipsec_nodes=("gwA", "gwB"),
        limited_nodes=(),
        tunnels=(Tunnel("gwA", "gwB", wan[0], wan[1], *net),),
        flows=(Flow("client-server", "client", "server", s, "gwA/wan"),),
    )


def pair6() -> Topology:
    """The lab's `pair` (host-to-host, transport mode) over IPv6."""
    a, b = "2001:db8::1", "2001:db8::2"
    return Topology(
        name="pair6",
        nodes=("hostA", "hostB"),
        wires=(Wire("hostA", "eth0", f"{a}/64", "hostB", "eth0", f"{b}/64"),),
        routes=(),
        forwarding=(),
        ipsec_nodes=("hostA", "hostB"),
        limited_nodes=(),
        tunnels=(Tunnel("hostA", "hostB", a, b, f"{a}/128", f"{b}/128"),),
        flows=(Flow("hostA-hostB", "hostA", "hostB", b, "hostA/eth0"),),
    )


NETS = {
    "4in4": lambda: line(4, 4),
    "6in6": lambda: line(6, 6),
    "6in4": lambda: line(6, 4),
    "4in6": lambda: line(4, 6),
    "transport4": pair,
    "transport6": pair6,
}


def ends(topo: Topology) -> tuple[tuple[str, str], tuple[str, str]]:
    """(node, address) of the flow's source and sink."""
    f = topo.flows[0]
    addr = {(w.a, w.a_addr.split("/")[0]) for w in topo.wires} | {
        (w.b, w.b_addr.split("/")[0]) for w in topo.wires
    }
    src = next(a for n, a in sorted(addr) if n == f.source)
    return (f.source, src), (f.sink, f.sink_addr)


def fingerprint(out: bool, spi: int, enc: bytes, integ: bytes) -> str:
    """ipsec-gw's key fingerprint in its sequence state (crates/ipsec-gw/src/seqstate.rs):
    the key material alone; the SPI and direction only for an SA with no keys."""
    h = hashlib.sha256(b"ipsec-gw key material v2\0")
    h.update(struct.pack(">I", len(enc)) + enc + struct.pack(">I", len(integ)) + integ)
    if not enc and not integ:
        h.update(bytes([out]) + struct.pack(">I", spi))
    return h.hexdigest()[:32]


def state_slot(direction: str, generation: int, lines: list[str]) -> str:
    """One slot of ipsec-gw's sequence state: its header (direction, generation, entry
    count, SHA-256 of the entries) and the entries."""
    body = "".join(lines)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return (
        f"ipsec-gw-seqstate v2 {direction} generation={generation} entries={len(lines)} "
        f"sha256={digest}\n{body}"
    )


def resume_after(conf: Path, left: bool, keys: dict[tuple[str, str], tuple[str, str]],
                 value: int) -> None:  # fmt: skip
    """Write ipsec-gw's sequence state as if every SA had sent and accepted `value`
    packets: it then numbers from value + 1 and its windows' tops are at value."""
    for direction, way in (("out", "lr" if left else "rl"), ("in", "rl" if left else "lr")):
        lines = []
        for (proto, w), (enc, integ) in keys.items():
            if w == way:
                spi = SPI[(proto, w)]
                fp = fingerprint(direction == "out", spi, bytes.fromhex(enc), bytes.fromhex(integ))
                lines.append(f"{fp} {value}\n")
        lines.sort()
        # both slots, generations 2 and 1: as after two writes (one alone would read as a
        # newer write lost, and raise every reservation a block)
        Path(f"{conf}.state.{direction}").write_text(state_slot(direction, 2, lines))
        Path(f"{conf}.state.{direction}.b").write_text(state_slot(direction, 1, lines))


@dataclass(frozen=True)
class Case:
    configuration: str
    net: str = "4in4"
    udp_encap: bool = False
    esn: bool = False

    def __str__(self) -> str:
        opts = ["udp"] * self.udp_encap + ["esn"] * self.esn
        return "-".join([self.configuration, self.net, *opts])


@pytest.fixture(scope="module")
def testbeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Testbed]]:
    """One testbed per topology, built when a case first needs it and shared by the
    cases after it (under TCG building namespaces, links and routes is seconds a case);
    each case leaves it as it found it (`ours_and_xfrm`)."""
    with ExitStack() as stack:
        made: dict[str, Testbed] = {}

        def get(net: str) -> Testbed:
            if net not in made:
                tb = stack.enter_context(Testbed(NETS[net](), tmp_path_factory.mktemp(net)))
                if tb.topo.forwarding:
                    # routes between the inner networks, for the kernel's output lookup
                    t = tb.topo.tunnels[0]
                    for node, dst, via in ((t.left, t.right_ts, t.right_outer),
                                           (t.right, t.left_ts, t.left_outer)):  # fmt: skip
                        fam = ["-6"] if ":" in dst else ["-4"]
                        gw = ["via", via] if (":" in dst) == (":" in via) else []
                        tb.run(node, ["ip", *fam, "route", "add", dst, *gw, "dev", "wan"])
                made[net] = tb
            return made[net]

        yield get


@contextmanager
def ours_and_xfrm(tb: Testbed, case: Case) -> Iterator[tuple[Testbed, Path]]:
    """ipsec-gw on the testbed's left IPsec node and the kernel's xfrm on its right one,
    sharing one set of fresh keys; yields the testbed and ours' stats socket. Afterwards
    the testbed is as before: the gateway stopped and its guard released (`--release`:
    rule, blackhole routes, nftables table), the kernel's states and policies flushed."""
    binary = gateway_binary()
    assert binary is not None, "ipsec-gw is not built"
    t = tb.topo.tunnels[0]
    ls = layers(case.configuration)
    keys = fresh_keys(ls)
    transport = case.net.startswith("transport")
    forward = bool(tb.topo.forwarding)
    d = private_dir(tb.rundir / re.sub(r"[^A-Za-z0-9_.-]+", "_", str(case)))
    # a socket path of its own: a stale one would look like a started gateway
    sock = gateway_socket_dir(tb) / f"gw-{t.left}-{d.name}.sock"
    conf = d / f"{t.left}.toml"
    private_file(conf, gateway_config(
        t.left, t, ls, keys, sock, udp_encap=case.udp_encap, esn=case.esn,
        mode="transport" if transport else "tunnel",
        mtu=1400 if transport else TUN_MTU,
    ))  # fmt: skip
    after = ESN_START if case.esn else 0
    if after:
        resume_after(conf, True, keys, after)
    lines = xfrm.commands(
        t.right, t, ls, xfrm.Keys(keys), forward,
        udp_encap=case.udp_encap, esn=case.esn, after_seq=after,
    )  # fmt: skip
    batch = d / f"{t.right}.ip"
    private_file(batch, "\n".join(lines) + "\n")
    tb.run(t.right, ["ip", "-batch", str(batch)])
    holder = xfrm.encap_socket(tb, t.right, t.right_outer) if case.udp_encap else None
    # fresh keys (resume_after's state, when written, is found and used)
    argv = [str(binary), "--config", str(conf), "--init-state"]
    p = tb.spawn(t.left, argv, f"ipsec-gw-{t.left}")
    try:
        # (a bound, not a measure: under TCG beside cargo test and the fuzzers the first
        # start of the session took over 10 s, with nothing wrong in its log)
        assert wait_for_socket(sock, p, 60), (tb.rundir / f"ipsec-gw-{t.left}.log").read_text()
        yield tb, sock
    finally:
        tb.stop(p)
        if holder:
            tb.stop(holder)
        tb.run(t.left, [str(binary), "--config", str(conf), "--release"], check=False)
        tb.run(t.right, ["ip", "xfrm", "policy", "flush"], check=False)
        tb.run(t.right, ["ip", "xfrm", "state", "flush"], check=False)


def counters(sock: Path) -> dict[str, Any]:
    """Its counters once they hold everything handled before this call."""
    return fresh_stats(sock)


def sequence_numbers(pkts: list[tuple[str, str, int, bytes]], src: str) -> list[int]:
    """The ESP or AH sequence numbers (the low 32 bits on the wire) `src` sent."""
    at = {50: 4, 17: 12, 51: 8}  # ESP; ESP after a UDP header; AH (RFC 4302 §2)
    return [
        struct.unpack(">I", payload[at[proto] : at[proto] + 4])[0]
        for s, _, proto, payload in pkts
        if s == src
    ]


CASES = [
    *(Case(c) for c in (
        "esp:aes128gcm16", "esp:aes256gcm16", "esp:chacha20poly1305", "esp:aes128-sha1",
        "esp:aes256-sha256", "esp:null-sha1", "ah:sha1", "ah:sha256", "ah:sha512",
        "ah:sha1+esp:aes128", "ipcomp+esp:aes128-sha1",
    )),
    Case("esp:aes128gcm16", "transport4"),
    Case("ah:sha1", "transport4"),
    Case("esp:aes128-sha1", "transport6"),
    Case("esp:aes128gcm16", "6in6"),
    Case("ah:sha256", "6in6"),
    Case("esp:aes256gcm16", "6in4"),
    Case("esp:aes128-sha1", "4in6"),
    Case("esp:aes128gcm16", udp_encap=True),
    Case("esp:chacha20poly1305", "6in6", udp_encap=True),
    Case("esp:aes128gcm16", "transport4", udp_encap=True),
    Case("esp:aes128gcm16", esn=True),
    Case("esp:aes128-sha1", esn=True),
    Case("ah:sha256", esn=True),
]  # fmt: skip


def planted(tmp: Path) -> Path:
    line = len(MARKER) + 9
    data = tmp / "planted.bin"
    data.write_bytes(b"".join(MARKER + b"%08d\n" % i for i in range(256 * 1024 // line)))
    return data


@pytest.mark.parametrize("case", CASES, ids=str)
def test_ours_and_the_kernel_interoperate(
    tmp_path: Path, testbeds: Callable[[str], Testbed], case: Case
) -> None:
    data = planted(tmp_path)
    with ours_and_xfrm(testbeds(case.net), case) as (tb, sock):
        t = tb.topo.tunnels[0]
        src, dst = ends(tb.topo)
        wan = "wan" if tb.topo.forwarding else "eth0"
        with capture(tb, t.left, wan, "outer") as pcap:
            transfer(tb, src, dst, data)  # ours seals, the kernel opens
            transfer(tb, dst, src, data)  # the kernel seals, ours opens
        st = counters(sock)
    pkts = ip_packets(pcap)
    outer = 17 if case.udp_encap else 51 if case.configuration.startswith("ah:") else 50
    assert {(s, d) for s, d, _, _ in pkts} == {
        (t.left_outer, t.right_outer),
        (t.right_outer, t.left_outer),
    }, "the outer link carries only the tunnel's packets"
    assert {proto for _, _, proto, _ in pkts} == {outer}, str(case)
    if case.udp_encap:
        assert {p[:4] for _, _, _, p in pkts} == {struct.pack(">HH", 4500, 4500)}
    raw = b"".join(p for _, _, _, p in pkts)
    esp = layers(case.configuration).esp
    if esp is None or esp.encryption == "null":
        # integrity only: the bytes go in clear, inside ESP/AH (the capture sees them)
        assert MARKER[:16] in raw, "the capture shows the bytes integrity-only SAs carry"
    else:
        assert MARKER[:16] not in raw, "planted bytes on the outer link"
    for direction in ("outbound", "inbound"):
        for sa in st[direction]["sas"]:
            assert sa["packets"] > 50 and sa["drops"] == {}, (direction, sa)
    if case.configuration.startswith("ipcomp"):
        (out,) = st["outbound"]["ipcomp"]
        (inb,) = st["inbound"]["ipcomp"]
        assert out["compressed"] > 10 and out["bytes_out"] < out["bytes_in"]
        assert inb["decompressed"] > 10, "the kernel's IPComp reached ours"
    if case.esn:
        for end in (t.left_outer, t.right_outer):
            seqs = sequence_numbers(pkts, end)
            # both ends started 60 below 2^32: the low 32 bits wrapped, and the ICVs
            # (over the high 32 bits, RFC 4303 §3.3.2.1) checked on the other side
            assert max(seqs) > ESN_START and min(seqs) < 1000, (end, min(seqs), max(seqs))
    if case.esn:
        for sa in st["outbound"]["sas"] + st["inbound"]["sas"]:
            assert sa["packets"] > 60, "every SA crossed 2^32"


def kernel_replay_drops(tb: Testbed, node: str, dst: str) -> int:
    """The kernel's replay counters (`replay-window`: too old, `replay`: seen) summed over
    `node`'s states towards `dst`."""
    text = tb.run(node, ["ip", "-s", "xfrm", "state", "list", "dst", dst])
    return sum(int(a) + int(b) for a, b in re.findall(r"replay-window (\d+) replay (\d+)", text))


def replay(tb: Testbed, node: str, iface: str, pcap: Path, src: str) -> int:
    """Send again, from `node`'s `iface`, every ESP packet of `pcap` that `src` sent.

    tcpdump picks them out and tcpreplay sends them at 1000 packets/s (well under the
    receiving kernel's backlog); both are C programs, so this costs seconds under TCG, where
    importing scapy alone took most of a minute."""
    esp = pcap.with_name(f"{pcap.stem}-from-{src}.pcap")
    tb.run(node, ["tcpdump", "-r", str(pcap), "-w", str(esp), f"ip proto 50 and src host {src}"])
    out = tb.run(node, ["tcpreplay", "-i", iface, "--pps", "1000", str(esp)], timeout=120)
    sent = re.search(r"Successful packets:\s+(\d+)", out)
    failed = re.search(r"Failed packets:\s+(\d+)", out)
    assert sent and failed and int(failed.group(1)) == 0, out
    return int(sent.group(1))


def test_a_replayed_capture_is_dropped_on_both_sides(
    tmp_path: Path, testbeds: Callable[[str], Testbed]
) -> None:
    """RFC 4303 §3.4.3: each side refuses the other's packets sent again."""
    data = planted(tmp_path)
    case = Case("esp:aes128gcm16")
    with ours_and_xfrm(testbeds(case.net), case) as (tb, sock):
        t = tb.topo.tunnels[0]
        with capture(tb, "gwA", "wan", "outer") as pcap:
            transfer(tb, CLIENT, SERVER, data)
            transfer(tb, SERVER, CLIENT, data)
        before = counters(sock)["inbound"]["sas"][0]
        kernel_before = kernel_replay_drops(tb, "gwB", t.right_outer)
        to_kernel = replay(tb, "gwA", "wan", pcap, t.left_outer)
        to_ours = replay(tb, "gwB", "wan", pcap, t.right_outer)
        after = counters(sock)["inbound"]["sas"][0]
        kernel_after = kernel_replay_drops(tb, "gwB", t.right_outer)
    assert to_kernel > 100 and to_ours > 50
    assert kernel_before == 0 and kernel_after == to_kernel, (kernel_after, to_kernel)
    ours = sum(after["drops"].get(k, 0) for k in ("replay", "replay_too_old"))
    assert ours == to_ours and after["packets"] == before["packets"], after
