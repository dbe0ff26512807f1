"""The registries every fact comes from: metrics declared once, backends listed once."""

from __future__ import annotations

import statistics

import pytest

from ipsec_lab import backends, metrics, runner, scenario


def _run(backend: str, mbps: list[float], effort: list[float]) -> list[dict]:
    return [
        {
            "backend": backend, "configuration": "esp:aes128gcm16", "link": "lan", "flow": "f",
            "workload": "tcp", "repetition": i, "status": "done", "reason": None,
            "backend_version": "x",
            "results": [{
                "label": "tcp", "mbps": m, "seconds": 2.0, "payload_bytes": 1000,
                "effort_us_per_kb": e,
                "ipsec_effort_us_per_kb": 0.0 if backend == "none" else e / 2,
                "wire_up_bytes": 1100, "wire_down_bytes": 100, "retransmits": i,
            }],
        }
        for i, (m, e) in enumerate(zip(mbps, effort))
    ]  # fmt: skip


def test_the_summary_aggregates_each_metric_as_declared() -> None:
    runs = _run("none", [100, 120, 110], [2.0, 2.2, 2.4]) + _run("ours", [50, 40, 60], [4, 5, 6])
    rows = {r["backend"]: r for r in runner.summarize(runs)}
    ours, none = rows["ours"], rows["none"]
    assert (ours["mbps_median"], ours["mbps_min"], ours["mbps_max"]) == (50, 40, 60)
    assert ours["mbps_cv"] == pytest.approx(statistics.stdev([50, 40, 60]) / 50)
    assert ours["mbps_vs_none"] == pytest.approx(50 / 110)
    assert ours["effort_vs_none"] == pytest.approx(5 / 2.2)
    assert ours["ipsec_effort_median"] == 2.5
    # none's IPsec effort is zero: no IPsec processes, so no figure rather than 0
    assert none["ipsec_effort_median"] is None
    assert ours["wire_pct_of_payload"] == pytest.approx(120.0)
    assert ours["retransmits_median"] == 1
    # every declared summary key is in the row, and prints in every column
    for m in metrics.METRICS:
        for key in [*m.summary.values(), *([m.vs_none] if m.vs_none else [])]:
            assert key in ours, key
    cells = metrics.cells(ours)
    assert len(cells) == len(metrics.COLUMNS) and "50.0 Mbit/s" in cells


def test_a_figure_prints_with_its_unit_the_same_everywhere() -> None:
    """The live progress line, the summary's notes and its cells print one way."""
    mbps = metrics.BY_KEY["mbps"]
    assert [mbps.show(v) for v in (9.5, 95.04, 950.4)] == [
        "9.50 Mbit/s",
        "95.0 Mbit/s",
        "950 Mbit/s",
    ]
    assert mbps.show(None) == "—"
    assert metrics.BY_KEY["other_cpu_before"].show(0.5) == "0.50 CPUs"
    assert metrics.BY_KEY["effort_us_per_kb"].show(12.345) == "12.3 µs/kB"
    ours = next(r for r in runner.summarize(_run("ours", [9.0, 9.5, 9.9], [1, 1, 1])))
    assert metrics.cells(ours)[0] == mbps.show(9.5)


def test_csv_columns_are_the_identity_then_each_exported_metric() -> None:
    fields = metrics.CSV_FIELDS
    assert fields[: len(metrics.CSV_IDENTITY)] == metrics.CSV_IDENTITY
    assert [f for f in fields if f in metrics.BY_KEY] == [m.key for m in metrics.METRICS if m.csv]
    assert len(set(fields)) == len(fields)


def test_every_registered_backend_is_built_by_name_and_accepted_by_scenarios() -> None:
    assert scenario.BACKENDS == backends.NAMES
    for e in backends.REGISTRY:
        assert backends.make(e.name).name == e.name
    assert backends.IPSEC_NAMES == tuple(n for n in backends.NAMES if n != "none")
    with pytest.raises(ValueError, match="unknown backend 'nope' \\(known: none, "):
        backends.make("nope")


# --- workloads: one registry, read by the scenario, the runner, check and hosts check ----


