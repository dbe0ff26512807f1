"""The model's inputs and commands: packet sizes read from pcap and pcapng captures, and
the command-line contract of `model`, `plan`, `advise` and `overhead`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab.model import parse_lalg
from ipsec_lab.model.pcap import CaptureError, size_histogram
from ipsec_lab.model.throughput import SyncModel, predict_mix

TEXT = Path(__file__).resolve().parent / "fixtures" / "prose.txt"


def _write_captures(tmp: Path) -> tuple[Path, Path, dict[int, int]]:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, Dot1Q, Ether
    from scapy.packet import Raw
    from scapy.utils import PcapNgWriter, wrpcap

    sizes = {100: 3, 576: 2, 1500: 1, 200: 1}
    frames = []
    for size, n in sizes.items():
        for _ in range(n):
            frames.append(Ether() / IP(dst="10.9.0.1") / UDP() / Raw(b"a" * (size - 28)))
    frames.append(Ether() / Dot1Q(vlan=7) / IPv6(dst="fd00::1") / UDP() / Raw(b"b" * 52))
    frames.append(Ether() / ARP())
    pcap = tmp / "t.pcap"
    wrpcap(str(pcap), frames)
    ng = tmp / "t.pcapng"
    w = PcapNgWriter(str(ng))
    for f in frames:
        w.write(f)
    w.close()
    return pcap, ng, {**sizes, 100: sizes[100] + 1}  # the IPv6 packet is 40 + 8 + 52


def test_capture_sizes_from_pcap_and_pcapng(tmp_path: Path) -> None:
    pcap, ng, want = _write_captures(tmp_path)
    for f in (pcap, ng):
        s = size_histogram(f)
        assert dict(s.sizes) == want and s.not_ip == 1 and s.frames == 9
    m = SyncModel(0.01, 100.0, parse_lalg("ip"))
    assert predict_mix(m, size_histogram(pcap).sizes.items()).mbps == pytest.approx(
        predict_mix(m, [(100, 4), (576, 2), (1500, 1), (200, 1)]).mbps
    )


def test_capture_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no such capture"):
        size_histogram(tmp_path / "missing.pcap")
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"not a capture at all")
    with pytest.raises(CaptureError, match=r"junk\.pcap: not a pcap"):
        size_histogram(junk)


# --- the command line -------------------------------------------------------------------


def _cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    p = cli(*args, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_cli_contract_fit_and_predict() -> None:
    sync = json.loads(
        _cli("model", "fit", "--mode", "sync", "--lalg", "esp:16", "--point", "128:2.204",
             "--point", "1280:11.382", "--json").stdout
    )  # fmt: skip
    assert sync["t_fix_ms"] == pytest.approx(0.4098, rel=0.003)
    assert sync["r_alg_mbps"] == pytest.approx(21.179, rel=0.001)
    asyn = json.loads(
        _cli("model", "fit", "--mode", "async", "--lalg", "ip", "--point", "128:102.4",
             "--point", "1024:575.3", "--point", "1400:622.2", "--json").stdout
    )  # fmt: skip
    assert {"t_fix_ms", "r_alg_mbps", "t_oh_ms", "l_bp_bytes"} <= set(asyn)
    assert asyn["l_bp_bytes"] == pytest.approx(600, rel=0.005)
    pred = json.loads(
        _cli("model", "predict", "--mode", "sync", "--lalg", "esp:16", "--t-fix-ms", "0.4098",
             "--r-alg-mbps", "21.179", "--size", "64", "--size", "512", "--size", "1420",
             "--json").stdout
    )  # fmt: skip
    got = {p["size"]: p["mbps"] for p in pred["predictions"]}
    assert list(got) == [64, 512, 1420]
    assert got[512] == pytest.approx(6.718, rel=0.01)
    assert got[1420] == pytest.approx(11.983, rel=0.01)


def test_cli_predict_mix_range_and_pcap(tmp_path: Path) -> None:
    pcap, _, _ = _write_captures(tmp_path)
    doc = json.loads(
        _cli("model", "predict", "--lalg", "esp:aes128gcm16", "--t-fix-ms", "0.001",
             "--r-alg-mbps", "5000", "--range", "64:80:8", "--mix", "imix", "--pcap",
             str(pcap), "--json").stdout
    )  # fmt: skip
    assert [p["size"] for p in doc["predictions"]] == [64, 72, 80]
    assert [m["mix"] for m in doc["mixes"]] == ["imix", f"pcap:{pcap}"]
    assert doc["mixes"][1]["packets"] == 8 and doc["mixes"][1]["not_ip"] == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--point", "128:abc", "--point", "1280:11"], "'abc' is not a rate"),
        (["--point", "12x:2", "--point", "1280:11"], "not a whole number"),
        (["--point", "128:2.204"], "at least two points"),
        (["--point", "128:2", "--point", "1280:30"], "negative or infinite R_alg"),
        (["--lalg", "esp:aes999", "--point", "128:2", "--point", "1280:11"], "aes999"),
        (["--lalg", "foo", "--point", "128:2", "--point", "1280:11"], "not a secured-length"),
        (["--point", "128:-2", "--point", "1280:11"], "'-2' is negative"),
    ],
)
def test_cli_fit_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    p = _cli("model", "fit", "--lalg", "esp:16", *args, ok=False)
    assert p.returncode == 2
    assert message in p.stderr
    assert "model fit" in p.stderr
    assert "Traceback" not in p.stderr


def test_cli_predict_needs_parameters() -> None:
    p = _cli("model", "predict", "--size", "64", ok=False)
    assert p.returncode == 2 and "--t-fix-ms" in p.stderr and "--r-alg-mbps" in p.stderr
    p = _cli("model", "predict", "--mode", "async", "--t-fix-ms", "0.1", "--r-alg-mbps", "5",
             ok=False)  # fmt: skip
    assert p.returncode == 2 and "--t-oh-ms" in p.stderr


@pytest.mark.quiet  # fits the engine's times: a busy machine may leave none to fit
def test_cli_plan_overhead_advise_json(tmp_path: Path) -> None:
    plan = json.loads(
        _cli("plan", "--cycles-per-byte", "140", "--cpu-mhz", "500", "--target-mbps", "100",
             "--max-load", "1", "--json").stdout
    )  # fmt: skip
    assert plan["mhz_per_mbps"] == pytest.approx(17.5)
    assert plan["cores"] == 4  # 100 Mbit/s at 17.5 MHz each on 500 MHz cores
    bench = json.loads(_cli("plan", "--bench", "esp:aes128gcm16", "--budget-ms", "5",
                            "--cpu-mhz", "1000", "--json").stdout)  # fmt: skip
    assert bench["cycles_per_byte"] > 0 and bench["per_core_mbps"] > 0
    assert len(bench["fit"]["points"]) == 6
    over = json.loads(_cli("overhead", "--config", "esp:aes128gcm16", "--size", "64",
                           "--transfer", "1KB", "--json").stdout)  # fmt: skip
    assert over["packets"][0]["wire"] == 120
    assert over["transfers"][0]["bytes"] == 1024
    data = tmp_path / "text"
    data.write_bytes(TEXT.read_bytes())
    adv = json.loads(_cli("advise", "ipcomp", "--data", str(data), "--link-mbps", "10",
                          "--json").stdout)  # fmt: skip
    assert adv["sample"]["compressed"] > 0
    assert adv["costs"]["compress_us_per_kb"] > 0 and adv["costs"]["esp_us_per_kb"] > 0
    assert {c["name"] for c in adv["cases"]} == {"none", "esp", "ipcomp+esp"}
    ferr = json.loads(_cli("advise", "ipcomp", "--reduction-pct", "43", "--link-mbps", "10",
                           "--costs", "ferrante2005-compressible", "--json").stdout)  # fmt: skip
    assert ferr["gain_pct"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan"], "give a source of costs"),
        (["plan", "--bench", "ah:sha1"], "measures one ESP SA"),
        (["overhead", "--config", "esp:bogus"], "unknown ESP encryption"),
        (["overhead", "--transfer", "3 parsecs"], "not a size"),
        (["advise", "ipcomp", "--link-mbps", "10"], "give one sample"),
        (["advise", "ipcomp", "--data", "/nonexistent", "--link-mbps", "10"], "no such file"),
        (["advise", "ipcomp", "--reduction-pct", "40", "--link-mbps", "0"], "greater than 0"),
    ],
)
def test_cli_tools_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    p = _cli(*args, ok=False)
    assert p.returncode == 2
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_help_of_every_model_command() -> None:
    for cmd in (["model", "fit"], ["model", "predict"], ["plan"], ["advise", "ipcomp"],
                ["overhead"]):  # fmt: skip
        out = _cli(*cmd, "--help").stdout
        assert "--json" in out and "example" in out
