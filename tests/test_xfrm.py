"""The `xfrm` backend's command lines (host side: this machine's kernel has no ESP, so
what the kernel does with them is checked in the VM tests): algorithms and key lengths
as the kernel's crypto API names them, bundle templates innermost first with the right
modes, host-to-host transport mode, forward policies only on gateways, fresh keys shared
by the two ends of a tunnel, and what the kernel cannot do refused with why."""

from __future__ import annotations

import re

import pytest

from ipsec_lab.backends import Unsupported
from ipsec_lab.backends.ours import layers
from ipsec_lab.backends.xfrm import Keys, Xfrm, commands, kernel_has
from ipsec_lab.testbed import Tunnel

GATEWAYS = Tunnel("gwA", "gwB", "192.0.2.1/24", "192.0.2.2/24", "10.1.0.0/24", "10.2.0.0/24")
HOSTS = Tunnel("hA", "hB", "192.0.2.1/24", "192.0.2.2/24", "192.0.2.1/32", "192.0.2.2/32")


def lines(configuration: str, node: str = "gwA", t: Tunnel = GATEWAYS, fwd: bool = True):
    ls = layers(configuration)
    keys = Keys.fresh(ls)
    return commands(node, t, ls, keys, forward=fwd), keys


def states(ls: list[str]) -> list[str]:
    return [x for x in ls if x.startswith("xfrm state add")]


def policies(ls: list[str]) -> list[str]:
    return [x for x in ls if x.startswith("xfrm policy add")]


@pytest.mark.parametrize(
    "configuration, algo, key_hex, icv_bits",
    [
        ("esp:aes128gcm16", "aead rfc4106(gcm(aes))", 40, "128"),
        ("esp:aes256gcm16", "aead rfc4106(gcm(aes))", 72, "128"),
        ("esp:chacha20poly1305", "aead rfc7539esp(chacha20,poly1305)", 72, "128"),
        ("esp:aes128gmac", "aead rfc4543(gcm(aes))", 40, "128"),
        ("esp:aes128-sha1", "auth-trunc hmac(sha1)", 40, "96"),
        ("esp:aes256-sha256", "auth-trunc hmac(sha256)", 64, "128"),
        ("esp:aes256-sha512", "auth-trunc hmac(sha512)", 128, "256"),
        ("esp:3des-md5", "auth-trunc hmac(md5)", 32, "96"),
        ("ah:sha384", "auth-trunc hmac(sha384)", 96, "192"),
    ],
)
def test_algorithms_and_key_lengths(
    configuration: str, algo: str, key_hex: int, icv_bits: str
) -> None:
    out, _ = lines(configuration)
    for s in states(out):
        # AH over IPv4: 32-bit alignment (RFC 4302), which Linux must be told
        assert ("flag align4" in s) == configuration.startswith("ah:"), s
        m = re.search(re.escape(algo) + r" 0x([0-9a-f]+) (\d+)", s)
        assert m, s
        assert len(m.group(1)) == key_hex and m.group(2) == icv_bits, s
        assert "replay-window 32" in s
    assert len(states(out)) == 2 and len(policies(out)) == 3


def test_cbc_and_null_encryption() -> None:
    out, _ = lines("esp:aes192-sha1")
    assert all(re.search(r"enc cbc\(aes\) 0x[0-9a-f]{48} auth-trunc", s) for s in states(out))
    out, _ = lines("esp:null-sha256")
    assert all('enc ecb(cipher_null) "" auth-trunc hmac(sha256)' in s for s in states(out))
    out, _ = lines("esp:des-sha1")
    assert all(re.search(r"enc cbc\(des\) 0x[0-9a-f]{16} ", s) for s in states(out))


def test_bundles_list_templates_innermost_first() -> None:
    out, _ = lines("ah:sha1+esp:aes128")
    pol = policies(out)
    for p in pol:
        esp, ah = p.index("proto esp mode tunnel"), p.index("proto ah mode transport")
        assert esp < ah, p  # ESP (tunnel, builds the outer header) inside AH
    out, _ = lines("ipcomp+esp:aes128-sha1")
    st = states(out)
    assert sum("proto comp spi 2 mode tunnel comp deflate" in s for s in st) == 2
    assert sum("proto esp" in s and "mode transport" in s for s in st) == 2
    for p in policies(out):
        comp, esp = p.index("proto comp spi 2 mode tunnel"), p.index("proto esp mode transport")
        assert comp < esp, p
        # inbound, IPComp may be absent (too small to compress, RFC 3173 §2.2)
        assert ("level use" in p) == (" dir out " not in p), p


