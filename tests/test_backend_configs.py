"""What the backends write before a packet moves: strongSwan's proposals and what
libipsec cannot do, ours-udp's configuration, swanctl.conf of the clients topology."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipsec_lab import scenario
from ipsec_lab.backends import Unsupported
from ipsec_lab.backends.charon_files import swanctl_conf
from ipsec_lab.backends.strongswan import esp_proposal
from ipsec_lab.testbed import topology


def test_strongswan_proposals_and_what_libipsec_cannot_do() -> None:
    assert esp_proposal("esp:aes128gcm16") == "aes128gcm16"
    assert esp_proposal("esp:aes256-sha256") == "aes256-sha256"
    assert esp_proposal("esp:null-sha1") == "null-sha1"
    assert esp_proposal("esp:3des-md5") == "3des-md5"
    for cfg, why in [
        ("ah:sha1", "no AH"),
        ("ah:sha1+esp:aes128", "no AH"),
        ("ipcomp+esp:aes128-sha1", "IPComp"),
        ("esp:aes128", "without integrity"),
        ("esp:aes128gmac", "GMAC"),
        ("none", "backend `none`"),
    ]:
        with pytest.raises(Unsupported, match=why):
            esp_proposal(cfg)


def test_ours_udp_is_ipsec_gw_with_esp_in_udp_and_refuses_ah() -> None:
    from ipsec_lab import backends
    from ipsec_lab.backends.ours import Ours

    b = backends.make("ours-udp")
    assert isinstance(b, Ours) and b.name == "ours-udp" and b.udp_encap
    assert backends.make("ours").name == "ours"
    for cfg in ("ah:sha1", "ah:sha1+esp:aes128"):
        with pytest.raises(Unsupported, match="UDP encapsulation"):
            b.check(cfg)
    scenario.parse('backends = ["none", "ours-udp"]\n', "s.toml")  # a known backend


def test_swanctl_conf_of_the_clients_server_has_both_tunnels() -> None:
    topo = topology("clients")
    text = swanctl_conf("server", list(topo.tunnels), "aes128gcm16", "ab" * 32)
    assert text.count("esp_proposals = aes128gcm16") == 2
    assert "local_ts = 192.0.2.1/32" in text and "remote_ts = 192.0.2.2/32" in text
    assert "local_ts = 198.51.100.1/32" in text and "remote_ts = 198.51.100.2/32" in text
    assert text.count("secret = 0x" + "ab" * 32) == 2


@pytest.mark.parametrize("answer", ["not json", "silent", "too long"])
def test_a_stats_socket_that_answers_wrongly_is_an_error_naming_it(
    tmp_path: Path, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lab asks a gateway's stats socket itself (`ours.stats`): an answer that is not
    JSON, none within the bound (a peer that keeps the connection open), or one over the
    size bound is a LabError naming the socket — never a hang or a parse of part of it."""
    import socket
    import threading

    from ipsec_lab.backends import ours
    from ipsec_lab.testbed.build import LabError

    monkeypatch.setattr(ours, "STATS_MAX_BYTES", 4096)
    path = tmp_path / "gw.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    release = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            assert conn.recv(64) == b"json\n"
            if answer == "not json":
                conn.sendall(b"{ not json")
            elif answer == "too long":
                conn.sendall(b"[" + b"0," * 4096 + b"0]")
            if answer == "silent":
                release.wait(10)  # holds the connection open past the bound

    t = threading.Thread(target=serve)
    t.start()
    want = {"not json": "not its JSON", "silent": r"no whole answer within 0\.5 s",
            "too long": "an answer over 0 MiB"}[answer]  # fmt: skip
    try:
        with pytest.raises(LabError, match=rf"ipsec-gw stats: {path}: .*{want}"):
            ours.stats(path, timeout=0.5)
    finally:
        release.set()
        t.join()
        listener.close()


