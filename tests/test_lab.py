"""The lab's parts that need no namespaces: scenario validation, the RFC 2544 search, the
results store, the summary, strongSwan's proposal mapping, the SMTP message, the CLI's
errors."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import cli
from ipsec_lab import preflight, runner, scenario
from ipsec_lab.backends import Unsupported
from ipsec_lab.backends.strongswan import _swanctl_conf, esp_proposal
from ipsec_lab.store import RunKey, Store
from ipsec_lab.testbed import topology
from ipsec_lab.traffic.apps import mail_message
from ipsec_lab.traffic.rfc2544 import partial_drop_rate, search

# --- scenarios ---------------------------------------------------------------------------

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
        ("speed = 3", "speed", "unknown key"),
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
        ("[gateway]\ncpus = [99]", "gateway.cpus", "CPU numbers"),
        ("[gateway]\ncpu_quota = 0", "gateway.cpu_quota", "outside"),
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
    ],
)
def test_scenario_errors_name_the_file_and_key(text: str, key: str, words: str) -> None:
    with pytest.raises(scenario.ScenarioError) as e:
        scenario.parse(text, "bad.toml")
    assert e.value.key == key
    assert str(e.value).startswith(f"bad.toml: {key}: ")
    assert words in str(e.value)


def test_a_missing_scenario_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(scenario.ScenarioError, match="No such file"):
        scenario.load(tmp_path / "nope.toml")


def test_the_example_scenarios_are_valid() -> None:
    files = sorted(Path(__file__).parent.parent.glob("scenarios/*.toml"))
    assert len(files) >= 4
    for f in files:
        sc = scenario.load(f)
        assert preflight.plan(sc), f


# --- RFC 2544 search ------------------------------------------------------------------


def _lossy_above(capacity: float, calls: list[float]) -> object:
    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        loss = 0.0 if rate <= capacity else 100 * (rate - capacity) / rate
        return {"offered_mbps": rate, "loss_pct": loss}

    return trial


@pytest.mark.parametrize("capacity", [1.0, 17.3, 63.0, 99.9])
def test_search_brackets_the_loss_free_rate_within_the_resolution(capacity: float) -> None:
    calls: list[float] = []
    r = search(_lossy_above(capacity, calls), 100.0, 0.5, 0.0, 30)  # type: ignore[arg-type]
    assert r.converged
    assert capacity - 0.5 <= r.rate_mbps <= capacity
    assert calls[0] == 100.0  # the first trial is at the top rate
    assert [t["offered_mbps"] for t in r.trials] == calls
    # every verdict agrees with the loss it saw
    assert all(t["passed"] == (t["loss_pct"] == 0) for t in r.trials)


def test_search_passing_at_the_top_stops_at_once() -> None:
    calls: list[float] = []
    r = search(_lossy_above(500, calls), 100.0, 1.0, 0.0, 30)  # type: ignore[arg-type]
    assert r.converged and r.rate_mbps == 100.0 and calls == [100.0]


def test_search_tolerance_and_trial_bound() -> None:
    calls: list[float] = []
    # 5 % loss just above 50 Mbit/s: with a 10 % tolerance the search goes higher
    r = search(_lossy_above(50, calls), 100.0, 0.1, 10.0, 40)  # type: ignore[arg-type]
    assert r.rate_mbps > 50
    calls.clear()
    r = search(_lossy_above(50, calls), 100.0, 0.001, 0.0, 4)  # type: ignore[arg-type]
    assert not r.converged and len(r.trials) == 4 and "4 trials" in r.reason


def test_search_with_nothing_passing_reports_zero() -> None:
    r = search(lambda rate: {"loss_pct": 100.0}, 10.0, 1.0, 0.0, 20)
    assert r.rate_mbps == 0.0 and r.converged


# --- store ------------------------------------------------------------------------------


def _row(mbps: float, effort: float) -> dict[str, object]:
    return {
        "mbps": mbps, "seconds": 1.0, "payload_bytes": 1000, "effort_us_per_kb": effort,
        "trials": [{"offered_mbps": 10.0, "loss_pct": 0.0, "passed": True}],
        "cpu_series": [{"t": 0.5, "user": 0.1, "system": 0.2, "softirq": 0.0, "idle": 0.7}],
    }  # fmt: skip


def test_store_keeps_finished_runs_and_resumes_the_unfinished_campaign(tmp_path: Path) -> None:
    db = tmp_path / "lab" / "results.sqlite"
    s = Store(db)
    c = s.new_campaign("t", "t.toml", "text-1", {"cpu": "x"})
    k1 = RunKey("none", "none", "l", "tcp", "f", 1)
    k2 = RunKey("strongswan", "esp:aes128gcm16", "l", "tcp", "f", 1)
    k3 = RunKey("strongswan", "ah:sha1", "l", "tcp", "f", 1)
    s.record(c, k1, "done", time.time(), results=[("tcp", _row(9.5, 5.0))])
    s.record(c, k2, "failed", time.time(), reason="charon died")
    s.record(c, k3, "skipped", time.time(), reason="no AH")
    s.close()

    s = Store(db)  # as a new process would
    assert s.resumable("text-1") == c
    assert s.resumable("other text") is None
    assert s.finished_keys(c) == {k1, k3}  # the failed run is to be retried
    s.record(c, k2, "done", time.time(), results=[("tcp", _row(9.0, 7.0))])
    runs = s.runs(c)
    assert [r["status"] for r in runs] == ["done", "skipped", "done"]  # failed one replaced
    assert runs[0]["results"][0]["mbps"] == 9.5
    assert s.trials(runs[0]["id"]) == [{"offered_mbps": 10.0, "loss_pct": 0.0, "passed": True}]
    n = s.db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    assert n == 2
    s.set_status(c, "finished")
    assert s.resumable("text-1") is None


def test_summary_medians_spread_and_ratios_to_none() -> None:
    def run(backend: str, cfg: str, rep: int, mbps: float, eff: float) -> dict[str, object]:
        return {
            "backend": backend, "configuration": cfg, "link": "l", "flow": "f",
            "workload": "tcp", "repetition": rep, "status": "done", "reason": None,
            "results": [{"label": "tcp", "mbps": mbps, "effort_us_per_kb": eff, "seconds": 1.0}],
        }  # fmt: skip

    runs = [
        run("none", "none", 1, 10.0, 2.0),
        run("none", "none", 2, 12.0, 2.0),
        run("none", "none", 3, 11.0, 2.0),
        run("strongswan", "esp:aes128gcm16", 1, 5.0, 8.0),
        run("strongswan", "esp:aes128gcm16", 2, 6.0, 10.0),
        run("strongswan", "esp:aes128gcm16", 3, 7.0, 12.0),
    ]
    runs.append(
        {"backend": "strongswan", "configuration": "ah:sha1", "link": "l", "flow": "f",
         "workload": "tcp", "status": "skipped", "reason": "no AH", "results": []}
    )  # fmt: skip
    rows = {r["configuration"]: r for r in runner.summarize(runs)}  # type: ignore[arg-type]
    none, ss = rows["none"], rows["esp:aes128gcm16"]
    assert none["mbps_median"] == 11.0 and none["n"] == 3
    assert (ss["mbps_min"], ss["mbps_median"], ss["mbps_max"]) == (5.0, 6.0, 7.0)
    assert ss["mbps_vs_none"] == pytest.approx(6 / 11)
    assert ss["effort_vs_none"] == pytest.approx(5.0)
    assert ss["mbps_cv"] == pytest.approx(1 / 6)
    assert rows["ah:sha1"]["skipped"] == "no AH"


# --- strongSwan configuration -----------------------------------------------------------


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
    text = _swanctl_conf("server", list(topo.tunnels), "aes128gcm16", "ab" * 32)
    assert text.count("esp_proposals = aes128gcm16") == 2
    assert "local_ts = 192.0.2.1/32" in text and "remote_ts = 192.0.2.2/32" in text
    assert "local_ts = 198.51.100.1/32" in text and "remote_ts = 198.51.100.2/32" in text
    assert text.count("secret = 0x" + "ab" * 32) == 2


# --- SMTP message ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1024, 10 * 1024, 1 << 20])
def test_mail_message_is_about_the_size_asked_and_well_formed(n: int) -> None:
    import email

    m = mail_message(n, random.Random(1))
    assert n - 80 <= len(m) <= n
    assert all(len(line) <= 998 for line in m.split(b"\r\n"))
    msg = email.message_from_bytes(m)
    assert msg["Content-Transfer-Encoding"] == "base64"
    assert len(msg.get_payload(decode=True)) > 0


# --- the CLI's errors ------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli(*args, timeout=60, env=env)


def test_run_with_a_bad_scenario_names_the_key_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("topology = 'star'\n")
    p = _cli("run", str(f), "--lab", str(tmp_path / "lab"))
    assert p.returncode == 2
    assert f"{f}: topology: must be one of pair, line, clients" in p.stderr
    assert not (tmp_path / "lab" / "results.sqlite").exists()


def test_results_without_a_lab_says_so(tmp_path: Path) -> None:
    p = _cli("results", "--lab", str(tmp_path / "nolab"))
    assert p.returncode == 2 and "no results in" in p.stderr


def test_results_lists_and_exports_a_campaign(tmp_path: Path) -> None:
    s = Store(tmp_path / "results.sqlite")
    c = s.new_campaign("demo", "d.toml", "x", {"cpu": "y"})
    s.record(c, RunKey("none", "none", "l", "tcp", "f", 1), "done", time.time(),
             results=[("tcp", _row(9.5, 5.0))])  # fmt: skip
    s.close()
    p = _cli("results", "--lab", str(tmp_path), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)[0]["name"] == "demo"
    p = _cli("results", str(c), "--lab", str(tmp_path), "--csv")
    assert p.returncode == 0
    header, row = p.stdout.strip().splitlines()
    assert header.startswith("campaign_id,run_id,backend") and ",9.5," in row
    p = _cli("results", "99", "--lab", str(tmp_path))
    assert p.returncode == 2 and "no campaign 99" in p.stderr


def test_run_refuses_without_root_after_checking_the_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ipsec_lab import cli

    f = tmp_path / "s.toml"
    f.write_text('backends = ["none"]\n')
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # an ordinary user
    assert cli.main(["run", str(f), "--lab", str(tmp_path / "lab")]) == 2
    assert "needs root" in capsys.readouterr().err
    assert not (tmp_path / "lab").exists()
    assert cli.main(["clean"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_the_cpu_soaker_sees_a_busy_cpu() -> None:
    import multiprocessing as mp
    import os

    from ipsec_lab.meters.soaker import Soaker

    s = Soaker()
    s.start(calibrate_s=0.5)
    try:
        cpu = s.cpus[0]

        def burn() -> None:
            os.sched_setaffinity(0, {cpu})
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                pass

        mark = s.mark()
        p = mp.get_context("fork").Process(target=burn)
        p.start()
        p.join(10)
        used = s.used_since(mark)
    finally:
        s.close()
    # the busy loop (normal priority) took CPU `cpu` from the idle-priority soaker for
    # most of the time measured
    assert used["soaker_per_cpu"][0] > 0.6, used
    assert all(0.0 <= u <= 1.0 for u in used["soaker_per_cpu"])
    assert not any(p.is_alive() for p in s.procs)


@pytest.mark.parametrize("capacity", [0.8, 4.2, 17.0, 370.0])
def test_search_narrows_to_the_rate_an_overloaded_device_delivered(capacity: float) -> None:
    """Trials that report what they delivered (at most the capacity) hint where to look:
    the same answer as plain halving from a generous ceiling, in fewer trials."""
    calls: list[float] = []

    def trial(rate: float) -> dict[str, float]:
        calls.append(rate)
        loss = 0.0 if rate <= capacity else 100 * (rate - capacity) / rate
        return {"offered_mbps": rate, "loss_pct": loss, "mbps": min(rate, capacity)}

    r = search(trial, 1000.0, 0.05, 0.0, 40)  # type: ignore[arg-type]
    plain: list[float] = []
    p = search(_lossy_above(capacity, plain), 1000.0, 0.05, 0.0, 40)  # type: ignore[arg-type]
    assert r.converged and capacity - 0.05 <= r.rate_mbps <= capacity
    assert p.converged and abs(p.rate_mbps - r.rate_mbps) <= 0.05
    assert len(calls) < len(plain)
    assert calls[1] <= 1.5 * capacity  # the second trial already sits near the capacity


@pytest.mark.parametrize("capacity", [3.0, 60.0])
def test_search_is_not_misled_by_a_device_that_delivers_little_when_overloaded(
    capacity: float,
) -> None:
    """Receive livelock: flooded, the device delivers a quarter of what it forwards
    loss-free. The hint (1.5 x that) is tried, passes, and the search goes on above it."""

    def trial(rate: float) -> dict[str, float]:
        if rate <= capacity:
            return {"offered_mbps": rate, "loss_pct": 0.0, "mbps": rate}
        return {"offered_mbps": rate, "loss_pct": 50.0, "mbps": capacity / 4}

    r = search(trial, 1000.0, 0.05, 0.0, 60)  # type: ignore[arg-type]
    assert r.converged and capacity - 0.05 <= r.rate_mbps <= capacity


def test_ndr_and_pdr_come_from_one_search() -> None:
    """A device losing nothing up to 100 Mbit/s and 0.3 % up to 120: the search for the
    NDR (0 loss) tries rates in between, and the PDR (<= 0.5 %, FD.io CSIT) is read from
    the same trials."""

    def trial(rate: float) -> dict[str, float]:
        loss = 0.0 if rate <= 100 else 0.3 if rate <= 120 else 20.0
        return {"offered_mbps": rate, "loss_pct": loss}

    r = search(trial, 1000.0, 1.0, 0.0, 30)
    assert 99.0 <= r.rate_mbps <= 100.0  # NDR
    pdr = partial_drop_rate(r.trials)
    assert r.rate_mbps < pdr <= 120.0  # the trials that lost 0.3 % count toward the PDR
    assert partial_drop_rate([{"offered_mbps": 5.0, "loss_pct": 1.0}]) == 0.0


def test_forwarding_rate_at_overload_is_the_median_delivery_of_overloaded_trials() -> None:
    from ipsec_lab.traffic.rfc2544 import forwarding_rate_at_overload

    trials = [
        {"offered_mbps": 500.0, "loss_pct": 97.0, "mbps": 40.0},  # livelock: left out
        {"offered_mbps": 45.0, "loss_pct": 0.0, "mbps": 45.0},  # passed: not overloaded
        {"offered_mbps": 90.0, "loss_pct": 10.0, "mbps": 80.0},
        {"offered_mbps": 84.0, "loss_pct": 0.0, "mbps": 78.0},  # 0 loss, arrived late
        {"offered_mbps": 81.0, "loss_pct": 1.0, "mbps": 79.0},
    ]
    mfr, spread, n = forwarding_rate_at_overload(trials, 0.1)
    assert (mfr, n) == (79.0, 3) and spread == pytest.approx(2 / 79)
    # dedicated overload trials at a fixed rate keep even a far-off one
    assert forwarding_rate_at_overload(trials[:1], 0.1, livelock=False)[0] == 40.0
    assert forwarding_rate_at_overload(trials[1:2], 0.1) == (None, None, 0)


def test_a_workload_of_several_sizes_scales_its_ceiling_to_one_packet_rate() -> None:
    sc = scenario.parse(
        "[[workloads]]\nkind = 'rfc2544'\nsizes = [128, 1280, 512]\nmax_rate_mbit = 500\n"
        "resolution_mbit = 1\noverload_trials = 3",
        "s.toml",
    )
    w = sc.workloads[0]
    assert w.all_sizes == (128, 1280, 512) and w.name == "rfc2544-128-1280-512"
    assert w.size_label(512) == "rfc2544-512"
    assert w.max_rate_for(1280) == 500 and w.max_rate_for(128) == pytest.approx(50)
    assert w.resolution_for(512) == pytest.approx(0.4)
    one = scenario.parse("[[workloads]]\nkind = 'rfc2544'\nsize = 512", "o.toml").workloads[0]
    assert one.all_sizes == (512,) and one.max_rate_for(512) == one.max_rate_mbit


def _drifting_device(
    capacity: dict[int, float], calls: list[tuple[int, float]], drift: float = 0.01
) -> Any:
    """An overloaded device whose speed drifts: every trial it gets `drift` faster, at
    every size alike (what a shared host does over minutes). A trial offered less than
    its capacity is carried whole."""

    def trial(size: int, rate: float) -> dict[str, float]:
        speed = 1 + drift * len(calls)
        calls.append((size, rate))
        cap = capacity[size] * speed
        got = min(rate, cap)
        return {"size": size, "offered_mbps": rate, "mbps": got,
                "loss_pct": 100 * (rate - got) / rate}  # fmt: skip

    return trial


def test_overload_rounds_give_every_size_every_place_and_the_same_drift() -> None:
    """Rounds rotate the sizes (each takes each place in turn), so a drift in the
    host's speed moves every size's median about alike: the ratio of two sizes' MFRs is
    the device's own to within a round's drift. One size after another, as separate runs
    measure them, the later size gets the faster minutes and the ratio is off by nine
    trials' drift."""
    from ipsec_lab.traffic.rfc2544 import forwarding_rate_at_overload, overload_rounds

    cap = {128: 10.0, 1280: 80.0, 512: 40.0}
    tops = {s: 2 * c for s, c in cap.items()}
    calls: list[tuple[int, float]] = []
    got = overload_rounds(_drifting_device(cap, calls), tops, tops, 9, 0.1)
    order = [s for s, _ in calls]
    assert order[:9] == [128, 1280, 512, 1280, 512, 128, 512, 128, 1280]
    for s in cap:  # every place in a round, three times each
        assert [order[i] for i in range(0, 27, 3)].count(s) == 3
    assert all(len(ts) == 9 and all(t["overload"] for t in ts) for ts in got.values())
    assert [t["round"] for t in got[512]] == list(range(9))

    def mfr(ts: list[dict[str, Any]]) -> float:
        m = forwarding_rate_at_overload(ts, 0.1, livelock=False)[0]
        assert m is not None
        return m

    assert mfr(got[1280]) / mfr(got[128]) == pytest.approx(8.0, rel=0.025)
    assert mfr(got[512]) / mfr(got[128]) == pytest.approx(4.0, rel=0.025)
    calls.clear()
    one_by_one = {
        s: overload_rounds(_drifting_device(cap, calls), {s: tops[s]}, tops, 9, 0.1)[s] for s in cap
    }
    assert mfr(one_by_one[1280]) / mfr(one_by_one[128]) > 8.0 * 1.06