def test_host_to_host_is_transport_mode_and_gateways_forward() -> None:
    out, _ = lines("esp:aes128gcm16", "hA", HOSTS, fwd=False)
    assert all("mode transport" in x for x in out if "mode" in x)
    assert [p.split(" src ")[0] for p in policies(out)] == [
        "xfrm policy add dir out", "xfrm policy add dir in",
    ]  # fmt: skip
    assert "src 192.0.2.1/32 dst 192.0.2.2/32" in policies(out)[0]
    out, _ = lines("esp:aes128gcm16")
    assert "xfrm policy add dir fwd src 10.2.0.0/24 dst 10.1.0.0/24" in policies(out)[2]


def test_both_ends_share_a_tunnels_fresh_keys() -> None:
    ls = layers("esp:aes128-sha1")
    keys = Keys.fresh(ls)
    a = states(commands("gwA", GATEWAYS, ls, keys, True))
    b = states(commands("gwB", GATEWAYS, ls, keys, True))
    # gwA's outbound SA (SPI 0x1001, A -> B) is gwB's inbound one, keys and all
    a_out = next(s for s in a if "spi 0x1001" in s)
    b_in = next(s for s in b if "spi 0x1001" in s)
    assert a_out == b_in and "src 192.0.2.1 dst 192.0.2.2" in a_out
    assert Keys.fresh(ls).keys != keys.keys  # drawn fresh each time


def test_what_the_kernel_cannot_do_is_refused_with_why() -> None:
    with pytest.raises(Unsupported, match=r"AH with AES-GMAC-128 \(RFC 4543 AH is not in Linux"):
        Xfrm().check("ah:aes128gmac")
    ok, _ = kernel_has("esp")
    if not ok:  # this machine's kernel: no ESP; say what to do
        with pytest.raises(
            Unsupported, match=r"has no ESP in xfrm.*micro-VM \(--vm\).*linux-image-amd64"
        ):
            Xfrm().check("esp:aes128gcm16")


def test_strongswan_on_the_kernel_asks_for_what_the_configuration_has() -> None:
    from ipsec_lab.backends import make
    from ipsec_lab.backends.charon_files import charon_conf, swanctl_conf
    from ipsec_lab.backends.strongswan import kernel_proposals

    assert kernel_proposals("ah:sha256+esp:aes128") == ("aes128", "sha256", False)
    assert kernel_proposals("ipcomp+esp:aes128-sha1") == ("aes128-sha1", None, True)
    assert kernel_proposals("aes128gcm16") == ("aes128gcm16", None, False)
    with pytest.raises(Unsupported, match="AES-GMAC"):
        kernel_proposals("ah:aes128gmac")
    conf = swanctl_conf("gwA", [GATEWAYS], "aes128", "00" * 32, "sha256", True, kernel=True)
    assert "encap = no" in conf and "esp_proposals = aes128\n" in conf
    assert "ah_proposals = sha256\n" in conf and "ipcomp = yes\n" in conf
    lib = swanctl_conf("gwA", [GATEWAYS], "aes128-sha1", "00" * 32)
    assert "encap = yes" in lib and "ah_proposals" not in lib
    from pathlib import Path

    assert "kernel-libipsec" not in charon_conf(Path("/v"), Path("/l"), kernel=True)
    assert "kernel-libipsec" in charon_conf(Path("/v"), Path("/l"))
    names = {n: make(n).name for n in ("strongswan-kernel", "strongswan-libipsec")}
    assert names == {"strongswan-kernel": "strongswan-kernel",
                     "strongswan-libipsec": "strongswan-libipsec"}  # fmt: skip


HOSTS6 = Tunnel("hA", "hB", "2001:db8::1", "2001:db8::2", "2001:db8::1/128", "2001:db8::2/128")
V6_IN_V4 = Tunnel("gwA", "gwB", "192.0.2.1", "192.0.2.2", "2001:db8:1::/64", "2001:db8:2::/64")


def test_udp_encapsulation_esn_and_where_the_numbers_start() -> None:
    ls = layers("ipcomp+esp:aes128-sha1")
    keys = Keys.fresh(ls)
    out = states(commands("gwA", GATEWAYS, ls, keys, True, udp_encap=True, esn=True,
                          after_seq=(1 << 32) + 5))  # fmt: skip
    esp = [s for s in out if "proto esp" in s]
    assert len(esp) == 2 and all("encap espinudp 4500 4500 0.0.0.0" in s for s in esp)
    # ESP is the bundle's outer layer, in transport mode over IPComp's tunnel
    assert all(" mode transport " in s and "flag esn " in s for s in esp)
    # the IPComp state stays inside ESP: no encapsulation, no sequence numbers
    assert all("encap" not in s and "replay" not in s for s in out if "proto comp" in s)
    outbound = next(s for s in esp if "spi 0x1001" in s)  # gwA -> gwB
    inbound = next(s for s in esp if "spi 0x2002" in s)
    assert "replay-oseq 0x5 replay-oseq-hi 0x1" in outbound and "replay-seq " not in outbound
    assert "replay-seq 0x5 replay-seq-hi 0x1" in inbound and "oseq" not in inbound
    with pytest.raises(ValueError, match="need ESN"):
        commands("gwA", GATEWAYS, ls, keys, True, after_seq=1 << 32)
    with pytest.raises(Unsupported, match="RFC 3948"):
        commands("gwA", GATEWAYS, layers("ah:sha1"), Keys.fresh(layers("ah:sha1")), True,
                 udp_encap=True)  # fmt: skip
    with pytest.raises(Unsupported, match="RFC 3948"):
        Xfrm(udp_encap=True).check("ah:sha1+esp:aes128")
    assert Xfrm(udp_encap=True).name == "xfrm-udp"


