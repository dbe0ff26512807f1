"""The gateway's boundary, third pass (issue 39): no key serves two SAs whatever field,
protocol or suite holds it; nothing a protect policy matches leaves in clear whatever the
config's numbers or the host's rules; one gateway never removes another's guard; a crash
never lets a packet be accepted twice; `--release` never opens a running gateway's
boundary; a reload whose guard cannot be installed is refused; the tools the gateway runs
get a clean environment. Each test fails on the gateway before these fixes. Needs root
(CI runs as root)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours, gateway_binary, stats
from netutil import capture, count, poll_until
from test_gateway_fail_closed_root import _reload, _spoof
from test_gateway_traffic_root import blast, guard_dropped, hup, replay_esp, sa, settle, tunnel

pytestmark = pytest.mark.root

NFT = "/usr/sbin/nft"


def _gw(tb: object, node: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
    """`ipsec-gw ARGS` in `node`'s namespace, to completion."""
    argv = ["ip", "netns", "exec", tb.ns(node), str(gateway_binary()), *args]  # type: ignore[attr-defined]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _hex(seed: int, n: int) -> str:
    return bytes((i * 13 + seed) % 256 for i in range(n)).hex()


# (SA blocks sharing one key K, the key each must be refused under): ESP's AES-GCM
# enc_key and AH's AES-GMAC integ_key (the review's pair: one GHASH key, nonces 1, 2, …
# under both), and ESP's AES-GMAC against AH's.
K = _hex(7, 20)
PAIRS = {
    "esp-gcm+ah-gmac": (
        f'encryption = "aes128gcm16"\nenc_key = "{K}"\n',
        f'protocol = "ah"\nencryption = "null"\nintegrity = "aes128gmac"\ninteg_key = "{K}"\n',
    ),
    "esp-gmac+ah-gmac": (
        f'encryption = "aes128gmac"\nenc_key = "{K}"\n',
        f'protocol = "ah"\nencryption = "null"\nintegrity = "aes128gmac"\ninteg_key = "{K}"\n',
    ),
}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_one_key_as_gcm_and_gmac_is_refused_by_check_start_and_reload(
    tmp_path: Path, pair: str
) -> None:
    """The review's reproduction: the same bytes as an ESP AES-GCM `enc_key` and an AH
    AES-GMAC `integ_key` passed `--check` ("usable (2 SAs …)") and both SAs numbered
    from 1. Refused now by --check, start and reload, naming the field, never the key."""
    one, two = PAIRS[pair]
    extra = (
        f'\n[[sa]]\nname = "x1"\ndirection = "out"\nspi = 0x7001\n{one}'
        f'\n[[sa]]\nname = "x2"\ndirection = "in"\nspi = 0x7002\n{two}'
    )
    with tunnel(tmp_path) as (tb, gw):
        good = gw.configs["gwA"].read_text()
        bad_text = good.rstrip() + "\n" + extra
        bad = tmp_path / "shared.toml"
        bad.write_text(bad_text)
        check = _gw(tb, "gwA", "--config", str(bad), "--check")
        start = _gw(tb, "gwA", "--config", str(bad), "--init-state")
        for p in (check, start):
            assert p.returncode == 2, p.stderr
            assert re.search(r"sa\[\d\]\.integ_key: the same key as sa\[\d\]\.enc_key", p.stderr), (
                p.stderr
            )
            assert K not in p.stderr  # the key itself is never printed
        st = _reload_refused(gw, "gwA", bad_text)
        assert gw.process("gwA").poll() is None
        assert len(st["outbound"]["sas"]) == 1  # the running config stays


def _reload_refused(gw: Ours, node: str, text: str) -> dict:
    gw.configs[node].write_text(text)
    before, st = hup(gw, node)
    assert st["reloads_refused"] == before["reloads_refused"] + 1, st
    assert st["reloads"] == before["reloads"], st
    return st