def test_overload_rounds_offer_more_after_a_trial_the_path_carried_whole() -> None:
    """A size whose search fell short (its first overload trial is carried whole) is
    offered 1.5 x more each time, up to its ceiling; a size the path never overloads
    stops after its retries; the others are not held up by it. With the data plane's
    clock each trial is timed from quiet to quiet."""
    from ipsec_lab.traffic import rfc2544 as r

    cap = {64: 10.0, 1420: 1000.0}  # 1420: above its ceiling, never overloaded
    calls: list[tuple[int, float]] = []
    tops, ceiling = {64: 8.0, 1420: 100.0}, {64: 40.0, 1420: 120.0}
    ns = iter(range(0, 10**9, 10**6))
    clock = lambda: {"gwA": (next(ns), len(calls) * 1000)}  # noqa: E731
    old = (r.QUIET_EVERY_S, r.QUIET_MAX_S)
    r.QUIET_EVERY_S, r.QUIET_MAX_S = 0.0, 1.0
    try:
        got = r.overload_rounds(_drifting_device(cap, calls), tops, ceiling, 2, 0.1, clock)
    finally:
        r.QUIET_EVERY_S, r.QUIET_MAX_S = old
    assert [t["offered_mbps"] for t in got[64]] == [8.0, 12.0, 12.0]
    assert [t["overload"] for t in got[64]] == [False, True, True]
    assert [t["offered_mbps"] for t in got[1420]] == [100.0, 120.0, 120.0, 120.0]
    assert not any(t["overload"] for t in got[1420])
    assert len(got[1420]) == 2 + r.OVERLOAD_RETRIES
    assert all(t["plane_ns_per_packet"] and t["plane_ns_per_packet"] > 0 for t in got[64])