def test_every_workload_kind_is_listed_once_and_reads_only_keys_a_workload_has() -> None:
    import dataclasses

    from ipsec_lab import workloads
    from ipsec_lab.traffic.workload import Workload

    fields = {f.name for f in dataclasses.fields(Workload)}
    assert len(workloads.KINDS) == len(set(workloads.KINDS)) == len(workloads.REGISTRY)
    assert scenario.WORKLOAD_KINDS == workloads.KINDS
    for k in workloads.REGISTRY:
        assert k.keys <= fields, (k.name, k.keys - fields)
        # a minimal workload of each kind parses (a scenario can name every kind)
        sc = scenario.parse(f'name = "x"\n[[workloads]]\nkind = "{k.name}"\n', "t.toml")
        assert sc.workloads[0].kind == k.name


@pytest.mark.parametrize("key", ["rate_mbit", "sizes", "files", "minutes", "background"])
def test_a_key_another_kind_reads_is_refused_naming_the_kinds_that_use_it(key: str) -> None:
    from ipsec_lab import workloads

    takers = [k.name for k in workloads.REGISTRY if key in k.keys]
    lacking = next(k for k in workloads.REGISTRY if key not in k.keys)
    text = f'name = "x"\n[[workloads]]\nkind = "{lacking.name}"\n{key} = 1\n'
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse(text, "t.toml")
    said = str(e.value)
    assert said.startswith(f"t.toml: workloads[0].{key}: only ")
    assert all(t in said for t in takers) and f"{lacking.said()} takes" in said, said


def test_check_estimates_each_run_by_its_kind(tmp_path: object) -> None:
    """`check`'s time for a run is its kind's traffic plus the warm-up and the run's own
    overhead: a new kind's estimate is its own."""
    from ipsec_lab import preflight, workloads
    from ipsec_lab.testbed import LINK_PRESETS

    link = LINK_PRESETS["ethernet-100"]
    sc = scenario.parse('name = "x"\n[[workloads]]\nkind = "tcp"\nbytes = "100M"\n', "t.toml")
    w = sc.workloads[0]
    got = preflight.run_seconds(w, link, 1.0)
    assert got == pytest.approx(100 * 2**20 * 8 / 100e6 + 1.0 + preflight.RUN_OVERHEAD_S)
    soak = scenario.parse('name = "x"\n[[workloads]]\nkind = "soak"\nminutes = 2\n', "t.toml")
    assert workloads.of(soak.workloads[0]).seconds(soak.workloads[0], 100) == 125


def test_hosts_check_asks_each_workload_kind_for_its_tools() -> None:
    from ipsec_lab.hosts import check

    sc = scenario.parse(
        'name = "x"\n[[workloads]]\nkind = "http"\n[[workloads]]\nkind = "tcp"\ndata = "text"\n'
        '[[workloads]]\nkind = "latency"\nbackground = "tcp"\n',
        "t.toml",
    )
    client = check.needed_tools("client", "line", ("ours",), sc.workloads)
    assert {"nginx", "curl", "python3", "irtt", "iperf3"} <= set(client)
    assert "nginx" not in check.needed_tools("gwA", "line", ("ours",), sc.workloads)
    # bulk TCP behind the probes: no UDP generator, so trafgen is not looked for
    assert check.optional_tools("client", "line", client, sc.workloads) == []
    udp = scenario.parse('name = "x"\n[[workloads]]\nkind = "udp"\n', "t.toml").workloads
    assert {"python3", "trafgen"} <= set(check.optional_tools("client", "line", [], udp))
    assert check.optional_tools("server", "line", [], udp) == ["nft"]


# --- backends: what the lab must know of each before it starts, in its entry ------------


def test_every_backend_entry_builds_its_backend_here_and_for_hosts() -> None:
    """Each entry's class builds the backend named (no module looked up by string), and
    each that runs on real hosts takes them (`use_hosts` is the protocol's, not probed)."""
    from pathlib import Path

    from ipsec_lab.hosts import load

    hosts = load(Path(__file__).resolve().parents[1] / "examples" / "hosts" / "line.toml")
    for e in backends.REGISTRY:
        b = backends.make(e.name)
        assert type(b) is e.cls and e.module in type(b).__module__
        assert e.start_s > 0
        if e.hosts:
            backends.make(e.name, hosts=hosts)
    # the user ipsec-gw runs as is ours' and nobody else's; the tools charon needs are
    # strongSwan's three entries'
    assert {e.name for e in backends.REGISTRY if e.user} == {"ours", "ours-udp"}
    charon = {e.name for e in backends.REGISTRY if "/usr/lib/ipsec/charon" in e.tools}
    assert charon == {"strongswan", "strongswan-kernel", "strongswan-libipsec"}


