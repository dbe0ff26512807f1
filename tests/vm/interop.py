"""Ours against the Linux kernel's IPsec (xfrm), run INSIDE the micro-VM by
tests/test_vm_root.py (this file is not collected on the host, whose kernel has no ESP):
gwA runs ipsec-gw, gwB the kernel's xfrm with the same fresh keys; a file each way must
arrive with an equal SHA-256, the outer link must carry only ESP/AH (IPComp rides inside
ESP) and never the planted bytes, and ours must count every packet through its SAs with
no drop."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ipsec_lab.backends import xfrm
from ipsec_lab.backends.ours import fresh_keys, gateway_binary, gateway_config, layers, stats
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed, wait_for_path

sys.path.insert(0, str(Path(__file__).parents[1]))
from netutil import transfer

MARKER = b"IPSEC-LAB-PLANTED-MARKER-0123456789-"
CLIENT, SERVER = ("client", "10.1.0.2"), ("server", "10.2.0.2")


@contextmanager
def ours_and_xfrm(tmp: Path, configuration: str) -> Iterator[tuple[Testbed, Path]]:
    """The line topology with ipsec-gw on gwA and the kernel's xfrm on gwB, sharing one
    set of fresh keys; yields the testbed and gwA's stats socket."""
    binary = gateway_binary()
    assert binary is not None, "ipsec-gw is not built"
    with Testbed(topology("line"), tmp / "run") as tb:
        t = tb.topo.tunnels[0]
        ls = layers(configuration)
        keys = fresh_keys(ls)
        sock = tb.sockets / "gw-gwA.sock"
        conf = tb.rundir / "gwA.toml"
        conf.write_text(gateway_config("gwA", t, ls, keys, sock))
        conf.chmod(0o600)
        batch = tb.rundir / "gwB.ip"
        batch.touch(mode=0o600)
        batch.write_text("\n".join(xfrm.commands("gwB", t, ls, xfrm.Keys(keys), True)) + "\n")
        tb.run("gwB", ["ip", "-batch", str(batch)])
        p = tb.spawn("gwA", [str(binary), "--config", str(conf)], "ipsec-gw-gwA")
        try:
            assert wait_for_path(sock, p, 10), (tb.rundir / "ipsec-gw-gwA.log").read_text()
            yield tb, sock
        finally:
            tb.stop(p)
            tb.run("gwB", ["ip", "xfrm", "policy", "flush"], check=False)
            tb.run("gwB", ["ip", "xfrm", "state", "flush"], check=False)


@contextmanager
def capture(tb: Testbed, node: str, iface: str) -> Iterator[Path]:
    pcap = tb.rundir / f"{node}-{iface}.pcap"
    p = tb.spawn(node, ["tcpdump", "-i", iface, "-U", "-n", "-w", str(pcap), "ip"], "tcpdump")
    log = tb.rundir / "tcpdump.log"
    deadline = time.monotonic() + 20
    while b"listening on" not in (log.read_bytes() if log.exists() else b""):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    try:
        yield pcap
    finally:
        time.sleep(0.3)
        tb.stop(p)


def counters(sock: Path) -> dict[str, Any]:
    time.sleep(0.3)  # the workers publish every 100 ms
    return stats(sock)


@pytest.mark.parametrize(
    "configuration",
    [
        "esp:aes128gcm16",
        "esp:aes256gcm16",
        "esp:chacha20poly1305",
        "esp:aes128-sha1",
        "esp:aes256-sha256",
        "esp:null-sha1",
        "ah:sha1",
        "ah:sha256",
        "ah:sha512",
        "ah:sha1+esp:aes128",
        "ipcomp+esp:aes128-sha1",
    ],
)
def test_ours_and_the_kernel_interoperate(tmp_path: Path, configuration: str) -> None:
    line = len(MARKER) + 9
    data = tmp_path / "planted.bin"
    data.write_bytes(b"".join(MARKER + b"%08d\n" % i for i in range(256 * 1024 // line)))
    with ours_and_xfrm(tmp_path, configuration) as (tb, sock):
        with capture(tb, "gwA", "wan") as pcap:
            transfer(tb, CLIENT, SERVER, data)  # ours seals, the kernel opens
            transfer(tb, SERVER, CLIENT, data)  # the kernel seals, ours opens
        st = counters(sock)
    from scapy.all import IP, rdpcap

    pkts = [p for p in rdpcap(str(pcap)) if IP in p]
    outer = {51} if configuration.startswith("ah:") else {50}
    assert {p[IP].proto for p in pkts} == outer, configuration
    raw = b"".join(bytes(p) for p in pkts)
    esp = layers(configuration).esp
    if esp is None or esp.encryption == "null":
        # integrity only: the bytes go in clear, inside ESP/AH (the capture sees them)
        assert MARKER[:16] in raw, "the capture shows the bytes integrity-only SAs carry"
    else:
        assert MARKER[:16] not in raw, "planted bytes on the outer link"
    for direction in ("outbound", "inbound"):
        for sa in st[direction]["sas"]:
            assert sa["packets"] > 50 and sa["drops"] == {}, (direction, sa)
    if configuration.startswith("ipcomp"):
        (out,) = st["outbound"]["ipcomp"]
        (inb,) = st["inbound"]["ipcomp"]
        assert out["compressed"] > 10 and out["bytes_out"] < out["bytes_in"]
        assert inb["decompressed"] > 10, "the kernel's IPComp reached ours"
