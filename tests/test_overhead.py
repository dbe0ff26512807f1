"""The overhead calculator (study 4's view): a transfer counted by hand, and the load
increase falling with size inside the published bands."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_wireguard_is_a_configuration_of_its_own_with_its_wire_sizes() -> None:
    """WireGuard's transport data message (whitepaper §5.4.6): 16 bytes of header, the
    packet zero-padded to 16, a 16-byte tag, in UDP; the largest whole inner packet is the
    MTU less all that (its padding stops at the interface's MTU)."""
    from ipsec_lab.model.overhead import largest_inner
    from ipsec_lab.model.transforms import ConfigError, Layout, parse_configuration, wire_size

    wg = parse_configuration(" WireGuard ")
    assert wg.text == "wireguard" and wg.wireguard and not wg.is_none and not wg.esp
    for size, padded in ((64, 64), (65, 80), (100, 112), (1440, 1440)):
        assert wire_size(wg, size) == 20 + 8 + 16 + padded + 16
        assert wire_size(wg, size, Layout(outer=6)) == 40 + 8 + 16 + padded + 16
    assert largest_inner(wg, 1500) == 1440 and largest_inner(wg, 1500, Layout(outer=6)) == 1420
    # the padding stops at the device's MTU: the largest packet fills the link exactly,
    # whatever the MTU and the outer family (1420 and 1340 are not multiples of 16)
    for mtu, outer in ((1500, 4), (1500, 6), (1400, 4), (9000, 4), (1280, 6)):
        top = largest_inner(wg, mtu, Layout(outer=outer))
        assert wire_size(wg, top, Layout(outer=outer, tunnel_mtu=top)) == mtu, (mtu, outer)
        assert wire_size(wg, top - 1, Layout(outer=outer, tunnel_mtu=top)) == mtu  # padded to it
    # a TCP transfer's full-size segments fill the link, not 4 bytes past it
    down = ovh.transfer(wg, 10 << 20, 1500, Layout(outer=6)).server_to_client
    assert down.ip_bytes <= down.packets * 1500
    for bad in ("wireguard+esp:aes128gcm16", "ipcomp+wireguard"):
        with pytest.raises(ConfigError, match="wireguard is a configuration of its own"):
            parse_configuration(bad)