def test_ipsec_and_wireguard_backends_each_refuse_the_others_configuration() -> None:
    """Every backend that runs IPsec refuses `wireguard` naming WireGuard's backend, and
    every WireGuard backend refuses each IPsec configuration and none — over the whole
    registry, so a backend added later is held to it too."""
    from ipsec_lab import backends
    from ipsec_lab.backends.base import ipsec_configuration
    from ipsec_lab.backends.wireguard import _WireGuard

    ipsec = ["esp:aes128gcm16", "esp:chacha20poly1305", "ah:sha1+esp:aes128-sha1",
             "ipcomp+esp:aes128-sha1"]  # fmt: skip
    checked = set()
    for e in backends.REGISTRY:
        if e.name in ("none", "external"):  # the baseline; a DUT the lab does not configure
            continue
        b = backends.make(e.name)
        if isinstance(b, _WireGuard):
            for cfg in [*ipsec, "none"]:
                with pytest.raises(Unsupported, match=f"{e.name} runs WireGuard's one suite"):
                    b.check(cfg)
        else:
            said = "WireGuard's configuration \\(backends wireguard, wireguard-go, boringtun\\)"
            with pytest.raises(Unsupported, match=f"^{e.name} runs IPsec; `wireguard` is {said}"):
                b.check("wireguard")
        checked.add(e.name)
    assert {"ours", "ours-udp", "xfrm", "strongswan-libipsec", "wireguard",
            "wireguard-go", "boringtun"} <= checked  # fmt: skip
    with pytest.raises(Unsupported, match="use backend `none`"):
        ipsec_configuration("none", "x")


def test_wireguards_overhead_and_wireguard_gos_version_says_it_is_debians() -> None:
    """(The key pairs, made on each node, are checked against another X25519 where they
    are made: tests/wgcheck.py.)"""
    from ipsec_lab.backends.userspace_wireguard import DEBIAN_NOTE, versioned
    from ipsec_lab.model.transforms import Layout, wireguard_overhead

    def overhead(outer: int) -> int:
        return wireguard_overhead(Layout(outer=outer))

    assert overhead(4) == 60 and overhead(6) == 80  # wg-quick's 1420 on 1500: IPv6's 80
    # a release from before upstream's 2023 batching says so beside its figures; a later
    # one does not
    assert versioned("wireguard-go v0.0.20220316") == f"wireguard-go v0.0.20220316 ({DEBIAN_NOTE})"
    assert versioned("wireguard-go v0.0.20230223") == "wireguard-go v0.0.20230223"
    assert versioned("") == "wireguard-go (unknown version)"
    from ipsec_lab.backends.wireguard import versions

    # what the gateways said: once where they agree, each node's where they do not
    assert versions({"gwA": "Linux 6.1", "gwB": "Linux 6.1"}) == "Linux 6.1"
    assert versions({"gwA": "Linux 6.1", "gwB": "Linux 6.12"}) == "gwA: Linux 6.1; gwB: Linux 6.12"
    assert versions({}) == ""


