"""Scenario files: presets expanded, the run plan, the CLI's rate and size grammar, and
errors that name the file and the key; every shipped example is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipsec_lab import preflight, scenario

GOOD = """
name = "t"
topology = "line"
backends = ["none", "strongswan"]
configurations = ["esp:aes128gcm16", "@ferrante2005"]
repetitions = 2
[[links]]
preset = "ethernet-10"
[[links]]
name = "lossy"
rate_mbit = 20
loss_pct = 1
delay_ms = 5
[[workloads]]
kind = "tcp"
bytes = "10M"
[[workloads]]
kind = "rfc2544"
size = 512
[gateway]
cpu_quota = 0.5
"""


def test_a_good_scenario_reads_with_presets_expanded() -> None:
    sc = scenario.parse(GOOD, "good.toml")
    assert sc.topology == "line"
    assert sc.backends == ("none", "strongswan")
    # the preset expands in place and duplicates go
    assert sc.configurations[0] == "esp:aes128gcm16"
    assert "ah:sha1+esp:aes128" in sc.configurations
    assert "ipcomp+esp:aes128-sha1" in sc.configurations
    assert len(sc.configurations) == len(set(sc.configurations))
    assert sc.links[0].rate_mbit == 10 and not sc.links[0].needs_netem
    assert sc.links[1].name == "lossy" and sc.links[1].needs_netem
    assert sc.workloads[0].bytes == 10 << 20
    assert sc.workloads[1].name == "rfc2544-512"
    assert sc.gateway.cpu_quota == 0.5


def test_plan_runs_none_once_per_link_workload_and_repetition() -> None:
    sc = scenario.parse(GOOD, "good.toml")
    plan = preflight.plan(sc)
    n_cfg = len(sc.configurations)
    assert len(plan) == 2 * 2 * 2 * (1 + n_cfg)  # links x workloads x reps x (none + cfgs)
    assert {p.key.configuration for p in plan if p.key.backend == "none"} == {"none"}
    assert len({p.key for p in plan}) == len(plan)


def test_scenario_rates_and_sizes_take_the_cli_grammar() -> None:
    sc = scenario.parse(
        "[[links]]\nname = 'x'\nrate_mbit = '1.5G'\n[[links]]\nname = 'y'\nrate_mbit = '500k'\n"
        "[[workloads]]\nkind = 'udp'\nrate_mbit = '10Mbit/s'\n"
        "[[workloads]]\nkind = 'http'\nfiles = ['1KiB', '10MB', 300]\n"
        "[[workloads]]\nkind = 'tcp'\nbytes = '1G'",
        "ok.toml",
    )
    assert [lk.rate_mbit for lk in sc.links] == [1500.0, 0.5]
    assert sc.workloads[0].rate_mbit == 10.0
    assert sc.workloads[1].files == (1024, 10 << 20, 300)
    assert sc.workloads[2].bytes == 1 << 30


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("topology = 'ring'", "topology", "pair, line, clients"),
        ("backends = ['libreswan']", "backends", "unknown backend"),
        ("configurations = ['esp:aes999']", "configurations", "aes999"),
        ("configurations = ['@nostudy']", "configurations", "@ferrante2005"),
        ("colour = 3", "colour", "unknown key (known"),  # nothing near: no guess
        ("repetitons = 2", "repetitons", "unknown key — did you mean repetitions?"),
        (
            "[[workloads]]\nkind = 'tcp'\nsecnods = 3",
            "workloads[0].secnods",
            "did you mean seconds?",
        ),
        ("[[links]]\nname = 'x'\nrat_mbit = 3", "links[0].rat_mbit", "did you mean rate_mbit?"),
        (
            "configurations = ['aes-128-gcm']",
            "configurations",
            "configurations: 'aes-128-gcm': unknown ESP encryption 'aes' (did you mean",
        ),
        ("repetitions = 0", "repetitions", "outside"),
        ("repetitions = 1.5", "repetitions", "whole number"),
        ("links = ['ethernet-1000']", "links[0].preset", "unknown preset"),
        ("[[links]]\nrate_mbit = 5", "links[0].name", "needs a name"),
        ("[[links]]\nname = 'x'\nrate_mbit = -5", "links[0].rate_mbit", "negative"),
        ("[[links]]\nname = 'x'\nloss_pct = 'lots'", "links[0].loss_pct", "number"),
        ("[[workloads]]\nkind = 'ftp'", "workloads[0].kind", "tcp, udp"),
        ("[[workloads]]\nkind = 'tcp'\nbytes = 'many'", "workloads[0].bytes", "not a size"),
        ("[[workloads]]\nkind = 'udp'\nbytes = 100", "workloads[0].bytes", "only a tcp"),
        ("[[workloads]]\nkind = 'udp'\nsize = 20", "workloads[0].size", "outside"),
        ("[[workloads]]\nkind = 'tcp'\n[[workloads]]\nkind = 'tcp'", "workloads", "label"),
        (
            "[[workloads]]\nkind = 'rfc2544'\nmax_rate_mbit = 5\nresolution_mbit = 10",
            "workloads[0].resolution_mbit",
            "below max_rate_mbit",
        ),
        ("[[workloads]]\nkind = 'tcp'\ndata = 'zeros'", "workloads[0].data", "iperf, text"),
        ("[[workloads]]\nkind = 'udp'\ndata = 'text'", "workloads[0].data", "only a tcp"),
        (
            "[[workloads]]\nkind = 'tcp'\ndata = 'text'\nstreams = 4",
            "workloads[0].data",
            "one stream",
        ),
        (
            "[[workloads]]\nkind = 'rfc2544'\noverload_trials = 51",
            "workloads[0].overload_trials",
            "outside",
        ),
        (
            "[[workloads]]\nkind = 'rfc2544'\noverload_trials = 2.5",
            "workloads[0].overload_trials",
            "whole number",
        ),
        (
            "[[workloads]]\nkind = 'udp'\noverload_trials = 2",
            "workloads[0].overload_trials",
            "rfc2544",
        ),
        ("[[workloads]]\nkind = 'udp'\nsizes = [64]", "workloads[0].sizes", "only an rfc2544"),
        (
            "[[workloads]]\nkind = 'rfc2544'\nsize = 64\nsizes = [64, 128]",
            "workloads[0].sizes",
            "not both",
        ),
        ("[[workloads]]\nkind = 'rfc2544'\nsizes = []", "workloads[0].sizes", "non-empty"),
        ("[[workloads]]\nkind = 'rfc2544'\nsizes = [64, 32]", "workloads[0].sizes", "outside"),
        ("[[workloads]]\nkind = 'rfc2544'\nsizes = [64, 64]", "workloads[0].sizes", "twice"),
        ("stage_timing = 'yes'", "stage_timing", "true or false"),
        # the UDP generator: a known one, and the paced ones only where the source does no
        # IPsec of its own (each refused by name, on every topology that has such sources)
        ("generator = 'pktgen'", "generator", "auto, udp-gso, trafgen, iperf3"),
        ("topology = 'pair'\ngenerator = 'trafgen'", "generator", "cannot drive the pair"),
        ("topology = 'pair'\ngenerator = 'udp-gso'", "generator", "udp-gso cannot drive the pair"),
        (
            "topology = 'clients'\n[[workloads]]\nkind = 'udp'\ngenerator = 'udp-gso'",
            "workloads[0].generator",
            "udp-gso cannot drive the clients topology",
        ),
        ("[[workloads]]\nkind = 'udp'\ngenerator = 'fast'", "workloads[0].generator", "auto,"),
        (
            "topology = 'clients'\n[[workloads]]\nkind = 'rfc2544'\ngenerator = 'trafgen'",
            "workloads[0].generator",
            "own (host-to-host) IPsec",
        ),
        ("[[workloads]]\nkind = 'tcp'\ngenerator = 'iperf3'", "workloads[0].generator", "only a"),
        ("[[workloads]]\nkind = 'udp'\nflows = 0", "workloads[0].flows", "outside"),
        ("[gateway]\ncpus = [99]", "gateway.cpus", "CPU numbers"),
        ("[gateway]\ncpu_quota = 0", "gateway.cpu_quota", "outside"),
        ("[gateway]\naqm = 'codel'", "gateway.aqm", "true or false"),
        ("[gateway]\ntun_queue = 0", "gateway.tun_queue", "outside"),
        ("[gateway]\ntun_queue = 1.5", "gateway.tun_queue", "whole"),
        ("[gateway]\ntun_queue = 'short'", "gateway.tun_queue", '"auto" or a number'),
        ("name = = 3", "name (line 1)", "Invalid value"),
        # a TOML error names the key on its line, with its table
        ("[[links]]\nname = 'x'\nrate_mbit = 10M", "links.rate_mbit (line 3)", 'rate_mbit = "10M"'),
        # keys are checked per workload kind: one another kind reads is refused, not ignored
        ("[[workloads]]\nkind = 'tcp'\nrate_mbit = 10", "workloads[0].rate_mbit", "only a udp"),
        ("[[workloads]]\nkind = 'http'\nseconds = 3", "workloads[0].seconds", "an http"),
        ("[[workloads]]\nkind = 'udp'\nstreams = 4", "workloads[0].streams", "only a tcp"),
        ("[[workloads]]\nkind = 'imix'\nsize = 64", "workloads[0].size", "udp or rfc2544"),
        # rates in one grammar: a byte rate is refused with the bit spelling
        ("[[links]]\nname = 'x'\nrate_mbit = '10MB'", "links[0].rate_mbit", "write 80M"),
        ("[[links]]\nname = 'x'\nrate_mbit = '-1G'", "links[0].rate_mbit", "negative"),
        ("[[workloads]]\nkind = 'http'\nfiles = ['1Mb']", "workloads[0].files", "bits"),
        # the tunnel-count axis: counts within range, on line, with a spreading generator
        ("tunnels = 0", "tunnels", "from 1 to 4,096, not 0"),
        ("tunnels = [1, 4097]", "tunnels", "not 4097"),
        ("tunnels = ['16']", "tunnels", "a tunnel count or a list"),
        ("tunnels = [true]", "tunnels", "a tunnel count or a list"),
        ("tunnels = []", "tunnels", "a tunnel count or a list"),
        ("topology = 'pair'\ntunnels = [1, 16]", "tunnels", 'topology "line"'),
        (
            "tunnels = 16\n[[workloads]]\nkind = 'rfc2544'\ngenerator = 'trafgen'",
            "workloads[0].generator",
            "sends to one address",
        ),
        (
            "tunnels = 16\ngenerator = 'iperf3'\n[[workloads]]\nkind = 'udp'",
            "workloads[0].generator",
            "the scenario's `generator`",
        ),
    ],
)
def test_scenario_errors_name_the_file_and_key(text: str, key: str, words: str) -> None:
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse(text, "bad.toml")
    assert e.value.key == key
    assert str(e.value).startswith(f"bad.toml: {key}: ")
    assert words in str(e.value)


def test_the_generator_is_the_scenario_s_unless_a_workload_names_its_own() -> None:
    sc = scenario.parse(
        "generator = 'iperf3'\n[[workloads]]\nkind = 'udp'\n"
        "[[workloads]]\nkind = 'rfc2544'\ngenerator = 'trafgen'\nflows = 16",
        "g.toml",
    )
    assert sc.generator == "iperf3"
    assert [(w.generator, w.flows) for w in sc.workloads] == [("iperf3", 1), ("trafgen", 16)]
    # by default the fastest available: decided where the traffic runs
    assert scenario.parse("[[workloads]]\nkind = 'imix'", "d.toml").workloads[0].generator == "auto"


def test_check_says_which_generator_each_udp_workload_gets_and_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """auto on `line` is udp-gso here (it needs only nft beside the lab's Python); one
    asked for is said so; host-to-host topologies get iperf3 with the reason; without nft
    no paced generator can be counted; bulk TCP has no generator."""
    import shutil

    text = ("topology = '{t}'\n[[workloads]]\nkind = 'udp'\n[[workloads]]\nkind = 'rfc2544'\n"
            "label = 'tg'\ngenerator = 'trafgen'\n[[workloads]]\nkind = 'tcp'\n")  # fmt: skip
    gens = preflight.generators(scenario.parse(text.format(t="line"), "g.toml"))
    assert gens == {"udp-1420": "udp-gso (the fastest here)", "tg": "trafgen (asked for)"}
    sc = scenario.parse(text.format(t="pair").replace("generator = 'trafgen'", ""), "p.toml")
    assert set(preflight.generators(sc).values()) == {
        "iperf3 (the paced generators cannot drive the sources' own host-to-host IPsec)"
    }
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda t: None if t == "nft" else real(t))
    gens = preflight.generators(scenario.parse(text.format(t="line"), "g.toml"))
    assert gens["udp-1420"].startswith("iperf3 (no nft here") and gens["tg"].startswith(
        "trafgen: no nft"
    )


def test_a_missing_scenario_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(scenario.ScenarioError, match="No such file"):
        scenario.load(tmp_path / "nope.toml")


def test_the_example_scenarios_are_valid() -> None:
    files = sorted(Path(__file__).parent.parent.glob("scenarios/*.toml"))
    assert len(files) >= 4
    for f in files:
        sc = scenario.load(f)
        assert preflight.plan(sc), f


def test_ours_gateways_run_codel_when_the_scenario_asks_and_only_then() -> None:
    """`[gateway] aqm = true` reaches ours' and ours-udp's gateway configs (`aqm = true`
    in [gateway], which ipsec-gw reads); without it their configs say nothing of it
    (a gateway on a host with an older build still reads them); other backends have no
    such setting."""
    import tomllib

    from ipsec_lab import backends
    from ipsec_lab.backends.ours import fresh_keys, gateway_config, layers
    from ipsec_lab.testbed import topology

    assert scenario.parse("[gateway]\naqm = true", "a.toml").gateway.aqm is True
    assert scenario.parse("", "a.toml").gateway.aqm is False
    for name in ("ours", "ours-udp"):
        assert backends.make(name, aqm=True).aqm is True  # type: ignore[attr-defined]
        assert backends.make(name).aqm is False  # type: ignore[attr-defined]
    assert not hasattr(backends.make("strongswan", aqm=True), "aqm")
    t = topology("line").tunnels[0]
    ls = layers("esp:aes128gcm16")
    keys = fresh_keys(ls)
    on = tomllib.loads(gateway_config("gwA", t, ls, keys, Path("/s"), aqm=True))
    off = gateway_config("gwA", t, ls, keys, Path("/s"))
    assert on["gateway"]["aqm"] is True and "aqm" not in tomllib.loads(off)["gateway"]


def test_ours_tun_queue_is_the_scenarios_or_the_gateways_default_and_in_the_row() -> None:
    """`[gateway] tun_queue = N` reaches ours' and ours-udp's gateway configs; without it
    their configs leave the gateway its default, which the backend still says (each row
    records `tun_queue`); other backends have none."""
    import tomllib

    from ipsec_lab import backends
    from ipsec_lab.backends.ours import TUN_QUEUE, fresh_keys, gateway_config, layers
    from ipsec_lab.testbed import topology

    assert scenario.parse("[gateway]\ntun_queue = 32", "a.toml").gateway.tun_queue == 32
    assert scenario.parse("", "a.toml").gateway.tun_queue is None
    assert scenario.parse("[gateway]\ntun_queue = 'auto'", "a.toml").gateway.tun_queue == "auto"
    for name in ("ours", "ours-udp"):
        assert backends.make(name, tun_queue=32).tun_queue == 32  # type: ignore[attr-defined]
        assert backends.make(name).tun_queue == TUN_QUEUE  # type: ignore[attr-defined]
    assert not hasattr(backends.make("strongswan", tun_queue=32), "tun_queue")
    t = topology("line").tunnels[0]
    ls = layers("esp:aes128gcm16")
    keys = fresh_keys(ls)
    on = tomllib.loads(gateway_config("gwA", t, ls, keys, Path("/s"), tun_queue=32))
    off = gateway_config("gwA", t, ls, keys, Path("/s"))
    assert on["gateway"]["tun_queue"] == 32 and "tun_queue" not in tomllib.loads(off)["gateway"]
    auto = tomllib.loads(gateway_config("gwA", t, ls, keys, Path("/s"), tun_queue="auto"))
    assert auto["gateway"]["tun_queue"] == "auto"
