//! GRO on the way into the TUN device: opened packets that continue one TCP (or UDP) flow
//! are joined into one large packet the kernel takes in a single write, with a virtio-net
//! header (virtio spec 1.2 §5.1.6.2; Linux `include/uapi/linux/virtio_net.h`) asking it to
//! cut the packet up again only if it must leave the host.
//!
//! The rules are those of the kernel's GRO and of wireguard-go's `tun/offload_linux.go`
//! (which tun-rs's `send_multiple` ports): TCP segments join when they have the same
//! addresses, ports and acknowledgment number, follow each other in sequence, carry the
//! same IP header fields (TOS/traffic class, TTL/hop limit, DF) and TCP options, have only
//! ACK (or ACK and PSH, which ends the packet) set, and no segment is larger than the first;
//! a shorter one ends the packet. UDP datagrams of one flow join the same way where the
//! device takes UDP segmentation (Linux 6.2+). Each joined segment's checksum is checked
//! first: the joined packet goes up with a partial checksum the kernel trusts, so a
//! corrupt segment must not hide in it.
//!
//! Written here rather than taken from tun-rs because tun-rs copies each packet it
//! looks at into a fresh `Vec` (an allocation per packet on the hot path) and copies it
//! twice more; here a packet is copied once, straight into the buffer it is written from.
//! One more rule than wireguard-go's: packets of one connection are never reordered — a
//! packet of a connection that cannot join its open packet closes it, so nothing that
//! arrives later is written ahead of it.

use ipsec::wire::ip::{v4, v6, IPV4_DF};
use ipsec::wire::l4::{tcp, udp};
use std::os::fd::{AsRawFd, RawFd};

use ipsec::MAX_PACKET;
use tun_rs::SyncDevice;
use tun_rs::{
    checksum, checksum_no_fold, VirtioNetHdr, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
    VIRTIO_NET_HDR_GSO_UDP_L4, VIRTIO_NET_HDR_LEN,
};

use crate::stats::Io;
use crate::sys;

const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
/// UDP GSO cuts at most this many datagrams from one packet (UDP_MAX_SEGMENTS before
/// Linux 6.1).
const MAX_UDP_SEGMENTS: usize = 64;
const TCP: u8 = 6;
const UDP: u8 = 17;
/// VIRTIO_NET_HDR_F_NEEDS_CSUM: the checksum at csum_start + csum_offset holds the
/// pseudo-header sum; the rest is to be summed (CHECKSUM_PARTIAL).
const NEEDS_CSUM: u8 = 1;

/// A connection: protocol, addresses and ports.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Conn {
    proto: u8,
    v6: bool,
    /// Source then destination address (IPv4: the first 8 bytes).
    addrs: [u8; 32],
    ports: [u8; 4],
}

/// What a packet is to GRO.
enum Parsed {
    /// A segment that may join (or start) a joined packet.
    Segment(Segment),
    /// TCP or UDP that cannot join (SYN, FIN, no payload, …): it closes its connection's
    /// open packet, to keep the connection's order.
    Closes(Conn),
    /// Anything else: written as it is, and it closes every open packet.
    Other,
}

#[derive(Clone, Copy)]
struct Segment {
    conn: Conn,
    /// TCP: the acknowledgment number (segments acknowledging differently do not join).
    ack: u32,
    seq: u32,
    psh: bool,
    iph: usize,
    /// The TCP (20–60 bytes) or UDP (8) header's length.
    l4h: usize,
    payload: usize,
}

/// One buffer's packet: a segment others may join, or a packet written as it is.
struct Item {
    /// The first segment, when the packet is one others may join (or have joined).
    first: Option<Segment>,
    /// More may still join.
    open: bool,
    segments: usize,
    gso_size: usize,
    next_seq: u32,
}

/// Opened packets waiting for the TUN device, joined where they may be.
pub struct Coalescer {
    bufs: Vec<Vec<u8>>,
    items: Vec<Item>,
    /// The device takes a virtio-net header before each packet (IFF_VNET_HDR): the only
    /// way to hand it a joined packet. Without it packets are written one by one.
    vnet: bool,
    /// The device takes UDP segmentation offload (TUN_F_USO4/6).
    udp: bool,
}

impl Coalescer {
    /// Room for `slots` packets, each buffer large enough for a whole joined packet.
    pub fn new(slots: usize, vnet: bool, udp: bool) -> Coalescer {
        Coalescer {
            bufs: (0..slots)
                .map(|_| {
                    let mut b = crate::sys::resident(VIRTIO_NET_HDR_LEN + MAX_PACKET);
                    b.clear();
                    b
                })
                .collect(),
            items: Vec::with_capacity(slots),
            vnet,
            udp: vnet && udp,
        }
    }

