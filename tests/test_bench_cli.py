"""`ipsec-lab bench`: the `--json` contract scripts depend on (suites, stages, configs,
study 1's bundles) and arguments refused with a message that names them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ipsec_lab.cli import main


def test_bench_json_shape() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ipsec_lab.cli",
            "bench",
            "--suite",
            "aes128gcm16",
            "--size",
            "64",
            "--size",
            "1420",
            "--budget-ms",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert set(doc) == {"results", "environment", "repetitions", "other_cpu", "busy",
                        "busy_threshold_cpus"}  # fmt: skip
    assert doc["repetitions"] == 3 and isinstance(doc["busy"], bool)
    rows = doc["results"]
    assert [(r["suite"], r["mode"], r["op"], r["size"]) for r in rows] == [
        ("aes128gcm16", "tunnel", "seal", 64),
        ("aes128gcm16", "tunnel", "open", 64),
        ("aes128gcm16", "tunnel", "seal", 1420),
        ("aes128gcm16", "tunnel", "open", 1420),
    ]
    for r in rows:
        for k in (
            "ns_per_packet",
            "mpps",
            "gbps",
            "raw_ns_per_packet",
            "ratio_to_raw",
            "us_per_kb",
        ):
            assert r[k] > 0, k
        assert r["ratio_to_raw"] == pytest.approx(r["raw_ns_per_packet"] / r["ns_per_packet"])
        assert r["mpps"] == pytest.approx(1e3 / r["ns_per_packet"])
        assert r["gbps"] == pytest.approx(r["size"] * 8 / r["ns_per_packet"])
        assert r["ns_min"] <= r["ns_per_packet"] <= r["ns_max"] and r["repetitions"] == 3
        assert r["ratio_is_noise"] == (r["ratio_to_raw"] > 1.0)
    assert "cpu" in doc["environment"] and "kernel" in doc["environment"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--size", "10"], "IP packet size must be 28 to 9000"),
        (["bench", "--suite", "aes999"], "is not a proposal"),
        (["bench", "--mode", "sideways"], "invalid choice"),
        (["bench", "--budget-ms", "0"], "must be at least 1"),
        (["bench", "--config", "wireguard"], "the engine does IPsec"),
        (["plan", "--bench", "wireguard"], "the engine benchmark measures one ESP SA"),
    ],
)
def test_bad_cli_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    assert rc == 2
    assert message in capsys.readouterr().err


def test_invalid_pairing_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["bench", "--suite", "aes128gcm16-sha1", "--size", "64", "--budget-ms", "1", "--json"])
        == 2
    )
    assert "combined-mode" in capsys.readouterr().err


def test_bench_stages_json_shape() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "bench", "--suite", "aes128-sha1",
         "--size", "1420", "--op", "seal", "--budget-ms", "5", "--stages", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    (row,) = json.loads(out.stdout)["results"]
    assert {"header", "padding", "iv", "cipher", "mac"} == set(row["stages"])
    assert row["per_byte_ns"] == pytest.approx(row["stages"]["cipher"] + row["stages"]["mac"])
    assert row["stage_timing_cost"] > -1 and 0 <= row["stage_timing_off_cost"] < 1


def test_bench_configs_and_study1_json() -> None:
    def run(*args: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "ipsec_lab.cli", "bench", *args, "--budget-ms", "3",
             "--trials", "1", "--json"],
            capture_output=True, text=True, timeout=180, check=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    doc = run("--config", "ipcomp+esp:aes128-sha1", "--data", "text", "--data", "random",
              "--op", "seal")  # fmt: skip
    by = {r["payload"]: r for r in doc["results"]}
    assert by["text"]["wire_len"] < 1420 < by["random"]["wire_len"]  # compressed vs not
    assert all(r["mbps"] > 0 and r["us_per_kb"] > 0 for r in doc["results"])
    s1 = run("--study1")
    names = [r["name"] for r in s1["rows"]]
    assert names == [
        "auth only", "enc only", "enc + SHA-1", "enc + SHA-2", "AH + ESP",
        "IPComp, compressible", "IPComp, incompressible",
    ]  # fmt: skip
    base = next(r for r in s1["rows"] if r["name"] == "enc + SHA-1")
    assert base["effort_vs_enc_sha1"] == 1.0 and base["published_effort_vs_enc_sha1"] == 1.0
    assert all(r["effort_vs_enc_sha1"] > 0 for r in s1["rows"])


def test_bench_config_errors() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "bench", "--config", "ipcomp+ah:sha1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and "give ESP" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "bench", "--config", "aes-128-gcm"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and "(did you mean aes128gcm16?)" in p.stderr
    assert p.stderr.count("aes-128-gcm") == 1  # named once, not twice


def test_bench_config_stages_split_a_bundle() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ipsec_lab.cli", "bench", "--config", "ipcomp+esp:aes128-sha1",
         "--op", "seal", "--budget-ms", "3", "--trials", "1", "--stages", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    (row,) = json.loads(out.stdout)["results"]
    # IPComp's compress and ESP's cipher and MAC land in one split, on the model's terms.
    assert {"compress", "cipher", "mac", "iv", "header"} <= set(row["stages"])
    per_byte = row["stages"]["compress"] + row["stages"]["cipher"] + row["stages"]["mac"]
    assert row["per_byte_ns"] == pytest.approx(per_byte)


@pytest.mark.quiet  # a busy loop of its own: not beside other jobs
def test_bench_on_a_busy_machine_says_so() -> None:
    """A bounded busy loop of the test's own beside the benchmark: flagged BUSY, in the
    JSON and the table."""
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic() + 20\n"
                             "while time.monotonic() < t: pass"])  # fmt: skip
    try:
        args = [sys.executable, "-m", "ipsec_lab.cli", "bench", "--suite", "aes128gcm16",
                "--size", "64", "--op", "seal", "--budget-ms", "100", "--repeat", "2"]  # fmt: skip
        doc = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True,
                                        timeout=60, check=True).stdout)  # fmt: skip
        assert doc["busy"] and doc["other_cpu"] > doc["busy_threshold_cpus"], doc
        text = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
        assert "BUSY machine" in text.stdout and "rerun on a quiet machine" in text.stdout
    finally:
        spin.kill()
        spin.wait()


def test_repetitions_keep_the_median_and_the_spread_and_flag_ratio_noise() -> None:
    from ipsec_lab import bench

    reps = iter([[{"ns_per_packet": 300.0, "raw_ns_per_packet": 200.0}],
                 [{"ns_per_packet": 100.0, "raw_ns_per_packet": 210.0}],
                 [{"ns_per_packet": 200.0, "raw_ns_per_packet": 190.0}]])  # fmt: skip
    (row,), _other = bench.repeated(lambda: next(reps), 3)
    assert (row["ns_per_packet"], row["ns_min"], row["ns_max"]) == (200.0, 100.0, 300.0)
    assert (row["raw_ns_per_packet"], row["raw_ns_min"], row["raw_ns_max"]) == (200, 190, 210)
    derived = bench._spread(row, {"ratio_to_raw": 200.0 / 200.0})
    assert derived["ratio_is_noise"] is False and derived["repetitions"] == 3
    assert bench._spread(row, {"ratio_to_raw": 1.06})["ratio_is_noise"] is True
