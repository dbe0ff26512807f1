"""The gateway daemon `ipsec-gw` with real traffic: client - gwA - gwB - server in
namespaces (the lab's testbed), iperf3 through the tunnel, tcpdump on the gateways' link,
scapy replaying what it saw. Needs root (CI runs as root); each test removes its
namespaces and processes, also on failure."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab.backends.ours import Ours, gateway_binary, stats
from ipsec_lab.testbed import Link, topology
from ipsec_lab.testbed.build import CpuLimit, LabError, Testbed
from ipsec_lab.traffic import iperf
from ipsec_lab.traffic.udp import udp as udp_workload
from ipsec_lab.traffic.workload import Workload
from netutil import capture, count, fresh_stats, holds, poll_until, transfer

pytestmark = pytest.mark.root

LONG_TUN_QUEUE, SHORT_TUN_QUEUE = 500, 16  # config/gateway.rs: "auto"'s two lengths

MARKER = b"IPSEC-LAB-PLANTED-MARKER-0123456789-"


@pytest.fixture(autouse=True)
def gateway_built() -> None:
    if gateway_binary() is None:
        pytest.fail("ipsec-gw is not built (make gateway)")


@contextmanager
def tunnel(
    tmp_path: Path,
    configuration: str = "esp:aes128gcm16",
    link: Link | None = None,
    udp_encap: bool = False,
    edit: Callable[[str, str], str] | None = None,
) -> Iterator[tuple[Testbed, Ours]]:
    with Testbed(topology("line"), tmp_path / "run") as tb:
        if link:
            tb.shape(link)
        gw = Ours(udp_encap=udp_encap, edit=edit)
        gw.start(tb, configuration)
        try:
            yield tb, gw
        finally:
            gw.stop(tb)


def _flow(tb: Testbed) -> Any:
    return tb.topo.flows[0]


def _plain(label: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return fn()


def tcp(tb: Testbed, seconds: float = 2) -> dict[str, Any]:
    (row,) = iperf.tcp(tb, _flow(tb), Workload("tcp", seconds=seconds), _plain, 0)
    return row


def udp(tb: Testbed, size: int = 1000, rate: float = 50, seconds: float = 2) -> dict[str, Any]:
    w = Workload("udp", size=size, rate_mbit=rate, seconds=seconds)
    (row,) = udp_workload(tb, _flow(tb), w, _plain, 0)
    return row


def send_file(tb: Testbed, path: Path, streams: int = 1) -> None:
    """Send the bytes of `path` client -> server over `streams` TCP connections at once;
    every byte must arrive unchanged on each (`netutil.transfer`)."""
    flow = _flow(tb)
    transfer(tb, (flow.source, ""), (flow.sink, flow.sink_addr), path, 30, streams)


def planted(tb: Testbed, mib: int) -> Path:
    """A file of `mib` MiB of MARKER, to send through the tunnel and look for on the link;
    each MARKER numbered, so bytes in a wrong place change the file's digest."""
    data = tb.rundir / "planted.bin"
    line = len(MARKER) + 9
    data.write_bytes(b"".join(MARKER + b"%08d\n" % i for i in range(mib * 1024 * 1024 // line)))
    return data


def gateway_key(line: str) -> Callable[[str, str], str]:
    """An `edit` for `tunnel`: `line` added to both gateways' [gateway] table."""
    return lambda node, text: text.replace("[gateway]\n", f"[gateway]\n{line}\n", 1)


def sa_key(lines: dict[str, tuple[str, str]]) -> Callable[[str, str], str]:
    """An `edit` for `tunnel`: per node, `line` added to the SA named `name` ({node:
    (name, line)}); other nodes' configs unchanged."""

    def edit(node: str, text: str) -> str:
        if node not in lines:
            return text
        name, line = lines[node]
        return text.replace(f'name = "{name}"', f'name = "{name}"\n{line}', 1)

    return edit


def blast(tb: Testbed, n: int, size: int = 200, through: Ours | None = None) -> None:
    """Send `n` UDP datagrams client -> server (no handshake needed, unlike iperf3's).
    With `through` (the tunnel's gateways), return once gwA has taken all `n` from its
    TUN device and so handled them (sealed and sent, or dropped and counted)."""
    before = taken(settle(through, "gwA")) if through else 0
    script = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "[s.sendto(b'x' * int(sys.argv[2]), ('10.2.0.2', 9)) for _ in range(int(sys.argv[1]))]"
    )
    tb.run("client", [sys.executable, "-c", script, str(n), str(size)], timeout=30)
    if through:
        # a packet read is handled before the counters holding it are published
        sock = through.sockets["gwA"]
        poll_until(f"gwA to take the {n} datagrams from its TUN device",
                   lambda: taken(stats(sock)) >= before + n)  # fmt: skip


def taken(st: dict[str, Any]) -> int:
    """What a gateway's outbound worker has read from its TUN device, by its counters."""
    return int(st["outbound"]["io"]["rx_packets"])


def arrived(gw: Ours, n: int, node: str = "gwB") -> dict[str, Any]:
    """`node`'s counters once its inbound SA `in` has handled `n` packets since it
    started — accepted or dropped (a wait that does not presume the outcome)."""

    def handled(st: dict[str, Any]) -> int:
        x = sa(st, "inbound", "in")
        return int(x["packets"]) + sum(x["drops"].values())

    sock = gw.sockets[node]
    poll_until(f"{node} to handle {n} packets", lambda: handled(stats(sock)) >= n)
    return settle(gw, node)


def guard_dropped(table: str, rule: str) -> int:
    """The packets the guard's table (`nft list table` text) dropped by its rules
    commented `rule` ("clear_inbound", "clear_outbound")."""
    m = re.findall(rf"counter packets (\d+) bytes \d+ drop comment \"{rule}\"", table)
    return sum(int(x) for x in m)


def sa(st: dict[str, Any], direction: str, name: str) -> dict[str, Any]:
    (x,) = [s for s in st[direction]["sas"] if s["name"] == name]
    return x


def settle(gw: Ours, node: str) -> dict[str, Any]:
    """`node`'s counters once they hold everything it handled before this call."""
    return fresh_stats(gw.sockets[node])


def hup(gw: Ours, node: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """SIGHUP `node`'s gateway and wait until it has handled it — taken the new config
    or refused it (one of its two counters moved) —: its counters before, and after
    its workers published them again."""

    def handled(st: dict[str, Any]) -> int:
        return int(st["reloads"]) + int(st["reloads_refused"])

    before = stats(gw.sockets[node])
    os.kill(gw.process(node).pid, signal.SIGHUP)
    poll_until(f"{node} to handle its SIGHUP",
               lambda: handled(stats(gw.sockets[node])) > handled(before))  # fmt: skip
    # the SAs' tables as the workers publish them next (every 100 ms) after the reload
    return before, settle(gw, node)


def hup_then_restart(tb: Testbed, gw: Ours, node: str, n: int) -> tuple[dict[str, Any], ...]:
    """SIGHUP `node`'s gateway, send `n` datagrams, then restart it and send `n` more: its
    counters after each. The reload must not have stopped it."""
    hup(gw, node)
    blast(tb, n, through=gw)
    after_reload = settle(gw, node)
    assert gw.process(node).poll() is None, "the reload killed the gateway"
    gw.restart(tb, node)
    blast(tb, n, through=gw)
    return after_reload, settle(gw, node)


@pytest.mark.parametrize(
    "configuration",
    [
        "esp:aes128gcm16",
        "esp:aes256-sha256",
        "esp:chacha20poly1305",
        "esp:null-sha1",
        "ah:sha1",
        "ah:aes128gmac",
    ],
)
def test_tcp_and_udp_through_the_tunnel(tmp_path: Path, configuration: str) -> None:
    with tunnel(tmp_path, configuration) as (tb, gw):
        t = tcp(tb)
        u = udp(tb)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    assert t["mbps"] > 10, t
    # the tunnel delivered what the generator sent, in the trial's time; the generator's
    # own pace is not the tunnel's (on 2 cores it shares them with both gateways: with
    # AES-CBC + HMAC it sent 50 Mbit/s' packets in 2.0-2.7 s, on this build and the last)
    assert u["loss_pct"] < 2.0 and u["mbps"] >= 0.95 * u["sent_mbps"], u
    # and the row says whether its figure is the generator's (not a rate asserted: the
    # generator's pace depends on what else runs)
    short = u["sent_mbps"] < 0.95 * u["offered_mbps"] and u["loss_pct"] <= 0.01
    assert u["sent_packets"] > 0 and u["generator_bound"] == short, u
    # every packet went through the SAs, and none was refused
    assert sa(a, "outbound", "out")["packets"] > 1000
    assert sa(b, "inbound", "in")["packets"] > 1000
    # GRO into gwB's TUN device: the opened segments of a flow went up joined, in fewer
    # writes than packets (how many fewer depends on the batches, so on load; and the
    # kernel took them: TCP ran)
    assert 0 < b["inbound"]["io"]["tun_writes"] < b["inbound"]["io"]["tx_packets"]
    for st in (a, b):
        for d in ("outbound", "inbound"):
            for s in st[d]["sas"]:
                assert s["drops"] == {}, (d, s)


@pytest.mark.parametrize("configuration", ["ah:aes128gmac", "ah:sha1"])
def test_ah_keeps_the_packet_whose_outer_identification_comes_round_to_0(
    tmp_path: Path, configuration: str
) -> None:
    """86,000 DF-less datagrams through an AH tunnel: the outer IPv4 identification comes
    round past 65,535 once, and the packet after it must not go out as 0 — Linux gives a
    raw packet of identification 0 and DF clear one of its own choosing after AH's ICV
    covered the 0, and gwB refused it (icv_failure; found by trafgen, whose UDP is
    DF-less, where iperf3's had DF set)."""
    from ipsec_lab.traffic.paced import Trafgen

    with tunnel(tmp_path, configuration) as (tb, gw):
        tg = Trafgen(tb, _flow(tb))
        rows = []
        try:
            # 85,937 packets of 64 B a trial: past 65,536 sealed even with one in five lost
            # before gwA (trafgen, the tbf and both gateways share 2 cores: 7-8 % were, of
            # 70,312; 24 % once in CI, and the test failed) — on a machine busier than that,
            # another trial, at most three in all, until gwA has sealed past 65,536
            for _ in range(3):
                rows.append(tg.trial(64, 10.0, 4.4))
                if sa(settle(gw, "gwA"), "outbound", "out")["packets"] > 65_536:
                    break
        finally:
            tg.close()
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    # gwA sealed more than 65,536: its identification came round
    assert sa(a, "outbound", "out")["packets"] > 65_536, (rows, sa(a, "outbound", "out"))
    inbound = sa(b, "inbound", "in")
    assert inbound["drops"] == {}, inbound
    assert inbound["packets"] == sa(a, "outbound", "out")["packets"]


def test_the_wire_carries_only_esp_and_never_the_payload(tmp_path: Path) -> None:
    with tunnel(tmp_path) as (tb, _gw):
        data = planted(tb, 2)
        with capture(tb, "gwA", "wan", "wan") as pcap:
            send_file(tb, data)
    from scapy.all import IP, rdpcap

    pkts = [p for p in rdpcap(str(pcap)) if IP in p]
    assert len(pkts) > 1000
    assert {p[IP].proto for p in pkts} == {50}  # ESP, nothing else between the gateways
    raw = b"".join(bytes(p) for p in pkts)
    assert MARKER[:16] not in raw and b"PLANTED" not in raw
    assert data.read_bytes().count(MARKER) > 1000  # it was there to be seen


def test_udp_encapsulation_carries_esp_in_udp_4500(tmp_path: Path) -> None:
    with tunnel(tmp_path, udp_encap=True) as (tb, gw):
        data = planted(tb, 4)
        with capture(tb, "gwA", "wan", "wan") as pcap:
            t = tcp(tb)
            send_file(tb, data)  # every byte arrives, through GSO and GRO
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
        binary, sock = str(gateway_binary()), str(gw.sockets["gwA"])
        human = subprocess.run([binary, "stats", "--socket", sock], capture_output=True, text=True)
        prom = subprocess.run(
            [binary, "stats", "--socket", sock, "--prometheus"], capture_output=True, text=True
        )
    assert re.search(r"outbound: \d+ packets in, \d+ out \([1-9]\d* UDP GSO sends", human.stdout)
    assert re.search(r'ipsec_gw_udp_gso_sends_total\{direction="out"\} [1-9]', prom.stdout)
    assert re.search(r"inbound: \d+ packets in, \d+ out in [1-9]\d* TUN writes", human.stdout)
    assert re.search(r'ipsec_gw_tun_writes_total\{direction="in"\} [1-9]', prom.stdout)
    assert t["mbps"] > 10
    # every IPv4 packet between the gateways is UDP from port 4500 to 4500 (tcpdump reads
    # the capture: some 200,000 packets), and the planted payload is nowhere in it
    assert count(pcap, "ip") > 1000
    assert count(pcap, "ip and not (udp src port 4500 and udp dst port 4500)") == 0
    assert not holds(pcap, MARKER[:16]) and not holds(pcap, b"PLANTED")
    assert sa(a, "outbound", "out")["packets"] > 100
    assert a["inbound"]["io"]["not_esp"] == 0
    # UDP offloads (this kernel has them): gwA sent several ESP packets per send (GSO),
    # gwB took several per receive (GRO), and nothing was refused or dropped
    assert a["outbound"]["io"]["gso_sends"] > 0
    assert b["inbound"]["io"]["gro_receives"] > 0
    assert a["outbound"]["io"]["tx_packets"] > 2 * a["outbound"]["io"]["gso_sends"]
    # and its GRO'd datagrams, opened segment by segment in place, went up to the TUN
    # device joined again (the file arrived whole: the kernel took the joined packets)
    assert 0 < b["inbound"]["io"]["tun_writes"] < b["inbound"]["io"]["tx_packets"]
    for st in (a, b):
        assert st["outbound"]["io"]["send_errors"] == 0
        for d in ("outbound", "inbound"):
            for s in st[d]["sas"]:
                assert s["drops"] == {}, (d, s)


def test_a_shaped_link_carries_esp_in_udp_as_frames(tmp_path: Path) -> None:
    """On a link with a rate the lab switches veth's UDP GSO off: the gateway still sends
    GSO batches, the kernel cuts them before the link, whose counters count real frames."""

    def tx_packets() -> int:
        return int(tb.run("gwA", ["cat", "/sys/class/net/wan/statistics/tx_packets"]))

    with tunnel(tmp_path, udp_encap=True, link=Link("l100", rate_mbit=100)) as (tb, gw):
        before = tx_packets()
        tcp(tb)
        a = settle(gw, "gwA")
        sent = tx_packets() - before
    esp = sa(a, "outbound", "out")["packets"]
    assert a["outbound"]["io"]["gso_sends"] > 0
    assert esp > 1000 and sent >= esp, (sent, esp)


def test_udp_encapsulation_without_offloads(tmp_path: Path) -> None:
    with tunnel(tmp_path, udp_encap=True, edit=gateway_key("offload = false")) as (tb, gw):
        data = planted(tb, 1)
        send_file(tb, data)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    assert "offload" in gw.configs["gwA"].read_text()
    assert a["outbound"]["io"]["gso_sends"] == 0 and b["inbound"]["io"]["gro_receives"] == 0
    assert b["inbound"]["io"]["tun_writes"] == b["inbound"]["io"]["tx_packets"]  # no joining
    assert sa(b, "inbound", "in")["packets"] > 700  # 1 MiB in MTU-sized ESP packets


def test_udp_gso_refused_falls_back_to_one_datagram_per_send(tmp_path: Path) -> None:
    with tunnel(tmp_path, udp_encap=True) as (tb, gw):
        # gwA's outer link now carries less than a sealed full-sized packet: the kernel
        # refuses to cut GSO sends into segments it would have to fragment (EINVAL), so
        # gwA sends them one by one (and the kernel fragments those)
        tb.run("gwA", ["ip", "link", "set", "wan", "mtu", "1400"])
        data = planted(tb, 1)
        send_file(tb, data)
        a = settle(gw, "gwA")
    assert a["outbound"]["io"]["send_errors"] == 0
    assert a["outbound"]["io"]["gso_sends"] == 0
    assert sa(a, "outbound", "out")["packets"] > 700
    log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert "UDP GSO refused" in log, log


def test_mismatched_keys_are_icv_failures_and_nothing_passes(tmp_path: Path) -> None:
    def other_key(node: str, text: str) -> str:
        if node != "gwB":
            return text
        # gwB's inbound SA gets a different key than gwA's outbound one
        return re.sub(r'(name = "in".*?enc_key = ")([0-9a-f]{2})',
                      lambda m: m.group(1) + ("00" if m.group(2) != "00" else "11"),
                      text, count=1, flags=re.S)  # fmt: skip

    with tunnel(tmp_path, edit=other_key) as (tb, gw):
        blast(tb, 500, through=gw)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    assert sa(a, "outbound", "out")["packets"] > 0.9 * 500  # (a burst may lose a few)
    got = sa(b, "inbound", "in")
    assert got["packets"] == 0  # not one delivered
    received = b["inbound"]["io"]["rx_packets"]
    assert received > 0.9 * 500
    assert got["drops"].get("icv_failure", 0) == received


def replay_esp(tb: Testbed, pcap: Path) -> int:
    """Send every ESP packet of `pcap` again from gwA's outer interface (scapy); how many."""
    script = (
        "import sys; from scapy.all import rdpcap, sendp; "
        "from scapy.layers.inet import IP; "
        "ps = [p for p in rdpcap(sys.argv[1]) if IP in p and p[IP].proto == 50]; "
        "sendp(ps, iface='wan', verbose=False); print(len(ps))"
    )
    return int(tb.run("gwA", [sys.executable, "-c", script, str(pcap)], timeout=60))


@pytest.mark.parametrize("crypto_workers", [1, 4])
def test_replayed_packets_are_counted_replay_drops(tmp_path: Path, crypto_workers: int) -> None:
    with tunnel(tmp_path, edit=gateway_key(f"crypto_workers = {crypto_workers}")) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            udp(tb, rate=5, seconds=1)
        b0 = settle(gw, "gwB")
        before, before_io = sa(b0, "inbound", "in"), b0["inbound"]["io"]
        sent = replay_esp(tb, pcap)
        b1 = settle(gw, "gwB")
        after, after_io = sa(b1, "inbound", "in"), b1["inbound"]["io"]
    assert sent > 100
    replays = after["drops"].get("replay", 0) + after["drops"].get("replay_too_old", 0)
    received = after_io["rx_packets"] - before_io["rx_packets"]
    assert received > 0.9 * sent  # (a few may be lost on the way; none is let in)
    assert replays == received
    assert after["packets"] == before["packets"]  # not one replayed packet delivered


@pytest.mark.parametrize("crypto_workers", [1, 4])
def test_reordering_within_the_window_drops_nothing_and_loss_does_not_stall(
    tmp_path: Path, crypto_workers: int
) -> None:
    """ESP sealed here with gwA's outbound key (read from its config), sent to gwB from
    gwA's namespace out of order and with gaps: this kernel has no netem to reorder or
    drop on the link, and a crafted sequence is exact about what arrives when. Last, a
    burst with every packet twice in a row: with a crypto crew, twins land in one batch
    and are verified side by side; the second must still be a replay."""
    import random

    from scapy.all import IP, UDP, Raw

    from ipsec_lab import _native

    with tunnel(tmp_path, edit=gateway_key(f"crypto_workers = {crypto_workers}")) as (tb, gw):
        conf = gw.configs["gwA"].read_text()
        key = re.search(r'name = "out".*?enc_key = "([0-9a-f]+)"', conf, re.S)
        assert key
        sa_out = _native.SecurityAssociation(
            0x1001, "aes128gcm16", enc_key=bytes.fromhex(key.group(1)),
            tunnel_src="192.0.2.1", tunnel_dst="192.0.2.2",
        )  # fmt: skip

        def sealed(seqs: list[int]) -> list[bytes]:
            inner = bytes(IP(src="10.1.0.2", dst="10.2.0.2") / UDP(dport=9) / Raw(b"r" * 100))
            return [sa_out.seal(inner, seq=q) for q in seqs]

        def send(pkts: list[bytes], gap: float = 0.0005) -> None:
            f = tb.rundir / "esp.bin"
            f.write_bytes(b"".join(len(p).to_bytes(2, "big") + p for p in pkts))
            script = (
                "import socket, sys, time; d = open(sys.argv[1], 'rb').read(); "
                "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW); i = 0\n"
                "while i < len(d):\n n = int.from_bytes(d[i:i+2], 'big')\n"
                " s.sendto(d[i+2:i+2+n], ('192.0.2.2', 0)); i += 2 + n\n"
                " if float(sys.argv[2]): time.sleep(float(sys.argv[2]))"
            )
            tb.run("gwA", [sys.executable, "-c", script, str(f), str(gap)], timeout=60)

        rng = random.Random(7)
        # 1..256, shuffled within blocks of 64: reordered by up to 63 places (window 1024)
        seqs = list(range(1, 257))
        for i in range(0, 256, 64):
            block = seqs[i : i + 64]
            rng.shuffle(block)
            seqs[i : i + 64] = block
        send(sealed(seqs))
        first = sa(settle(gw, "gwB"), "inbound", "in")
        # then 257..512 with every fourth lost, then 513..520: no stall after the gaps
        send(sealed([q for q in range(257, 513) if q % 4]))
        send(sealed(list(range(513, 521))))
        second = sa(settle(gw, "gwB"), "inbound", "in")
        send(sealed([301]))  # one already seen: a replay
        third = sa(settle(gw, "gwB"), "inbound", "in")
        # 521..580, each twice in a row, as fast as one socket sends (64 to a batch)
        send(sealed([q for q in range(521, 581) for _ in (0, 1)]), gap=0)
        fourth = sa(settle(gw, "gwB"), "inbound", "in")
    assert first["packets"] == 256 and first["drops"] == {}
    assert second["packets"] == 256 + 192 + 8 and second["drops"] == {}
    assert third["packets"] == second["packets"] and third["drops"] == {"replay": 1}
    assert fourth["packets"] == third["packets"] + 60, fourth
    assert fourth["drops"] == {"replay": 1 + 60}, fourth


def tun_dropped(tb: Testbed, node: str) -> int:
    """Packets the kernel dropped in front of `node`'s gateway: its TUN device's queue
    was full (the gateway did not read in time)."""
    path = "/sys/class/net/ipsec0/statistics/tx_dropped"
    return int(tb.run(node, ["cat", path], timeout=10))


def both(*edits: Callable[[str, str], str]) -> Callable[[str, str], str]:
    """`edit`s for `tunnel`, applied in turn."""

    def edit(node: str, text: str) -> str:
        for e in edits:
            text = e(node, text)
        return text

    return edit


# With a crypto crew the SA's last packet is numbered before the SA stops and sealed by
# the crew after it: it must still go (sealed with the retired SA's keys), and no other.
@pytest.mark.parametrize("crypto_workers", [1, 4])
def test_an_expired_sa_sends_nothing_in_clear(tmp_path: Path, crypto_workers: int) -> None:
    # gwA's outbound SA stops after 200 packets (its hard lifetime)
    hard_limit = both(
        sa_key({"gwA": ("out", "hard_packets = 200")}),
        gateway_key(f"crypto_workers = {crypto_workers}"),
    )
    with tunnel(tmp_path, edit=hard_limit) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 500, through=gw)
        a = settle(gw, "gwA")
    out = sa(a, "outbound", "out")
    assert out["state"] == "expired" and out["packets"] == 200
    # the rest were refused by policy: no SA to protect them, so nothing went out. Every
    # packet gwA read from its TUN device is accounted for: sealed, bypassed or a named
    # drop (a `policy_discard` is the kernel's own, not the blast's). Of the blast's 500
    # all but a few reached gwA: on a loaded host one can be lost on the client's way to
    # it (seen here: 299 no_sa of 300, the gateway having read 499), which no SA decides.
    io, drops = a["outbound"]["io"], a["outbound"]["drops"]
    assert io["rx_packets"] == 200 + sum(drops.values()) + io.get("bypassed", 0), (io, drops)
    assert set(drops) <= {"no_sa", "policy_discard"}, drops
    assert 290 <= drops["no_sa"] <= 300, drops
    from scapy.all import IP, rdpcap

    pkts = [p for p in rdpcap(str(pcap)) if IP in p and p[IP].src == "192.0.2.1"]
    assert {p[IP].proto for p in pkts} == {50} and len(pkts) == 200


@pytest.mark.parametrize(
    ("configuration", "udp_encap"),
    [("esp:aes128gcm16", False), ("esp:aes256-sha256", False), ("esp:aes128gcm16", True)],
)
def test_a_crypto_crew_seals_and_opens_one_sa_on_several_threads_in_order(
    tmp_path: Path, configuration: str, udp_encap: bool
) -> None:
    crew = gateway_key("crypto_workers = 4")
    with tunnel(tmp_path, configuration, udp_encap=udp_encap, edit=crew) as (tb, gw):
        data = planted(tb, 8)
        # 4 TCP connections at once, every byte of each arriving in order (the digests)
        send_file(tb, data, streams=4)
        t = tcp(tb)
        queued_out = tun_dropped(tb, "gwA")
        u = udp(tb)
        queued_out = tun_dropped(tb, "gwA") - queued_out
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
        names = set()
        for node in ("gwA", "gwB"):
            tasks = Path(f"/proc/{gw.process(node).pid}/task").iterdir()
            names |= {(task / "comm").read_text().strip() for task in tasks}
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert "4 crypto workers each" in log
    # the worker and 3 helpers per direction
    assert {f"{d}-{i}" for d in ("seal", "open") for i in range(3)} <= names, names
    assert t["mbps"] > 10, t
    # UDP: whatever was lost was lost in front of gwA, in its TUN device's queue (the
    # kernel counts it), not by the gateways: 4 crew threads per direction and gateway
    # on this 2-core host starve the reading worker now and then (here 2.5-8 % of 50
    # Mbit/s; `auto` gives 1 thread on 2 cores). Every packet read was sealed and opened.
    assert u["mbps"] > 10 and u["lost_packets"] <= queued_out, (u, queued_out)
    for st, d in ((a, "outbound"), (b, "inbound")):
        io = st[d]["io"]
        assert io["rx_packets"] == io["tx_packets"] + sum(st[d]["drops"].values()), (d, io)
    # 4 x 8 MiB in full-sized packets, each sealed once by the crew, none refused by gwB:
    # not one number twice (a replay drop), not one ICV wrong, not one out of the window
    sealed, opened = sa(a, "outbound", "out")["packets"], sa(b, "inbound", "in")["packets"]
    assert sealed > 20000 and 0.98 * sealed <= opened <= sealed, (sealed, opened)
    for st in (a, b):
        for d in ("outbound", "inbound"):
            for s in st[d]["sas"]:
                assert s["drops"] == {}, (d, s)


@pytest.mark.parametrize("crypto_workers", [1, 4])
def test_sighup_reload_keeps_the_sas_and_a_bad_config_is_refused(
    tmp_path: Path, crypto_workers: int
) -> None:
    with tunnel(tmp_path, edit=gateway_key(f"crypto_workers = {crypto_workers}")) as (tb, gw):
        tcp(tb, seconds=1)
        before = sa(settle(gw, "gwA"), "outbound", "out")
        hup(gw, "gwA")
        tcp(tb, seconds=1)
        mid = settle(gw, "gwA")
        assert mid["reloads"] == 1 and mid["reloads_refused"] == 0
        after = sa(mid, "outbound", "out")
        assert after["packets"] > before["packets"] > 0  # the same SA went on counting
        conf = gw.configs["gwA"]
        good = conf.read_text()
        conf.write_text(good.replace('encryption = "aes128gcm16"', 'encryption = "aes999"', 1))
        hup(gw, "gwA")
        t = tcp(tb, seconds=1)  # the running config still carries traffic
        end = settle(gw, "gwA")
        assert end["reloads"] == 1 and end["reloads_refused"] == 1
        assert t["mbps"] > 10
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
        assert "reload refused" in log and "aes999" in log
    assert "stopping" in (tmp_path / "run" / "ipsec-gw-gwA.log").read_text()


@pytest.mark.parametrize("udp_encap", [False, True])
def test_one_worker_for_both_directions(tmp_path: Path, udp_encap: bool) -> None:
    with tunnel(tmp_path, udp_encap=udp_encap, edit=gateway_key("workers = 1")) as (tb, gw):
        data = planted(tb, 1)
        send_file(tb, data)
        u = udp(tb)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
        # the thread layout is fixed at start: a reload that changes it is refused
        conf = gw.configs["gwA"]
        conf.write_text(conf.read_text().replace("workers = 1", "workers = 2", 1))
        assert hup(gw, "gwA")[1]["reloads_refused"] == 1
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert "one worker" in log and "reload refused" in log and "workers" in log
    assert u["loss_pct"] < 2.0, u
    # 1 MiB of data in full-sized ESP packets, sealed by gwA and opened by gwB
    assert sa(a, "outbound", "out")["packets"] > 700
    assert sa(b, "inbound", "in")["packets"] > 700
    for st in (a, b):  # both directions of both gateways worked, on one thread each
        assert sa(st, "outbound", "out")["packets"] > 10  # (the ACKs: a few with GRO)
        assert sa(st, "inbound", "in")["packets"] > 10
        for d in ("outbound", "inbound"):
            for s in st[d]["sas"]:
                assert s["drops"] == {}, (d, s)


def with_v6(node: str, text: str) -> str:
    """A gateway config (`Ours(edit=…)`) that also protects the IPv6 inside subnets
    fd00:1::/64 (client's) and fd00:2::/64 (server's), which `inside_v6` addresses."""
    mine, theirs = ("fd00:1::/64", "fd00:2::/64")
    if node == "gwB":
        mine, theirs = theirs, mine
    text = text.replace("routes = [", f'routes = ["{theirs}", ', 1)
    return text + (
        f'\n[[policy]]\ndirection = "out"\nsrc = "{mine}"\ndst = "{theirs}"\n'
        f'action = "protect"\nsa = "out"\n'
        f'\n[[policy]]\ndirection = "in"\nsrc = "{theirs}"\ndst = "{mine}"\n'
        f'action = "protect"\nsa = "in"\n'
    )


def inside_v6(tb: Testbed) -> None:
    """IPv6 on the line's inside links beside IPv4: client fd00:1::2, server fd00:2::2,
    the gateways ::1 of each and forwarding."""
    for node, dev, addr in (
        ("client", "eth0", "fd00:1::2/64"), ("gwA", "lan", "fd00:1::1/64"),
        ("gwB", "lan", "fd00:2::1/64"), ("server", "eth0", "fd00:2::2/64"),
    ):  # fmt: skip
        tb.run(node, ["ip", "-6", "addr", "add", addr, "dev", dev, "nodad"])
    tb.run("client", ["ip", "-6", "route", "add", "default", "via", "fd00:1::1"])
    tb.run("server", ["ip", "-6", "route", "add", "default", "via", "fd00:2::1"])
    for gw_node in ("gwA", "gwB"):
        tb.run(gw_node, ["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])


def test_ipv6_inner_traffic_over_ipv4_outer(tmp_path: Path) -> None:
    with Testbed(topology("line"), tmp_path / "run") as tb:
        inside_v6(tb)
        gw = Ours(edit=with_v6)
        gw.start(tb, "esp:aes128gcm16")
        try:
            srv = iperf.Servers(tb, "server", [iperf.PORT])
            try:
                out = tb.run(
                    "client",
                    ["iperf3", "-c", "fd00:2::2", "-p", str(iperf.PORT), "-t", "2", "-J"],
                    timeout=40,
                )
            finally:
                srv.close()
            a = settle(gw, "gwA")
        finally:
            gw.stop(tb)
    import json

    assert json.loads(out)["end"]["sum_received"]["bits_per_second"] > 10e6
    assert sa(a, "outbound", "out")["packets"] > 1000


def test_check_and_stats_commands(tmp_path: Path) -> None:
    binary = str(gateway_binary())
    bad = tmp_path / "bad.toml"
    bad.write_text('[gateway]\ntun = "ipsec0"\nlocal = "192.0.2.1"\nremote = "x"\n')
    p = subprocess.run([binary, "--config", str(bad), "--check"], capture_output=True, text=True)
    assert p.returncode == 2
    assert f"{bad}: gateway.remote: " in p.stderr and "not an IP address" in p.stderr
    p = subprocess.run(
        [binary, "stats", "--socket", str(tmp_path / "none.sock")], capture_output=True, text=True
    )
    assert p.returncode == 1 and "cannot read" in p.stderr
    # the lab asks the socket itself (no program started): no gateway there is its error
    with pytest.raises(LabError, match=r"ipsec-gw stats: .*none\.sock: "):
        stats(tmp_path / "none.sock")
    with tunnel(tmp_path) as (tb, gw):
        tcp(tb, seconds=1)
        settle(gw, "gwA")
        sock = str(gw.sockets["gwA"])
        # ... and gets the document `ipsec-gw stats --json` prints, counters and all
        cli = json.loads(
            subprocess.run(
                [binary, "stats", "--socket", sock, "--json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        lab = stats(Path(sock))
        assert lab.keys() == cli.keys() and lab["outbound"].keys() == cli["outbound"].keys()
        for d in ("outbound", "inbound"):
            assert [(s["spi"], s["suite"]) for s in lab[d]["sas"]] == [
                (s["spi"], s["suite"]) for s in cli[d]["sas"]
            ]
            assert lab[d]["sas"][0]["packets"] >= cli[d]["sas"][0]["packets"] > 0
        human = subprocess.run([binary, "stats", "--socket", sock], capture_output=True, text=True)
        prom = subprocess.run(
            [binary, "stats", "--socket", sock, "--prometheus"], capture_output=True, text=True
        )
        conf = gw.configs["gwA"].read_text()
    assert "SA out spi 0x00001001 esp aes128gcm16" in human.stdout
    assert re.search(r'ipsec_gw_sa_packets_total\{sa="out",spi="0x00001001",direction="out"\} \d+',
                     prom.stdout)  # fmt: skip
    key = re.search(r'enc_key = "([0-9a-f]+)"', conf)
    assert key and key.group(1) not in human.stdout + prom.stdout
    log = (tmp_path / "run" / "ipsec-gw-gwA.log").read_text()
    assert key.group(1) not in log


@pytest.mark.parametrize("mode", ["transport", "tunnel"])
def test_host_to_host_protects_the_hosts_own_traffic(tmp_path: Path, mode: str) -> None:
    """pair topology: each host its own gateway; the route to the peer's own address goes
    into the TUN device, the gateway's marked packets past it (policy routing)."""
    with Testbed(topology("pair"), tmp_path / "run") as tb:
        gw = Ours(mode=mode)
        gw.start(tb, "esp:aes128gcm16")
        try:
            tb_mtu = tb.run("hostA", ["ip", "-j", "link", "show", "dev", "ipsec0"])
            with capture(tb, "hostA", "eth0", "link") as pcap:
                t = tcp(tb, seconds=2)
            a = settle(gw, "hostA")
        finally:
            gw.stop(tb)
    assert t["mbps"] > 10
    assert sa(a, "outbound", "out")["packets"] > 1000
    # no clear TCP between the hosts: every IPv4 packet is ESP
    assert count(pcap, "ip") > 1000 and count(pcap, "ip and not ip proto 50") == 0
    # Full-size segments fill the 1500-byte link exactly (`mtu = "auto"`): tunnel mode's
    # TUN offers 1446 — outer IPv4 20 + ESP 8 + IV 8 + (1446 + 2 trailer = 1448, a multiple
    # of 4) + ICV 16 = 1500; transport keeps the packet's own header in front and offers
    # 1466 — 20 + 8 + 8 + (1446 of payload + 2) + 16 = 1500. Nothing larger, no fragment.
    full = 1500  # the largest IPv4 total length on the link
    assert json.loads(tb_mtu)[0]["mtu"] == (1446 if mode == "tunnel" else 1466)
    assert count(pcap, f"ip[2:2] = {full}") > 0 and count(pcap, f"ip[2:2] > {full}") == 0


def test_bundles_ah_over_esp_and_ipcomp_inside_esp(tmp_path: Path) -> None:
    """Study 1's "AH + ESP" and "IPComp + ESP" through the gateways: the wire shows the
    outer layer, each layer's SA counts, and compressible data shrinks."""
    with tunnel(tmp_path / "ah", "ah:sha1+esp:aes128") as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            t = tcp(tb)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    assert t["mbps"] > 10
    assert count(pcap, "ip") > 1000 and count(pcap, "ip and not ip proto 51") == 0  # AH outside
    for name in ("esp-out", "ah-out"):
        assert sa(a, "outbound", name)["packets"] > 1000
    for name in ("esp-in", "ah-in"):
        assert sa(b, "inbound", name)["packets"] > 1000 and sa(b, "inbound", name)["drops"] == {}

    text = tmp_path / "text.txt"
    words = b"the gateway compresses English text before it encrypts it, as study one did. "
    text.write_bytes(words * (4 * 1024 * 1024 // len(words)))
    with tunnel(tmp_path / "ipcomp", "ipcomp+esp:aes128-sha1") as (tb, gw):
        send_file(tb, text)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    (out,) = a["outbound"]["ipcomp"]
    (inb,) = b["inbound"]["ipcomp"]
    assert out["compressed"] > 1000 and out["bytes_out"] < out["bytes_in"] / 2
    assert inb["decompressed"] >= out["compressed"] * 0.99 and inb["drops"] == {}


@pytest.mark.parametrize("crypto_workers", [1, 2])
def test_ipcomp_inside_esp_in_udp_opens_coalesced_datagrams(
    tmp_path: Path, crypto_workers: int
) -> None:
    """Random data does not compress, so IPComp sends it as it is (RFC 3173 §2.2) and the
    ESP packets are all one size: UDP GRO hands gwB several per receive. With IPComp in
    the bundle each segment is opened in a copy of its own, at the buffer's headroom
    (decompressing may grow it past its slot) — by the worker alone, or by its crew;
    every byte still arrives."""
    crew = gateway_key(f"crypto_workers = {crypto_workers}")
    with tunnel(tmp_path, "ipcomp+esp:aes128-sha1", udp_encap=True, edit=crew) as (tb, gw):
        data = tb.rundir / "random.bin"
        data.write_bytes(random.Random(7).randbytes(2 * 1024 * 1024))
        send_file(tb, data)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    (out,) = a["outbound"]["ipcomp"]
    (inb,) = b["inbound"]["ipcomp"]
    assert out["incompressible"] > 1000 and inb["drops"] == {}
    assert b["inbound"]["io"]["gro_receives"] > 0
    assert 0 < b["inbound"]["io"]["tun_writes"] < b["inbound"]["io"]["tx_packets"]
    for d in ("outbound", "inbound"):
        for s in b[d]["sas"]:
            assert s["drops"] == {}, (d, s)


@pytest.mark.parametrize("udp_encap", [False, True])
def test_ipv4_inner_traffic_over_ipv6_outer(tmp_path: Path, udp_encap: bool) -> None:
    def outer_v6(key: str, text: str) -> str:
        me, peer = (
            ("2001:db8::1", "2001:db8::2") if key == "gwA" else ("2001:db8::2", "2001:db8::1")
        )
        text = re.sub(r'local = "[^"]+"', f'local = "{me}"', text, count=1)
        return re.sub(r'remote = "[^"]+"', f'remote = "{peer}"', text, count=1)

    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.run("gwA", ["ip", "-6", "addr", "add", "2001:db8::1/64", "dev", "wan", "nodad"])
        tb.run("gwB", ["ip", "-6", "addr", "add", "2001:db8::2/64", "dev", "wan", "nodad"])
        gw = Ours(edit=outer_v6, udp_encap=udp_encap)
        gw.start(tb, "esp:aes128gcm16")
        try:
            flt = "ip6 and src host 2001:db8::1 and dst host 2001:db8::2"
            with capture(tb, "gwA", "wan", "wan6", bpf=flt) as pcap:
                t = tcp(tb, seconds=2)
            a, b = settle(gw, "gwA"), settle(gw, "gwB")
        finally:
            gw.stop(tb)
    assert t["mbps"] > 10
    assert sa(a, "outbound", "out")["packets"] > 1000
    assert sa(b, "inbound", "in")["packets"] > 1000 and sa(b, "inbound", "in")["drops"] == {}
    assert count(pcap, "ip6") > 1000
    other = "not udp dst port 4500" if udp_encap else "not ip6 proto 50"
    assert count(pcap, f"ip6 and {other}") == 0


def test_without_tun_offloads_every_packet_is_one_read_and_write(tmp_path: Path) -> None:
    """`offload = false`: the plain TUN path (no virtio header) carries traffic too."""
    with tunnel(tmp_path, edit=gateway_key("offload = false")) as (tb, gw):
        t = tcp(tb)
        u = udp(tb)
        a, b = settle(gw, "gwA"), settle(gw, "gwB")
    assert t["mbps"] > 10 and u["loss_pct"] < 2.0
    assert b["inbound"]["io"]["tun_writes"] == b["inbound"]["io"]["tx_packets"]
    assert sa(a, "outbound", "out")["packets"] > 1000 and sa(a, "outbound", "out")["drops"] == {}
    log = (tmp_path / "run" / "ipsec-gw-gwA.log").read_text()
    assert "offloads: TCP off, UDP off" in log


def home_cgroup(pid: int, root: Path) -> Path:
    """The directory, under the CPU controller's `root` (v2's /sys/fs/cgroup, v1's
    /sys/fs/cgroup/cpu), of the cgroup process `pid` is in for that controller."""
    for line in Path("/proc", str(pid), "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        v2 = root == Path("/sys/fs/cgroup")
        if (v2 and controllers == "") or (not v2 and "cpu" in controllers.split(",")):
            return root / path.lstrip("/")
    raise AssertionError(f"process {pid} is in no cgroup of {root}")


@contextmanager
def starved(p: Any, cpus_worth: float = 0.01) -> Iterator[None]:
    """`p` held to `cpus_worth` of a CPU for the block (a cgroup's `cpu.max`: 1 ms in
    every 100 by default), the kernel's quota: a gateway that takes datagrams slower than
    they come, whatever this test's own threads are given, so its receive queue stands.
    (Stopping and continuing it from a thread here let it run as long as that thread took
    to wake: at 2.4 us a datagram a few ms more in every 100 kept it up with 12.5 k/s.)
    `p` is back in its own cgroup after the block, whatever happened."""
    limit = CpuLimit(f"test-starved-{os.getpid()}", cpus_worth)
    try:
        back = home_cgroup(p.pid, limit.path.parent) / "cgroup.procs"
        limit.procs.write_text(str(p.pid))
        try:
            yield
        finally:
            try:
                back.write_text(str(p.pid))
            except ProcessLookupError:
                pass  # it ended meanwhile: nothing to move back (the block says why)
    finally:
        limit.remove()


@pytest.mark.parametrize(("aqm", "udp_encap"), [(True, False), (True, True), (False, False)])
def test_codel_drops_from_a_standing_receive_queue_and_counts_them(
    tmp_path: Path, aqm: bool, udp_encap: bool
) -> None:
    """`aqm = true` (RFC 8289): gwB takes ESP slower than it comes (held to 1 ms of CPU in
    every 100), so its socket's queue stands far above CoDel's 5 ms: packets are dropped as
    they are taken, unopened, and counted as `queue_delay_drops` (raw ESP, and ESP in UDP
    whose datagrams the kernel coalesces: one packet per decision); every packet gwB
    received is accounted for. Without `aqm` the same queue is only the kernel's tail
    drop, and none is counted."""
    edit = gateway_key(f"aqm = {str(aqm).lower()}")
    with tunnel(tmp_path, udp_encap=udp_encap, edit=edit) as (tb, gw):
        with starved(gw.process("gwB")):
            u = udp(tb, size=1000, rate=100, seconds=2)
        b = settle(gw, "gwB")
    io = b["inbound"]["io"]
    (sa,) = b["inbound"]["sas"]
    assert u["sent_packets"] > 20_000, u
    # the premise: gwB fell behind, its socket's queue filled and the kernel dropped at
    # its tail (what a gateway keeping up never loses)
    assert io["rx_packets"] < u["sent_packets"] * 0.9, (io, u)
    assert sa["drops"] == {} and b["inbound"]["drops"] == {}, b["inbound"]
    # every packet received was opened, dropped by CoDel, or not ESP (4500's keepalives)
    assert sa["packets"] + io["queue_delay_drops"] + io["not_esp"] == io["rx_packets"], io
    if aqm:
        assert io["queue_delay_drops"] > 0, io
    else:
        assert io["queue_delay_drops"] == 0, io


@pytest.mark.parametrize("tun_queue", [None, 4])
def test_the_tun_queue_holds_what_it_is_set_to_and_what_overflows_it_is_counted(
    tmp_path: Path, tun_queue: int | None
) -> None:
    """`tun_queue` (default Linux's 500 for a TUN device): the outbound queue between the
    kernel's forwarding and gwA's reads holds that many packets. With gwA starved (1 ms of
    CPU in 100), a burst fills it: the kernel drops the rest at its tail and gwA's stats
    count them as `tun_queue_drops`; every packet the client sent was sealed or is one of
    those (nothing lost elsewhere, nothing sent in clear)."""
    edit = gateway_key(f"tun_queue = {tun_queue}") if tun_queue else None
    want = tun_queue or LONG_TUN_QUEUE
    with tunnel(tmp_path, edit=edit) as (tb, gw):
        link = tb.run("gwA", ["ip", "-o", "link", "show", "dev", "ipsec0"])
        assert re.search(rf"\bqlen {want}\b", link), link
        before = settle(gw, "gwA")
        assert before["tun_queue_drops"] == 0, before
        with starved(gw.process("gwA")):
            u = udp(tb, size=1000, rate=100, seconds=1)
        a = settle(gw, "gwA")
        clear = a["clear_dropped"]["outbound"]
    (out,) = a["outbound"]["sas"]
    drops = a["tun_queue_drops"]
    assert u["sent_packets"] > 10_000, u
    # the premise: gwA fell behind, so its queue filled
    assert drops > 0, (drops, u)
    assert out["packets"] + drops == u["sent_packets"], (out, drops, u)
    assert clear == 0, a["clear_dropped"]


def _qlen(tb: Testbed) -> int:
    link = tb.run("gwA", ["ip", "-o", "link", "show", "dev", "ipsec0"])
    m = re.search(r"\bqlen (\d+)\b", link)
    assert m, link
    return int(m.group(1))


def test_the_auto_tun_queue_is_short_under_tcp_bulk_and_long_again_after(
    tmp_path: Path,
) -> None:
    """`tun_queue = "auto"`: while TCP's GSO super-packets bring most of
    what gwA reads, its TUN device's queue is SHORT_TUN_QUEUE (a TCP bulk flow fills any
    queue: 500 stood at ~20 ms); 1-2 s after the flow ends (LONG_AFTER windows, an idle
    worker waking every 200 ms), LONG_TUN_QUEUE again (bursts of small packets need the
    places). Both seen on the device (`ip link`), and the changes counted in gwA's
    outbound io."""
    import threading

    with tunnel(tmp_path, edit=gateway_key('tun_queue = "auto"')) as (tb, gw):
        assert _qlen(tb) == LONG_TUN_QUEUE
        seen: set[int] = set()
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                seen.add(_qlen(tb))
                done.wait(0.05)

        w = threading.Thread(target=watch)
        w.start()
        try:
            r = tcp(tb, seconds=2)
        finally:
            done.set()
            w.join()
        assert r["mbps"] > 0, r
        assert SHORT_TUN_QUEUE in seen, seen
        poll_until("gwA's TUN queue long again", lambda: _qlen(tb) == LONG_TUN_QUEUE, 5)
        a = settle(gw, "gwA")
    assert a["outbound"]["io"]["tun_queue_changes"] >= 2, a["outbound"]["io"]