    /// Every buffer holds a packet: `flush` before the next `push`.
    pub fn is_full(&self) -> bool {
        self.items.len() == self.bufs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Take one IP packet (copied): joined to an open packet of its flow, or in a buffer
    /// of its own. The caller flushes when full.
    pub fn push(&mut self, pkt: &[u8]) {
        debug_assert!(!self.is_full());
        let parsed = if self.vnet && pkt.len() <= MAX_PACKET {
            parse(pkt, self.udp)
        } else {
            Parsed::Other
        };
        match parsed {
            Parsed::Segment(s) => {
                if self.join(pkt, &s) {
                    return;
                }
                self.close(&s.conn);
                let ok = segment_checksum_ok(pkt, &s);
                self.start(pkt, ok.then_some(s));
            }
            Parsed::Closes(conn) => {
                self.close(&conn);
                self.start(pkt, None);
            }
            Parsed::Other => {
                // Not knowing whose it is (a fragment, IP options, ICMP…), nothing that
                // came before it may take a later packet.
                for it in self.items.iter_mut() {
                    it.open = false;
                }
                self.start(pkt, None);
            }
        }
    }

    /// Join `pkt` to the open packet of its connection, if the rules allow.
    fn join(&mut self, pkt: &[u8], s: &Segment) -> bool {
        let Some(i) = self
            .items
            .iter()
            .rposition(|it| it.open && it.first.is_some_and(|f| f.conn == s.conn))
        else {
            return false;
        };
        let vnet = self.vnet_len();
        let (it, buf) = (&mut self.items[i], &mut self.bufs[i]);
        let Some(first) = it.first else { return false };
        let head = &buf[vnet..];
        let fits = s.ack == first.ack
            && s.l4h == first.l4h
            && s.payload <= it.gso_size
            && head.len() + s.payload <= MAX_PACKET
            && if s.conn.proto == TCP {
                s.seq == it.next_seq && tcp_options(pkt, s) == tcp_options(head, &first)
            } else {
                it.segments < MAX_UDP_SEGMENTS
            }
            && ip_headers_match(pkt, head)
            && ipv4_id_follows(pkt, head, it.segments)
            && segment_checksum_ok(pkt, s);
        if !fits {
            return false;
        }
        buf.extend_from_slice(&pkt[s.iph + s.l4h..]);
        it.segments += 1;
        it.next_seq = s.seq.wrapping_add(s.payload as u32);
        if s.psh {
            buf[vnet + first.iph + 13] |= tcp::FLAG_PSH;
        }
        // PSH ends a joined packet; so does a shorter segment (only the last may be) and
        // a full buffer.
        if s.psh || s.payload < it.gso_size || buf.len() - vnet + it.gso_size > MAX_PACKET {
            it.open = false;
        }
        true
    }

    fn vnet_len(&self) -> usize {
        if self.vnet {
            VIRTIO_NET_HDR_LEN
        } else {
            0
        }
    }

    /// No packet of `conn` joins what is open: something of the connection came between.
    fn close(&mut self, conn: &Conn) {
        for it in self.items.iter_mut() {
            if it.first.is_some_and(|f| f.conn == *conn) {
                it.open = false;
            }
        }
    }

    /// `pkt` in the next buffer; `open`: a segment others may join.
    fn start(&mut self, pkt: &[u8], open: Option<Segment>) {
        let vnet = self.vnet_len();
        let buf = &mut self.bufs[self.items.len()];
        buf.clear();
        buf.resize(vnet, 0);
        buf.extend_from_slice(pkt);
        self.items.push(Item {
            first: open,
            open: open.is_some_and(|s| !s.psh),
            segments: 1,
            gso_size: open.map_or(0, |s| s.payload),
            next_seq: open.map_or(0, |s| s.seq.wrapping_add(s.payload as u32)),
        });
    }

    /// Hand each packet, joined ones with their headers fixed and a virtio-net header
    /// describing them, to `write` (in the order their first segments came); `write`
    /// returns whether the device took it. Returns how many it refused.
    pub fn flush(&mut self, mut write: impl FnMut(&[u8]) -> bool) -> u64 {
        let mut refused = 0;
        for (it, buf) in self.items.iter().zip(self.bufs.iter_mut()) {
            if self.vnet {
                let hdr = match it.first {
                    Some(first) if it.segments > 1 => finish(buf, &first, it.gso_size),
                    _ => VirtioNetHdr::default(),
                };
                // The buffer starts with VIRTIO_NET_HDR_LEN bytes reserved for it.
                let _ = hdr.encode(&mut buf[..VIRTIO_NET_HDR_LEN]);
            }
            if !write(buf) {
                refused += 1;
            }
        }
        self.items.clear();
        refused
    }
}

/// A 16-bit big-endian field.
fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

/// The fields of a joinable packet, or why it is not one.
fn parse(pkt: &[u8], udp_ok: bool) -> Parsed {
    let Some(&first) = pkt.first() else {
        return Parsed::Other;
    };
    let mut addrs = [0u8; 32];
    let (iph, proto, v6) = match first >> 4 {
        4 => {
            // No options, the whole packet, not a fragment (MF clear, offset 0).
            if pkt.len() < IPV4_HEADER_LEN
                || first & 0x0f != 5
                || usize::from(be16(&pkt[v4::TOTAL_LEN])) != pkt.len()
                || be16(&pkt[v4::FLAGS_FRAG]) & 0x3fff != 0
            {
                return Parsed::Other;
            }
            addrs[..8].copy_from_slice(&pkt[v4::SRC.start..v4::DST.end]);
            (IPV4_HEADER_LEN, pkt[v4::PROTOCOL], false)
        }
        6 => {
            // TCP or UDP right after the fixed header (no extension headers).
            if pkt.len() < IPV6_HEADER_LEN
                || usize::from(be16(&pkt[v6::PAYLOAD_LEN])) != pkt.len() - IPV6_HEADER_LEN
            {
                return Parsed::Other;
            }
            addrs.copy_from_slice(&pkt[v6::SRC.start..v6::DST.end]);
            (IPV6_HEADER_LEN, pkt[v6::NEXT_HEADER], true)
        }
        _ => return Parsed::Other,
    };
    let l4 = &pkt[iph..];
    let min = if proto == TCP {
        tcp::HEADER_LEN
    } else {
        udp::HEADER_LEN
    };
    if !(proto == TCP || proto == UDP) || l4.len() < min {
        return Parsed::Other;
    }
    let conn = Conn {
        proto,
        v6,
        addrs,
        ports: l4[tcp::PORTS].try_into().unwrap(), // the same 4 bytes in UDP
    };
    let mut s = Segment {
        conn,
        ack: 0,
        seq: 0,
        psh: false,
        iph,
        l4h: udp::HEADER_LEN,
        payload: 0,
    };
    if proto == TCP {
        let l4h = usize::from(l4[tcp::DATA_OFFSET] >> 4) * 4;
        let flags = l4[tcp::FLAGS];
        if !(tcp::HEADER_LEN..=60).contains(&l4h)
            || l4.len() <= l4h
            || (flags != tcp::FLAG_ACK && flags != tcp::FLAG_ACK | tcp::FLAG_PSH)
        {
            return Parsed::Closes(conn);
        }
        s.l4h = l4h;
        s.seq = u32::from_be_bytes(l4[tcp::SEQ].try_into().unwrap());
        s.ack = u32::from_be_bytes(l4[tcp::ACK].try_into().unwrap());
        s.psh = flags & tcp::FLAG_PSH != 0;
    } else if !udp_ok || l4.len() <= udp::HEADER_LEN || usize::from(be16(&l4[udp::LEN])) != l4.len()
    {
        return Parsed::Closes(conn);
    }
    s.payload = l4.len() - s.l4h;
    Parsed::Segment(s)
}

/// The pseudo-header sum (RFC 793 §3.1, RFC 768; RFC 8200 §8.1 for IPv6) of a packet
/// whose transport part is `l4_len` bytes.
fn pseudo_sum(pkt: &[u8], s: &Segment, l4_len: usize) -> u64 {
    let addrs = if s.conn.v6 {
        &pkt[v6::SRC.start..v6::DST.end]
    } else {
        &pkt[v4::SRC.start..v4::DST.end]
    };
    let len = (l4_len as u16).to_be_bytes();
    checksum_no_fold(
        &[0, s.conn.proto, len[0], len[1]],
        checksum_no_fold(addrs, 0),
    )
}

/// The segment's TCP/UDP checksum verifies (RFC 1071: the sum over the pseudo-header and
/// the transport part, checksum included, is all ones).
fn segment_checksum_ok(pkt: &[u8], s: &Segment) -> bool {
    let l4 = &pkt[s.iph..];
    checksum(l4, pseudo_sum(pkt, s, l4.len())) == 0xffff
}

/// A TCP segment's options (what follows the 20 fixed header bytes).
fn tcp_options<'a>(pkt: &'a [u8], s: &Segment) -> &'a [u8] {
    &pkt[s.iph + tcp::HEADER_LEN..s.iph + s.l4h]
}