def test_a_row_s_bytes_are_those_its_meters_covered() -> None:
    """One size: the overload trials run inside the row's meters, so its payload bytes
    and seconds (what the CPU effort divides by) count them with the search's; several
    sizes interleaved: they ran outside every row's meters, and are only listed."""
    from ipsec_lab.traffic.rfc2544 import SearchResult, _finish, _search_row

    w = scenario.parse("[[workloads]]\nkind = 'rfc2544'\nsize = 512", "o.toml").workloads[0]
    found = [{"offered_mbps": 9.0, "loss_pct": 0.0, "passed": True, "mbps": 9.0,
              "payload_bytes": 1000, "seconds": 2.0}]  # fmt: skip
    over = [{"offered_mbps": 12.0, "loss_pct": 9.0, "mbps": 10.0, "overload": True,
             "payload_bytes": 3000, "seconds": 2.0}] * 2  # fmt: skip
    for metered, (payload, seconds) in ((True, (7000, 6.0)), (False, (1000, 2.0))):
        row = _search_row(w, 512, SearchResult(9.0, list(found)))
        _finish(row, over, 0.1, metered=metered)
        assert (row["payload_bytes"], row["seconds"]) == (payload, seconds)
        assert len(row["trials"]) == 3 and row["mfr_mbps"] == 10.0