def test_a_table_after_the_main_rule_is_refused_and_the_hosts_own_packets_never_leave_in_clear(
    tmp_path: Path,
) -> None:
    """`table = 40000` put the gateway's rule after `lookup main`: with a host-to-host
    policy, ICMP left in clear while `--check` called the config usable. Now such a
    table is refused; and whatever sends the host's own protected packets elsewhere (here
    a rule of the host's own before the gateway's, to the main table's plain route) the
    guard's output chain drops them — counted, never on the wire in clear."""
    with tunnel(tmp_path) as (tb, gw):
        rule = ["ip", "rule", "add", "to", "10.2.0.0/24", "lookup", "main", "priority", "10"]
        tb.run("gwA", rule)
        with capture(tb, "gwA", "wan", "wan") as pcap:
            ping = ["ping", "-c", "5", "-i", "0.2", "-W", "1", "-I", "10.1.0.1", "10.2.0.2"]
            p = subprocess.run(["ip", "netns", "exec", tb.ns("gwA"), *ping],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
        listed = tb.run("gwA", ["nft", "list", "table", "inet", "ipsec_gw_220"])
        high = tmp_path / "high.toml"
        high.write_text(gw.configs["gwA"].read_text().replace("table = 220", "table = 40000"))
        check = _gw(tb, "gwA", "--config", str(high), "--check")
    assert p.returncode != 0, p.stdout  # nothing got through
    assert count(pcap, "icmp and src host 10.1.0.1") == 0, "the host's own ping left in clear"
    assert guard_dropped(listed, "clear_outbound") >= 5, listed
    assert check.returncode == 2 and "gateway.table" in check.stderr, check.stderr
    assert "40000 is too high" in check.stderr


def test_a_second_gateway_on_the_same_table_is_refused_and_the_first_guard_stands(
    tmp_path: Path,
) -> None:
    """Two gateways with the same (default) table rebuilt one `inet ipsec_gw_220` with the
    second's policies only: gwB's protected subnet then took spoofed clear packets. The
    second is refused now, before it touches anything, and gwB's guard still drops them."""
    with tunnel(tmp_path) as (tb, gw):
        second = tmp_path / "second.toml"
        text = gw.configs["gwB"].read_text()
        text = re.sub(r'tun = "\w+"', 'tun = "ipsec9"', text)
        text = re.sub(r'stats = "[^"]*"\n', "", text)
        text = re.sub(r'dst = "10\.1\.0\.0/24"', 'dst = "10.8.0.0/24"', text)
        second.write_text(text)
        p = _gw(tb, "gwB", "--config", str(second), "--init-state", timeout=15)
        assert p.returncode == 1, p.stderr
        assert "another ipsec-gw runs on routing table 220" in p.stderr, p.stderr
        assert "ipsec9" not in tb.run("gwB", ["ip", "-o", "link"])
        sock = gw.sockets["gwB"]
        before = stats(sock)["clear_dropped"]["inbound"]
        with capture(tb, "gwB", "lan", "lan") as pcap:
            _spoof(tb, 3, b"SPOOFED-SECOND")
            poll_until("gwB's guard to drop the 3 clear packets",
                       lambda: stats(sock)["clear_dropped"]["inbound"] >= before + 3)  # fmt: skip
        assert gw.process("gwB").poll() is None
    assert count(pcap, "udp and src port 4444") == 0, "a spoofed clear packet got through"


@pytest.mark.parametrize("shared", ["tun", "stats"])
def test_a_second_gateway_with_the_first_ones_tun_or_stats_socket_is_refused_leaving_nothing(
    tmp_path: Path, shared: str
) -> None:
    """The same class on another table: a second gateway named the first one's TUN device
    (its guard went in, then the TUN failed: its blackholes for table 221 stayed) or its
    stats socket (removed and taken over). Refused now before anything is made."""
    with tunnel(tmp_path) as (tb, gw):
        text = gw.configs["gwB"].read_text().replace("table = 220", "table = 221")
        if shared == "stats":
            text = re.sub(r'tun = "\w+"', 'tun = "ipsec9"', text)
        else:
            text = re.sub(r'stats = "[^"]*"\n', "", text)
        second = tmp_path / "second.toml"
        second.write_text(text)
        p = _gw(tb, "gwB", "--config", str(second), "--init-state", timeout=15)
        assert p.returncode == 1, p.stderr
        want = "exists already" if shared == "tun" else "a running gateway answers on it"
        assert want in p.stderr, p.stderr
        assert "ipsec_gw_221" not in tb.run("gwB", ["nft", "list", "tables"])
        assert "lookup 221" not in tb.run("gwB", ["ip", "rule"])
        assert gw.process("gwB").poll() is None
        assert sa(settle(gw, "gwB"), "inbound", "in")["state"] == "active"  # its socket answers


def test_release_is_refused_while_the_gateway_runs(tmp_path: Path) -> None:
    """`ipsec-gw --release` opened the boundary under a running gateway (the lab runs it
    after a stop that may not have killed one). Refused now; after the stop it works."""
    with tunnel(tmp_path) as (tb, gw):
        conf = str(gw.configs["gwA"])
        p = _gw(tb, "gwA", "--config", conf, "--release")
        assert p.returncode == 1 and "--release refused" in p.stderr, p.stderr
        assert "ipsec_gw_220" in tb.run("gwA", ["nft", "list", "tables"])
        assert "lookup 220" in tb.run("gwA", ["ip", "rule"])
        gwa = gw.process("gwA")
        gwa.send_signal(signal.SIGTERM)
        gwa.wait(10)
        p = _gw(tb, "gwA", "--config", conf, "--release")
        assert p.returncode == 0, p.stderr
        assert "ipsec_gw_220" not in tb.run("gwA", ["nft", "list", "tables"])


RECEIVER = """
import select, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9))
print("ready", flush=True)
n, watch = 0, [s, sys.stdin]
while n < 100000:
    r, _, _ = select.select(watch, [], [], 0.5)
    if s in r:
        s.recv(65535)
        n += 1
    elif sys.stdin in r:
        watch = [s]  # told to end (or its parent gone): drain, then stop
    elif len(watch) == 1:
        break  # 0.5 s without a datagram since
print(n, flush=True)
"""


@contextmanager
def _received(tb: object, node: str) -> Iterator[list[int]]:
    """Count the UDP datagrams to port 9 that reach an application on `node` while the
    block runs (a socket: what the kernel delivers, GSO segmented); the count is in the
    yielded list after the block (taken 0.5 s after the last datagram)."""
    p = subprocess.Popen(["ip", "netns", "exec", tb.ns(node), sys.executable, "-c", RECEIVER],  # type: ignore[attr-defined]
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    out: list[int] = []
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield out
        out.append(int(p.communicate("end\n", timeout=30)[0].strip()))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(5)


def test_no_packet_accepted_before_a_crash_is_accepted_after_it(tmp_path: Path) -> None:
    """After `kill -9` within 100 ms of the traffic, a capture of 200 datagrams replayed
    from outside was delivered a second time (199 or 200 of 200): the inbound top was
    written every 100 ms. Now the receiver reserves ahead of what it accepts, so a
    restart refuses all of it."""
    with tunnel(tmp_path) as (tb, gw):
        blast(tb, 10)  # every neighbour on the way resolved (an unresolved one holds 3)
        for node, addr in (("client", "10.1.0.1"), ("gwA", "192.0.2.2"), ("gwB", "10.2.0.2")):
            neigh = ["ip", "neigh", "show", addr]
            poll_until(f"{node} to resolve {addr}",
                       lambda n=node, c=neigh: "lladdr" in tb.run(n, c))  # fmt: skip
        with capture(tb, "gwA", "wan", "wan") as pcap, _received(tb, "server") as first:
            blast(tb, 200)
            time.sleep(0.05)
            gwb = gw.process("gwB")
            gwb.send_signal(signal.SIGKILL)
            gwb.wait(10)
        gw.restart(tb, "gwB")
        with _received(tb, "server") as again:
            sent = replay_esp(tb, pcap)
        after = sa(settle(gw, "gwB"), "inbound", "in")
    assert first[0] >= 190, f"only {first[0]} of 200 reached the server before the crash"
    assert sent >= 200
    assert again == [0], f"{again[0]} datagrams were accepted a second time"
    assert after["packets"] == 0, after
    refused = after["drops"].get("replay", 0) + after["drops"].get("replay_too_old", 0)
    assert refused >= 200, after["drops"]


@contextmanager
def _nft_as(gw: object, node: str, script: str) -> Iterator[Path]:
    """`nft` replaced by `script` (sh) for gateway `node` alone: bind-mounted over
    /usr/sbin/nft in its own mount namespace (`ip netns exec` gave it one), where the
    gateway's user can run it. Yields a directory the script may write to; `$REAL` in the
    script is a copy of the real nft."""
    d = Path(tempfile.mkdtemp(prefix="ipl-nft-"))
    try:
        d.chmod(0o777)
        shutil.copy2(NFT, d / "nft-real")
        fake = d / "nft"
        fake.write_text(f"#!/bin/sh\nREAL={d}/nft-real\nOUT={d}\n{script}\n")
        fake.chmod(0o755)
        pid = str(gw.process(node).pid)  # type: ignore[attr-defined]
        subprocess.run(["nsenter", "-t", pid, "-m", "mount", "--bind", str(fake), NFT],
                       check=True, timeout=10)  # fmt: skip
        try:
            yield d
        finally:
            subprocess.run(["nsenter", "-t", pid, "-m", "umount", NFT], check=False, timeout=10)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_reload_whose_guard_fails_is_refused_and_tools_get_a_clean_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload whose guard could not be installed was applied anyway (the error printed,
    the reload counted). Refused now: the running config and its guard stay, traffic goes
    on. And `nft` (as `ip`) ran with the gateway's whole environment: now a clean one."""
    monkeypatch.setenv("IPSEC_LAB_CANARY", "from-the-gateways-environment")
    extra = (
        '\n[[policy]]\ndirection = "out"\nsrc = "10.1.0.0/24"\ndst = "10.9.0.0/24"\n'
        'action = "discard"\n'
    )
    with tunnel(tmp_path) as (tb, gw):
        text = gw.configs["gwA"].read_text()
        with _nft_as(gw, "gwA", 'env > "$OUT/env.txt"; exec "$REAL" "$@"') as d:
            _reload(gw, "gwA", text + extra)
            env = dict(
                x.split("=", 1) for x in (d / "env.txt").read_text().splitlines() if "=" in x
            )
        assert "IPSEC_LAB_CANARY" not in env, env
        assert set(env) <= {"PATH", "LC_ALL", "PWD", "SHLVL", "_"}, sorted(env)
        guard = tb.run("gwA", ["nft", "list", "table", "inet", "ipsec_gw_220"])
        assert "10.9.0.0/24" in guard  # that reload's guard is in place
        more = text + extra.replace("10.9.0.0", "10.7.0.0")
        with _nft_as(gw, "gwA", 'echo "nft: simulated failure" >&2; exit 1'):
            _reload_refused(gw, "gwA", more)
        after = tb.run("gwA", ["nft", "list", "table", "inet", "ipsec_gw_220"])
        before = sa(settle(gw, "gwB"), "inbound", "in")["packets"]
        blast(tb, 20, through=gw)
        moved = sa(settle(gw, "gwB"), "inbound", "in")["packets"] - before
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert after == guard, "the guard changed under a refused reload"
    assert "10.7.0.0" not in after
    assert moved >= 20, moved  # the running config carries traffic still
    assert "reload refused" in log and "simulated failure" in log


def test_a_key_the_peer_sent_under_is_never_sent_under_after_reloads_or_a_restart(
    tmp_path: Path,
) -> None:
    """Review finding: a key moved from the inbound SA to the outbound one (two reloads,
    or a restart) resumed above this gateway's inbound reservation, but the peer may have
    sent past what reached it: numbers it used could be sealed again under its key. Now
    refused at start, and by a reload (which the outbound worker would otherwise fail on,
    stopping the gateway): the running config stays, the key never printed."""
    with tunnel(tmp_path) as (tb, gw):
        blast(tb, 20)  # gwB's inbound SA accepts some: its key is in gwB's inbound state
        conf = gw.configs["gwB"]
        text = conf.read_text()
        blocks = {
            d: next(b for b in text.split("[[sa]]") if f'direction = "{d}"' in b)
            for d in ("in", "out")
        }
        k_in, k_out = (re.search(r'enc_key = "(\w+)"', blocks[d])[1] for d in ("in", "out"))  # type: ignore[index]
        assert k_in != k_out
        # first reload: the inbound SA gets a new key (the old one leaves the config)
        first = text.replace(k_in, _hex(99, len(k_in) // 2))
        conf.write_text(first)
        before, after = hup(gw, "gwB")
        assert after["reloads"] == before["reloads"] + 1
        # second reload: the outbound SA takes the key the peer sent under
        st = _reload_refused(gw, "gwB", first.replace(k_out, k_in))
        assert gw.process("gwB").poll() is None, "the reload stopped the gateway"
        assert len(st["outbound"]["sas"]) == 1  # the running config's
        p = gw.process("gwB")
        p.send_signal(signal.SIGTERM)
        p.wait(10)
        start = _gw(tb, "gwB", "--config", str(conf))
    assert start.returncode != 0, start.stderr
    assert "the inbound sequence state records a key of this outbound SA" in start.stderr
    assert k_in not in start.stderr
