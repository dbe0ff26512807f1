"""The lab's UDP sender (generator `udp-gso`): a bounded count of UDP datagrams of given IP
sizes to one address, handed to the source's own IP stack many per system call.

Run as a program on the traffic's source (a namespace here, a real host over ssh: it needs
only Python 3's standard library and is pushed there as one file):

    python3 udpsend.py --dst ADDR --dport PORT --sport PORT --flows N --sizes 64x1[,1500x1]
        --count N

and prints one line of JSON: the datagrams sent, the seconds from the first system call to
the last one's return, the calls made and whether UDP GSO was used.

Why: trafgen writes one frame per system call when the kernel paces it (its ring refuses a
full queue), and tops out near a quarter of a million packets a second here, below what the
pacing token bucket and a gateway can take. One size goes out as UDP GSO messages (Linux
4.18's UDP_SEGMENT, `udp(7)`): one message of up to SEGMENTS datagrams of one size, cut into
datagrams below the stack — at the first device or qdisc that cannot take it whole, here the
pacing bucket (`tbf` segments a buffer larger than its burst) — several messages per
`sendmmsg(2)`. A mix's datagrams go one message each, interleaved as trafgen's, a round per
`sendmmsg`. Each datagram is an ordinary one of the source's stack: its own IP ID, no DF
(IP_PMTUDISC_DONT: a gateway fragments what its tunnel cannot carry, as trafgen's packets
ask), its checksum the kernel's. The socket blocks while its send buffer is full: what the
bucket has not yet let out holds the sender back, as with trafgen's qdisc path.

With several flows each flow is a socket of its own bound to SPORT + i; the flows take turns
per GSO message (a call each) or per call of datagrams (whole rounds of a mix, up to 64;
trafgen's turn is per packet), so a flow's packets go in runs of up to 64. With more
destinations (`--more-dsts`: the many-tunnel testbed's, `testbed/tunnels.py`) the sockets
are not connected and each message goes to the next destination in turn: a datagram, or
a GSO message's run of up to 64, per tunnel.
Where UDP GSO is refused (a route through the kernel's IPsec: `EIO`; a kernel before 4.18,
found by its socket option) the same datagrams go one message each. An ICMP error for an
earlier datagram, reported on a later call, is counted and the count goes on; a sender
that sends nothing for STALL_S, or runs past `--deadline`, gives up (exit 1).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence

IPV4_UDP = 28  # an IPv4 header and a UDP header: what a datagram's IP size holds besides
ETHERNET = 14  # the frame header the pacing bucket counts with each datagram
SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h
IP_MTU_DISCOVER, IP_PMTUDISC_DONT = 10, 0  # linux/in.h (Python's socket has neither)
SEGMENTS = 64  # datagrams in one GSO message (the kernel's UDP_MAX_SEGMENTS is 64 or more)
MAX_GSO_PAYLOAD = 65_507 - 8  # one message's payload, under an IP packet's 64 KiB
# what a connected UDP socket's send says when an ICMP error came back for an earlier
# datagram (port or host unreachable: a sink without its counter, a gateway's own route)
ICMP_REPORTS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
STALL_S = 2.0  # no datagram sent for this long: the sender gives up (Stalled)
MESSAGES = 8  # messages per sendmmsg: GSO messages of one size, or a mix's datagrams
MIX_MESSAGES = 64


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


# struct cmsghdr (cmsg_len size_t, cmsg_level int, cmsg_type int) and CMSG_SPACE of a u16:
# 16 and 24 bytes on a 64-bit host, 12 and 16 on a 32-bit one
CMSG_HDR = struct.calcsize("@Nii")
CMSG_SPACE = CMSG_HDR + -(-2 // struct.calcsize("@N")) * struct.calcsize("@N")


def _cmsg_segment(size: int) -> bytes:
    """One control message: UDP_SEGMENT = `size` (struct cmsghdr, then a u16, padded)."""
    return struct.pack("@NiiH", CMSG_HDR + 2, SOL_UDP, UDP_SEGMENT, size).ljust(CMSG_SPACE, b"\0")


class Batch:
    """A reusable `sendmmsg` vector: `lengths[i]` payload bytes in message i, each with a
    UDP_SEGMENT of `segment` where `segment` is set."""

    def __init__(self, lengths: list[int], segment: int | None) -> None:
        n = len(lengths)
        self.lengths = lengths
        self.payload = ctypes.create_string_buffer(b"A" * max(lengths, default=1))
        self.iovs = (_Iovec * n)()
        self.msgs = (_Mmsghdr * n)()
        self.cmsg = ctypes.create_string_buffer(_cmsg_segment(segment or 0)) if segment else None
        for i, length in enumerate(lengths):
            self.iovs[i].iov_base = ctypes.addressof(self.payload)
            self.iovs[i].iov_len = length
            h = self.msgs[i].msg_hdr
            h.msg_iov = ctypes.pointer(self.iovs[i])
            h.msg_iovlen = 1
            if self.cmsg is not None:
                h.msg_control = ctypes.addressof(self.cmsg)
                h.msg_controllen = CMSG_SPACE


def segments(size: int, over: int) -> int:
    """Datagrams of `size` IP bytes in one GSO message: as many as fit (SEGMENTS, 64 KiB),
    and their frames (IP size + an Ethernet header each) more than `over` bytes — the
    pacing bucket's depth, beyond which the bucket cuts a message into its datagrams;
    0: none fit so (the datagrams go one message each)."""
    payload = size - IPV4_UDP
    if payload <= 0:
        return 0
    k = min(SEGMENTS, MAX_GSO_PAYLOAD // payload)
    return k if k * (size + ETHERNET) > over and k > 1 else 0


def interleaved(sizes: Sequence[tuple[int, int]]) -> list[int]:
    """One round of a mix of (size, packets a round): one of each size in turn while it
    has any left (7:4:1 goes S M L S M S M S M S S S). trafgen's packet file is written
    in this order too (`paced.packets`)."""
    order: list[int] = []
    left = dict(sizes)
    while any(left.values()):
        for s, _ in sizes:
            if left[s]:
                order.append(s)
                left[s] -= 1
    return order


def plan(sizes: list[tuple[int, int]], gso: bool,
         over: int = 0) -> tuple[list[int], int | None, list[int]]:  # fmt: skip
    """(payload bytes per message of one full call, the GSO segment size or None, the
    datagrams each message carries)."""
    for s, n in sizes:
        if s < IPV4_UDP or n < 1:
            raise ValueError(f"a {s}-byte IPv4 UDP packet ({n} a round) cannot be sent")
    if len(sizes) == 1 and gso and (k := segments(sizes[0][0], over)):
        payload = sizes[0][0] - IPV4_UDP
        return [payload * k] * MESSAGES, payload, [k] * MESSAGES
    order = interleaved(sizes)
    # whole rounds in a call (each call starts a round: the mix's shares stay exact)
    rounds = max(1, MIX_MESSAGES // len(order))
    lengths = [s - IPV4_UDP for s in order] * rounds
    return lengths, None, [1] * len(lengths)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def has_gso(s: socket.socket) -> bool:
    """Whether this kernel takes UDP_SEGMENT (4.18 and later): an older one refuses the
    socket option, and would pass the control message over silently (each GSO message
    would leave as one datagram, fragmented)."""
    try:
        s.setsockopt(SOL_UDP, UDP_SEGMENT, 0)  # 0: no segmenting by default
    except OSError:
        return False
    return True


class Stalled(OSError):
    """Nothing sent for STALL_S, or past the deadline: the sender gives up."""


def sockaddr(addr: str, port: int) -> ctypes.Array[ctypes.c_char]:
    """A struct sockaddr_in for `sendmmsg`'s msg_name (its family in the host's order)."""
    return ctypes.create_string_buffer(
        struct.pack("=H", socket.AF_INET) + struct.pack("!H", port) + socket.inet_aton(addr),
        16,
    )


def spread(dst: str, more: str) -> list[str]:
    """`--more-dsts FIRST:COUNT`: `dst`, then COUNT consecutive addresses from FIRST."""
    first, _, n = more.partition(":")
    base = struct.unpack("!I", socket.inet_aton(first))[0]
    count = int(n)
    if not 0 < count <= 1 << 16 or base + count > 1 << 32:
        raise ValueError(f"--more-dsts {more}: from 1 to 65,536 addresses, within IPv4")
    return [dst] + [socket.inet_ntoa(struct.pack("!I", base + k)) for k in range(count)]


def send(dst: str, dport: int, sport: int, flows: int, sizes: list[tuple[int, int]],
         count: int, gso: bool = True, over: int = 0, deadline_s: float = 3600.0,
         more: list[str] | None = None) -> dict[str, object]:  # fmt: skip
    """Send `count` datagrams within `deadline_s` seconds; what was sent (see the
    module's docstring). Stalled when no call sent anything for STALL_S (a route that
    went away answers every call with an error) or past the deadline: the lab's own
    bound on the command may end only the shell that started this on a host. `more`:
    further destinations, taken in turn with `dst` a message each (unconnected sockets:
    no ICMP error is reported then)."""
    libc = _libc()
    socks = []
    names = [sockaddr(a, dport) for a in [dst, *(more or [])]] if more else []
    for i in range(flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DONT)
        s.bind(("0.0.0.0", sport + i))
        if not names:
            s.connect((dst, dport))
        socks.append(s)
    # each flow's next message's destination, of `names`: every flow goes to every one
    cursors = [0] * flows
    gso = gso and has_gso(socks[0])
    lengths, segment, per = plan(sizes, gso, over)
    batch = Batch(lengths, segment)
    sent = calls = 0
    used_gso, refused, icmp = segment is not None, 0, 0
    t0 = time.monotonic()
    turn, progress = 0, t0
    while sent < count:
        now = time.monotonic()
        if now - progress > STALL_S or now - t0 > deadline_s:
            why = f"nothing sent for {STALL_S:g} s" if now - t0 <= deadline_s else (
                f"past its deadline of {deadline_s:g} s")  # fmt: skip
            raise Stalled(f"{why} ({sent} of {count} sent, {icmp} ICMP errors reported)")
        flow = turn % flows
        fd = socks[flow].fileno()
        turn += 1
        if segment is not None and count - sent < per[0]:
            # fewer left than a whole GSO message, which the bucket might let out
            # whole: the rest one message each
            lengths, segment, per = plan(sizes, False)
            batch = Batch(lengths, None)
        # the messages this call: all of them, or as many as the count leaves — whole
        # GSO messages only (at least one is owed: above)
        want = count - sent
        if segment:  # several flows: their turn each GSO message
            takes = [per[0]] * min(len(per) if flows == 1 else 1, want // per[0])
        else:  # whole rounds, up to MIX_MESSAGES datagrams: a flow's turn each call
            takes = [1] * min(len(per), want)
        m = len(takes)
        for j in range(m if names else 0):
            h = batch.msgs[j].msg_hdr
            h.msg_name = ctypes.addressof(names[(cursors[flow] + j) % len(names)])
            h.msg_namelen = 16
        r = libc.sendmmsg(fd, batch.msgs, m, 0)
        calls += 1
        if r < 0:
            e = ctypes.get_errno()
            if e == errno.EINTR:
                continue
            if e in ICMP_REPORTS:
                # an ICMP error for an earlier datagram, reported on this call, which
                # sent nothing: the count goes on (trafgen's frames never see one)
                icmp += 1
                continue
            if segment is not None and e in (errno.EIO, errno.EINVAL):
                # GSO refused on this route: the same datagrams, a message each
                lengths, segment, per = plan(sizes, False)
                batch = Batch(lengths, None)
                refused = e
                continue
            raise OSError(e, f"sendmmsg: {os.strerror(e)}")
        sent += sum(takes[:r])
        cursors[flow] += max(r, 0)
        if r > 0:
            progress = time.monotonic()
    took = time.monotonic() - t0
    for s in socks:
        s.close()
    return {
        "sent": sent,
        "seconds": took,
        "calls": calls,
        "gso": used_gso and not refused,
        "gso_refused": errno.errorcode.get(refused, "") if refused else "",
        "icmp_errors": icmp,
    }


def _sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        s, _, n = part.partition("x")
        out.append((int(s), int(n or 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dst", required=True)
    ap.add_argument("--dport", type=int, required=True)
    ap.add_argument("--sport", type=int, required=True)
    ap.add_argument("--flows", type=int, default=1)
    ap.add_argument("--sizes", type=_sizes, required=True, help="SIZExPER_ROUND,…")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--no-gso", action="store_true", help="a message per datagram")
    ap.add_argument(
        "--more-dsts",
        metavar="FIRST:COUNT",
        help="COUNT more destinations from FIRST on, each message to the next",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=3600.0,
        metavar="S",
        help="give up (exit 1) after S seconds, sent or not",
    )
    ap.add_argument(
        "--gso-over",
        type=int,
        default=0,
        metavar="BYTES",
        help="each GSO message's frames more than BYTES (the pacing bucket's "
        "depth), else a message per datagram",
    )
    a = ap.parse_args(argv)
    if a.count < 1 or a.flows < 1:
        ap.error("--count and --flows must be at least 1")
    try:
        more = spread(a.dst, a.more_dsts)[1:] if a.more_dsts else None
        out = send(a.dst, a.dport, a.sport, a.flows, a.sizes, a.count, not a.no_gso,
                   a.gso_over, a.deadline, more)  # fmt: skip
    except (OSError, ValueError) as e:
        print(f"udpsend: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
