"""IP packets out of a capture file (pcap or pcapng), for size histograms and data samples.

scapy's raw readers do the file format; this module only finds the IP packet inside each
frame (Ethernet with VLAN tags, Linux cooked v1/v2, raw IP, BSD loopback) and takes its
size from the IP header, so a capture cut short by its snap length still counts each
packet at its real size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ipsec_lab.units import plural

ETH_VLAN = (0x8100, 0x88A8, 0x9100)
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
# Link-layer header types (tcpdump.org/linktypes): header length before the IP packet,
# or None where it must be read from the frame.
LINKTYPE_NULL, LINKTYPE_ETHERNET, LINKTYPE_RAW_OLD, LINKTYPE_RAW = 0, 1, 12, 101
LINKTYPE_LOOP, LINKTYPE_SLL, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_SLL2 = 108, 113, 228, 229, 276


class CaptureError(ValueError):
    """A capture that cannot be read, naming the file and why."""


@dataclass
class CaptureSummary:
    sizes: Counter[int] = field(default_factory=Counter)
    frames: int = 0
    not_ip: int = 0  # frames without an IPv4/IPv6 packet (ARP, other link types, ...)

    @property
    def packets(self) -> int:
        return sum(self.sizes.values())


def _ip_offset(linktype: int, frame: bytes) -> int | None:
    if linktype in (LINKTYPE_RAW, LINKTYPE_RAW_OLD, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return 0
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        return 4
    if linktype == LINKTYPE_SLL:
        return 16 if len(frame) >= 16 and _be16(frame, 14) in (ETH_IPV4, ETH_IPV6) else None
    if linktype == LINKTYPE_SLL2:
        return 20 if len(frame) >= 20 and _be16(frame, 0) in (ETH_IPV4, ETH_IPV6) else None
    if linktype == LINKTYPE_ETHERNET:
        off, etype = 12, _be16(frame, 12) if len(frame) >= 14 else -1
        while etype in ETH_VLAN and len(frame) >= off + 8:
            off += 4
            etype = _be16(frame, off)
        return off + 2 if etype in (ETH_IPV4, ETH_IPV6) else None
    return None


def _be16(b: bytes, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


def ip_packet_size(ip: bytes) -> int | None:
    """The IP packet's own length from its header (None if it is not IPv4/IPv6)."""
    if len(ip) < 1:
        return None
    version = ip[0] >> 4
    if version == 4 and len(ip) >= 4:
        return _be16(ip, 2)
    if version == 6 and len(ip) >= 6:
        plen = _be16(ip, 4)
        return 40 + plen if plen else None  # 0 = jumbogram: not a size we model
    return None


def ip_packets(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """(real size, captured bytes) of each IP packet in a capture; non-IP frames skipped."""
    for _, size, ip in _frames(path):
        if size is not None:
            yield size, ip


def _frames(path: str | Path) -> Iterator[tuple[bytes, int | None, bytes]]:
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapReader

    p = Path(path)
    if p.is_dir():
        raise CaptureError(f"{p}: is a directory; give a capture file (pcap or pcapng)")
    if not p.exists():
        raise CaptureError(f"{p}: no such capture file")
    if p.is_file() and p.stat().st_size == 0:
        raise CaptureError(f"{p}: empty (a capture has at least its file header)")
    try:
        reader = RawPcapReader(str(p))
    except (Scapy_Exception, OSError, EOFError) as e:
        raise CaptureError(f"{p}: not a pcap or pcapng capture ({e})") from None
    with reader:
        default_lt = getattr(reader, "linktype", None)
        try:
            for frame, meta in reader:
                lt = getattr(meta, "linktype", None)
                lt = default_lt if lt is None else lt
                off = _ip_offset(int(lt if lt is not None else -1), frame)
                if off is None:
                    yield frame, None, b""
                    continue
                ip = frame[off:]
                yield frame, ip_packet_size(ip), ip
        except Scapy_Exception as e:
            raise CaptureError(f"{p}: capture is damaged ({e})") from None


def size_histogram(path: str | Path) -> CaptureSummary:
    out = CaptureSummary()
    for _, size, _ in _frames(path):
        out.frames += 1
        if size is None:
            out.not_ip += 1
        else:
            out.sizes[size] += 1
    if not out.sizes:
        raise CaptureError(f"{path}: no IPv4 or IPv6 packets in {plural(out.frames, 'frame')}")
    return out
