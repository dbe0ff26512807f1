"""The IPComp advisor (study 1's findings), the overhead calculator (study 4's view),
capture reading, and the command-line contract of `model`, `plan`, `advise`, `overhead`."""

from __future__ import annotations

import json
import os
import subprocess
import zlib
from pathlib import Path

import pytest

from conftest import cli
from ipsec_lab.model import ipcomp as ipc
from ipsec_lab.model import overhead as ovh
from ipsec_lab.model import parse_configuration, parse_lalg
from ipsec_lab.model.pcap import CaptureError, size_histogram
from ipsec_lab.model.throughput import SyncModel, predict_mix
from ipsec_lab.studies import ferrante2005 as F

TEXT = Path(__file__).resolve().parent / "fixtures" / "prose.txt"


# --- the advisor ------------------------------------------------------------------------


def test_study1_at_10_mbit_ipcomp_beats_the_link_while_cpu_bound() -> None:
    """Costs from study 1's 100 Mbit/s figures predict its 10 Mbit/s finding: IPComp on
    compressible data is CPU-bound yet faster than the link allows without IPsec."""
    sample = ipc.published(1 - F.IPCOMP_COMPRESSIBLE_REDUCTION_10, F.PACKET_SIZE)
    a = ipc.advise(sample, F.ipcomp_costs("compressible"), 10.0)
    both, none, esp = a.case("ipcomp+esp"), a.case("none"), a.case("esp")
    assert both.limit == "cpu" and none.limit == "link" and esp.limit == "link"
    assert both.mbps > none.mbps > esp.mbps
    assert a.gain_pct > 0 and "pays" in a.verdict
    # Published: 11.67 Mbit/s measured, 17.44 "with enough CPU".
    assert both.mbps == pytest.approx(F.IPCOMP_COMPRESSIBLE_MBPS_10, rel=0.1)
    assert both.link_mbps == pytest.approx(F.IPCOMP_ENOUGH_CPU_MBPS_10, rel=0.1)


@pytest.mark.parametrize(
    "data, reduction, published",
    [
        ("compressible", F.IPCOMP_COMPRESSIBLE_REDUCTION_100, F.IPCOMP_COMPRESSIBLE_MBPS_100),
        ("incompressible", 0.0, F.IPCOMP_INCOMPRESSIBLE_MBPS_100),
    ],
)
def test_study1_at_100_mbit_ipcomp_slows_everything(
    data: str, reduction: float, published: float
) -> None:
    sample = ipc.published(1 - reduction, F.PACKET_SIZE)
    a = ipc.advise(sample, F.ipcomp_costs(data), 100.0)
    both, esp = a.case("ipcomp+esp"), a.case("esp")
    assert both.limit == "cpu" and esp.limit == "cpu"
    assert both.mbps < esp.mbps
    assert a.gain_pct < 0 and "does not pay" in a.verdict
    assert esp.mbps == pytest.approx(F.ENC_SHA1_MBPS_100, rel=0.01)
    assert both.mbps == pytest.approx(published, rel=0.1)


def test_real_text_compresses_and_random_bytes_do_not() -> None:
    text = ipc.measure(ipc.packetize(TEXT.read_bytes(), 1500))
    assert text.compressed >= text.packets - 1  # all but perhaps a short last packet
    assert text.ratio < 0.8
    rnd = ipc.measure(ipc.packetize(os.urandom(300_000), 1500))
    assert rnd.compressed == 0 and rnd.incompressible == rnd.packets
    assert rnd.ratio == 1.0
    # Each packet really compresses to what is counted (raw DEFLATE, RFC 2394).
    for p, out in zip(ipc.packetize(TEXT.read_bytes(), 1500), text.out):
        if out is not None:
            c = ipc.deflate_raw(p)
            assert len(c) == out and zlib.decompress(c, -15) == p


def test_small_packets_are_not_compressed_and_window_bits_matter() -> None:
    pkts = ipc.packetize(TEXT.read_bytes()[:4000], 80)
    r = ipc.measure(pkts, min_size=90)
    assert r.too_small == r.packets and r.compressed == 0 and r.compress_input == 0
    big = TEXT.read_bytes() * 3
    w9 = ipc.measure([big[:9000]], wbits=9).out[0]
    w15 = ipc.measure([big[:9000]], wbits=15).out[0]
    assert w9 is not None and w15 is not None and w15 < w9
    with pytest.raises(ValueError, match="window bits 16"):
        ipc.measure([big], wbits=16)


def test_packetize_makes_ip_packets_of_the_given_size() -> None:
    pkts = ipc.packetize(b"x" * 3000, 1500)
    assert [len(p) for p in pkts] == [1500, 1500, 120]
    assert all(int.from_bytes(p[2:4], "big") == len(p) for p in pkts)


# --- overhead ---------------------------------------------------------------------------


def test_transfer_counts_by_hand() -> None:
    none = ovh.transfer(parse_configuration("none"), 3000)
    # MSS: 1500 - 20 - 20 - 12 = 1448 -> 3 data segments; 2 delayed ACKs.
    assert none.segment_data == 1448
    assert none.server_to_client.packets == 1 + 3 + 2  # SYN-ACK, data, FIN + ACK
    assert none.client_to_server.packets == 1 + 1 + 2 + 2  # SYN, ACK, data ACKs, FIN + ACK
    assert none.server_to_client.ip_bytes == 60 + 2 * 1500 + (52 + 104) + 2 * 52
    esp = ovh.transfer(parse_configuration("esp:aes128gcm16"), 3000)
    # Clamped: the largest inner packet whose ESP form fits 1500 bytes.
    inner = ovh.largest_inner(parse_configuration("esp:aes128gcm16"), 1500)
    from ipsec_lab.model import wire_size

    cfg = parse_configuration("esp:aes128gcm16")
    assert wire_size(cfg, inner) <= 1500 < wire_size(cfg, inner + 1)
    assert esp.segment_data == inner - 52


def test_study4_load_increase_falls_with_size_inside_the_published_bands() -> None:
    """Study 4 (3DES with MD5 or SHA-1, ESP or AH authentication): network-load increase
    20-30 % (HTTP) / 31-44 % (SMTP) for 1 KB, 3-8 % / 4-12 % for 10 MB."""
    configs = ["esp:3des-md5", "esp:3des-sha1", "ah:md5+esp:3des", "ah:sha1+esp:3des"]
    small = ovh.transfer_view(configs, 1024, request_bytes=100)
    large = ovh.transfer_view(configs, 10 * 1024 * 1024, request_bytes=100)
    for s, lg in zip(small["configs"], large["configs"]):
        assert 20 <= s["load_pct"] <= 44, s
        assert 3 <= lg["load_pct"] <= 12, lg
        assert lg["load_pct"] < s["load_pct"]
    # AH on top of ESP adds load over ESP alone (study 4: ~6 % more for 1 KB files).
    by = {r["config"]: r["load_pct"] for r in small["configs"]}
    assert by["ah:md5+esp:3des"] > by["esp:3des-md5"]


# --- captures ---------------------------------------------------------------------------


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
        (["plan"], "one source of costs"),
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
