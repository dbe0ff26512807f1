"""The overhead calculator (study 4's view): a transfer counted by hand, and the load
increase falling with size inside the published bands."""

from __future__ import annotations

from pathlib import Path

from ipsec_lab.model import overhead as ovh
from ipsec_lab.model import parse_configuration

TEXT = Path(__file__).resolve().parent / "fixtures" / "prose.txt"


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
