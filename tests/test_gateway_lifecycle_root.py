"""The gateway's life cycle, as a security device: restarts never repeat a (key, SPI,
sequence number) — with AES-GCM that is a repeated nonce — a restarted receiver refuses
what it accepted before, an SA past its hard lifetime stays dead, a config is refused
alike by --check, start and reload, a worker that dies takes the gateway down with it,
a killed gateway starts again, and the stats socket cannot delete a file. Needs root
(CI runs as root)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import gateway_binary
from netutil import capture
from test_gateway_traffic_root import (
    arrived,
    blast,
    hup,
    hup_then_restart,
    replay_esp,
    sa,
    sa_key,
    settle,
    tcp,
    tunnel,
)

pytestmark = pytest.mark.root


def _esp_numbers(pcap: Path, src: str) -> list[tuple[int, int]]:
    """(SPI, sequence number) of every ESP packet `src` sent, in capture order."""
    from scapy.all import IP, rdpcap

    out = []
    for p in rdpcap(str(pcap)):
        if IP in p and p[IP].src == src and p[IP].proto == 50:
            b = bytes(p[IP].payload)
            out.append((int.from_bytes(b[0:4], "big"), int.from_bytes(b[4:8], "big")))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_a_restart_with_the_same_keys_never_repeats_a_sequence_number(
    tmp_path: Path, sig: int
) -> None:
    """The reproduction from the issue: 20 datagrams, gwA stopped (or killed) and started
    again with the same config and keys, 20 more. Before the fix the second 20 reused
    the first 20's numbers (GCM nonces) and gwB dropped them all as replays."""
    with tunnel(tmp_path) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 20, through=gw)
            gw.restart(tb, "gwA", sig)
            blast(tb, 20, through=gw)
        b = arrived(gw, 40)
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    seen = _esp_numbers(pcap, "192.0.2.1")
    assert len(seen) >= 40, seen
    assert len(set(seen)) == len(seen), "a (SPI, sequence number) went out twice"
    first, second = seen[:20], seen[20:]
    assert min(s for _, s in second) > max(s for _, s in first)
    assert "resuming above sequence number" in log
    # and the second 20 arrived: no replay drops at gwB
    inb = sa(b, "inbound", "in")
    assert inb["packets"] >= 40 and not inb["drops"], inb


def test_a_restarted_receiver_refuses_what_it_accepted_before(tmp_path: Path) -> None:
    with tunnel(tmp_path) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 50, through=gw)
            # gwB has taken (nearly) all that gwA sealed: as many as the test asks it to
            # refuse after its restart (it writes its highest number ahead of accepting)
            arrived(gw, 45)
        gw.restart(tb, "gwB")
        sent = replay_esp(tb, pcap)
        b = settle(gw, "gwB")
    inb = sa(b, "inbound", "in")
    # what gwA sealed for gwB (the capture also holds gwB's answers to gwA: the server's
    # ICMP port unreachables, replayed at gwA itself)
    to_gwb = len(_esp_numbers(pcap, "192.0.2.1"))
    assert sent >= to_gwb >= 50
    assert inb["packets"] == 0, "a replayed packet was accepted after the restart"
    refused = inb["drops"].get("replay", 0) + inb["drops"].get("replay_too_old", 0)
    assert refused >= 0.9 * to_gwb


def test_an_sa_past_its_hard_lifetime_stays_expired_across_reload_and_restart(
    tmp_path: Path,
) -> None:
    hard_limit = sa_key({"gwA": ("out", "hard_packets = 100")})
    with tunnel(tmp_path, edit=hard_limit) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 150, through=gw)
            hup(gw, "gwA")
            blast(tb, 50, through=gw)
            after_reload = settle(gw, "gwA")
            gw.restart(tb, "gwA")
            blast(tb, 50, through=gw)
            after_restart = settle(gw, "gwA")
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert sa(after_reload, "outbound", "out")["state"] == "expired"
    assert sa(after_restart, "outbound", "out")["state"] == "expired"
    assert "stays expired" in log
    seen = _esp_numbers(pcap, "192.0.2.1")
    assert len(seen) == 100 and len(set(seen)) == 100  # 100 sent, then nothing at all


# Each a config rule: (what to change in gwA's good config, the key the error names).
BAD = [
    (("spi = 4097", "spi = 4097\nreplay_window = 100"), "replay_window"),
    (("spi = 4097", "spi = 5"), "spi"),
    (('encryption = "aes128gcm16"', 'encryption = "aes999"'), "encryption"),
    (('encryption = "aes128gcm16"', 'encryption = "3des"'), "legacy"),
    (('mode = "tunnel"', 'mode = "sideways"'), "mode"),
    (('tun = "ipsec0"', 'tun = "this-name-is-too-long"'), "tun"),
    (("[gateway]\n", "[gateway]\nno_such_key = 1\n"), "no_such_key"),
]


