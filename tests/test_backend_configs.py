"""What the backends write before a packet moves: strongSwan's proposals and what
libipsec cannot do, ours-udp's configuration, swanctl.conf of the clients topology."""

from __future__ import annotations

import pytest

from ipsec_lab import scenario
from ipsec_lab.backends import Unsupported
from ipsec_lab.backends.strongswan import _swanctl_conf, esp_proposal
from ipsec_lab.testbed import topology


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
