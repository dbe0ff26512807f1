"""Where the roles of a campaign on one machine run (testbed.placement), without root:
the choice per machine size and scenario, the mask RPS takes, the scenario key, and what
`check` says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab import scenario
from ipsec_lab.testbed.placement import Placement, choose, cpu_mask, placement_of


@pytest.mark.parametrize(
    ("cpus", "traffic", "dut"),
    [
        ((0, 1), (0,), (1,)),
        ((0, 1, 2), (0,), (1, 2)),
        ((0, 1, 2, 3), (0,), (1, 2, 3)),
        (tuple(range(8)), (0, 1), (2, 3, 4, 5, 6, 7)),
        ((2, 3), (2,), (3,)),  # a container's CPUs, not the machine's first
    ],
)
def test_auto_puts_traffic_and_the_ipsec_on_cpus_of_their_own(
    cpus: tuple[int, ...], traffic: tuple[int, ...], dut: tuple[int, ...]
) -> None:
    p = choose("auto", cpus=cpus)
    assert (p.mode, p.traffic, p.dut) == ("auto", traffic, dut)
    assert p.placed and not p.shared
    assert set(p.traffic) | set(p.dut) == set(cpus)
    assert p.record() == {"placement": "auto", "traffic_cpus": list(traffic),
                          "dut_cpus": list(dut), "dut_shared_cores": False,
                          "shared_why": ""}  # fmt: skip
    assert p.describe() == (f"placement: traffic on CPU {','.join(map(str, traffic))}, "
                            f"IPsec on CPU {','.join(map(str, dut))}")  # fmt: skip
    # trafgen's worker pins itself to CPU 0: fine where CPU 0 is the traffic's
    assert choose("auto", cpus=cpus, trafgen=True).shared is (0 not in traffic)


def test_one_cpu_off_and_a_quota_too_big_to_pin_share_every_core() -> None:
    for p in (choose("auto", cpus=(0,)), choose("off", cpus=(0, 1)),
              choose("auto", cpus=(0, 1), quota=1.5)):  # fmt: skip
        assert not p.placed and p.shared and p.mode == "off"
        assert p.record()["dut_shared_cores"] is True
        assert p.describe().startswith("placement: off — the traffic runs on every CPU; SHARED")
        assert p.record()["shared_why"].startswith("placement off: ")
    # a quota the IPsec's CPUs hold: placed, the quota applies on top
    assert choose("auto", cpus=(0, 1), quota=0.5).placed


def test_the_gateways_cpus_are_the_ipsecs_and_the_rest_the_traffics() -> None:
    p = choose("auto", gateway_cpus=(1,), cpus=(0, 1, 2, 3))
    assert (p.mode, p.traffic, p.dut, p.shared) == ("gateway", (0, 2, 3), (1,), False)
    every = choose("auto", gateway_cpus=(0, 1), cpus=(0, 1))
    assert every.shared and "overlap" in every.describe()
    # `placement = "off"` leaves the traffic unplaced; the IPsec stays on its CPUs
    off = choose("off", gateway_cpus=(1,), cpus=(0, 1))
    assert off.shared and off.record()["dut_cpus"] == [1] and off.record()["traffic_cpus"] == []
    assert "the IPsec pinned to CPU 1" in off.describe()
    # the IPsec on CPU 0 puts trafgen's worker (pinned to CPU 0 by itself) beside it
    zero = choose("auto", gateway_cpus=(0,), cpus=(0, 1), trafgen=True)
    assert zero.shared and "trafgen pins its worker to CPU 0" in zero.shared_why()
    assert not choose("auto", gateway_cpus=(0,), cpus=(0, 1)).shared  # iperf3 only


def test_host_to_host_topologies_are_placed_but_shared() -> None:
    p = placement_of("auto", (), None, on_hosts=False, host_to_host=True)
    assert p.placed and p.shared and "host to host" in p.shared_why()
    h = placement_of("auto", (), None, on_hosts=True, host_to_host=True)
    assert h.mode == "hosts" and h.shared
    assert not placement_of("auto", (), None, on_hosts=True).shared


def test_real_hosts_are_their_own_placement() -> None:
    p = Placement("hosts")
    assert not p.shared and p.record()["placement"] == "hosts"
    assert "hosts' own" in p.describe()


@pytest.mark.parametrize(
    ("cpus", "mask"),
    [
        ((0,), "00000001"),
        ((1,), "00000002"),
        ((1, 2, 3), "0000000e"),
        ((33,), "00000002,00000000"),
        ((0, 32, 63), "80000001,00000001"),
    ],
)
def test_the_rps_mask_is_sysfs_hexadecimal_in_32_bit_words(cpus: tuple[int, ...],
                                                           mask: str) -> None:  # fmt: skip
    assert cpu_mask(cpus) == mask


def test_the_scenario_key_is_auto_or_off_and_anything_else_is_named() -> None:
    base = 'topology = "line"\nbackends = ["none"]\n[[workloads]]\nkind = "tcp"\n'
    assert scenario.parse(base, "s.toml").placement == "auto"
    assert scenario.parse('placement = "off"\n' + base, "s.toml").placement == "off"
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse('placement = "on"\n' + base, "s.toml")
    assert "s.toml" in str(e.value) and "placement" in str(e.value) and "'on'" in str(e.value)


def test_check_says_the_placement_in_words_and_json(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('placement = "off"\ntopology = "line"\nbackends = ["none"]\n'
                 '[[workloads]]\nkind = "tcp"\n')  # fmt: skip
    p = cli("check", str(f), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["placement"]["placement"] == "off" and doc["placement"]["dut_shared_cores"]
    assert any("SHARED CORES" in w for w in doc["warnings"])
    p = cli("check", str(f))
    assert "placement: off — the traffic runs on every CPU; SHARED: placement off" in p.stdout
    # the line with trafgen on two CPUs or more: placed, nothing shared, no warning
    f.write_text('topology = "line"\nbackends = ["none"]\n[[workloads]]\nkind = "rfc2544"\n'
                 'generator = "trafgen"\nsize = 64\n')  # fmt: skip
    doc = json.loads(cli("check", str(f), "--json").stdout)
    assert doc["placement"]["placement"] == "auto" and not doc["placement"]["dut_shared_cores"]
    assert not any("SHARED" in w for w in doc["warnings"])
    # the pair: its hosts do their IPsec and their traffic alike
    f.write_text('topology = "pair"\nbackends = ["none"]\n[[workloads]]\nkind = "tcp"\n')
    doc = json.loads(cli("check", str(f), "--json").stdout)
    assert doc["placement"]["dut_shared_cores"] and "host to host" in doc["placement"]["says"]
