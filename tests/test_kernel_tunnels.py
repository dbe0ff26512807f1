"""The kernel's IPsec's N tunnels (issue 44): strongSwan's swanctl configurations for
both ends, the charon log reader that times the set-up, the scenario key and the
refusals; xfrm's `ip -batch` lines for N tunnels. The VM runs both for real
(tests/vm/tunnels.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipsec_lab import backends
from ipsec_lab.backends import xfrm
from ipsec_lab.backends.base import Unsupported
from ipsec_lab.backends.charon_files import LogCount, swanctl_conf
from ipsec_lab.backends.sa_plan import SPI, layers
from ipsec_lab.backends.strongswan import StrongSwan
from ipsec_lab.preflight import forecast
from ipsec_lab.scenario import ScenarioError, parse
from ipsec_lab.testbed import topology, tunnels

FIXTURES = Path(__file__).parent / "fixtures"


def _conns(text: str) -> list[dict[str, object]]:
    """Each connection of a swanctl.conf the lab wrote: its ids and its children's TS."""
    body = text.split("\nsecrets {", 1)[0]
    out = []
    for block in re.split(r"\n  t\d+ \{\n", body)[1:]:
        ids = re.findall(r"      id = (\S+)", block)
        kids = re.findall(r"local_ts = (\S+)\n\s+remote_ts = (\S+)", block)
        out.append({"local": ids[0], "remote": ids[1], "children": kids,
                    "starts": block.count("start_action = start")})  # fmt: skip
    return out


@pytest.mark.parametrize("n", [2, 16, 300])
def test_n_children_under_one_ike_sa_mirror_each_other_and_the_selectors(n: int) -> None:
    t = topology("line").tunnels[0]
    a = _conns(swanctl_conf("gwA", [t], "aes128gcm16", "ab", many=n, initiates=True))
    b = _conns(swanctl_conf("gwB", [t], "aes128gcm16", "ab", many=n))
    assert len(a) == len(b) == 1
    want = tunnels.selectors(t, n)
    assert a[0]["children"] == want
    assert b[0]["children"] == [(r, loc) for loc, r in want]
    assert (a[0]["local"], a[0]["remote"]) == (t.left_outer, t.right_outer)
    assert (b[0]["local"], b[0]["remote"]) == (t.right_outer, t.left_outer)
    assert a[0]["starts"] == n and b[0]["starts"] == 0  # the initiator's children start


@pytest.mark.parametrize("n", [2, 64])
def test_an_ike_sa_per_tunnel_has_identities_of_its_own_on_both_ends(n: int) -> None:
    t = topology("line").tunnels[0]
    gwa = swanctl_conf("gwA", [t], "aes128gcm16", "ab", many=n, ike_sas="per-tunnel")
    gwb = swanctl_conf("gwB", [t], "aes128gcm16", "ab", many=n, ike_sas="per-tunnel")
    a, b = _conns(gwa), _conns(gwb)
    assert len(a) == len(b) == n
    want = tunnels.selectors(t, n)
    for j in range(n):
        assert a[j]["children"] == [want[j]] and b[j]["children"] == [want[j][::-1]]
        assert (a[j]["local"], a[j]["remote"]) == (b[j]["remote"], b[j]["local"])
    assert len({c["local"] for c in a}) == n  # the responder tells them apart by these
    # each connection's PSK entry names the same pair of identities
    pairs = re.findall(r"id-1 = (\S+)\n\s+id-2 = (\S+)", gwa)
    assert pairs == [(c["local"], c["remote"]) for c in a]
    # every child numbered once across the file (the lab's names c0..c{n-1})
    assert sorted(int(x) for x in re.findall(r"\n      c(\d+) \{", gwa)) == list(range(n))


def test_the_log_reader_counts_charons_own_lines_across_partial_reads(tmp_path: Path) -> None:
    """Real charon lines (tests/fixtures/charon-children.log: one CHILD_SA established,
    two refused by the peer), written to the log in pieces cut mid-line, plus charon's
    retransmit and give-up lines (task_manager_v2.c's formats)."""
    real = (FIXTURES / "charon-children.log").read_bytes()
    extra = (b"1796216754 12[IKE] retransmit 1 of request with message ID 2\n"
             b"1796216754 12[IKE] retransmit 2 of request with message ID 2\n"
             b"1796216754 12[IKE] giving up after 3 retransmits\n")  # fmt: skip
    text = real + extra
    log = tmp_path / "charon.log"
    log.write_bytes(b"")
    c = LogCount(log)
    for cut in range(0, len(text), 97):  # 97: never on a line's end by design
        with open(log, "ab") as f:
            f.write(text[cut : cut + 97])
        c.read()
    assert (c.established, c.failed, c.retransmits) == (1, 3, 2)
    LogCount(tmp_path / "absent.log").read()  # no log yet: nothing, no error


def test_ike_sas_is_a_checked_scenario_key() -> None:
    assert parse("", "a.toml").gateway.ike_sas == "one"
    assert parse('[gateway]\nike_sas = "per-tunnel"', "a.toml").gateway.ike_sas == "per-tunnel"
    want = r"a.toml: gateway\.ike_sas: .*'one', 'per-tunnel'.*'each'"
    with pytest.raises(ScenarioError, match=want):
        parse('[gateway]\nike_sas = "each"', "a.toml")
    with pytest.raises(ValueError, match="ike_sas must be one of"):
        StrongSwan("kernel", ike_sas="each")