def test_cpu_per_packet_sums_each_node_s_cpu_over_its_own_packets() -> None:
    """A packet passes gwA (sealed) and gwB (opened): its cost is each one's CPU over
    the packets it handled — not over the packets delivered, which an overloaded gwB
    may have dropped after gwA sealed them; a node that handled none adds nothing."""
    from ipsec_lab.traffic.rfc2544 import cpu_per_packet, median_spread, quiet

    before = {"gwA": (10_000_000, 1000), "gwB": (20_000_000, 900), "gwC": (5, 7)}
    after = {"gwA": (30_000_000, 3000), "gwB": (32_000_000, 2400), "gwC": (500_005, 7)}
    # gwA 20 ms / 2000 = 10 µs, gwB 12 ms / 1500 = 8 µs
    assert cpu_per_packet(before, after) == pytest.approx(18_000)
    assert cpu_per_packet(before, before) is None
    assert median_spread([18.0, 20.0, 19.0]) == (19.0, pytest.approx(2 / 19))
    assert median_spread([]) == (None, None)
    # quiet: read until the packet counts stand still
    reads = iter([{"gwA": (1, 5)}, {"gwA": (2, 9)}, {"gwA": (3, 9)}, {"gwA": (4, 99)}])
    assert quiet(lambda: next(reads)) == {"gwA": (3, 9)}