def test_a_backend_resolves_by_its_entry_and_a_slower_variant_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses
    from pathlib import Path

    from ipsec_lab import preflight
    from ipsec_lab.hosts import load

    for e in backends.REGISTRY:
        if e.resolve is None:
            assert backends.resolve(e.name) == (e.name, "")
    hosts = load(Path(__file__).resolve().parents[1] / "examples" / "hosts" / "line.toml")
    name, why = backends.resolve("strongswan", hosts)
    assert name == "strongswan" and "libipsec" in why  # decided at start, on the hosts
    assert [e.name for e in backends.REGISTRY if e.slower] == ["strongswan-libipsec"]
    # asked for by name, the variant is what was asked: nothing to warn about
    assert preflight.slower_warnings(["strongswan-libipsec", "ours"]) == []
    # resolved to it (a kernel without ESP): said, with the entry's why and its words
    to_user_space = dataclasses.replace(
        backends.BY_NAME["strongswan"], resolve=lambda h: ("strongswan-libipsec", "no ESP")
    )
    monkeypatch.setitem(backends.BY_NAME, "strongswan", to_user_space)
    (said,) = preflight.slower_warnings(["strongswan", "ours"])
    assert said.startswith("strongswan runs as strongswan-libipsec here (no ESP): ")
    assert said.endswith(backends.BY_NAME["strongswan-libipsec"].slower)


def test_check_estimates_a_backends_start_from_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from ipsec_lab import preflight

    sc = scenario.parse(
        'name = "x"\nbackends = ["none", "ours"]\n[[workloads]]\nkind = "tcp"\n', "t.toml"
    )
    before = preflight.forecast(sc)["estimated_s"]
    slow = dataclasses.replace(backends.BY_NAME["none"], start_s=100.5)
    monkeypatch.setitem(backends.BY_NAME, "none", slow)
    assert preflight.forecast(sc)["estimated_s"] == before + 100


def test_hosts_check_asks_each_backend_entry_for_its_tools() -> None:
    from ipsec_lab.hosts import check

    gw = check.needed_tools("gwA", "line", ("ours", "xfrm-udp", "strongswan-kernel"))
    assert {"nft", "python3", "swanctl", "/usr/lib/ipsec/charon", "tc"} <= set(gw)
    assert "nft" not in check.needed_tools("gwA", "line", ("xfrm",))
    # the traffic's ends run no IPsec: no backend's tools there
    assert "swanctl" not in check.needed_tools("client", "line", ("strongswan",))


def test_a_namespace_testbed_is_told_from_one_of_hosts_by_the_interface(tmp_path: object) -> None:
    """The namespaces of one machine read one clock and share its programs; a testbed of
    real hosts does neither (a check by the concrete class named in the traffic code
    once compared against the interface's Protocol, and no testbed ever matched)."""
    from pathlib import Path

    from ipsec_lab.testbed import topology
    from ipsec_lab.testbed.build import Testbed
    from ipsec_lab.testbed.interface import on_hosts
    from ipsec_lab.traffic import generator, latency

    tb = Testbed(topology("line"), Path(str(tmp_path)))
    assert not on_hosts(tb) and latency.same_clock(tb)
    asked: list[str] = []

    class Hosts(Testbed):
        remote = True

        def run(self, node: str, argv: object, **kw: object) -> str:  # type: ignore[override]
            asked.append(node)
            return ""

    far = Hosts(topology("line"), Path(str(tmp_path)))
    assert on_hosts(far) and not latency.same_clock(far)
    assert generator._has(tb, "client", "sh") and asked == []  # this machine's own
    assert not generator._has(far, "client", "sh") and asked == ["client"]  # asked there


def test_every_backend_class_has_every_method_of_the_backend_protocol() -> None:
    """The runner calls each `Backend` method on whatever the registry made; a class
    missing one fails only when a campaign reaches it (`set_up_figures` was once missing
    from the user-space WireGuards, found by CI's WireGuard campaign). Every method the
    protocol declares is callable on every registered class, inherited or its own."""
    import inspect

    from ipsec_lab.backends import REGISTRY
    from ipsec_lab.backends.base import Backend

    wanted = sorted(n for n, v in vars(Backend).items()
                    if inspect.isfunction(v) and not n.startswith("_"))  # fmt: skip
    assert {"start", "stop", "set_up_figures", "version"} <= set(wanted)
    missing = [(e.name, n) for e in REGISTRY for n in wanted
               if not callable(getattr(e.cls, n, None))]  # fmt: skip
    assert missing == []