/// The fields that must be equal for IP packets to join (as the kernel's `inet_gro_receive`
/// and `ipv6_gro_receive` compare them): IPv4 TOS, DF and TTL; IPv6 traffic class, flow
/// label and hop limit (the first 32-bit word whole: segmentation copies the first
/// segment's header to every segment, so a different flow label would be lost — found by
/// the `gro` fuzz target).
fn ip_headers_match(a: &[u8], b: &[u8]) -> bool {
    if a[0] >> 4 == 6 {
        a[v6::VER_TC_FLOW] == b[v6::VER_TC_FLOW] && a[v6::HOP_LIMIT] == b[v6::HOP_LIMIT]
    } else {
        a[v4::TOS] == b[v4::TOS]
            && be16(&a[v4::FLAGS_FRAG]) >> 13 == be16(&b[v4::FLAGS_FRAG]) >> 13 // the flags
            && a[v4::TTL] == b[v4::TTL]
    }
}

/// IPv4 without DF: the ID must be the first segment's plus the segments joined so far,
/// as `inet_gro_receive` requires — segmentation numbers the segments so, and the ID of a
/// packet that may be fragmented on its way must be kept (found by the `gro` fuzz
/// target). With DF the ID identifies nothing (RFC 6864 §4.1) and is renumbered.
fn ipv4_id_follows(pkt: &[u8], first: &[u8], joined: usize) -> bool {
    if pkt[0] >> 4 != 4 || be16(&pkt[v4::FLAGS_FRAG]) & IPV4_DF != 0 {
        return true;
    }
    let id = |p: &[u8]| be16(&p[v4::IDENT]);
    id(pkt) == id(first).wrapping_add(joined as u16)
}

