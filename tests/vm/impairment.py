"""TCP through an impaired link (netem on both gateways' outer ends: 1 % loss, 5 %
reordering, 1 % duplication, 2 ms delay), run INSIDE the micro-VM by tests/test_vm_root.py
(the host's kernel has no netem): through ours, the file arrives whole and ours counts the
duplicated packets as replay drops and drops nothing else (reordering stays inside the
window, RFC 4303 §3.4.3); through the kernel's xfrm, the file arrives whole too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ipsec_lab.backends.ours import Ours, stats
from ipsec_lab.backends.xfrm import Xfrm
from ipsec_lab.testbed import Link, topology
from ipsec_lab.testbed.build import Testbed

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
from interop import CLIENT, SERVER, counters  # noqa: E402

from netutil import transfer  # noqa: E402

IMPAIRED = Link("impaired", delay_ms=2, loss_pct=1, reorder_pct=5, duplicate_pct=1)


def data(tmp: Path) -> Path:
    p = tmp / "file.bin"
    p.write_bytes(b"".join(b"line %08d of the impaired transfer\n" % i for i in range(60_000)))
    return p


def test_ours_through_loss_reordering_and_duplication(tmp_path: Path) -> None:
    f = data(tmp_path)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.shape(IMPAIRED)
        gw = Ours()
        gw.start(tb, "esp:aes128gcm16")
        try:
            transfer(tb, CLIENT, SERVER, f)
            transfer(tb, SERVER, CLIENT, f)
            a, b = counters(gw.sockets["gwA"]), stats(gw.sockets["gwB"])
        finally:
            gw.stop(tb)
    replays = 0
    for st in (a, b):
        (inb,) = st["inbound"]["sas"]
        (out,) = st["outbound"]["sas"]
        assert out["drops"] == {} and out["packets"] > 1000
        assert set(inb["drops"]) <= {"replay"}, inb["drops"]  # nothing but duplicates
        replays += inb["drops"].get("replay", 0)
    assert replays > 0, "netem duplicated packets: ours must have refused them as replays"


@pytest.mark.parametrize("configuration", ["esp:aes128gcm16", "ah:sha256+esp:aes128"])
def test_the_kernels_ipsec_through_the_same_link(tmp_path: Path, configuration: str) -> None:
    f = data(tmp_path)
    with Testbed(topology("line"), tmp_path / "run") as tb:
        tb.shape(IMPAIRED)
        x = Xfrm()
        x.start(tb, configuration)
        try:
            transfer(tb, CLIENT, SERVER, f)
            st = tb.run("gwB", ["ip", "-s", "xfrm", "state"])
        finally:
            x.stop(tb)
    assert "replay-window 32" in st
