"""What a newcomer meets first: one spelling of a configuration everywhere (with a
did-you-mean), rates with suffixes, --version, sizes in words, the MTU warning, and
plan saying when its figure is only an upper bound."""

from __future__ import annotations

import argparse
import json
import subprocess
from typing import Any

import pytest

from conftest import cli
from ipsec_lab import __version__, scenario
from ipsec_lab.cli import main
from ipsec_lab.cli.args import rate_mbps
from ipsec_lab.cli.output import human_bytes
from ipsec_lab.model.transforms import ConfigError, parse_configuration


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cli(*args, check=check)


@pytest.mark.parametrize("text", ["aes128gcm16", "esp:aes128gcm16", "ESP:AES128GCM16"])
def test_one_spelling_of_a_configuration(text: str) -> None:
    assert parse_configuration(text).text == "esp:aes128gcm16"
    assert parse_configuration("ipcomp+aes128-sha1").text == "ipcomp+esp:aes128-sha1"


def test_a_near_miss_gets_a_did_you_mean() -> None:
    with pytest.raises(ConfigError, match=r"did you mean aes128gcm16"):
        parse_configuration("aes128gcm")
    with pytest.raises(ConfigError, match=r"did you mean sha1"):
        parse_configuration("esp:aes128-sha")


def test_scenarios_store_the_one_spelling() -> None:
    sc = scenario.parse('backends = ["ours"]\nconfigurations = ["aes128gcm16"]\n')
    assert sc.configurations == ("esp:aes128gcm16",)


@pytest.mark.parametrize(
    ("text", "mbps"),
    [("100", 100.0), ("100M", 100.0), ("1G", 1000.0), ("1.5Gbit/s", 1500.0),
     ("500k", 0.5), ("10mbps", 10.0)],
)  # fmt: skip
def test_rates_take_suffixes(text: str, mbps: float) -> None:
    assert rate_mbps(text) == pytest.approx(mbps)


@pytest.mark.parametrize("text", ["fast", "-1G", "0", "1X"])
def test_bad_rates_say_how_to_write_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        rate_mbps(text)


def test_sizes_in_words() -> None:
    assert human_bytes(10 << 20) == "10 MB"
    assert human_bytes(1024) == "1 KB"
    assert human_bytes(300) == "300 B"
    assert human_bytes(1536 * 1024) == "1.5 MB"


def test_version() -> None:
    assert _cli("--version").stdout.strip() == f"ipsec-lab {__version__}"


def test_bench_takes_the_configuration_spelling_too() -> None:
    p = _cli("bench", "--suite", "esp:aes128gcm16", "--size", "64", "--op", "seal",
             "--budget-ms", "2", "--trials", "1", "--json")  # fmt: skip
    assert json.loads(p.stdout)["results"][0]["suite"] == "aes128gcm16"
    bad = _cli("bench", "--suite", "aes128gcm", check=False)
    assert bad.returncode == 2 and "did you mean aes128gcm16" in bad.stderr


def test_overhead_warns_over_the_mtu_and_prints_sizes_in_words() -> None:
    out = _cli("overhead", "--config", "esp:aes128gcm16", "--size", "1500", "--size", "1000",
               "--transfer", "10MB").stdout  # fmt: skip
    assert "a TCP transfer of 10 MB" in out
    assert "warning: esp:aes128gcm16 at 1500 B" in out and "1446 B" in out
    assert "at 1000 B" not in out  # only the packet that does not fit


@pytest.mark.quiet  # fits the engine's times: a busy machine may leave none to fit
def test_plan_from_the_engine_alone_says_it_is_an_upper_bound() -> None:
    p = _cli("plan", "--bench", "aes128gcm16", "--target-mbps", "1G", "--budget-ms", "5",
             "--trials", "1")  # fmt: skip
    assert "one core: at most" in p.stdout and "upper bound" in p.stdout
    doc = json.loads(_cli("plan", "--bench", "aes128gcm16", "--target-mbps", "100M",
                          "--budget-ms", "5", "--trials", "1", "--json").stdout)  # fmt: skip
    assert doc["costs_are"].startswith("upper bound") and doc["target_mbps"] == 100
    none = _cli("plan", "--campaign", "1", "--lab", "/nonexistent-lab", check=False)
    assert none.returncode == 2 and "no results in /nonexistent-lab" in none.stderr