def test_the_ipsec_cpu_clock_counts_every_thread_to_the_ns() -> None:
    """The process CPU-time clock: a second thread's 0.2 s counts after it ended, and it
    agrees with /proc/PID/stat's 10 ms ticks (psutil); a gone process counts 0."""
    import os
    import threading

    from ipsec_lab.meters import process_cpu_ns, process_cpu_s

    def burn() -> None:
        end = time.thread_time() + 0.2
        while time.thread_time() < end:
            pass

    me = [os.getpid()]
    ns0, s0 = process_cpu_ns(me), process_cpu_s(me)
    t = threading.Thread(target=burn)
    t.start()
    t.join()
    ns1, s1 = process_cpu_ns(me), process_cpu_s(me)
    assert ns1 - ns0 >= 0.2e9  # the thread's own 0.2 s of CPU, at least
    assert abs((ns1 - ns0) / 1e9 - (s1 - s0)) < 0.05
    assert process_cpu_ns([2**22 + 7]) == 0


def test_only_a_data_plane_that_counts_its_packets_lends_its_clock() -> None:
    """The kernel's ESP (xfrm, strongSwan on it) is softirq time, and charon's
    kernel-libipsec counts nothing the lab reads: no clock, so no CPU-per-packet figure
    that would make their work look free; ours without running gateways has none."""
    from ipsec_lab.backends import make
    from ipsec_lab.backends.ours import Ours
    from ipsec_lab.backends.strongswan import StrongSwan

    for b in (make("none"), make("xfrm"), StrongSwan("kernel"), StrongSwan("libipsec"), Ours()):
        assert b.plane_clock() == {}, b.name


