"""What the lab does to a link and asks of it, on either testbed (namespaces here, real
hosts in `hosts.testbed`): shaping its ends, its MTU, its root qdisc, its counters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ipsec_lab.testbed import Link, interface


def shape_ends(tb: interface.Testbed, link: Link, ends: Sequence[tuple[str, str]]) -> None:
    """`Testbed.shape` on the given (node, interface) ends of any testbed that runs
    commands in its nodes (namespaces here, real hosts in `hosts.testbed`)."""
    for node, ifname in ends:
        if link.mtu:
            tb.run(node, ["ip", "link", "set", "dev", ifname, "mtu", str(link.mtu)])
        if link.rate_mbit:
            off = ["tso", "gso", "tx-udp-segmentation", "gro"]
            tb.run(node, ["ethtool", "-K", ifname, *[w for f in off for w in (f, "off")]])
        tb.run(node, ["tc", "qdisc", "del", "dev", ifname, "root"], check=False)
        parent = ["root"]
        if link.needs_netem:
            netem = ["netem", "limit", "10000"]
            if link.delay_ms or link.jitter_ms:
                netem += ["delay", f"{link.delay_ms}ms"]
                if link.jitter_ms:
                    netem += [f"{link.jitter_ms}ms", "distribution", "normal"]
            if link.loss_pct:
                netem += ["loss", f"{link.loss_pct}%"]
            if link.reorder_pct:
                netem += ["reorder", f"{link.reorder_pct}%"]
            if link.duplicate_pct:
                netem += ["duplicate", f"{link.duplicate_pct}%"]
            root = ["tc", "qdisc", "add", "dev", ifname, "root", "handle", "1:"]
            tb.run(node, [*root, *netem])
            parent = ["parent", "1:1"]
        if link.rate_mbit:
            rate_bps = link.rate_mbit * 1e6 / 8
            # A bucket of 4 ms of traffic (at least 10 full frames): big enough for the
            # kernel's timer granularity, small against any measurement's seconds.
            burst = max(15_140, int(rate_bps * 0.004))
            tb.run(
                node,
                ["tc", "qdisc", "add", "dev", ifname, *parent, "handle", "10:", "tbf",
                 "rate", f"{link.rate_mbit}mbit", "burst", str(burst), "latency", "50ms"],
            )  # fmt: skip


# The kernel's own root qdiscs: an interface with one of them the lab may shape (or pace)
# and put back by deleting its own; any other is someone's, never replaced.
STOCK_QDISCS = ("noqueue", "pfifo_fast", "fq_codel", "mq", "fq", "pfifo", "none")


def link_mtu(tb: interface.Testbed, node: str, ifname: str) -> int:
    """The MTU of `ifname` on `node` now."""
    return int(json.loads(tb.run(node, ["ip", "-j", "link", "show", "dev", ifname]))[0]["mtu"])


def root_qdisc(tb: interface.Testbed, node: str, ifname: str) -> str:
    """The kind of `ifname`'s root qdisc on `node` (`none` when tc shows none)."""
    text = tb.run(node, ["tc", "-j", "qdisc", "show", "dev", ifname, "root"], check=False)
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return "none"
    return str(data[0].get("kind", "none")) if data else "none"


def link_counters(link: dict[str, Any]) -> dict[str, int]:
    """rx/tx bytes and packets of one link of `ip -j -s link show`."""
    st = link["stats64"]
    return {"rx_bytes": st["rx"]["bytes"], "rx_packets": st["rx"]["packets"],
            "tx_bytes": st["tx"]["bytes"], "tx_packets": st["tx"]["packets"]}  # fmt: skip