def _engine_timed(monkeypatch: pytest.MonkeyPatch, busy: int) -> list[list[dict[str, Any]]]:
    """The real engine benchmark, its first `busy` timings as a busy machine can give them:
    every size far dearer than the engine is, and the small ones dearest (times that fall
    with size, which no model of a packet's cost allows)."""
    from ipsec_lab import bench

    real, seen = bench.run, []

    def timed(*a: Any, **k: Any) -> tuple[list[dict[str, Any]], float]:
        rows, other = real(*a, **k)
        if len(seen) < busy:
            rows = [dict(r, ns_per_packet=100_000.0 - 10 * int(r["size"])) for r in rows]
        seen.append(rows)
        return rows, other

    monkeypatch.setattr(bench, "run", timed)
    return seen


PLAN_BENCH = ["plan", "--bench", "aes128gcm16", "--target-mbps", "100M", "--budget-ms", "5",
              "--trials", "1"]  # fmt: skip


@pytest.mark.quiet  # fits the engine's times: a busy machine may leave none to fit
def test_plan_times_a_busy_engine_again_keeping_each_sizes_least_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _engine_timed(monkeypatch, busy=1)
    assert main([*PLAN_BENCH, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert 2 <= len(seen) <= 3  # the real timings themselves may be noisy once more
    assert any(f"the engine was timed {len(seen)} times" in n for n in doc["notes"])
    fitted = {p["size"]: p["mbps"] for p in doc["fit"]["points"]}
    least = {s: min(float(r["ns_per_packet"]) for rows in seen for r in rows
                    if int(r["size"]) == s) for s in fitted}  # fmt: skip
    assert fitted == pytest.approx({s: s * 8e3 / ns for s, ns in least.items()})
    assert all(ns < 80_000 for ns in least.values())  # the busy timing's were not kept


def test_plan_says_when_the_engine_cannot_be_timed_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = _engine_timed(monkeypatch, busy=99)
    assert main(PLAN_BENCH) == 2
    err = capsys.readouterr().err
    assert len(seen) == 3 and "did not fit the model in 3 tries" in err
    assert "quiet machine" in err and "--trials (now 1)" in err and "--budget-ms (now 5)" in err


def test_plan_from_a_lab_campaign(tmp_path: object) -> None:
    from pathlib import Path

    from ipsec_lab.store import RunKey, Store

    lab = Path(str(tmp_path)) / "lab"
    store = Store(lab / "results.sqlite")
    cid = store.new_campaign("mine", "x.toml", 'backends = ["ours"]\n', {})
    for rep, eff in ((1, 10.0), (2, 12.0), (3, 11.0)):
        store.record(cid, RunKey("ours", "esp:aes128gcm16", "unshaped", "tcp", "c-s", rep),
                     "done", 0.0, results=[("tcp", {"mbps": 900.0, "seconds": 8.0,
                                                    "payload_bytes": 9e8,
                                                    "ipsec_effort_us_per_kb": eff})])  # fmt: skip
    store.close()
    doc = json.loads(_cli("plan", "--campaign", str(cid), "--lab", str(lab), "--cpu-mhz",
                          "2048", "--target-mbps", "1G", "--json").stdout)  # fmt: skip
    # median 11 µs/kB for both gateways: 5.5 per gateway = 5.5 x 2048 / 1024 = 11 c/B
    assert doc["cycles_per_byte"] == pytest.approx(11.0)
    assert doc["costs_are"].startswith("measured")
    wrong = _cli("plan", "--campaign", str(cid), "--lab", str(lab), "--configuration",
                 "ah:sha1", check=False)  # fmt: skip
    assert wrong.returncode == 2 and "no run with the IPsec processes' CPU measured" in wrong.stderr


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("conf", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_example_gateway_configs_pass_the_gateways_own_check(conf: object) -> None:
    gw = ROOT / "target" / "release" / "ipsec-gw"
    p = subprocess.run([str(gw), "--config", str(conf), "--check"], capture_output=True,
                       text=True, timeout=30)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "usable" in p.stderr + p.stdout


def test_every_shipped_scenario_parses_and_one_uses_ours() -> None:
    files = sorted((ROOT / "scenarios").glob("*.toml"))
    backends = set()
    for f in files:
        backends |= set(scenario.load(str(f)).backends)
    assert {"ours", "ours-udp"} <= backends