def _with(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_every_config_rule_is_refused_alike_by_check_start_and_reload(tmp_path: Path) -> None:
    binary = str(gateway_binary())
    with tunnel(tmp_path) as (tb, gw):
        conf = gw.configs["gwA"]
        good = conf.read_text()
        for (old, new), key in BAD:
            bad = tmp_path / "bad.toml"
            bad.write_text(_with(good, old, new))
            check = subprocess.run([binary, "--config", str(bad), "--check"],
                                   capture_output=True, text=True, timeout=10)  # fmt: skip
            assert check.returncode == 2 and key in check.stderr, (key, check.stderr)
            start = subprocess.run(["ip", "netns", "exec", tb.ns("gwA"), binary,
                                    "--config", str(bad)],
                                   capture_output=True, text=True, timeout=10)  # fmt: skip
            assert start.returncode == 2 and key in start.stderr, (key, start.stderr)
            assert "panicked" not in check.stderr + start.stderr
            # reload: refused, and the running config still carries traffic
            conf.write_text(_with(good, old, new))
            before, after = hup(gw, "gwA")
            assert after["reloads_refused"] == before["reloads_refused"] + 1, key
            assert gw.process("gwA").poll() is None, f"{key}: the gateway died on reload"
        conf.write_text(good)
        assert tcp(tb, seconds=1)["mbps"] > 10


def test_a_reload_that_changes_an_sa_but_keeps_its_keys_is_refused(tmp_path: Path) -> None:
    with tunnel(tmp_path) as (tb, gw):
        conf = gw.configs["gwA"]
        good = conf.read_text()
        conf.write_text(_with(good, 'name = "out"\ndirection = "out"\nspi = 4097',
                              'name = "out"\ndirection = "out"\nspi = 4098'))  # fmt: skip
        _, st = hup(gw, "gwA")
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
    assert st["reloads_refused"] == 1 and st["reloads"] == 0
    assert "keeps a key of sa" in log


def _rules(tb: object, node: str) -> list[str]:
    out = tb.run(node, ["ip", "rule", "show"])  # type: ignore[attr-defined]
    return [ln for ln in out.splitlines() if "lookup 220" in ln]


def test_a_killed_gateway_starts_again_and_leaves_one_rule(tmp_path: Path) -> None:
    with tunnel(tmp_path) as (tb, gw):
        assert len(_rules(tb, "gwA")) == 1
        gw.restart(tb, "gwA", signal.SIGKILL)  # no cleanup: its rule stays behind
        assert len(_rules(tb, "gwA")) == 1  # replaced, not doubled
        assert tcp(tb, seconds=1)["mbps"] > 10
        conf = gw.configs["gwA"]
        tb.stop(gw.process("gwA"))  # the gateway's own clean stop (SIGTERM), not the lab's
        # a clean stop leaves the guard (the rule to the blackholes): fail closed
        assert len(_rules(tb, "gwA")) == 1
        p = tb.run("gwA", [str(gateway_binary()), "--config", str(conf), "--release"])
        assert _rules(tb, "gwA") == [], p
        assert "ipsec_gw_220" not in tb.run("gwA", ["nft", "list", "tables"])


def _many_routes(key: str, text: str) -> str:
    """gwA routes 3,000 more prefixes into its TUN device (10.64.0.0/24 onwards)."""
    if key != "gwA":
        return text
    more = ", ".join(f'"10.{64 + i // 256}.{i % 256}.0/24"' for i in range(3000))
    return text.replace("routes = [", f"routes = [{more}, ", 1)


def _blackholes(tb: object) -> int:
    out = tb.run("gwA", ["ip", "route", "show", "table", "220", "type", "blackhole"])  # type: ignore[attr-defined]
    return len(out.splitlines())


def test_release_takes_thousands_of_blackholes_away_and_a_second_release_ends(
    tmp_path: Path,
) -> None:
    """`--release` of a gateway with 3,001 routes: every blackhole goes, in one batch;
    run again (nothing left to remove), each failing removal's line from `ip` filled
    its output pipe while the gateway still wrote the batch — both waited for ever
    before the gateway read the output while it wrote."""
    with tunnel(tmp_path, edit=_many_routes) as (tb, gw):
        conf = gw.configs["gwA"]
        tb.stop(gw.process("gwA"))  # a clean stop leaves the guard
        assert _blackholes(tb) == 3001
        release = ["ip", "netns", "exec", tb.ns("gwA"), str(gateway_binary()), "--config",
                   str(conf), "--release"]  # fmt: skip
        first = subprocess.run(release, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        assert _blackholes(tb) == 0 and _rules(tb, "gwA") == []
        again = subprocess.run(release, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0, again.stderr


def _table(tb: object) -> str:
    return tb.run("gwA", ["ip", "route", "show", "table", "220"])  # type: ignore[attr-defined,no-any-return]


def test_a_reload_takes_away_the_route_and_blackhole_of_a_prefix_it_no_longer_routes(
    tmp_path: Path,
) -> None:
    """A reload whose config no longer routed a prefix left its route into the TUN
    device and its blackhole behind, until the host rebooted (`--release` knows only the
    config's routes). Now both go; the routes kept stay, and carry traffic — also one the
    new config writes with host bits set (10.64.0.9/24 is the network 10.64.0.0/24: compared
    as written, it was "removed" and its route deleted under the new config)."""
    extra = '"10.64.0.0/24", "10.65.0.0/24", '

    def more(key: str, text: str) -> str:
        return text.replace("routes = [", "routes = [" + extra, 1) if key == "gwA" else text

    with tunnel(tmp_path, edit=more) as (tb, gw):
        before = _table(tb)
        conf = gw.configs["gwA"]
        text = conf.read_text().replace('"10.65.0.0/24", ', "", 1)
        conf.write_text(text.replace('"10.64.0.0/24"', '"10.64.0.9/24"', 1))
        _, st = hup(gw, "gwA")
        after = _table(tb)
        mbps = tcp(tb, seconds=1)["mbps"]
    assert st["reloads"] == 1 and st["reloads_refused"] == 0, st
    for prefix in ("10.64.0.0/24", "10.65.0.0/24", "10.2.0.0/24"):
        assert f"{prefix} dev ipsec0" in before and f"blackhole {prefix}" in before, before
    assert "10.65.0.0" not in after, after
    for prefix in ("10.64.0.0/24", "10.2.0.0/24"):
        assert f"{prefix} dev ipsec0" in after and f"blackhole {prefix}" in after, after
    assert mbps > 10


def test_the_tun_device_deleted_under_traffic_brings_the_gateway_down(tmp_path: Path) -> None:
    with tunnel(tmp_path) as (tb, gw):
        p = gw.process("gwA")
        tb.run("gwA", ["ip", "link", "del", "ipsec0"])
        try:
            blast(tb, 50)
        except Exception:
            pass
        rc = p.wait(10)
        log = (tb.rundir / "ipsec-gw-gwA.log").read_text()
        rules = _rules(tb, "gwA")
    assert rc == 1, log  # non-zero: a supervisor sees it
    assert "a worker stopped" in log and "worker failed" in log
    assert len(rules) == 1  # the guard stays: the protected subnet is closed, not open


def test_the_stats_socket_never_replaces_a_file(tmp_path: Path) -> None:
    binary = str(gateway_binary())
    with tunnel(tmp_path) as (tb, gw):
        sock = gw.sockets["gwA"]
        assert (os.stat(sock).st_mode & 0o777) == 0o600
        precious = tmp_path / "precious.toml"
        precious.write_text("do not delete me\n")
        conf = gw.configs["gwA"]
        other = tmp_path / "other.toml"
        text = conf.read_text().replace(f'stats = "{sock}"', f'stats = "{precious}"', 1)
        text = text.replace('tun = "ipsec0"', 'tun = "ipsec9"', 1)
        text = text.replace("table = 220", "table = 229", 1)
        other.write_text(text)
        p = subprocess.run(["ip", "netns", "exec", tb.ns("gwA"), binary, "--config", str(other),
                            "--init-state"],
                           capture_output=True, text=True, timeout=10)  # fmt: skip
    assert p.returncode == 1 and "not a socket" in p.stderr, p.stderr
    assert precious.read_text() == "do not delete me\n"


def one_sa_config(tmp_path: Path, direction: str, encryption: str, key_bytes: int) -> Path:
    """A gateway config with one SA of `direction`, its key in `k.hex` beside it, and the
    policy that uses it."""
    (tmp_path / "k.hex").write_text("00" * key_bytes)
    ours, theirs = ("10.1.0.0/24", "10.2.0.0/24")
    src, dst = (ours, theirs) if direction == "out" else (theirs, ours)
    conf = tmp_path / "gw.toml"
    conf.write_text(
        '[gateway]\ntun = "ipsec0"\nlocal = "192.0.2.1"\nremote = "192.0.2.2"\n'
        f'routes = ["{theirs}"]\n[[sa]]\nname = "{direction}"\ndirection = "{direction}"\n'
        f'spi = 4097\nencryption = "{encryption}"\nenc_key = "@k.hex"\n[[policy]]\n'
        f'direction = "{direction}"\nsrc = "{src}"\ndst = "{dst}"\naction = "protect"\n'
        f'sa = "{direction}"\n'
    )
    return conf


def test_encryption_without_integrity_is_warned_about(tmp_path: Path) -> None:
    binary = str(gateway_binary())
    conf = one_sa_config(tmp_path, "in", "aes128", 16)
    p = subprocess.run([binary, "--config", str(conf), "--check"], capture_output=True,
                       text=True, timeout=10)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "no anti-replay window" in p.stderr and "RFC 4303" in p.stderr


def test_a_hard_lifetime_on_any_sa_of_a_bundle_stops_the_bundle(tmp_path: Path) -> None:
    """The limit is on the bundle's inner ESP SA (not the outermost AH): outbound on gwA,
    inbound on gwB. Before, a sealed bundle never checked its SAs' lifetimes and an
    opened one only the outermost SA's."""

    limits = sa_key({"gwA": ("esp-out", "hard_packets = 100"),
                     "gwB": ("esp-in", "hard_packets = 60")})  # fmt: skip
    with tunnel(tmp_path, "ah:sha1+esp:aes128", edit=limits) as (tb, gw):
        with capture(tb, "gwA", "wan", "wan") as pcap:
            blast(tb, 150, through=gw)
            a, b = settle(gw, "gwA"), settle(gw, "gwB")
            # issue 29: a SIGHUP after a bundle member expired made the rebuild fail and
            # the gateway exit (and a restart was refused): now both keep the bundle
            # closed, and the gateway running
            reloaded, restarted = hup_then_restart(tb, gw, "gwA", 20)
    assert sa(a, "outbound", "esp-out")["state"] == "expired"
    assert sa(a, "outbound", "esp-out")["packets"] == 100
    assert reloaded["reloads"] == 1
    for st in (reloaded, restarted):
        assert sa(st, "outbound", "esp-out")["state"] == "expired"
        assert st["outbound"]["drops"].get("no_sa", 0) >= 20, st["outbound"]["drops"]
    from scapy.all import IP, rdpcap

    sent = [p for p in rdpcap(str(pcap)) if IP in p and p[IP].src == "192.0.2.1"]
    assert len(sent) == 100 and {p[IP].proto for p in sent} == {51}  # then nothing
    assert sa(b, "inbound", "esp-in")["state"] == "expired"
    assert sa(b, "inbound", "esp-in")["packets"] == 60


def test_the_gateway_runs_unprivileged_with_net_admin_and_net_raw_only(tmp_path: Path) -> None:
    """Not uid 0, no supplementary groups, CAP_NET_ADMIN and CAP_NET_RAW only (bounding
    set included; CAP_NET_ADMIN ambient for the `ip` and `nft` a reload runs),
    SECBIT_NOROOT locked — and it still carries traffic, reloads (reading its config
    and the other direction's state through what it opened as root) and stops cleanly,
    removing its stats socket."""
    import pwd

    gw_uid = pwd.getpwnam("ipsec-gw").pw_uid
    with tunnel(tmp_path) as (tb, gw):
        assert tcp(tb, seconds=1)["mbps"] > 10  # it works with what it kept
        pid = gw.process("gwA").pid
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        status = {t.name: (t / "status").read_text() for t in tasks}
        _, st = hup(gw, "gwA")
        assert st["reloads"] == 1 and gw.process("gwA").poll() is None
        assert tcp(tb, seconds=1)["mbps"] > 10
        sock = gw.sockets["gwA"]
        gw.stop(tb)
        assert not sock.exists()  # removed by its own, unprivileged, gateway
    assert len(status) >= 3  # main, the workers, stats: every thread
    want = 1 << 12 | 1 << 13  # CAP_NET_ADMIN, CAP_NET_RAW
    for tid, text in status.items():
        fields = dict(ln.split(":\t", 1) for ln in text.splitlines() if ":\t" in ln)
        assert [int(x) for x in fields["Uid"].split()] == [gw_uid] * 4, (tid, fields["Uid"])
        assert fields["Groups"].strip() == "", fields["Groups"]
        assert int(fields["CapEff"], 16) == want, (tid, fields["CapEff"])
        assert int(fields["CapPrm"], 16) == want, (tid, fields["CapPrm"])
        assert int(fields["CapBnd"], 16) == want, (tid, fields["CapBnd"])
        assert int(fields["CapInh"], 16) == 1 << 12
        assert int(fields["CapAmb"], 16) == 1 << 12
        assert fields["NoNewPrivs"].strip() == "1"


def test_a_key_file_others_can_read_is_warned_about(tmp_path: Path) -> None:
    binary = str(gateway_binary())
    conf = one_sa_config(tmp_path, "out", "aes128gcm16", 20)
    key = tmp_path / "k.hex"
    for mode, warned in ((0o644, True), (0o600, False)):
        key.chmod(mode)
        p = subprocess.run([binary, "--config", str(conf), "--check"], capture_output=True,
                           text=True, timeout=10)  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert ("may be read by others" in p.stderr) == warned, p.stderr
        assert "00" * 20 not in p.stderr  # the key itself never