def test_the_kernels_wireguard_says_why_it_cannot_run_on_a_kernel_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where `ip link add … type wireguard` is refused (this project's development kernel),
    the kernel's WireGuard is refused with the kernel's answer and where it does run (the
    micro-VM); where the kernel makes the device, only the configuration decides."""
    import platform
    import shutil

    from ipsec_lab import backends
    from ipsec_lab.backends import wireguard

    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    said = "Error: Unknown device type."
    monkeypatch.setattr(wireguard, "kernel_has_wireguard", lambda: (False, said))
    b = backends.make("wireguard")
    with pytest.raises(Unsupported) as e:
        b.check("wireguard")
    assert str(e.value) == (
        f"this kernel ({platform.release()}) makes no WireGuard devices ({said}): run it in "
        "the micro-VM (--vm), whose Debian kernel has the wireguard module, or on a kernel "
        "that has it"
    )
    monkeypatch.setattr(wireguard, "kernel_has_wireguard", lambda: (True, ""))
    b.check("wireguard")
    with pytest.raises(Unsupported, match="runs WireGuard's one suite"):
        b.check("esp:chacha20poly1305")
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    with pytest.raises(Unsupported, match=r"no wg here \(Debian package wireguard-tools"):
        b.check("wireguard")


def test_the_makefile_installs_the_boringtun_the_lab_names() -> None:
    """`make deps` installs boringtun-cli at the version backends/userspace_wireguard.py names (and
    `hosts check` tells a host to install): one figure in two files, held equal here."""
    import re

    from ipsec_lab.backends.userspace_wireguard import BORINGTUN_VERSION

    make = (Path(__file__).parent.parent / "Makefile").read_text()
    m = re.search(r"^BORINGTUN_VERSION := (\S+)$", make, re.M)
    assert m and m.group(1) == BORINGTUN_VERSION, m
    assert "--version $(BORINGTUN_VERSION)" in make


def test_the_lab_records_the_tun_queue_the_gateway_defaults_to() -> None:
    """Each ours row says its TUN devices' queue (`tun_queue`): the lab's TUN_QUEUE is the
    gateway's default (`None => TunQueue::Fixed(LONG_TUN_QUEUE)`), held equal here, and
    the metric's text says auto's two lengths as the gateway has them."""
    import re

    from ipsec_lab import metrics
    from ipsec_lab.backends.ours import TUN_QUEUE, Ours

    rs = (Path(__file__).parent.parent / "crates/ipsec-gw/src/config/gateway.rs").read_text()
    assert "None => TunQueue::Fixed(LONG_TUN_QUEUE)," in rs
    long_, short = (re.search(rf"^pub const {n}_TUN_QUEUE: u32 = (\d+);$", rs, re.M)
                    for n in ("LONG", "SHORT"))  # fmt: skip
    assert long_ and short and int(long_.group(1)) == TUN_QUEUE
    doc = metrics.BY_KEY["tun_queue"].doc
    assert f"{short.group(1)} packets" in doc and f"else {long_.group(1)}" in doc, doc
    assert Ours().tun_queue == TUN_QUEUE


def test_a_wireguard_peer_is_shaken_by_a_handshake_time_or_by_data_its_session_carried() -> None:
    """`wg show all latest-handshakes` (seconds since the epoch; boringtun's: since the
    handshake, so 0 for its first second) and `wg show all transfer` (rx, tx bytes: with
    boringtun only what a session sealed or opened): a peer counts once any number is not
    0, and a line of neither shape never counts. boringtun's start waited a second for its
    time to read 1 (setup_s 1.22 s against wireguard-go's 0.19; with the bytes, 0.22)."""
    from ipsec_lab.backends.userspace_wireguard import Boringtun, WireguardGo
    from ipsec_lab.backends.wireguard import Wireguard, shaken_peers

    handshakes = "wg0\tAAA=\t1796300000\nwg0\tBBB=\t0\nwg1\tCCC=\t1796300001\n"
    assert shaken_peers(handshakes) == {("wg0", "AAA="), ("wg1", "CCC=")}
    transfer = "wg0\tAAA=\t0\t0\nwg0\tBBB=\t84\t0\nwg1\tCCC=\t0\t84\nwg1\tDDD=\t0\t0\n"
    assert shaken_peers(transfer) == {("wg0", "BBB="), ("wg1", "CCC=")}
    assert shaken_peers("") == set()
    assert shaken_peers("wg0\tAAA=\n") == set()  # no number
    assert shaken_peers("wg0\tAAA=\t(none)\t5\n") == set()  # not a number
    assert shaken_peers("wg0\tAAA=\t1\t2\t3\n") == set()  # another command's shape
    # only boringtun's UAPI reports the time since: the others keep the handshake's time
    assert Boringtun.handshake_since
    assert not WireguardGo.handshake_since and not Wireguard.handshake_since
