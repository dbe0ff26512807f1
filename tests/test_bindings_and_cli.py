"""The Python face: known answers through the bindings, errors that name what is wrong,
and the `ipsec-lab bench --json` contract scripts depend on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ipsec_lab import DropError, SecurityAssociation, _native
from ipsec_lab.cli import main

# RFC 3602 §4 case 7: AES-128-CBC tunnel-mode ESP (SPI 0x8765, seq 2).
RFC3602_7 = dict(
    key="0123456789abcdef0123456789abcdef",
    iv="f4e765244f6407adf13dc1380f673f37",
    payload="45000054090400004001f988c0a87b03c0a87bc808009f76a90a0100b49c083d02a204000809"
    "0a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637",
    esp="0000876500000002f4e765244f6407adf13dc1380f673f37773b5241a4c449225e4f3ce5ed611b0c"
    "237ca96cf74a93013c1b0ea1a0cf70f8e4ecaec78ac53aad7a0f022b859243c647752e94a859352b"
    "8a4d4d2decd136e5c177f132ad3fbfb2201ac9904c74ee0a109e0ca1e4dfe9d5a100b842f1c22f0d",
)


def test_rfc3602_case7_through_the_bindings() -> None:
    tx = SecurityAssociation(0x8765, "aes128", enc_key=RFC3602_7["key"], mode="transport")
    esp = tx.seal_esp(
        bytes.fromhex(RFC3602_7["payload"]), 4, iv=bytes.fromhex(RFC3602_7["iv"]), seq=2
    )
    assert esp.hex() == RFC3602_7["esp"]
    rx = SecurityAssociation(
        0x8765, "aes128", enc_key=bytes.fromhex(RFC3602_7["key"]), mode="transport"
    )
    assert rx.open_esp(esp) == (bytes.fromhex(RFC3602_7["payload"]), 4)


def test_bad_sa_arguments_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"encryption key for aes128 must be 16 bytes"):
        SecurityAssociation(
            0x1000, "aes128", "sha1", enc_key="00" * 15, integ_key="00" * 20, mode="transport"
        )
    with pytest.raises(ValueError, match=r"aes128gcm16 is a combined-mode"):
        SecurityAssociation(0x1000, "aes128gcm16", "sha256", enc_key="00" * 20, mode="transport")
    with pytest.raises(ValueError, match=r"null with integrity null"):
        SecurityAssociation(0x1000, "null", "null", mode="transport")
    with pytest.raises(ValueError, match=r"unknown encryption algorithm \"des5\""):
        SecurityAssociation(0x1000, "des5", enc_key="00", mode="transport")
    with pytest.raises(ValueError, match=r"tunnel mode needs outer endpoints"):
        SecurityAssociation(0x1000, "aes128gcm16", enc_key="00" * 20)
    with pytest.raises(ValueError, match=r"SPI 5 is reserved"):
        SecurityAssociation(5, "aes128gcm16", enc_key="00" * 20, mode="transport")
    with pytest.raises(ValueError, match=r"replay window 100"):
        SecurityAssociation(
            0x1000, "aes128gcm16", enc_key="00" * 20, mode="transport", replay_window=100
        )
    with pytest.raises(ValueError, match=r"enc_key: hex key has a non-hex character"):
        SecurityAssociation(0x1000, "aes128gcm16", enc_key="zz" * 20, mode="transport")


def test_keys_never_appear_in_repr() -> None:
    key = "a1b2c3d4" * 5
    sa = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    assert "a1b2" not in repr(sa) and "redacted" in repr(sa)


def test_malformed_packet_is_a_named_drop() -> None:
    sa = SecurityAssociation(0x1000, "aes128gcm16", enc_key="00" * 20, mode="transport")
    for junk, reason in [
        (b"", "truncated"),
        (b"\x45" + b"\0" * 10, "truncated"),
        (b"\x75" + b"\0" * 40, "malformed_ip"),
    ]:
        with pytest.raises(DropError) as e:
            sa.open(junk)
        assert e.value.args[0] == reason
    assert set(sa.counters()["drops"]) == {"truncated", "malformed_ip"}
    assert set(_native.drop_reasons()) >= {
        "icv_failure",
        "replay",
        "bad_padding",
        "no_sa",
        "sequence_exhausted",
        "unknown_spi",
        "policy_mismatch",
    }


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
    assert set(doc) == {"results", "environment"}
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
    assert "cpu" in doc["environment"] and "kernel" in doc["environment"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--size", "10"], "IP packet size must be 28 to 9000"),
        (["bench", "--suite", "aes999"], "is not a proposal"),
        (["bench", "--mode", "sideways"], "invalid choice"),
        (["bench", "--budget-ms", "0"], "must be at least 1"),
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


def test_pyi_stub_matches_the_built_module() -> None:
    import ast
    from pathlib import Path

    import ipsec_lab

    stub = ast.parse((Path(ipsec_lab.__file__).parent / "_native.pyi").read_text())
    top = {
        n.name if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else n.target.id  # type: ignore[union-attr]
        for n in stub.body
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    }
    public = {n for n in dir(_native) if not n.startswith("_")}
    assert top == public
    sa_stub = next(
        n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "SecurityAssociation"
    )
    methods = {
        n.name
        for n in sa_stub.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("__")
    }
    assert methods == {n for n in dir(SecurityAssociation) if not n.startswith("_")}


def test_stage_timing_through_the_bindings() -> None:
    key = "00" * 20
    tx = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    rx = SecurityAssociation(0x1000, "aes128gcm16", enc_key=key, mode="transport")
    pkt = bytes.fromhex("450000200001000040110000c0a80001c0a80002") + bytes(12)
    rx.open(tx.seal(pkt))
    assert tx.counters()["stages"] == {} and rx.counters()["stages"] == {}
    tx.set_stage_timing(True)
    rx.set_stage_timing(True)
    for _ in range(3):
        rx.open(tx.seal(pkt))
    seal, open_ = tx.counters()["stages"], rx.counters()["stages"]
    assert isinstance(seal, dict) and isinstance(open_, dict)
    assert {"header", "padding", "iv", "cipher"} <= set(seal)
    assert {"replay_check", "cipher", "replay_update", "padding"} <= set(open_)
    assert all(v["calls"] == 3 for v in open_.values())
    tx.set_stage_timing(False)
    rx.open(tx.seal(pkt))
    assert tx.counters()["stages"]["cipher"]["calls"] == 3  # kept, not counted further


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
