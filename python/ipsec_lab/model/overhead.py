"""What IPsec adds on the wire: per packet, and for a whole application transfer (study 4).

Study 4 measured HTTP and SMTP transfers of 1 KB to 10 MB and reported, per direction, the
increase in bytes ("network load") and packets ("transactions") over no IPsec. A TCP
transfer here is counted the same way: handshake, request, data segments, delayed ACKs
(one per ``ack_every`` segments) and the closing exchange, each packet's bytes on the wire
taken from the configuration's layout. The tunnel is taken to clamp the MSS so that a
protected segment still fits the MTU (as gateways do; the alternative is fragments).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ipsec_lab.model.transforms import (
    ConfigError,
    Configuration,
    Layout,
    packet_plan,
    parse_configuration,
    wire_size,
    wireguard_overhead,
)

TCP_HEADER = 20
TCP_TIMESTAMPS = 12  # the options on every segment of a Linux connection (RFC 7323)
TCP_SYN_OPTIONS = 20  # MSS, SACK-permitted, timestamps, window scale on SYN / SYN-ACK


def per_packet(cfg: Configuration, size: int, layout: Layout | None = None) -> dict[str, Any]:
    """Wire bytes of one packet, and the bytes each algorithm works through (L_alg)."""
    plan = packet_plan(cfg, size, layout)
    w = plan.wire
    return {
        "config": cfg.text,
        "size": size,
        "wire": w,
        "overhead": w - size,
        "overhead_pct": 100 * (w - size) / size,
        "l_alg": plan.l_alg,
        "stages": plan.stages,
    }


def largest_inner(cfg: Configuration, mtu: int, layout: Layout | None = None) -> int:
    """The largest inner packet whose protected form fits ``mtu`` (the clamped size)."""
    lay = layout or Layout()
    lo = lay.inner_header + TCP_HEADER + TCP_TIMESTAMPS + 1
    if wire_size(cfg, lo, lay) > mtu:
        raise ConfigError(f"MTU {mtu} leaves no room for data under {cfg.text}")
    if cfg.wireguard:
        # its padding stops at the device's MTU (whitepaper §5.4.6): none at the MTU
        return mtu - wireguard_overhead(lay)
    size = mtu
    while wire_size(cfg, size, lay) > mtu:
        size -= 1
    return size


@dataclass
class Direction:
    packets: int = 0
    ip_bytes: int = 0  # bytes of the packets as IPsec puts them on the wire
    wire_bytes: int = 0  # plus the link-layer header

    def add(self, cfg: Configuration, size: int, lay: Layout, l2: int, count: int = 1) -> None:
        if count <= 0:
            return
        w = wire_size(cfg, size, lay)
        self.packets += count
        self.ip_bytes += count * w
        self.wire_bytes += count * (w + l2)


@dataclass
class Transfer:
    config: str
    nbytes: int
    segment_data: int  # application bytes per full segment
    server_to_client: Direction
    client_to_server: Direction

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "config": self.config,
            "bytes": self.nbytes,
            "segment_data": self.segment_data,
        }
        for name, di in (("s2c", self.server_to_client), ("c2s", self.client_to_server)):
            d[name] = {"packets": di.packets, "wire_bytes": di.wire_bytes}
        d["packets"] = self.server_to_client.packets + self.client_to_server.packets
        d["wire_bytes"] = self.server_to_client.wire_bytes + self.client_to_server.wire_bytes
        return d


def transfer(
    cfg: Configuration,
    nbytes: int,
    mtu: int = 1500,
    layout: Layout | None = None,
    request_bytes: int = 0,
    l2_bytes: int = 14,
    ack_every: int = 2,
) -> Transfer:
    """Packets and bytes of one TCP connection moving ``nbytes`` from server to client."""
    if nbytes < 0 or request_bytes < 0:
        raise ConfigError("transfer and request sizes must be zero or more bytes")
    if ack_every < 1:
        raise ConfigError("ack_every must be at least 1")
    lay = layout or Layout()
    hdr = lay.inner_header + TCP_HEADER + TCP_TIMESTAMPS
    syn = lay.inner_header + TCP_HEADER + TCP_SYN_OPTIONS
    inner_max = mtu if cfg.is_none else largest_inner(cfg, mtu, lay)
    if cfg.wireguard:  # the device's MTU is what fits the link: no padding past it
        lay = replace(lay, tunnel_mtu=inner_max)
    seg = inner_max - hdr
    if seg < 1:
        raise ConfigError(f"MTU {mtu} leaves no room for TCP data")
    s2c, c2s = Direction(), Direction()
    # Handshake (RFC 9293 §3.5).
    c2s.add(cfg, syn, lay, l2_bytes)
    s2c.add(cfg, syn, lay, l2_bytes)
    c2s.add(cfg, hdr, lay, l2_bytes)
    # The request, in as many segments as it needs.
    full, rest = divmod(request_bytes, seg)
    c2s.add(cfg, hdr + seg, lay, l2_bytes, full)
    if rest:
        c2s.add(cfg, hdr + rest, lay, l2_bytes)
    # The data, and the client's delayed ACKs (RFC 9293 §3.8.6.3: at least every 2nd
    # full segment).
    full, rest = divmod(nbytes, seg)
    s2c.add(cfg, hdr + seg, lay, l2_bytes, full)
    if rest:
        s2c.add(cfg, hdr + rest, lay, l2_bytes)
    data_segments = full + (1 if rest else 0)
    c2s.add(cfg, hdr, lay, l2_bytes, math.ceil(data_segments / ack_every))
    # Close: FIN from each side, each ACKed.
    s2c.add(cfg, hdr, lay, l2_bytes, 2)
    c2s.add(cfg, hdr, lay, l2_bytes, 2)
    return Transfer(cfg.text, nbytes, seg, s2c, c2s)


def increase(base: Transfer, other: Transfer) -> dict[str, float]:
    """Study 4's view: % increase in network load and transactions over no IPsec."""

    def pct(a: float, b: float) -> float:
        return 100 * (b - a) / a

    b, o = base, other
    return {
        "load_pct": pct(
            b.server_to_client.wire_bytes + b.client_to_server.wire_bytes,
            o.server_to_client.wire_bytes + o.client_to_server.wire_bytes,
        ),
        "load_s2c_pct": pct(b.server_to_client.wire_bytes, o.server_to_client.wire_bytes),
        "load_c2s_pct": pct(b.client_to_server.wire_bytes, o.client_to_server.wire_bytes),
        "packets_pct": pct(
            b.server_to_client.packets + b.client_to_server.packets,
            o.server_to_client.packets + o.client_to_server.packets,
        ),
    }


def transfer_view(
    configs: list[str],
    nbytes: int,
    mtu: int = 1500,
    layout: Layout | None = None,
    request_bytes: int = 0,
    l2_bytes: int = 14,
) -> dict[str, Any]:
    base = transfer(parse_configuration("none"), nbytes, mtu, layout, request_bytes, l2_bytes)
    rows = []
    for c in configs:
        t = transfer(parse_configuration(c), nbytes, mtu, layout, request_bytes, l2_bytes)
        rows.append({**t.to_json(), **increase(base, t)})
    return {"bytes": nbytes, "mtu": mtu, "none": base.to_json(), "configs": rows}
