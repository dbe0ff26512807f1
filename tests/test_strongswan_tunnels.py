"""strongSwan's N tunnels (issue 44): the swanctl configurations both ends get, the
charon log reader that times the set-up, the scenario key and the refusals. The VM runs
them for real (tests/vm/tunnels.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ipsec_lab import backends
from ipsec_lab.backends.base import Unsupported
from ipsec_lab.backends.strongswan import LogCount, StrongSwan, _swanctl_conf
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
    a = _conns(_swanctl_conf("gwA", [t], "aes128gcm16", "ab", many=n, initiates=True))
    b = _conns(_swanctl_conf("gwB", [t], "aes128gcm16", "ab", many=n))
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
    gwa = _swanctl_conf("gwA", [t], "aes128gcm16", "ab", many=n, ike_sas="per-tunnel")
    gwb = _swanctl_conf("gwB", [t], "aes128gcm16", "ab", many=n, ike_sas="per-tunnel")
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


def test_kernel_libipsec_refuses_many_tunnels_with_the_reason() -> None:
    """The libipsec entry is not a many-tunnel backend; `strongswan` resolving to it (or
    asked for it) refuses N > 1 at its check, saying why."""
    assert backends.tunnels_refusal("strongswan-libipsec", 16)
    assert backends.tunnels_refusal("strongswan-kernel", 16) is None
    with pytest.raises(Unsupported, match="kernel-libipsec sets up one tunnel"):
        StrongSwan("libipsec", tunnels=16).check("esp:aes128gcm16")
    StrongSwan("libipsec", tunnels=1).check("esp:aes128gcm16")  # one: as before