def test_checks_start_estimate_prices_an_ike_sa_per_tunnel_above_children_of_one() -> None:
    """`check`'s start per tunnel: an IKE daemon's IKE_SA each (a DH exchange each) costs
    more than as many CHILD_SAs under one; a backend without IKE ignores the key."""
    sw, gw = backends.BY_NAME["strongswan-kernel"], backends.BY_NAME["ours"]
    assert sw.start_estimate() == sw.start_estimate(1, "per-tunnel") == sw.start_s
    one, each = sw.start_estimate(256, "one"), sw.start_estimate(256, "per-tunnel")
    assert sw.start_s < one < each
    assert gw.start_estimate(256, "per-tunnel") == gw.start_estimate(256, "one") > gw.start_s
    sc = 'backends = ["strongswan-kernel"]\ntunnels = [256]\n[[workloads]]\nkind = "tcp"\n'
    per = parse(sc + '[gateway]\nike_sas = "per-tunnel"\n', "a.toml")
    (g_one,), (g_per,) = forecast(parse(sc, "a.toml"))["groups"], forecast(per)["groups"]
    assert g_per["seconds"] - g_one["seconds"] == pytest.approx(each - one)


def test_kernel_libipsec_refuses_many_tunnels_with_the_reason() -> None:
    """The libipsec entry is not a many-tunnel backend; `strongswan` resolving to it (or
    asked for it) refuses N > 1 at its check, saying why."""
    assert backends.tunnels_refusal("strongswan-libipsec", 16)
    assert backends.tunnels_refusal("strongswan-kernel", 16) is None
    with pytest.raises(Unsupported, match="kernel-libipsec sets up one tunnel"):
        StrongSwan("libipsec", tunnels=16).check("esp:aes128gcm16")
    StrongSwan("libipsec", tunnels=1).check("esp:aes128gcm16")  # one: as before


@pytest.mark.parametrize("udp", [False, True])
def test_xfrm_keys_n_tunnels_each_with_its_own_spis_keys_and_policies(udp: bool) -> None:
    """16 tunnels: each end has 2 SAs and 3 policies (out, in, fwd) a tunnel; SPIs
    SPI + (j << 16) both ways, every key its own and the same at both ends for the same
    SA; the policies' selectors are the tunnels' (testbed/tunnels.py), mirrored."""
    n, t = 16, topology("line").tunnels[0]
    ls = layers("esp:aes128gcm16", "xfrm")
    keys = [xfrm.Keys.fresh(ls) for _ in range(n)]
    lines = {node: xfrm.many_commands(node, t, ls, keys, True, udp_encap=udp)
             for node in ("gwA", "gwB")}  # fmt: skip
    states: dict[str, dict[tuple[str, str, int], str]] = {}
    for node, ls_ in lines.items():
        assert len(ls_) == 5 * n
        st = [ln.split() for ln in ls_ if ln.startswith("xfrm state")]
        states[node] = {(w[4], w[6], int(w[10], 16)): w[w.index("aead") + 2] for w in st}
        assert all(("encap" in w) == udp for w in st)
    assert states["gwA"] == states["gwB"]  # the same SA, the same key, at both ends
    want = {
        (a, b, SPI[("esp", way)] + (j << 16))
        for j in range(n)
        for a, b, way in (("192.0.2.1", "192.0.2.2", "lr"), ("192.0.2.2", "192.0.2.1", "rl"))
    }
    assert set(states["gwA"]) == want
    assert len(set(states["gwA"].values())) == 2 * n  # every SA its own key
    sel = tunnels.selectors(t, n)
    for node, mine in (("gwA", 0), ("gwB", 1)):
        pol = [ln.split() for ln in lines[node] if ln.startswith("xfrm policy")]
        outs = [(w[6], w[8]) for w in pol if w[4] == "out"]
        assert outs == [(p[mine], p[1 - mine]) for p in sel]
        assert sum(w[4] == "fwd" for w in pol) == n
        # each policy's template names its own tunnel's states (reqid j + 1): without
        # it the kernel takes any state of the same addresses for every tunnel
        reqid = [int(w[w.index("reqid") + 1]) for w in pol]
        assert reqid == [j + 1 for j in range(n) for _ in range(3)]
    for w in (ln.split() for ln in lines["gwA"] if ln.startswith("xfrm state")):
        j = (int(w[10], 16) - SPI[("esp", "lr" if w[4] == "192.0.2.1" else "rl")]) >> 16
        assert int(w[w.index("reqid") + 1]) == j + 1, w
    with pytest.raises(Unsupported, match="no bundles"):
        xfrm.many_commands("gwA", t, layers("esp:aes128gcm16+ipcomp", "xfrm"), keys, True)
    assert xfrm.many_commands("gwA", t, ls, keys[:1], True) == xfrm.commands(
        "gwA", t, ls, keys[0], True
    )  # one tunnel: exactly as before
