"""The gateway's boundary, second pass (issue 29): a key never numbers a nonce twice under
any SPI, an expired SA's traffic never moves to another SA, clear packets for protected
subnets never cross — while the gateway runs and while it is down — and a damaged or
shared sequence state is refused. Each test fails on the gateway before these fixes.
Needs root (CI runs as root)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours, gateway_binary, stats
from netutil import capture, poll_until
from test_gateway_traffic_root import (
    arrived,
    blast,
    guard_dropped,
    hup,
    hup_then_restart,
    sa,
    settle,
    tunnel,
)

pytestmark = pytest.mark.root


def _esp(pcap: Path, src: str) -> list[tuple[int, int, bytes]]:
    """(SPI, sequence number, the 8 bytes after them: GCM's explicit IV, RFC 4106 §3.1)
    of every ESP packet `src` sent, parsed from the capture's bytes."""
    from scapy.all import IP, rdpcap

    out = []
    for p in rdpcap(str(pcap)):
        if IP in p and p[IP].src == src and p[IP].proto == 50:
            b = bytes(p[IP].payload)
            out.append((int.from_bytes(b[0:4], "big"), int.from_bytes(b[4:8], "big"), b[8:16]))
    return out


def _set_spi(text: str, name: str, spi: int) -> str:
    new, n = re.subn(rf'(name = "{name}"\ndirection = "\w+"\nspi = )\d+', rf"\g<1>{spi}", text)
    assert n == 1, text
    return new


def _sa_block(text: str, name: str) -> str:
    m = re.search(rf'\[\[sa\]\]\nname = "{name}"\n.*?\n\n', text, re.S)
    assert m, text
    return m.group(0)


def _policy_block(text: str, direction: str) -> str:
    m = re.search(rf'\[\[policy\]\]\ndirection = "{direction}"\n.*?(?=\n\[\[|\Z)', text, re.S)
    assert m, text
    return m.group(0)


def _reload(gw: Ours, node: str, text: str) -> dict:
    gw.configs[node].write_text(text)
    before, st = hup(gw, node)
    assert st["reloads"] == before["reloads"] + 1, st
    return st


def test_a_key_never_numbers_an_iv_twice_across_spi_change_restart_and_reload(
    tmp_path: Path,
) -> None:
    """The issue's reproduction: 20 packets, the SPI changed (same key) on both gateways
    and both restarted, 20 more; then a reload takes the SA away and a later one brings
    its key back under a third SPI, 20 more. Before the fix the state was keyed by SPI
    and the second and third 20 reused IVs 1..20 under the same key."""
    with tunnel(tmp_path) as (tb, gw):
        a, b = gw.configs["gwA"].read_text(), gw.configs["gwB"].read_text()
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 20, through=gw)
            gw.configs["gwA"].write_text(_set_spi(a, "out", 0x3003))
            gw.configs["gwB"].write_text(_set_spi(b, "in", 0x3003))
            gw.restart(tb, "gwA")
            gw.restart(tb, "gwB")
            blast(tb, 20, through=gw)
            received = sa(arrived(gw, 20), "inbound", "in")["packets"]
            # reload 1: the outbound SA and its policy gone; reload 2: its key is back
            # under SPI 0x5005
            a2 = gw.configs["gwA"].read_text()
            gone = a2.replace(_sa_block(a2, "out"), "").replace(_policy_block(a2, "out"), "")
            _reload(gw, "gwA", gone)
            blast(tb, 5)  # no policy now: discarded, nothing on the wire
            _reload(gw, "gwA", _set_spi(a2, "out", 0x5005))
            blast(tb, 20, through=gw)
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    seen = _esp(pcap, "192.0.2.1")
    spis = [s for s, _, _ in seen]
    assert spis.count(0x1001) == 20 and spis.count(0x3003) == 20, spis
    assert spis.count(0x5005) == 20, spis
    ivs = [iv for _, _, iv in seen]
    assert len(set(ivs)) == len(ivs), "an IV went out twice under one key"
    numbers = [n for _, n, _ in seen]
    assert len(set(numbers)) == len(numbers)  # one key, one sequence: never repeated
    assert received >= 20  # the peer took the renumbered packets (no replay drops)
    assert "resuming above sequence number" in log


