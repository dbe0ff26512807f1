"""The tunnel-count axis without root: the many-tunnel testbed's addresses
(testbed/tunnels.py), the scenario's `tunnels` through the plan, `check` and the skips, and
ours' config for N tunnels as the real `ipsec-gw --check` reads it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ipsec_lab import backends, preflight, scenario
from ipsec_lab.backends import Unsupported, ours
from ipsec_lab.backends.sa_plan import fresh_keys
from ipsec_lab.testbed import topology, tunnels
from ipsec_lab.testbed.build import LabError


def test_tunnel_i_protects_the_clients_subnet_and_one_far_address() -> None:
    t = topology("line").tunnels[0]
    assert tunnels.selectors(t, 1) == [("10.1.0.0/24", "10.2.0.0/24")]
    sel = tunnels.selectors(t, 258)
    assert sel[0] == ("10.1.0.0/24", "10.2.0.0/24")
    assert sel[1] == ("10.1.0.0/24", "10.128.0.0/32")
    assert sel[257] == ("10.1.0.0/24", "10.128.1.0/32")
    assert len({r for _, r in sel}) == 258  # each its own pair
    assert tunnels.far_address(65535) == "10.128.255.255"
    for bad in (0, tunnels.MOST_TUNNELS + 1):
        with pytest.raises(ValueError):
            tunnels.selectors(t, bad)
    with pytest.raises(ValueError):
        tunnels.far_address(65536)


def test_a_spread_flow_is_a_flow_of_its_own_sent_to_every_tunnel() -> None:
    base = topology("line").flows[0]
    assert tunnels.spread(base, 1) is base
    f = tunnels.spread(base, 16)
    assert f.name == "client-server over 16 tunnels" and tunnels.base_name(f) == base.name
    assert tunnels.destinations(f) == ["10.2.0.2"] + [f"10.128.0.{i}" for i in range(15)]
    assert tunnels.nft_destinations(base) == "10.2.0.2"
    assert tunnels.nft_destinations(tunnels.spread(base, 2)) == "{ 10.2.0.2, 10.128.0.0 }"
    assert tunnels.nft_destinations(f) == "{ 10.2.0.2, 10.128.0.0-10.128.0.14 }"


SC = """
name = "t"
backends = ["none", "ours", "strongswan-libipsec"]
tunnels = [1, 16, 16]
[[workloads]]
kind = "rfc2544"
sizes = [64]
[[workloads]]
kind = "tcp"
"""


def test_the_plan_runs_each_count_and_skips_what_cannot_spread_or_set_up_many() -> None:
    sc = scenario.parse(SC, "t.toml")
    assert sc.tunnels == (1, 16) and scenario.parse("", "d.toml").tunnels == (1,)
    ps = preflight.plan(sc)
    assert len(ps) == 3 * 2 * 2  # backends x counts x workloads (one flow, repetition)
    flows = {(p.key.backend, p.key.workload, p.key.flow, p.flow.destinations) for p in ps}
    assert ("ours", "rfc2544-64", "client-server over 16 tunnels", 16) in flows
    assert ("ours", "rfc2544-64", "client-server", 1) in flows
    # the runner's and check's skips: tcp goes to one address, libipsec sets up one tunnel
    skip = {p.key: preflight.spread_skip(p) for p in ps}
    assert {k.workload for k, why in skip.items() if why} == {"tcp-1x-5s"}
    assert all("sends to one address" in why for why in skip.values() if why)
    assert backends.tunnels_refusal("strongswan-libipsec", 16)
    assert not backends.tunnels_refusal("strongswan-libipsec", 1)
    # WireGuard's N is a device per site on gwB: bounded, and on namespaces only so far
    for name, most in (("wireguard", 1024), ("wireguard-go", 64), ("boringtun", 64)):
        assert not backends.tunnels_refusal(name, most)
        assert f"at most {most}" in str(backends.tunnels_refusal(name, most + 1))
        assert "real hosts" in str(backends.tunnels_refusal(name, 2, hosts=True))
        assert not backends.tunnels_refusal(name, 1, hosts=True)
    assert not backends.tunnels_refusal("xfrm", 4096)
    assert not backends.tunnels_refusal("ours-udp", 4096)
    groups = preflight.forecast(sc)["groups"]
    by = {(g["backend"], g["tunnels"], g["status"], g["reason"][:20]) for g in groups}
    assert ("strongswan-libipsec", 16, "skip", "16 tunnels: strongsw") in by
    assert ("ours", 16, "skip", "16 tunnels: a tcp wo") in by
    assert any(g["backend"] == "ours" and g["tunnels"] == 16 and g["status"] == "run"
               for g in groups)  # fmt: skip
    # a bundle is one tunnel's: check says so, as the start would
    one = 'backends = ["ours"]\nconfigurations = ["esp:aes128gcm16+ipcomp"]'
    bundle = scenario.parse(
        SC.replace('backends = ["none", "ours", "strongswan-libipsec"]', one), "b.toml"
    )
    gs = {(g["tunnels"], g["status"]) for g in preflight.forecast(bundle)["groups"]
          if g["reason"] == ours.NO_BUNDLES or g["status"] == "run"}  # fmt: skip
    assert gs == {(1, "run"), (16, "skip")}, preflight.forecast(bundle)["groups"]
    with pytest.raises(ValueError, match="sets up one so far"):
        backends.make("strongswan-libipsec", tunnels=16)
    assert backends.make("wireguard-go", tunnels=16).tunnels == 16  # type: ignore[attr-defined]
    assert backends.make("ours", tunnels=16).tunnels == 16  # type: ignore[attr-defined]


def _configs(n: int, configuration: str = "esp:aes128gcm16") -> dict[str, str]:
    t = topology("line").tunnels[0]
    ls = ours.layers(configuration)
    more = [(a, b, fresh_keys(ls)) for a, b in tunnels.selectors(t, n)[1:]]
    keys = fresh_keys(ls)
    return {node: ours.gateway_config(node, t, ls, keys, Path("/nonexistent/gw.sock"),
                                      more=more) for node in ("gwA", "gwB")}  # fmt: skip


class _Host:
    """A testbed of real hosts as route_far sees one: what each `ip route show` answers,
    and the commands and ledger entries it is given, in order."""

    remote = True

    def __init__(self, have: dict[str, str]) -> None:
        self.topo = topology("line")
        self.have = have
        self.did: list[tuple[str, str, str]] = []

    def driven(self, node: str) -> bool:
        return node != "client"

    def run(self, node: str, argv: list[str], **_: object) -> str:
        self.did.append((node, "run", " ".join(argv)))
        return self.have.get(node, "") if argv[2] == "show" else ""

    def record(self, node: str, what: str, undo: str) -> None:
        self.did.append((node, "record", f"{what} | {undo}"))


def test_far_routes_on_real_hosts_are_added_through_the_ledger_never_replacing_one() -> None:
    """On hosts, each of FAR's routes on a driven host (not this fake's client): looked
    for in every table, its delete in the
    host's ledger before it is added; one already there as the lab's is left as it is
    (not the lab's to remove); any other route of FAR is refused, naming it, before
    anything is done on that host. Which backends may: ours and none, not xfrm's or
    strongSwan's N (each says why)."""
    tb = _Host({"gwA": "10.128.0.0/16 via 192.0.2.2 dev eth2 "})
    tunnels.route_far(tb, 16)  # type: ignore[arg-type]
    assert tb.did == [
        ("server", "run", "ip route show table all exact 10.128.0.0/16"),
        ("server", "record", "route local 10.128.0.0/16 dev lo (16 tunnels) | "
                             "ip route del local 10.128.0.0/16 dev lo"),
        ("server", "run", "ip route add local 10.128.0.0/16 dev lo"),
        ("gwB", "run", "ip route show table all exact 10.128.0.0/16"),
        ("gwB", "record", "route 10.128.0.0/16 via 10.2.0.2 (16 tunnels) | "
                          "ip route del 10.128.0.0/16 via 10.2.0.2"),
        ("gwB", "run", "ip route add 10.128.0.0/16 via 10.2.0.2"),
        ("gwA", "run", "ip route show table all exact 10.128.0.0/16"),  # the lab's: kept
    ]  # fmt: skip
    tb = _Host({"server": "10.128.0.0/16 via 10.2.0.1 dev eth1 "})
    with pytest.raises(
        LabError,
        match=r"server already routes 10\.128\.0\.0/16 \(10\.128"
        r"\.0\.0/16 via 10\.2\.0\.1 dev eth1\)",
    ):
        tunnels.route_far(tb, 16)  # type: ignore[arg-type]
    assert [d[1] for d in tb.did] == ["run"]  # asked, then nothing
    tb = _Host({})
    tunnels.route_far(tb, 1)  # type: ignore[arg-type]  # one tunnel: no FAR at all
    assert tb.did == []
    for name in ("none", "ours", "ours-udp"):
        assert backends.tunnels_refusal(name, 16, hosts=True) is None
    assert "one shell line" in str(backends.tunnels_refusal("xfrm-udp", 16, hosts=True))
    assert "charon's log" in str(backends.tunnels_refusal("strongswan-kernel", 16, hosts=True))
    assert backends.tunnels_refusal("strongswan-kernel", 16) is None  # on namespaces
    assert backends.tunnels_refusal("xfrm", 1, hosts=True) is None


def test_ours_config_for_n_tunnels_is_what_ipsec_gw_takes(tmp_path: Path) -> None:
    """64 tunnels: gwA and gwB each hold 128 SAs under 128 distinct SPIs (the same
    SPI and key on both ends of each SA), 128 policies, and gwA routes FAR into its TUN
    device; `ipsec-gw --check` (the real one) takes both."""
    binary = ours.gateway_binary()
    if binary is None:
        pytest.fail("ipsec-gw is not built (make gateway)")
    texts = _configs(64)
    sas = {}
    for node, text in texts.items():
        f = tmp_path / f"{node}.toml"
        f.write_text(text)
        f.chmod(0o600)
        p = subprocess.run([str(binary), "--config", str(f), "--check"], capture_output=True,
                           text=True, timeout=60, check=False)  # fmt: skip
        assert p.returncode == 0 and "128 SAs, 128 policies" in p.stderr, p.stderr
        found = re.findall(r'direction = "(out|in)"\nspi = (\d+)\n(?:.*\n){4}enc_key = "(\w+)"',
                           text)  # fmt: skip
        assert len(found) == 128 and len({spi for _, spi, _ in found}) == 128
        sas[node] = {(d, int(spi), k) for d, spi, k in found}
    flip = {"out": "in", "in": "out"}
    assert {(flip[d], s, k) for d, s, k in sas["gwA"]} == sas["gwB"]  # both ends agree
    assert len({k for _, _, k in sas["gwA"]}) == 128  # every SA its own key
    assert 'routes = ["10.2.0.0/24", "10.128.0.0/16"]' in texts["gwA"]
    assert 'routes = ["10.1.0.0/24"]' in texts["gwB"]
    with pytest.raises(Unsupported, match="no bundles"):
        _configs(2, "esp:aes128gcm16+ipcomp")


def test_a_campaign_of_several_counts_reports_the_rate_against_them() -> None:
    """The report's table and plot of the axis: per backend, each count's rate, its
    ratio to one tunnel's, the set-up time and the memory per tunnel added."""
    from ipsec_lab import campaign_report
    from ipsec_lab.studies import Analysis

    def row(backend: str, n: int, mbps: float, rss: float, **ike: float) -> dict[str, object]:
        flow = "client-server" if n == 1 else f"client-server over {n} tunnels"
        return {"backend": backend, "backend_label": backend, "configuration": "esp:x",
                "link": "unshaped", "flow": flow, "measurement": "rfc2544-64", "n": 1,
                "tunnels": n, "mbps_median": mbps, "setup_s_median": 0.1 * n,
                "ipsec_rss_at_start_median": rss, **ike}  # fmt: skip

    an = Analysis("c", "c", "c")
    measured = [row("ours", 1, 20.0, 2**20), row("ours", 16, 15.0, 2**20 + 15 * 2048),
                row("none", 1, 90.0, 0), row("none", 16, 90.0, 0),
                row("strongswan-kernel", 16, 9.0, 2**21, tunnels_per_s_median=41.5,
                    ike_retransmits_max=3)]  # fmt: skip
    campaign_report._tunnel_axis(an, measured, 7)
    (plot,) = an.plots
    assert plot.categories == ["1", "16"]
    assert plot.series["ours esp:x (unshaped, client-server)"] == [20.0, 15.0]
    (table,) = an.tables
    ours16 = next(r for r in table.rows if r[1].startswith("ours") and r[2] == 16)
    # x 1 tunnel, set-up, no IKE figures (ours has no IKE), MiB, KiB per tunnel
    assert ours16[3:10] == ["15", "0.75", "1.6", "—", "—", "1.03", "2"]
    ike = next(r for r in table.rows if r[1].startswith("strongswan"))
    assert ike[5:8] == ["1.6", "41.5", "3"]  # set-up, IKE tunnels/s, retransmits
    an2 = Analysis("c", "c", "c")
    campaign_report._tunnel_axis(an2, measured[:1] + measured[2:3], 7)
    assert not an2.plots and not an2.tables  # one count: no axis


def test_wireguards_n_tunnels_are_a_hub_and_a_site_per_tunnel() -> None:
    """N tunnels through WireGuard (backends/wireguard.py): gwA's hub, the same End in
    every pair, routes the server's subnet and FAR into its device; gwB's N sites each
    a device, port, table and key of its own, the i-th site's network the i-th tunnel's
    right selector; only the first site routes (the others only receive). One tunnel is
    the topology's two ends as before."""
    from ipsec_lab.backends.wireguard import Wireguard, _remote, _rules

    class Tb:
        topo = topology("line")
        token = "abc123"

    pairs = Wireguard(tunnels=16)._ends_of(Tb())  # type: ignore[arg-type]
    t = Tb.topo.tunnels[0]
    hub = pairs[0][0]
    assert all(a is hub for a, _, _ in pairs) and hub.node == "gwA"
    assert _remote(hub) == ("10.2.0.0/24", tunnels.FAR) and hub.mine == "10.1.0.0/24"
    rules = [" ".join(r) for r, _ in _rules(hub, "add")]
    assert rules[1:] == [f"ip rule add to {net} lookup {hub.table} pref {hub.pref + 1}"
                         for net in _remote(hub)]  # fmt: skip
    sites = [b for _, b, _ in pairs]
    assert [(s.mine, s.theirs) for s in sites] == [(r, ls) for ls, r in tunnels.selectors(t, 16)]
    assert [s.routed for s in sites] == [True] + [False] * 15
    assert {s.node for s in sites} == {"gwB"}
    for field in ("dev", "port", "table", "pref"):
        assert len({getattr(e, field) for e in [hub, *sites]}) == 17, field
    assert all(len(e.dev) <= 15 for e in [hub, *sites])  # IFNAMSIZ
    (one,) = Wireguard()._ends_of(Tb())  # type: ignore[arg-type]
    assert (one[0].node, one[0].mine, one[0].theirs, one[0].extra) == (
        "gwA",
        "10.1.0.0/24",
        "10.2.0.0/24",
        (),
    )
    assert (one[1].node, one[1].mine, one[1].theirs, one[1].routed) == (
        "gwB",
        "10.2.0.0/24",
        "10.1.0.0/24",
        True,
    )