def test_tunnels_take_either_inner_family_and_ipv6_hosts_keep_neighbour_discovery() -> None:
    ls = layers("esp:aes128gcm16")
    tunnel = states(commands("gwA", V6_IN_V4, ls, Keys.fresh(ls), True))
    assert all("mode tunnel" in s and "af-unspec" in s for s in tunnel)
    pol = policies(commands("gwA", V6_IN_V4, ls, Keys.fresh(ls), True))
    assert (
        "dir out src 2001:db8:1::/64 dst 2001:db8:2::/64 priority 1000 tmpl src "
        "192.0.2.1 dst 192.0.2.2 proto esp mode tunnel" in pol[0]
    )
    assert not any("ipv6-icmp" in p for p in pol)  # ND on the outer link: no policy covers it
    hosts = commands("hA", HOSTS6, ls, Keys.fresh(ls), False)
    assert all("mode transport" in s and "af-unspec" not in s for s in states(hosts))
    nd = [p for p in policies(hosts) if "ipv6-icmp" in p]
    assert sorted(re.findall(r"dir (\w+) .* type (\d+) priority (\d+)$", "\n".join(nd), re.M)) \
        == [("in", "135", "100"), ("in", "136", "100"), ("out", "135", "100"),
            ("out", "136", "100")]  # fmt: skip
    assert all("tmpl" not in p for p in nd)  # no template: let through in clear
    protect = [p for p in policies(hosts) if "ipv6-icmp" not in p]
    assert all("priority 1000" in p for p in protect)  # ND's bypass wins (lower first)
    # IPv6 AH: no align4 (IPv6 aligns to 8 bytes as Linux does, RFC 4302 §3.3.3.2.1)
    ah = states(commands("hA", HOSTS6, layers("ah:sha256"), Keys.fresh(layers("ah:sha256")),
                         False))  # fmt: skip
    assert ah and not any("align4" in s for s in ah)


HOSTS6 = Tunnel("hA", "hB", "2001:db8::1/64", "2001:db8::2/64", "2001:db8::1/128",
                "2001:db8::2/128")  # fmt: skip


@pytest.mark.parametrize("configuration, t", [
    ("ipcomp+esp:aes128-sha256+ah:sha1", GATEWAYS),
    ("esp:aes128gcm16", HOSTS6),  # with the neighbour-discovery bypass policies
])  # fmt: skip
def test_on_real_hosts_exactly_what_was_added_is_deleted(configuration: str, t: Tunnel) -> None:
    """On a host the lab does not own it deletes each state and policy it added, by the
    state's (src, dst, protocol, SPI) and the policy's direction and selector — never a
    flush, and no key in the ledger's line."""
    from ipsec_lab.backends.xfrm import undo_commands

    ls, keys = lines(configuration, node=t.left, t=t)
    undo = undo_commands(ls)
    assert len(undo) == len(ls)
    assert not any("flush" in u for u in undo)
    for add, delete in zip(ls, undo, strict=True):
        w = add.split()
        if w[1] == "state":
            f = {w[i]: w[i + 1] for i in range(3, len(w) - 1)}
            assert delete == (f"ip xfrm state delete src {f['src']} dst {f['dst']} "
                              f"proto {f['proto']} spi {f['spi']}")  # fmt: skip
        else:
            selector = add.split(" priority ")[0].removeprefix("xfrm policy add ")
            assert delete == f"ip xfrm policy delete {selector}"
    text = " ".join(undo)
    for enc, integ in keys.keys.values():
        for k in (enc, integ):
            if k:
                assert k not in text
    if ":" in t.left_outer:
        nd = [u for u in undo if "ipv6-icmp" in u]
        assert len(nd) == 4 and all(re.search(r"type 13[56]$", u) for u in nd)


def test_on_real_hosts_the_hosts_kernel_is_probed_not_this_one() -> None:
    """With hosts, `check` refuses what no kernel can do but leaves ESP to the hosts'
    kernels (this machine's lacks it); `version` names the hosts' kernel."""
    x = Xfrm()
    x.use_hosts(object())  # type: ignore[arg-type]
    x.check("esp:aes128gcm16")  # no local probe: would be refused here otherwise
    with pytest.raises(Unsupported, match="no AH with"):
        x.check("ah:aes128gmac")
    assert "on the hosts" in x.version()
