"""A link's MTU as a property of the link (no root): the scenario key, and what a run
records of it — the inner packet that fits whole, worked out by hand from RFC 4303's
layout, and the note when a tunnel offers more than fits."""

from __future__ import annotations

import pytest

from ipsec_lab import scenario
from ipsec_lab.backends.mtu import facts, fragmenting_note

BASE = 'topology = "line"\nbackends = ["none"]\n[[workloads]]\nkind = "tcp"\n'


# ESP with AES-GCM-128 in tunnel mode over IPv4 (RFC 4303 §2, RFC 4106 §3): outer IPv4 20,
# SPI + sequence number 8, IV 8, ICV 16, and the inner packet + pad length + next header
# (2) padded to a multiple of 4. At 1500: 1500 - 52 = 1448 = inner + 2 -> inner 1446; in
# UDP (RFC 3948) 8 more -> 1440 -> 1438. At 1600: 1546 and 1538.
@pytest.mark.parametrize(
    ("backend", "mtu", "whole", "inner"),
    [
        ("none", 1500, 1500, None),
        ("xfrm", 1500, 1446, None),
        ("ours", 1500, 1446, 1500),
        ("ours-udp", 1500, 1438, 1500),
        ("ours", 1600, 1546, 1500),
        ("xfrm-udp", 1600, 1538, None),
        ("strongswan-kernel", 1500, 1446, None),
    ],
)
def test_what_fits_the_link_whole_is_the_links_mtu_less_esps_overhead(
    backend: str, mtu: int, whole: int, inner: int | None
) -> None:
    # `inner`: what the backend's tunnel device says it offers (ours with a fixed 1500,
    # as before `mtu = "auto"`: the summary must name it FRAGMENTING where 1500 > whole)
    f = facts("line", backend, "esp:aes128gcm16", mtu, inner)
    assert f["link_mtu"] == mtu and f["largest_whole_inner"] == whole
    assert f.get("inner_mtu") == inner
    note = fragmenting_note([f])
    assert bool(note) == (inner is not None and inner > whole)
    if note:
        assert f"offers an inner MTU of {inner} B but only {whole} B fit the {mtu}-B link" in note


def test_host_to_host_is_transport_mode_and_a_tun_that_fits_is_not_named() -> None:
    f = facts("pair", "ours", "esp:aes128gcm16", 1500, 1466)
    # transport mode: no outer header, 1500 - 32 = 1468 = inner + 2 -> 1466 (what
    # ipsec-gw's `mtu = "auto"` gives its TUN: tests/test_lab_fidelity_root.py reads it)
    assert (f["inner_mtu"], f["largest_whole_inner"]) == (1466, 1466)
    assert fragmenting_note([f]) == ""
    assert "inner_mtu" not in facts("pair", "xfrm", "esp:aes128gcm16", 1500)


def test_the_link_key_mtu_is_a_whole_number_of_bytes_named_when_wrong() -> None:
    sc = scenario.parse(BASE + '[[links]]\nname = "real"\nmtu = 1500\n', "s.toml")
    assert sc.links[0].mtu == 1500
    assert scenario.parse(BASE, "s.toml").links[0].mtu is None  # the topology's own
    for bad, why in (("1000", "outside 1280..9000"), ("1500.5", "whole number"),
                     ('"big"', "must be a number")):  # fmt: skip
        with pytest.raises(scenario.ScenarioError) as e:
            scenario.parse(BASE + f'[[links]]\nname = "real"\nmtu = {bad}\n', "s.toml")
        assert "s.toml" in str(e.value) and "mtu" in str(e.value) and why in str(e.value)


def test_a_link_the_lab_does_not_drive_has_no_mtu_figure() -> None:
    """An external DUT's link: the lab cannot read it, and says nothing fits."""
    f = facts("line", "external", "esp:aes128gcm16", None)
    assert f == {"link_mtu": None, "largest_whole_inner": None}
    assert fragmenting_note([f]) == ""
