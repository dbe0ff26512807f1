"""A campaign runs its backends one after another on one testbed: each backend's stop must
leave the gateways as `none` left them — rules, routes in every table, nftables, devices —
or the next backend's traffic meets what it left (ours' guard, stopped but not released,
dropped wireguard-go's packets into its blackholes). Every backend that runs here, and
then wireguard-go after each IPsec backend, carrying traffic. Needs root."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipsec_lab import backends
from ipsec_lab.backends import Unsupported
from ipsec_lab.testbed import topology
from ipsec_lab.testbed.build import Testbed

pytestmark = pytest.mark.root

CONFIG = {"wireguard-go": "wireguard"}  # the others: an ESP suite every one of them runs


def state(tb: Testbed) -> dict[str, list[str]]:
    """What a backend may change in the IPsec nodes, as text to compare."""
    out: dict[str, list[str]] = {}
    for node in tb.topo.ipsec_nodes:
        for argv in (["ip", "rule", "show"], ["ip", "-6", "rule", "show"],
                     ["ip", "route", "show", "table", "all"],
                     ["ip", "-6", "route", "show", "table", "all"],
                     ["ip", "-o", "link", "show"], ["nft", "list", "ruleset"]):  # fmt: skip
            text = tb.run(node, argv)
            if argv[-1] == "show" and "link" in argv:  # names and flags, not counters
                text = "\n".join(ln.split(" link/")[0] for ln in text.splitlines())
            # IPv6 link-local routes come as each device's address does, after the testbed
            # is built: the kernel's, whatever a backend does
            out[f"{node}: {' '.join(argv)}"] = sorted(
                ln for ln in text.splitlines() if "fe80:" not in ln and "ff00::/8" not in ln
            )
    return out


def _runs_here(name: str) -> bool:
    try:
        backends.make(name).check(CONFIG.get(name, "esp:aes128gcm16"))
    except Unsupported:
        return False
    return True


def ping(tb: Testbed) -> str:
    flow = tb.topo.flows[0]
    return tb.run(flow.source, ["ping", "-c", "2", "-i", "0.2", "-W", "2", flow.sink_addr],
                  timeout=15)  # fmt: skip


def test_each_backend_leaves_the_gateways_as_none_left_them(tmp_path: Path) -> None:
    # every entry that runs here (`strongswan` is one of its two variants, both listed)
    names = [e.name for e in backends.REGISTRY if e.namespaces and e.ipsec
             and e.name != "strongswan" and _runs_here(e.name)]  # fmt: skip
    # this machine (no ESP in its kernel): ours, ours-udp, libipsec and wireguard-go at least
    assert {"ours", "ours-udp", "strongswan-libipsec", "wireguard-go"} <= set(names), names
    with Testbed(topology("line"), tmp_path / "run") as tb:
        before = state(tb)
        for name in names:
            b = backends.make(name)
            b.start(tb, CONFIG.get(name, "esp:aes128gcm16"))
            try:
                assert " 0% packet loss" in ping(tb), name
            finally:
                b.stop(tb)
            after = state(tb)
            changed = {k: sorted(set(after[k]) ^ set(before[k])) for k in before
                       if after[k] != before[k]}  # fmt: skip
            assert not changed, f"{name} left: {changed}"
            # and the next backend carries traffic where this one ran: WireGuard's
            if name != "wireguard-go":
                wg = backends.make("wireguard-go")
                wg.start(tb, "wireguard")
                try:
                    assert " 0% packet loss" in ping(tb), f"wireguard-go after {name}"
                finally:
                    wg.stop(tb)