def test_a_trial_counts_what_never_arrived_beyond_what_was_in_flight() -> None:
    from ipsec_lab.traffic.rfc2544 import with_unarrived

    row = {"loss_pct": 0.0, "lost_packets": 0, "sender_packets": 1000,
           "sent_packets": 850, "unarrived_packets": 150, "seconds": 1.0}  # fmt: skip
    out = with_unarrived(row)
    # 1000 pps x 20 ms + 2 = 22 may be in flight; 128 more were queued: 12.8 %
    assert out["loss_pct"] == pytest.approx(12.8) and out["receiver_loss_pct"] == 0.0
    calm = with_unarrived({**row, "sent_packets": 990, "unarrived_packets": 10})
    assert calm["loss_pct"] == 0.0


# --- a backend that dies is not measured -------------------------------------------------


class _Testbed:
    """What Campaign._one asks of a testbed, and no namespaces."""

    def log_mark(self) -> dict[str, int]:
        return {}

    def logs_since(self, mark: dict[str, int]) -> list[tuple[str, str]]:
        return [("ipsec-gw-gwA.log", "ipsec-gw: worker inbound panicked")]


def test_a_run_whose_gateway_died_is_failed_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ipsec-gw exiting during a run (the workload itself went fine: the lab's gateways
    keep plain routes, so traffic can flow without it) fails that run and the next one,
    which is not run at all — and says which process exited, with status and log."""
    from ipsec_lab.backends.ours import Ours

    sc = scenario.parse(GOOD.replace('["none", "strongswan"]', '["ours"]'), "t.toml")
    c = runner.Campaign(sc, tmp_path / "lab")
    gw = Ours()
    gw._procs = {"gwA": subprocess.Popen(["sleep", "30"]), "gwB": subprocess.Popen(["sleep", "30"])}
    ran: list[str] = []

    def workload(tb: object, flow: object, w: object, metered: object, warmup: float) -> list:
        ran.append(w.kind)  # type: ignore[attr-defined]
        gw._procs["gwB"].kill()  # the gateway dies while traffic flows
        gw._procs["gwB"].wait()
        return [{"label": "tcp", "mbps": 95.0}]

    monkeypatch.setitem(runner.WORKLOADS, "tcp", workload)
    first, second = [p for p in c.plan if p.workload.kind == "tcp"][:2]
    try:
        c._one(_Testbed(), gw, first, "ipsec-gw test")  # type: ignore[arg-type]
        c._one(_Testbed(), gw, second, "ipsec-gw test")  # type: ignore[arg-type]
        assert gw.died() == "ipsec-gw gwB exited (status -9)"  # gwA still runs
    finally:
        gw._procs["gwA"].kill()
    runs = {r["repetition"]: r for r in c.store.runs(c.id)}
    assert [r["status"] for r in runs.values()] == ["failed", "failed"]
    assert ran == ["tcp"], "the second run must not run through a dead gateway"
    assert "ours went down during the run: ipsec-gw gwB exited (status -9)" in runs[1]["reason"]
    assert "worker inbound panicked" in runs[1]["reason"]  # the gateway's own log
    assert runs[2]["reason"].startswith("ours is down: ipsec-gw gwB exited (status -9)")


def test_key_files_and_their_directories_are_private_from_the_start(tmp_path: Path) -> None:
    """Issue 29, item 12: a file holding keys is created 0600 (never readable by others
    between a write and a chmod), a file that existed with a wider mode is narrowed before
    the keys go in, a symlink put in its place is refused, and a run's directories are
    0700 whatever the umask."""
    import os
    import stat

    from ipsec_lab.backends import private_dir, private_file

    old = os.umask(0)  # the widest umask: nothing may depend on it
    try:
        d = private_dir(tmp_path / "run" / "ipsec-gw")
        f = d / "gwA.toml"
        private_file(f, 'enc_key = "00"\n')
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        wide = d / "old.toml"
        wide.write_text("x")
        wide.chmod(0o644)
        private_file(wide, "keys\n")
        assert stat.S_IMODE(wide.stat().st_mode) == 0o600 and wide.read_text() == "keys\n"
        target = tmp_path / "elsewhere"
        target.write_text("precious\n")
        link = d / "link.toml"
        link.symlink_to(target)
        with pytest.raises(OSError):
            private_file(link, "keys\n")
        assert target.read_text() == "precious\n"
    finally:
        os.umask(old)