/// Fix a joined packet's IP length (and IPv4 header checksum), UDP length, and put the
/// pseudo-header sum in its transport checksum for the kernel to complete; the virtio-net
/// header that says so.
fn finish(buf: &mut [u8], first: &Segment, gso_size: usize) -> VirtioNetHdr {
    let pkt = &mut buf[VIRTIO_NET_HDR_LEN..];
    let (len, iph) = (pkt.len(), first.iph);
    let l4_len = len - iph;
    if first.conn.v6 {
        pkt[v6::PAYLOAD_LEN].copy_from_slice(&(l4_len as u16).to_be_bytes());
    } else {
        pkt[v4::TOTAL_LEN].copy_from_slice(&(len as u16).to_be_bytes());
        pkt[v4::CHECKSUM].fill(0);
        let c = !checksum(&pkt[..iph], 0);
        pkt[v4::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
    let (gso_type, csum_offset) = match (first.conn.proto, first.conn.v6) {
        (UDP, _) => {
            let at = iph + udp::LEN.start;
            pkt[at..at + 2].copy_from_slice(&(l4_len as u16).to_be_bytes());
            (VIRTIO_NET_HDR_GSO_UDP_L4, udp::CHECKSUM.start)
        }
        (_, false) => (VIRTIO_NET_HDR_GSO_TCPV4, tcp::CHECKSUM.start),
        (_, true) => (VIRTIO_NET_HDR_GSO_TCPV6, tcp::CHECKSUM.start),
    };
    let partial = checksum(&[], pseudo_sum(pkt, first, l4_len));
    let at = iph + csum_offset;
    pkt[at..at + 2].copy_from_slice(&partial.to_be_bytes());
    VirtioNetHdr {
        flags: NEEDS_CSUM,
        gso_type,
        hdr_len: (iph + first.l4h) as u16,
        gso_size: gso_size as u16,
        csum_start: iph as u16,
        csum_offset: csum_offset as u16,
    }
}

/// Opened packets wait here to be written to the TUN device together: with offloads,
/// a flow's segments are joined (GRO, [`Coalescer`]) into fewer, larger writes.
pub struct TunSink {
    pub(crate) gro: Coalescer,
    fd: RawFd,
}

impl TunSink {
    /// A sink for `tun` joining up to `slots` packets per write.
    pub fn new(tun: &SyncDevice, slots: usize) -> TunSink {
        TunSink {
            gro: Coalescer::new(slots, tun.tcp_gso(), tun.udp_gso()),
            fd: tun.as_raw_fd(),
        }
    }

    /// Queue one opened packet, counted as sent; written when the queue is full.
    #[inline]
    pub fn push(&mut self, pkt: &[u8], io: &mut Io) {
        self.gro.push(pkt);
        io.tx_packets += 1;
        io.tx_bytes += pkt.len() as u64;
        if self.gro.is_full() {
            self.flush(io);
        }
    }

    /// Write the waiting packets to the TUN device, one write each (joined or not); a
    /// write the device refuses is counted in `send_errors`.
    pub fn flush(&mut self, io: &mut Io) {
        if self.gro.is_empty() {
            return;
        }
        let fd = self.fd;
        let mut writes = 0;
        io.send_errors += self.gro.flush(|b| {
            writes += 1;
            sys::write_packet(fd, b)
        });
        io.tun_writes += writes;
    }

    /// A sink that writes nowhere (`flush` on its `gro` collects what it holds): tests.
    #[cfg(test)]
    pub(crate) fn detached(gro: Coalescer) -> TunSink {
        TunSink { gro, fd: -1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 over `parts`: the one plain checksum (`ipsec::wire::checksum`, checked
    /// against RFC 1071 §3's example), a reference apart from the vectorised sums of tun-rs
    /// the gateway uses.
    fn rfc1071(parts: &[&[u8]]) -> u16 {
        ipsec::wire::checksum(&parts.concat())
    }

    use ipsec::wire::l4::pseudo_header as pseudo;

    /// Set the transport checksum of an IP packet (and the IPv4 header's) by RFC 1071.
    fn seal_checksums(pkt: &mut [u8], proto: u8) {
        let iph = if pkt[0] >> 4 == 6 { 40 } else { 20 };
        if iph == 20 {
            pkt[10..12].fill(0);
            let c = rfc1071(&[&pkt[..20]]);
            pkt[10..12].copy_from_slice(&c.to_be_bytes());
        }
        let at = iph + if proto == TCP { 16 } else { 6 };
        pkt[at..at + 2].fill(0);
        let c = rfc1071(&[&pseudo(pkt, proto, pkt.len() - iph), &pkt[iph..]]);
        pkt[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }

    fn ip_header(v6: bool, proto: u8, l4_len: usize, id: u16) -> Vec<u8> {
        if v6 {
            let mut h = vec![0x60, 0, 0, 0];
            h.extend_from_slice(&(l4_len as u16).to_be_bytes());
            h.extend_from_slice(&[proto, 64]);
            h.extend_from_slice(&[0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            h.extend_from_slice(&[0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            h
        } else {
            let total = (20 + l4_len) as u16;
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&total.to_be_bytes());
            h.extend_from_slice(&id.to_be_bytes());
            h.extend_from_slice(&[0x40, 0, 64, proto, 0, 0, 10, 1, 0, 1, 10, 2, 0, 1]);
            h
        }
    }

    /// A TCP segment 5201 → 40000 with a timestamp option (32-byte header).
    fn tcp(v6: bool, seq: u32, ack: u32, flags: u8, payload: &[u8], id: u16) -> Vec<u8> {
        let mut t = vec![0x14, 0x51, 0x9c, 0x40];
        t.extend_from_slice(&seq.to_be_bytes());
        t.extend_from_slice(&ack.to_be_bytes());
        t.extend_from_slice(&[0x80, flags, 0x01, 0xf5, 0, 0, 0, 0]);
        t.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]);
        t.extend_from_slice(payload);
        let mut p = ip_header(v6, TCP, t.len(), id);
        p.extend_from_slice(&t);
        seal_checksums(&mut p, TCP);
        p
    }

    fn udp(v6: bool, payload: &[u8], id: u16) -> Vec<u8> {
        let len = (8 + payload.len()) as u16;
        let mut u = vec![0x13, 0x89, 0x9c, 0x40];
        u.extend_from_slice(&len.to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        let mut p = ip_header(v6, UDP, u.len(), id);
        p.extend_from_slice(&u);
        seal_checksums(&mut p, UDP);
        p
    }

    fn data(n: usize, salt: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect()
    }

    /// Push `pkts` and flush: what the device would be handed, in order.
    fn run(c: &mut Coalescer, pkts: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for p in pkts {
            c.push(p);
            assert!(!c.is_full());
        }
        let refused = c.flush(|b| {
            out.push(b.to_vec());
            true
        });
        assert_eq!(refused, 0);
        out
    }

    /// Cut a written packet back up as the kernel would (tun-rs's independent gso_split)
    /// and check the partial checksum the kernel is asked to complete.
    fn cut(written: &[u8], v6: bool) -> (VirtioNetHdr, Vec<Vec<u8>>) {
        let hdr = VirtioNetHdr::decode(written).unwrap();
        let mut pkt = written[VIRTIO_NET_HDR_LEN..].to_vec();
        if hdr.gso_type == 0 {
            return (hdr, vec![pkt]);
        }
        assert_eq!(hdr.flags, NEEDS_CSUM);
        // Completing the checksum as NEEDS_CSUM asks (sum from csum_start, the stored
        // pseudo-header sum included) must give a packet whose checksum verifies.
        let (start, at) = (
            usize::from(hdr.csum_start),
            usize::from(hdr.csum_start + hdr.csum_offset),
        );
        let mut done = pkt.clone();
        let c = rfc1071(&[&done[start..]]);
        done[at..at + 2].copy_from_slice(&c.to_be_bytes());
        let proto = if hdr.gso_type == VIRTIO_NET_HDR_GSO_UDP_L4 {
            UDP
        } else {
            TCP
        };
        let l4_len = done.len() - start;
        assert_eq!(rfc1071(&[&pseudo(&done, proto, l4_len), &done[start..]]), 0);
        if !v6 {
            assert_eq!(rfc1071(&[&done[..20]]), 0, "IPv4 header checksum");
        }
        let mut outs = vec![vec![0u8; 2048]; 64];
        let mut sizes = vec![0usize; 64];
        let n = tun_rs::gso_split(&mut pkt, hdr, &mut outs, &mut sizes, 0, v6).unwrap();
        let segs = (0..n).map(|i| outs[i][..sizes[i]].to_vec()).collect();
        (hdr, segs)
    }

    #[test]
    fn tcp_segments_in_sequence_join_and_cut_back_to_the_same_packets() {
        for v6 in [false, true] {
            let (a, b, c) = (data(1000, 1), data(1000, 2), data(600, 3));
            let pkts = vec![
                tcp(v6, 5000, 77, tcp::FLAG_ACK, &a, 9),
                tcp(v6, 6000, 77, tcp::FLAG_ACK, &b, 10),
                tcp(v6, 7000, 77, tcp::FLAG_ACK | tcp::FLAG_PSH, &c, 11),
            ];
            let mut co = Coalescer::new(8, true, true);
            let out = run(&mut co, &pkts);
            assert_eq!(out.len(), 1, "v6 {v6}: one write");
            let iph = if v6 { 40 } else { 20 };
            assert_eq!(out[0].len(), VIRTIO_NET_HDR_LEN + iph + 32 + 2600);
            let (hdr, segs) = cut(&out[0], v6);
            let want = if v6 {
                VIRTIO_NET_HDR_GSO_TCPV6
            } else {
                VIRTIO_NET_HDR_GSO_TCPV4
            };
            assert_eq!(hdr.gso_type, want);
            assert_eq!((hdr.gso_size, hdr.hdr_len), (1000, iph as u16 + 32));
            assert_eq!(
                segs, pkts,
                "v6 {v6}: the kernel's cut gives the originals back"
            );
        }
    }

    #[test]
    fn udp_datagrams_join_only_where_the_device_takes_udp_segmentation() {
        for v6 in [false, true] {
            let pkts: Vec<Vec<u8>> = (0..4)
                .map(|i| {
                    udp(
                        v6,
                        &data(if i < 3 { 1200 } else { 500 }, i),
                        20 + u16::from(i),
                    )
                })
                .collect();
            let out = run(&mut Coalescer::new(8, true, true), &pkts);
            assert_eq!(out.len(), 1);
            let (hdr, segs) = cut(&out[0], v6);
            assert_eq!(
                (hdr.gso_type, hdr.gso_size),
                (VIRTIO_NET_HDR_GSO_UDP_L4, 1200)
            );
            assert_eq!(segs, pkts);
            let out = run(&mut Coalescer::new(8, true, false), &pkts);
            assert_eq!(out.len(), 4, "no USO: one write each");
            for (o, p) in out.iter().zip(&pkts) {
                assert_eq!(cut(o, v6).1, vec![p.clone()]);
            }
        }
    }

    #[test]
    fn a_segment_with_a_bad_checksum_joins_nothing_and_goes_as_it_came() {
        let mut bad = tcp(false, 6000, 1, tcp::FLAG_ACK, &data(1000, 2), 2);
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        let pkts = vec![
            tcp(false, 5000, 1, tcp::FLAG_ACK, &data(1000, 1), 1),
            bad.clone(),
            tcp(false, 7000, 1, tcp::FLAG_ACK, &data(1000, 3), 3),
        ];
        let out = run(&mut Coalescer::new(8, true, true), &pkts);
        let got: Vec<Vec<Vec<u8>>> = out.iter().map(|o| cut(o, false).1).collect();
        // The third cannot join the first across the bad one (order is kept).
        assert_eq!(
            got,
            vec![vec![pkts[0].clone()], vec![bad], vec![pkts[2].clone()]]
        );
        // A bad first segment: nothing joins it.
        let mut first = pkts[0].clone();
        first[40] ^= 1;
        let out = run(
            &mut Coalescer::new(8, true, true),
            &[first, pkts[2].clone()],
        );
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn a_connection_is_never_reordered() {
        let seg = |seq: u32, flags: u8, n: usize| tcp(false, seq, 1, flags, &data(n, seq as u8), 1);
        // A gap, a FIN between segments, a new ACK number: each starts a new packet, and
        // nothing later is written ahead of what came before it.
        let pkts = vec![
            seg(1000, tcp::FLAG_ACK, 100),
            seg(1200, tcp::FLAG_ACK, 100),      // gap: new packet
            seg(1100, tcp::FLAG_ACK, 100), // the missing one: may not join 1000 (1200 came first)
            seg(1300, tcp::FLAG_ACK | 0x01, 0), // FIN, no payload
            seg(1300, tcp::FLAG_ACK, 100),
            tcp(false, 1400, 2, tcp::FLAG_ACK, &data(100, 9), 1), // another ACK number
            vec![
                0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 1, 0, 1, 10, 2, 0, 1, 8, 0, 0, 0, 0,
                0, 0, 0,
            ], // ICMP
            tcp(false, 1500, 2, tcp::FLAG_ACK, &data(100, 9), 1), // may not jump the ICMP packet
        ];
        let out = run(&mut Coalescer::new(16, true, true), &pkts);
        let got: Vec<Vec<u8>> = out.iter().flat_map(|o| cut(o, false).1).collect();
        assert_eq!(got, pkts);
        assert_eq!(out.len(), 8);
    }

    #[test]
    fn what_may_not_join_ends_or_never_starts_a_joined_packet() {
        // IPv4 identifications count up, as a sender's (and the kernel's cut) do.
        let id = std::cell::Cell::new(0u16);
        let seg = |seq: u32, n: usize, flags: u8| {
            id.set(id.get() + 1);
            tcp(false, seq, 1, flags, &data(n, 1), id.get())
        };
        let cases: Vec<(&str, Vec<Vec<u8>>, usize)> = vec![
            (
                "PSH ends it",
                vec![
                    seg(0, 100, tcp::FLAG_ACK | tcp::FLAG_PSH),
                    seg(100, 100, tcp::FLAG_ACK),
                ],
                2,
            ),
            (
                "shorter ends it",
                vec![
                    seg(0, 100, tcp::FLAG_ACK),
                    seg(100, 50, tcp::FLAG_ACK),
                    seg(150, 50, tcp::FLAG_ACK),
                ],
                2,
            ),
            (
                "larger may not follow",
                vec![seg(0, 100, tcp::FLAG_ACK), seg(100, 200, tcp::FLAG_ACK)],
                2,
            ),
            (
                "SYN never joins",
                vec![seg(0, 100, 0x02), seg(100, 100, tcp::FLAG_ACK)],
                2,
            ),
        ];
        for (what, pkts, writes) in cases {
            let out = run(&mut Coalescer::new(8, true, true), &pkts);
            assert_eq!(out.len(), writes, "{what}");
            let got: Vec<Vec<u8>> = out.iter().flat_map(|o| cut(o, false).1).collect();
            assert_eq!(got, pkts, "{what}");
        }
        // Different TTL (IP header fields) or TCP options: separate packets.
        let a = seg(0, 100, tcp::FLAG_ACK);
        let mut b = seg(100, 100, tcp::FLAG_ACK);
        b[8] = 63;
        seal_checksums(&mut b, TCP);
        let mut c = seg(100, 100, tcp::FLAG_ACK);
        c[20 + 27] = 8; // another timestamp
        seal_checksums(&mut c, TCP);
        assert_eq!(
            run(&mut Coalescer::new(8, true, true), &[a.clone(), b]).len(),
            2
        );
        assert_eq!(run(&mut Coalescer::new(8, true, true), &[a, c]).len(), 2);
    }

    /// Found by the `gro` fuzz target: an IPv6 flow label, and an IPv4 ID where DF is
    /// clear, would have been lost in the cut (segmentation copies the first segment's
    /// header and numbers IDs from it): such segments do not join, and each comes back
    /// as it came.
    #[test]
    fn flow_labels_and_ids_segmentation_cannot_keep_do_not_join() {
        let mut a6 = tcp(true, 0, 1, tcp::FLAG_ACK, &data(100, 1), 0);
        let mut b6 = tcp(true, 100, 1, tcp::FLAG_ACK, &data(100, 2), 0);
        a6[1..4].copy_from_slice(&[0x00, 0x12, 0x34]);
        b6[1..4].copy_from_slice(&[0x00, 0x56, 0x78]); // another flow label
        seal_checksums(&mut a6, TCP);
        seal_checksums(&mut b6, TCP);
        let out = run(
            &mut Coalescer::new(8, true, true),
            &[a6.clone(), b6.clone()],
        );
        assert_eq!(out.len(), 2, "different flow labels stay apart");
        let got: Vec<Vec<u8>> = out.iter().flat_map(|o| cut(o, true).1).collect();
        assert_eq!(got, vec![a6.clone(), b6]);
        let mut c6 = tcp(true, 100, 1, tcp::FLAG_ACK, &data(100, 2), 0);
        c6[1..4].copy_from_slice(&[0x00, 0x12, 0x34]); // the same label: joins
        seal_checksums(&mut c6, TCP);
        assert_eq!(run(&mut Coalescer::new(8, true, true), &[a6, c6]).len(), 1);
        // IPv4 without DF: IDs 7 then 9 stay apart, 7 then 8 join; with DF, 7 then 9 join.
        let v4 = |seq: u32, id: u16, df: bool| {
            let mut p = tcp(false, seq, 1, tcp::FLAG_ACK, &data(100, 1), id);
            if !df {
                p[6] = 0;
                seal_checksums(&mut p, TCP);
            }
            p
        };
        for (ids, df, writes) in [((7, 9), false, 2), ((7, 8), false, 1), ((7, 9), true, 1)] {
            let pkts = [v4(0, ids.0, df), v4(100, ids.1, df)];
            let out = run(&mut Coalescer::new(8, true, true), &pkts);
            assert_eq!(out.len(), writes, "ids {ids:?} DF {df}");
            if !df {
                let got: Vec<Vec<u8>> = out.iter().flat_map(|o| cut(o, false).1).collect();
                assert_eq!(
                    got,
                    pkts.to_vec(),
                    "ids {ids:?}: each comes back as it came"
                );
            }
        }
    }

    #[test]
    fn a_joined_packet_stays_within_64_kib() {
        let pkts: Vec<Vec<u8>> = (0..50)
            .map(|i| {
                tcp(
                    false,
                    i * 1400,
                    1,
                    tcp::FLAG_ACK,
                    &data(1400, i as u8),
                    i as u16,
                )
            })
            .collect();
        let out = run(&mut Coalescer::new(8, true, true), &pkts);
        assert_eq!(out.len(), 2);
        assert!(out
            .iter()
            .all(|o| o.len() - VIRTIO_NET_HDR_LEN <= MAX_PACKET));
        let got: Vec<Vec<u8>> = out.iter().flat_map(|o| cut(o, false).1).collect();
        assert_eq!(got, pkts);
    }

    #[test]
    fn without_a_virtio_header_or_for_anything_else_packets_go_as_they_came() {
        let pkts = vec![
            tcp(false, 0, 1, tcp::FLAG_ACK, &data(100, 1), 1),
            tcp(false, 100, 1, tcp::FLAG_ACK, &data(100, 2), 2),
        ];
        let out = run(&mut Coalescer::new(8, false, true), &pkts);
        assert_eq!(out, pkts, "no virtio header: written as they are, one each");
        let junk = vec![vec![], vec![0x45], vec![0x99; 60], vec![0x60; 30]];
        let out = run(&mut Coalescer::new(8, true, true), &junk);
        assert_eq!(out.len(), junk.len());
        for (o, j) in out.iter().zip(&junk) {
            assert_eq!(o[..VIRTIO_NET_HDR_LEN], [0; VIRTIO_NET_HDR_LEN]);
            assert_eq!(&o[VIRTIO_NET_HDR_LEN..], &j[..]);
        }
    }

    #[test]
    fn full_and_refused() {
        let mut c = Coalescer::new(2, true, true);
        c.push(&udp(false, &data(10, 1), 1));
        assert!(!c.is_full());
        c.push(&tcp(false, 0, 1, 0x02, &[], 1));
        assert!(c.is_full());
        let mut calls = 0;
        assert_eq!(
            c.flush(|_| {
                calls += 1;
                calls == 1
            }),
            1
        );
        assert!(c.is_empty());
    }
}