def test_a_config_where_two_sas_share_a_key_is_refused_by_check_start_and_reload(
    tmp_path: Path,
) -> None:
    binary = str(gateway_binary())
    with tunnel(tmp_path) as (tb, gw):
        conf = gw.configs["gwA"]
        good = conf.read_text()
        out_key = re.search(r'enc_key = "(\w+)"', _sa_block(good, "out"))
        in_key = re.search(r'enc_key = "(\w+)"', _sa_block(good, "in"))
        assert out_key and in_key
        bad_text = good.replace(in_key.group(1), out_key.group(1))
        bad = tmp_path / "shared.toml"
        bad.write_text(bad_text)
        check = subprocess.run([binary, "--config", str(bad), "--check"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
        start = subprocess.run(["ip", "netns", "exec", tb.ns("gwA"), binary, "--config",
                                str(bad), "--init-state"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
        for p in (check, start):
            assert p.returncode == 2, p.stderr
            assert "sa[1].enc_key" in p.stderr and "the same key as sa[0]" in p.stderr, p.stderr
            assert out_key.group(1) not in p.stderr  # the key itself is never printed
        conf.write_text(bad_text)
        before, after = hup(gw, "gwA")
        assert after["reloads_refused"] == before["reloads_refused"] + 1
        assert gw.process("gwA").poll() is None


def _expiring_then_null(node: str, text: str) -> str:
    """gwA: `out` (GCM) protects 10.2.0.2/32 only, with hard_packets = 5; after it in the
    file, `nullsa` (ESP-NULL, readable on the wire) protects 10.2.0.3/32."""
    if node != "gwA":
        return text
    text = text.replace('name = "out"', 'name = "out"\nhard_packets = 5', 1)
    text = text.replace(
        'direction = "out"\nsrc = "10.1.0.0/24"\ndst = "10.2.0.0/24"',
        'direction = "out"\nsrc = "10.1.0.0/24"\ndst = "10.2.0.2/32"',
        1,
    )
    integ = "ab" * 32
    return text + (
        f'\n[[sa]]\nname = "nullsa"\ndirection = "out"\nspi = {0x1003}\nencryption = "null"\n'
        f'integrity = "sha256"\ninteg_key = "{integ}"\n'
        '\n[[policy]]\ndirection = "out"\nsrc = "10.1.0.0/24"\ndst = "10.2.0.3/32"\n'
        'action = "protect"\nsa = "nullsa"\n'
    )


def test_an_expired_sas_traffic_is_dropped_never_carried_by_the_next_sa(tmp_path: Path) -> None:
    """The issue's reproduction: after `out` expired, a SIGHUP (and then a restart) sent
    10.2.0.2's traffic under `nullsa` (SPI 0x1003), payload readable. Now: the expired
    SA's id is never reused, its policy drops (`no_sa`), the gateway lives through the
    reload and starts again."""
    with tunnel(tmp_path, edit=_expiring_then_null) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 10, through=gw)
            assert sa(settle(gw, "gwA"), "outbound", "out")["state"] == "expired"
            after_reload, after_restart = hup_then_restart(tb, gw, "gwA", 10)
    assert after_reload["reloads"] == 1
    for st in (after_reload, after_restart):
        assert sa(st, "outbound", "out")["state"] == "expired"
        assert sa(st, "outbound", "nullsa")["packets"] == 0
        assert st["outbound"]["drops"].get("no_sa", 0) >= 10, st["outbound"]["drops"]
    seen = _esp(pcap, "192.0.2.1")
    assert [s for s, _, _ in seen] == [0x1001] * 5, seen  # then nothing at all
    from scapy.all import IP, UDP, rdpcap

    clear = [p for p in rdpcap(str(pcap)) if IP in p and UDP in p and p[IP].dst == "10.2.0.2"]
    assert clear == []


def _spoof(tb: object, n: int, payload: bytes) -> None:
    """From gwA's outer interface, past its gateway and routing (a frame straight onto the
    link): clear UDP 10.1.0.2 -> 10.2.0.2, as a host on the outside could send it."""
    mac = tb.run("gwB", ["cat", "/sys/class/net/wan/address"]).strip()  # type: ignore[attr-defined]
    script = (
        "import sys; from scapy.all import Ether, IP, UDP, Raw, sendp; "
        "sendp(Ether(dst=sys.argv[1]) / IP(src='10.1.0.2', dst='10.2.0.2') / "
        "UDP(sport=4444, dport=9) / Raw(sys.argv[2].encode()), iface='wan', "
        "count=int(sys.argv[3]), inter=0.01, verbose=False)"
    )
    tb.run("gwA", [sys.executable, "-c", script, mac, payload.decode(), str(n)], timeout=60)  # type: ignore[attr-defined]


def _more_tunnels(key: str, text: str) -> str:
    """gwB with three more tunnels' inbound policies after its own (to its SA `in`): its
    guard's rule for them is one over a set of (source . destination) pairs."""
    if key != "gwB":
        return text
    return text + "".join(
        f'\n[[policy]]\ndirection = "in"\nsrc = "10.9.{k}.0/24"\ndst = "10.8.{k}.0/24"\n'
        f'action = "protect"\nsa = "in"\n'
        for k in range(3)
    )


@pytest.mark.parametrize("many", [False, True], ids=["one-tunnel", "in-a-set-of-four"])
def test_clear_packets_from_outside_for_the_protected_subnet_are_dropped_running_and_down(
    tmp_path: Path, many: bool
) -> None:
    """RFC 4301 §5.2: gwB's kernel forwarded a clear packet addressed into its protected
    subnet straight to the server (only ESP reaches the gateway). Now gwB's nftables
    table drops and counts it — while it runs, and after `kill -9` — alone or as one of
    several tunnels' pairs in one rule's set."""
    with tunnel(tmp_path, edit=_more_tunnels if many else None) as (tb, gw):
        table = tb.run("gwB", ["nft", "list", "table", "inet", "ipsec_gw_220"])
        in_set = "ip saddr . ip daddr { 10.1.0.0/24 . 10.2.0.0/24, 10.9.0.0/24 . 10.8.0.0/24"
        assert (in_set in table) == many, table
        with capture(tb, "gwB", "lan", "lan") as pcap:
            _spoof(tb, 20, b"SPOOFED-RUNNING")
            sock = gw.sockets["gwB"]
            poll_until("gwB's guard to drop the 20 clear packets",
                       lambda: stats(sock)["clear_dropped"]["inbound"] >= 20)  # fmt: skip
            st = settle(gw, "gwB")
            p = gw.process("gwB")
            p.send_signal(signal.SIGKILL)
            p.wait(10)
            _spoof(tb, 20, b"SPOOFED-DOWN")

            def all_dropped() -> str:
                t = tb.run("gwB", ["nft", "list", "table", "inet", "ipsec_gw_220"])
                return t if guard_dropped(t, "clear_inbound") >= 40 else ""

            # the 20 sent while it was down are dropped too: the table outlives the gateway
            counted = poll_until("gwB's table to drop 40 clear packets in all", all_dropped)
    assert st["clear_dropped"]["inbound"] >= 20, st["clear_dropped"]
    from scapy.all import UDP, rdpcap

    delivered = [p for p in rdpcap(str(pcap)) if UDP in p and p[UDP].sport == 4444]
    assert delivered == [], f"{len(delivered)} spoofed clear packets reached the server"
    assert guard_dropped(counted, "clear_inbound") >= 40, counted


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "stop"])
def test_a_gateway_down_sends_nothing_in_clear_and_carries_traffic_again_after_restart(
    tmp_path: Path, sig: int
) -> None:
    """The issue's reproduction: with the line topology's plain route to the far subnet,
    after `kill -9` (and after SIGTERM) the client's traffic left gwA in clear. Now the
    blackhole routes and the rule stay while it is down."""
    with tunnel(tmp_path) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            ping = ["ping", "-c", "10", "-i", "0.2", "-W", "1", "10.2.0.2"]
            up = subprocess.run(["ip", "netns", "exec", tb.ns("client"), *ping],
                                capture_output=True, text=True, timeout=30)  # fmt: skip
            p = gw.process("gwA")
            p.send_signal(sig)
            p.wait(10)
            down = subprocess.run(["ip", "netns", "exec", tb.ns("client"), *ping],
                                  capture_output=True, text=True, timeout=30)  # fmt: skip
            gw.restart(tb, "gwA")
            again = subprocess.run(["ip", "netns", "exec", tb.ns("client"), *ping],
                                   capture_output=True, text=True, timeout=30)  # fmt: skip
    assert up.returncode == 0 and again.returncode == 0, (up.stdout, again.stdout)
    assert down.returncode != 0  # nothing got through while it was down
    from scapy.all import ICMP, IP, rdpcap

    clear = [p for p in rdpcap(str(pcap)) if IP in p and ICMP in p and "10." in p[IP].src]
    assert clear == [], f"{len(clear)} ICMP packets crossed the outer link in clear"
    assert len(_esp(pcap, "192.0.2.1")) >= 20  # before and after, sealed


def _state(gw: object, node: str) -> Path:
    return Path(f"{gw.configs[node]}.state.out")  # type: ignore[attr-defined]


def test_a_bad_or_shared_state_is_refused_and_one_damaged_slot_survived_safely(
    tmp_path: Path,
) -> None:
    """Missing (both slots), both damaged, and a second gateway on the same state are
    refused with what to do; one slot cut short is survived, every reservation one block
    higher (no number reused). Before, a missing file was read as empty and numbering
    restarted at 1."""
    binary = str(gateway_binary())
    with tunnel(tmp_path) as (tb, gw):
        blast(tb, 10, through=gw)
        conf = gw.configs["gwA"]
        out, out_b = _state(gw, "gwA"), Path(f"{_state(gw, 'gwA')}.b")

        def start(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["ip", "netns", "exec", tb.ns("gwA"), binary, "--config",
                                   str(conf), *extra],
                                  capture_output=True, text=True, timeout=10)  # fmt: skip

        second = start("--init-state")  # gwA still runs, holding the state's lock
        assert second.returncode == 1 and "another ipsec-gw holds" in second.stderr, second.stderr
        p = gw.process("gwA")
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        saved = {f: f.read_bytes() for f in (out, out_b)}
        for f in (out, out_b):
            f.unlink()
        missing = start()
        assert missing.returncode == 1 and "no sequence state" in missing.stderr
        assert "--init-state" in missing.stderr
        for f, data in saved.items():
            f.write_bytes(data[: len(data) - 5])  # both cut short
        damaged = start()
        assert damaged.returncode == 1 and "not usable" in damaged.stderr, damaged.stderr
        newer = max(saved, key=lambda f: int(re.search(rb"generation=(\d+)", saved[f])[1]))  # type: ignore[index]
        for f, data in saved.items():
            f.write_bytes(data if f != newer else data[: len(data) - 5])
        with capture(tb, "gwA", "wan", "wan") as pcap:
            gw.restart(tb, "gwA")  # one slot cut: survives
            blast(tb, 10, through=gw)
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert "a newer write may be lost" in log
    numbers = [n for s, n, _ in _esp(pcap, "192.0.2.1") if s == 0x1001]
    assert len(numbers) == 10 and min(numbers) > 2 * (1 << 20), numbers  # a block higher


def test_the_stats_socket_is_removed_only_while_it_is_still_the_gateways(tmp_path: Path) -> None:
    """A reload that moves `stats` is refused (before, the stop then deleted whatever the
    new path named, as root); a file put where the socket was is left alone at the stop;
    the gateway's own socket is removed."""
    with tunnel(tmp_path) as (tb, gw):
        conf = gw.configs["gwA"]
        sock = gw.sockets["gwA"]
        precious = tmp_path / "precious.txt"
        precious.write_text("keep me\n")
        good = conf.read_text()
        conf.write_text(good.replace(f'stats = "{sock}"', f'stats = "{precious}"', 1))
        before, after = hup(gw, "gwA")
        assert after["reloads_refused"] == before["reloads_refused"] + 1
        conf.write_text(good)
        sock.unlink()
        sock.write_text("not the gateway's\n")  # another file where the socket was
        p = gw.process("gwA")
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
        assert sock.read_text() == "not the gateway's\n"
        assert "no longer the stats socket this gateway bound" in log
        sock.unlink()
        gw.restart(tb, "gwA")
        assert sock.exists()
        q = gw.process("gwA")
        q.send_signal(signal.SIGTERM)
        q.wait(10)
        assert not sock.exists()  # its own: removed
    assert precious.read_text() == "keep me\n"


def test_a_sighup_during_start_up_waits_for_the_gateway(tmp_path: Path) -> None:
    """The handlers are in place before anything is made: watched from /proc, the
    gateway catches SIGHUP while its TUN device does not exist yet (before, it caught it
    only once the TUN device, sockets and workers existed, and a SIGHUP in between killed
    it with no clean-up); one sent then is handled, as a reload, once it is up."""
    binary = str(gateway_binary())
    with tunnel(tmp_path) as (tb, gw):
        conf = gw.configs["gwB"]
        p = gw.process("gwB")
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        log = tmp_path / "early.log"
        with log.open("w") as out:
            # `ip netns exec` execs the gateway in place: the PID becomes the gateway's
            q = subprocess.Popen(["ip", "netns", "exec", tb.ns("gwB"), binary, "--config",
                                  str(conf)], stdout=out, stderr=out)  # fmt: skip
            sent = False
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and q.poll() is None and not sent:
                    try:
                        exe = os.readlink(f"/proc/{q.pid}/exe")
                        status = Path(f"/proc/{q.pid}/status").read_text()
                        devices = Path(f"/proc/{q.pid}/net/dev").read_text()
                    except OSError:
                        continue
                    if not exe.endswith("ipsec-gw"):
                        continue
                    if "ipsec0:" in devices:
                        break  # the TUN device exists: too late to tell
                    caught = int(status.split("SigCgt:")[1].split()[0], 16)
                    if caught & (1 << (signal.SIGHUP - 1)):
                        os.kill(q.pid, signal.SIGHUP)
                        sent = True
                up = False
                while time.monotonic() < deadline and q.poll() is None:
                    if "reloaded" in log.read_text():
                        up = True
                        break
                    time.sleep(0.05)
                text = log.read_text()
            finally:
                if q.poll() is None:
                    q.send_signal(signal.SIGTERM)
                q.wait(10)
    assert sent, f"SIGHUP was not caught before the TUN device existed:\n{text}"
    assert up and "ipsec-gw: up" in text, (q.returncode, text)
