//! IPv4 (RFC 791) and IPv6 (RFC 8200) header views, and the selector fields the SPD
//! matches on.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::constants::{proto, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use crate::drop::DropReason;
use crate::wire::checksum;

/// IPv4 header fields (RFC 791 §3.1).
pub mod v4 {
    use core::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// IPv6 header fields (RFC 8200 §3).
pub mod v6 {
    use core::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Fields of an IPv6 extension header (RFC 8200 §4): every one starts with next header
/// and length (in 8-byte units, not counting the first 8); a routing header's fourth
/// byte is segments left.
pub(crate) mod ext {
    pub const NEXT_HEADER: usize = 0;
    pub const LEN: usize = 1;
    pub const ROUTING_SEGMENTS_LEFT: usize = 3;
    /// The length in bytes of the extension header starting at `h[0]`.
    pub fn len(h: &[u8]) -> usize {
        (usize::from(h[LEN]) + 1) * 8
    }
}

/// Fields of an IPv4 option (RFC 791 §3.1) and of an IPv6 option (RFC 8200 §4.2): type
/// then length, except the one-byte IPv4 end-of-list and no-op.
pub(crate) mod opt {
    pub const TYPE: usize = 0;
    pub const LEN: usize = 1;
}

/// IPv4 "don't fragment" flag in the flags/fragment-offset word.
pub const IPV4_DF: u16 = 0x4000;
const IPV4_MF_OFFSET: u16 = 0x3fff;

/// A checked IPv4 header view: version 4, IHL ≥ 5, header and total length inside the buffer.
#[derive(Debug)]
pub struct Ipv4Header<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Ipv4Header<T> {
    pub fn new_checked(buf: T) -> Result<Self, DropReason> {
        let b = buf.as_ref();
        if b.len() < IPV4_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        let h = Ipv4Header(buf);
        if h.version() != 4 || h.header_len() < IPV4_HEADER_LEN {
            return Err(DropReason::MalformedIp);
        }
        let b = h.0.as_ref();
        if h.header_len() > b.len() || (h.total_len() as usize) > b.len() {
            return Err(DropReason::Truncated);
        }
        if (h.total_len() as usize) < h.header_len() {
            return Err(DropReason::MalformedIp);
        }
        Ok(h)
    }
    /// A view for writing a header into fresh bytes (no field checks).
    pub fn new_unchecked(buf: T) -> Self {
        Ipv4Header(buf)
    }
    fn b(&self) -> &[u8] {
        self.0.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[v4::VER_IHL] >> 4
    }
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[v4::VER_IHL] & 0x0f) * 4
    }
    pub fn tos(&self) -> u8 {
        self.b()[v4::TOS]
    }
    pub fn total_len(&self) -> u16 {
        u16::from_be_bytes([
            self.b()[v4::TOTAL_LEN.start],
            self.b()[v4::TOTAL_LEN.start + 1],
        ])
    }
    pub fn ident(&self) -> u16 {
        u16::from_be_bytes([self.b()[v4::IDENT.start], self.b()[v4::IDENT.start + 1]])
    }
    pub fn flags_frag(&self) -> u16 {
        u16::from_be_bytes([
            self.b()[v4::FLAGS_FRAG.start],
            self.b()[v4::FLAGS_FRAG.start + 1],
        ])
    }
    /// True for a fragment (MF set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.flags_frag() & IPV4_MF_OFFSET != 0
    }
    pub fn protocol(&self) -> u8 {
        self.b()[v4::PROTOCOL]
    }
    pub fn ttl(&self) -> u8 {
        self.b()[v4::TTL]
    }
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[v4::SRC]).unwrap())
    }
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[v4::DST]).unwrap())
    }
    pub fn checksum_ok(&self) -> bool {
        checksum(&self.b()[..self.header_len()]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Header<T> {
    fn m(&mut self) -> &mut [u8] {
        self.0.as_mut()
    }
    /// Write version 4 and IHL 5: an option-less header's first byte (RFC 791 §3.1).
    fn set_version_ihl5(&mut self) {
        self.m()[v4::VER_IHL] = 0x45;
    }
    pub fn set_tos(&mut self, tos: u8) {
        self.m()[v4::TOS] = tos;
    }
    pub fn set_ident(&mut self, ident: u16) {
        self.m()[v4::IDENT].copy_from_slice(&ident.to_be_bytes());
    }
    pub fn set_flags_frag(&mut self, flags_frag: u16) {
        self.m()[v4::FLAGS_FRAG].copy_from_slice(&flags_frag.to_be_bytes());
    }
    pub fn set_ttl(&mut self, ttl: u8) {
        self.m()[v4::TTL] = ttl;
    }
    pub fn set_src(&mut self, src: Ipv4Addr) {
        self.m()[v4::SRC].copy_from_slice(&src.octets());
    }
    pub fn set_dst(&mut self, dst: Ipv4Addr) {
        self.m()[v4::DST].copy_from_slice(&dst.octets());
    }
    pub fn set_total_len(&mut self, len: u16) {
        self.m()[v4::TOTAL_LEN].copy_from_slice(&len.to_be_bytes());
    }
    pub fn set_protocol(&mut self, p: u8) {
        self.m()[v4::PROTOCOL] = p;
    }
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.m();
        b[v4::CHECKSUM].copy_from_slice(&[0, 0]);
        let c = checksum(&b[..hl]);
        b[v4::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
}

/// A checked IPv6 header view: version 6, 40 bytes, payload length inside the buffer.
#[derive(Debug)]
pub struct Ipv6Header<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> Ipv6Header<T> {
    pub fn new_checked(buf: T) -> Result<Self, DropReason> {
        let b = buf.as_ref();
        if b.len() < IPV6_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        let h = Ipv6Header(buf);
        if h.version() != 6 {
            return Err(DropReason::MalformedIp);
        }
        if IPV6_HEADER_LEN + h.payload_len() as usize > h.0.as_ref().len() {
            return Err(DropReason::Truncated);
        }
        Ok(h)
    }
    pub fn new_unchecked(buf: T) -> Self {
        Ipv6Header(buf)
    }
    fn b(&self) -> &[u8] {
        self.0.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[v6::VER_TC_FLOW.start] >> 4
    }
    pub fn traffic_class(&self) -> u8 {
        let w = u32::from_be_bytes(self.b()[v6::VER_TC_FLOW].try_into().unwrap());
        ((w >> 20) & 0xff) as u8
    }
    pub fn flow_label(&self) -> u32 {
        u32::from_be_bytes(self.b()[v6::VER_TC_FLOW].try_into().unwrap()) & 0xf_ffff
    }
    pub fn payload_len(&self) -> u16 {
        u16::from_be_bytes([
            self.b()[v6::PAYLOAD_LEN.start],
            self.b()[v6::PAYLOAD_LEN.start + 1],
        ])
    }
    pub fn next_header(&self) -> u8 {
        self.b()[v6::NEXT_HEADER]
    }
    pub fn hop_limit(&self) -> u8 {
        self.b()[v6::HOP_LIMIT]
    }
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[v6::SRC]).unwrap())
    }
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[v6::DST]).unwrap())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Header<T> {
    /// Version 6, traffic class and flow label: the first word (RFC 8200 §3).
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let w = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xf_ffff);
        self.0.as_mut()[v6::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    }
    pub fn set_next_header(&mut self, next_header: u8) {
        self.0.as_mut()[v6::NEXT_HEADER] = next_header;
    }
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.0.as_mut()[v6::HOP_LIMIT] = hop_limit;
    }
    pub fn set_src(&mut self, src: Ipv6Addr) {
        self.0.as_mut()[v6::SRC].copy_from_slice(&src.octets());
    }
    pub fn set_dst(&mut self, dst: Ipv6Addr) {
        self.0.as_mut()[v6::DST].copy_from_slice(&dst.octets());
    }
    pub fn set_payload_len(&mut self, len: u16) {
        self.0.as_mut()[v6::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    }
}

/// An option-less IPv4 header as its fields (RFC 791 §3.1), smoltcp's `Ipv4Repr`: what
/// a tunnel's outer header or a header put in front of a received payload says. Version,
/// IHL (5) and the checksum follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    /// Bytes after the header: total length − 20.
    pub payload_len: usize,
    /// DSCP and ECN (RFC 2474, RFC 3168).
    pub tos: u8,
    pub ident: u16,
    /// Flags and fragment offset: [`IPV4_DF`] or 0 for a whole datagram.
    pub flags_frag: u16,
    pub ttl: u8,
}

impl Ipv4Repr {
    /// The fields of a header — of the header alone: whether the payload follows in the
    /// buffer is the caller's to check (`Ipv4Header::new_checked`). A view made
    /// unchecked may hold anything: a buffer shorter than 20 bytes is
    /// [`DropReason::Truncated`]; a version other than 4, an IHL under 5, a total length
    /// shorter than the header or a wrong checksum is [`DropReason::MalformedIp`];
    /// options cannot be represented here ([`DropReason::UnsupportedHeader`]).
    pub fn parse<T: AsRef<[u8]>>(h: &Ipv4Header<T>) -> Result<Self, DropReason> {
        if h.b().len() < IPV4_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        if h.version() != 4 || h.header_len() < IPV4_HEADER_LEN {
            return Err(DropReason::MalformedIp);
        }
        if h.header_len() != IPV4_HEADER_LEN {
            return Err(DropReason::UnsupportedHeader);
        }
        let payload_len = usize::from(h.total_len()).checked_sub(IPV4_HEADER_LEN);
        let payload_len = payload_len.ok_or(DropReason::MalformedIp)?;
        if !h.checksum_ok() {
            return Err(DropReason::MalformedIp);
        }
        Ok(Ipv4Repr {
            src: h.src(),
            dst: h.dst(),
            protocol: h.protocol(),
            payload_len,
            tos: h.tos(),
            ident: h.ident(),
            flags_frag: h.flags_frag(),
            ttl: h.ttl(),
        })
    }
    /// The header's length: 20, there being no options.
    pub const fn header_len(&self) -> usize {
        IPV4_HEADER_LEN
    }
    /// The whole packet's length: header and payload (the total length field).
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN + self.payload_len
    }
    /// Write every byte of the header, checksum last (RFC 791 §3.1, RFC 1071). The view
    /// must have at least 20 bytes; the total length is truncated to 16 bits, as the
    /// caller has bounded it by [`crate::constants::MAX_PACKET`].
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ipv4Header<T>) {
        h.set_version_ihl5();
        h.set_tos(self.tos);
        h.set_total_len(self.buffer_len() as u16);
        h.set_ident(self.ident);
        h.set_flags_frag(self.flags_frag);
        h.set_ttl(self.ttl);
        h.set_protocol(self.protocol);
        h.set_src(self.src);
        h.set_dst(self.dst);
        h.fill_checksum();
    }
}

/// The fixed IPv6 header as its fields (RFC 8200 §3), smoltcp's `Ipv6Repr`; extension
/// headers are part of the payload here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    /// Bytes after the fixed header, extension headers included (payload length).
    pub payload_len: usize,
    pub hop_limit: u8,
    /// DSCP and ECN.
    pub traffic_class: u8,
    /// 20 bits (RFC 6437).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// The fields of a header — of the header alone, as for [`Ipv4Repr::parse`]: a
    /// buffer shorter than 40 bytes is [`DropReason::Truncated`], a version other than 6
    /// [`DropReason::MalformedIp`].
    pub fn parse<T: AsRef<[u8]>>(h: &Ipv6Header<T>) -> Result<Self, DropReason> {
        if h.b().len() < IPV6_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        if h.version() != 6 {
            return Err(DropReason::MalformedIp);
        }
        Ok(Ipv6Repr {
            src: h.src(),
            dst: h.dst(),
            next_header: h.next_header(),
            payload_len: usize::from(h.payload_len()),
            hop_limit: h.hop_limit(),
            traffic_class: h.traffic_class(),
            flow_label: h.flow_label(),
        })
    }
    /// The fixed header's length: 40.
    pub const fn header_len(&self) -> usize {
        IPV6_HEADER_LEN
    }
    /// The whole packet's length: fixed header and payload.
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN + self.payload_len
    }
    /// Write every byte of the fixed header (RFC 8200 §3). The view must have at least
    /// 40 bytes; the payload length is truncated to 16 bits (no jumbograms).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ipv6Header<T>) {
        h.set_version_tc_flow(self.traffic_class, self.flow_label);
        h.set_payload_len(self.payload_len as u16);
        h.set_next_header(self.next_header);
        h.set_hop_limit(self.hop_limit);
        h.set_src(self.src);
        h.set_dst(self.dst);
    }
}

/// Where, in an IPv6 packet, a security header goes in transport mode and which
/// byte holds the "next header" value that must point at it.
///
/// RFC 4303 §3.1.1: ESP comes after hop-by-hop, routing and fragment headers (we
/// also keep destination options that precede a routing header in front).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V6Split {
    /// Offset of the first byte after the headers that stay in front.
    pub offset: usize,
    /// Offset of the byte holding the next-header value of the last header kept in front.
    pub nh_at: usize,
    /// The upper-layer (or ESP) protocol that follows them; `IPV6_FRAG` for a fragment.
    pub next_header: u8,
}

impl V6Split {
    pub fn is_fragment(&self) -> bool {
        self.next_header == proto::IPV6_FRAG
    }
}

/// Walk an IPv6 packet's extension headers to the transport-mode insertion point.
/// With `until`, walk until that header (ESP or AH) is found instead (inbound).
/// A fragment header stops the walk (`next_header == IPV6_FRAG`): IPsec works on whole
/// packets, and the caller decides what a fragment means.
pub fn ipv6_split(pkt: &[u8], until: Option<u8>) -> Result<V6Split, DropReason> {
    let h = Ipv6Header::new_checked(pkt)?;
    let end = IPV6_HEADER_LEN + h.payload_len() as usize;
    let mut nh = h.next_header();
    let mut nh_at = v6::NEXT_HEADER;
    let mut off = IPV6_HEADER_LEN;
    // At most a handful of extension headers make sense; bound the walk.
    for _ in 0..8 {
        if until == Some(nh) {
            return Ok(V6Split {
                offset: off,
                nh_at,
                next_header: nh,
            });
        }
        let follows_routing = nh == proto::IPV6_OPTS
            && off + 2 <= end
            && pkt[off + ext::NEXT_HEADER] == proto::IPV6_ROUTE;
        let skip = matches!(nh, proto::HOPOPT | proto::IPV6_ROUTE)
            || follows_routing
            || (until.is_some() && nh == proto::IPV6_OPTS);
        if !skip {
            return Ok(V6Split {
                offset: off,
                nh_at,
                next_header: nh,
            });
        }
        if off + 8 > end {
            return Err(DropReason::Truncated);
        }
        let len = ext::len(&pkt[off..]);
        if off + len > end {
            return Err(DropReason::Truncated);
        }
        nh_at = off;
        nh = pkt[off + ext::NEXT_HEADER];
        off += len;
    }
    Err(DropReason::MalformedIp)
}

/// An IP packet of either version, checked.
#[derive(Debug)]
pub enum IpPacket<'a> {
    V4(Ipv4Header<&'a [u8]>),
    V6(Ipv6Header<&'a [u8]>),
}

impl<'a> IpPacket<'a> {
    pub fn parse(pkt: &'a [u8]) -> Result<Self, DropReason> {
        match pkt.first().map(|b| b >> 4) {
            Some(4) => Ok(IpPacket::V4(Ipv4Header::new_checked(pkt)?)),
            Some(6) => Ok(IpPacket::V6(Ipv6Header::new_checked(pkt)?)),
            Some(_) => Err(DropReason::MalformedIp),
            None => Err(DropReason::Truncated),
        }
    }
    /// The IP version: 4 or 6.
    pub fn version(&self) -> u8 {
        match self {
            IpPacket::V4(_) => 4,
            IpPacket::V6(_) => 6,
        }
    }
    /// Length the header says the packet has (≤ the buffer).
    pub fn packet_len(&self) -> usize {
        match self {
            IpPacket::V4(h) => h.total_len() as usize,
            IpPacket::V6(h) => IPV6_HEADER_LEN + h.payload_len() as usize,
        }
    }
    pub fn src(&self) -> IpAddr {
        match self {
            IpPacket::V4(h) => h.src().into(),
            IpPacket::V6(h) => h.src().into(),
        }
    }
    pub fn dst(&self) -> IpAddr {
        match self {
            IpPacket::V4(h) => h.dst().into(),
            IpPacket::V6(h) => h.dst().into(),
        }
    }
    /// DSCP + ECN byte (IPv4 TOS / IPv6 traffic class).
    pub fn tos(&self) -> u8 {
        match self {
            IpPacket::V4(h) => h.tos(),
            IpPacket::V6(h) => h.traffic_class(),
        }
    }
}

/// The fields an SPD selector matches (RFC 4301 §4.4.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Upper-layer protocol (after IPv6 extension headers).
    pub protocol: u8,
    /// Ports for TCP/UDP/SCTP when present in this packet (not for non-first fragments).
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
}

impl PacketInfo {
    pub fn parse(pkt: &[u8]) -> Result<Self, DropReason> {
        let ip = IpPacket::parse(pkt)?;
        let (protocol, l4_off, fragment) = match &ip {
            IpPacket::V4(h) => (h.protocol(), h.header_len(), h.is_fragment()),
            IpPacket::V6(_) => {
                let s = ipv6_split(pkt, None)?;
                if s.is_fragment() {
                    // The fragment header's own next header; no ports in a fragment.
                    (
                        pkt.get(s.offset).copied().ok_or(DropReason::Truncated)?,
                        s.offset,
                        true,
                    )
                } else {
                    (s.next_header, s.offset, false)
                }
            }
        };
        let end = ip.packet_len();
        let has_ports = matches!(protocol, proto::TCP | proto::UDP | 132) && !fragment;
        let (src_port, dst_port) = if has_ports && l4_off + 4 <= end {
            (
                Some(u16::from_be_bytes([pkt[l4_off], pkt[l4_off + 1]])),
                Some(u16::from_be_bytes([pkt[l4_off + 2], pkt[l4_off + 3]])),
            )
        } else {
            (None, None)
        };
        Ok(PacketInfo {
            src: ip.src(),
            dst: ip.dst(),
            protocol,
            src_port,
            dst_port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// smoltcp's habit: the buffer starts as this byte, so a byte emit leaves unwritten
    /// shows up in the comparison.
    const SENTINEL: u8 = 0xa5;

    fn v4_repr() -> Ipv4Repr {
        Ipv4Repr {
            src: Ipv4Addr::new(192, 0, 2, 2),
            dst: Ipv4Addr::new(192, 0, 2, 1),
            protocol: proto::ESP,
            payload_len: 100,
            tos: 0,
            ident: 0,
            flags_frag: IPV4_DF,
            ttl: 64,
        }
    }

    #[test]
    fn an_emitted_ipv4_header_checksums_to_zero() {
        // RFC 1071: the one's-complement sum over a header with its checksum is 0xffff.
        let mut h = [SENTINEL; 20];
        v4_repr().emit(&mut Ipv4Header::new_unchecked(&mut h[..]));
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        let v = Ipv4Header::new_unchecked(&h[..]);
        assert!(v.checksum_ok());
        assert_eq!(
            (u16::from_be_bytes([h[2], h[3]]), h[6], h[8], h[9]),
            (120, 0x40, 64, 50)
        );
    }

    /// IPv4 headers written by others, with the fields they hold:
    /// - draft-mcgrew-gcm-test-01 §4 (test case 3), the inner TCP SYN's header: DF set;
    /// - RFC 3602 §4 (case 7), the inner ICMP echo's header: DF clear, ident 0x0904;
    /// - the worked checksum example of Wikipedia's "Internet checksum" article (192.168.0.1
    ///   to 192.168.0.199, UDP, checksum 0xb861).
    const OTHERS_V4: [(&str, [u8; 20], Ipv4Repr); 3] = [
        (
            "draft-mcgrew-gcm-test-01 case 3",
            [
                0x45, 0x00, 0x00, 0x30, 0x69, 0xa6, 0x40, 0x00, 0x80, 0x06, 0x26, 0x90, 0xc0, 0xa8,
                0x01, 0x02, 0x93, 0x89, 0x15, 0x5e,
            ],
            Ipv4Repr {
                src: Ipv4Addr::new(192, 168, 1, 2),
                dst: Ipv4Addr::new(147, 137, 21, 94),
                protocol: proto::TCP,
                payload_len: 0x30 - 20,
                tos: 0,
                ident: 0x69a6,
                flags_frag: IPV4_DF,
                ttl: 128,
            },
        ),
        (
            "RFC 3602 case 7",
            [
                0x45, 0x00, 0x00, 0x54, 0x09, 0x04, 0x00, 0x00, 0x40, 0x01, 0xf9, 0x88, 0xc0, 0xa8,
                0x7b, 0x03, 0xc0, 0xa8, 0x7b, 0xc8,
            ],
            Ipv4Repr {
                src: Ipv4Addr::new(192, 168, 123, 3),
                dst: Ipv4Addr::new(192, 168, 123, 200),
                protocol: proto::ICMP,
                payload_len: 0x54 - 20,
                tos: 0,
                ident: 0x0904,
                flags_frag: 0,
                ttl: 64,
            },
        ),
        (
            "Wikipedia, Internet checksum",
            [
                0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
                0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
            ],
            Ipv4Repr {
                src: Ipv4Addr::new(192, 168, 0, 1),
                dst: Ipv4Addr::new(192, 168, 0, 199),
                protocol: proto::UDP,
                payload_len: 0x73 - 20,
                tos: 0,
                ident: 0,
                flags_frag: IPV4_DF,
                ttl: 64,
            },
        ),
    ];

    #[test]
    fn others_ipv4_headers_parse_to_their_fields_and_emit_byte_for_byte() {
        for (source, bytes, want) in OTHERS_V4 {
            let got = Ipv4Repr::parse(&Ipv4Header::new_unchecked(&bytes[..]));
            assert_eq!(got, Ok(want), "{source}");
            assert_eq!(
                want.buffer_len(),
                usize::from(u16::from_be_bytes([bytes[2], bytes[3]]))
            );
            let mut b = [SENTINEL; 20];
            want.emit(&mut Ipv4Header::new_unchecked(&mut b[..]));
            assert_eq!(b, bytes, "{source}");
        }
    }

    #[test]
    fn ipv4_repr_round_trips_and_refuses_what_it_cannot_hold() {
        for r in [
            v4_repr(),
            Ipv4Repr {
                tos: 0xb9,
                ident: 0xfffe,
                flags_frag: 0x2001, // MF, offset 8 bytes: a fragment's word is kept
                ttl: 1,
                payload_len: 65_515,
                ..v4_repr()
            },
        ] {
            let mut b = [SENTINEL; 20];
            r.emit(&mut Ipv4Header::new_unchecked(&mut b[..]));
            assert_eq!(Ipv4Repr::parse(&Ipv4Header::new_unchecked(&b[..])), Ok(r));
            assert_eq!((r.header_len(), r.buffer_len()), (20, 20 + r.payload_len));
        }
        let mut b = [SENTINEL; 20];
        v4_repr().emit(&mut Ipv4Header::new_unchecked(&mut b[..]));
        let mut bad = b;
        bad[v4::CHECKSUM.start] ^= 1;
        let parse = |b: &[u8]| Ipv4Repr::parse(&Ipv4Header::new_unchecked(b));
        assert_eq!(parse(&bad), Err(DropReason::MalformedIp), "checksum");
        let mut v6 = b;
        v6[v4::VER_IHL] = 0x65;
        assert_eq!(parse(&v6), Err(DropReason::MalformedIp), "version");
        assert_eq!(
            parse(&SCAPY_V4_OPTIONS_UDP),
            Err(DropReason::UnsupportedHeader),
            "options"
        );
        // a view made unchecked over too few bytes, or an IHL under 5: refused, no panic
        for n in 0..20 {
            assert_eq!(parse(&b[..n]), Err(DropReason::Truncated), "{n} bytes");
        }
        let mut ihl4 = b;
        ihl4[v4::VER_IHL] = 0x44;
        assert_eq!(parse(&ihl4), Err(DropReason::MalformedIp), "IHL 4");
        let mut short = b;
        short[v4::TOTAL_LEN].copy_from_slice(&19u16.to_be_bytes());
        Ipv4Header::new_unchecked(&mut short[..]).fill_checksum();
        assert_eq!(
            parse(&short),
            Err(DropReason::MalformedIp),
            "total < header"
        );
    }

    #[test]
    fn ipv6_repr_round_trips_every_field() {
        let r = Ipv6Repr {
            src: Ipv6Addr::from(fd00(1)),
            dst: Ipv6Addr::from(fd00(2)),
            next_header: proto::AH,
            payload_len: 65_535,
            hop_limit: 1,
            traffic_class: 0xff,
            flow_label: 0xf_ffff,
        };
        for r in [
            r,
            Ipv6Repr {
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 255,
                ..r
            },
        ] {
            let mut b = [SENTINEL; 40];
            r.emit(&mut Ipv6Header::new_unchecked(&mut b[..]));
            assert_eq!(Ipv6Repr::parse(&Ipv6Header::new_unchecked(&b[..])), Ok(r));
            assert_eq!((r.header_len(), r.buffer_len()), (40, 40 + r.payload_len));
        }
        let mut b = [SENTINEL; 40];
        r.emit(&mut Ipv6Header::new_unchecked(&mut b[..]));
        for n in 0..40 {
            let parsed = Ipv6Repr::parse(&Ipv6Header::new_unchecked(&b[..n]));
            assert_eq!(parsed, Err(DropReason::Truncated), "{n} bytes: no panic");
        }
        b[0] = 0x40 | (b[0] & 0x0f);
        assert_eq!(
            Ipv6Repr::parse(&Ipv6Header::new_unchecked(&b[..])),
            Err(DropReason::MalformedIp)
        );
    }

    /// IPv4 as scapy builds it: `IP(tos=0xb8, len=120, id=0x1234, flags="DF", ttl=64,
    /// proto=50, src="192.0.2.2", dst="198.51.100.7")`, checksum 0x3b2b.
    const SCAPY_V4: [u8; 20] = [
        0x45, 0xb8, 0, 0x78, 0x12, 0x34, 0x40, 0, 0x40, 0x32, 0x3b, 0x2b, 192, 0, 2, 2, 198, 51,
        100, 7,
    ];

    /// `IP(src="10.1.0.2", dst="10.2.0.2", ttl=3, flags="MF",
    /// options=[IPOption_Router_Alert()]) / UDP(sport=5001, dport=5201) / "ab"`: IHL 6.
    const SCAPY_V4_OPTIONS_UDP: [u8; 34] = [
        0x46, 0, 0, 0x22, 0, 1, 0x20, 0, 3, 0x11, 0xee, 0xbf, 10, 1, 0, 2, 10, 2, 0, 2, 0x94, 4, 0,
        0, 0x13, 0x89, 0x14, 0x51, 0, 0x0a, 0x62, 0x97, b'a', b'b',
    ];

    fn fd00(last: u8) -> [u8; 16] {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = last;
        a
    }

    /// `IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrHopByHop() / IPv6ExtHdrDestOpt() /
    /// IPv6ExtHdrRouting(segleft=0) / UDP(sport=7, dport=9) / "z"`, or with
    /// `IPv6ExtHdrFragment(m=1, id=5)` in place of the destination options and routing.
    fn scapy_v6_ext(fragment: bool) -> Vec<u8> {
        let mut p = vec![
            0x60,
            0,
            0,
            0,
            0,
            if fragment { 0x19 } else { 0x21 },
            0,
            0x40,
        ];
        p.extend_from_slice(&fd00(1));
        p.extend_from_slice(&fd00(2));
        if fragment {
            p.extend_from_slice(&[0x2c, 0, 1, 4, 0, 0, 0, 0]); // hop-by-hop, PadN
            p.extend_from_slice(&[0x11, 0, 0, 1, 0, 0, 0, 5]); // fragment, M=1, id 5
        } else {
            p.extend_from_slice(&[0x3c, 0, 1, 4, 0, 0, 0, 0]); // hop-by-hop
            p.extend_from_slice(&[0x2b, 0, 1, 4, 0, 0, 0, 0]); // destination options
            p.extend_from_slice(&[0x11, 0, 0, 0, 0, 0, 0, 0]); // routing, type 0, left 0
        }
        p.extend_from_slice(&[0, 7, 0, 9, 0, 9, 0x8b, 0xc7, b'z']);
        p
    }

    #[test]
    fn scapys_ipv4_header_reads_and_is_what_emit_writes() {
        let mut whole = SCAPY_V4.to_vec();
        whole.resize(120, 0); // the total length the header gives
        assert_eq!(
            Ipv4Header::new_checked(&SCAPY_V4[..]).err(),
            Some(DropReason::Truncated)
        );
        let h = Ipv4Header::new_checked(&whole[..]).unwrap();
        assert_eq!((h.version(), h.header_len(), h.tos()), (4, 20, 0xb8));
        assert_eq!((h.flags_frag(), h.is_fragment()), (IPV4_DF, false));
        assert_eq!((h.ttl(), h.protocol()), (64, 50));
        assert_eq!(h.src(), Ipv4Addr::new(192, 0, 2, 2));
        assert_eq!(h.dst(), Ipv4Addr::new(198, 51, 100, 7));
        assert!(h.checksum_ok());
        let repr = Ipv4Repr::parse(&h).unwrap();
        assert_eq!(repr.payload_len, 100);
        assert_eq!(h.ident(), 0x1234);
        let mut b = [SENTINEL; 20];
        repr.emit(&mut Ipv4Header::new_unchecked(&mut b[..]));
        assert_eq!(b, SCAPY_V4);
    }

    #[test]
    fn scapys_ipv4_with_options_finds_the_ports_after_them() {
        let h = Ipv4Header::new_checked(&SCAPY_V4_OPTIONS_UDP[..]).unwrap();
        assert_eq!((h.header_len(), h.total_len()), (24, 34));
        assert!(h.is_fragment(), "MF is set");
        assert!(h.checksum_ok());
        // a fragment's ports are not read (RFC 4301 §4.4.1.1: OPAQUE)
        let info = PacketInfo::parse(&SCAPY_V4_OPTIONS_UDP).unwrap();
        assert_eq!(
            (info.protocol, info.src_port, info.dst_port),
            (17, None, None)
        );
        let mut whole = SCAPY_V4_OPTIONS_UDP;
        whole[6] = 0; // MF cleared: the whole datagram
        let info = PacketInfo::parse(&whole).unwrap();
        assert_eq!(
            (info.src_port, info.dst_port),
            (Some(5001), Some(5201)),
            "after the options"
        );
        let mut bad = SCAPY_V4_OPTIONS_UDP;
        bad[11] ^= 1;
        assert!(!Ipv4Header::new_checked(&bad[..]).unwrap().checksum_ok());
        assert!(Ipv4Header::new_checked(&SCAPY_V4_OPTIONS_UDP[..23]).is_err());
    }

    #[test]
    fn scapys_ipv6_header_reads_and_is_what_emit_writes() {
        // IPv6(tc=0xb8, fl=0x12345, plen=16, nh=50, hlim=255, src=2001:db8::1, dst=::2)
        let mut want = vec![0x6b, 0x81, 0x23, 0x45, 0, 0x10, 0x32, 0xff];
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        src[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        dst[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        (src[15], dst[15]) = (1, 2);
        want.extend_from_slice(&src);
        want.extend_from_slice(&dst);
        want.resize(56, 0); // the 16 payload bytes the header counts
        let h = Ipv6Header::new_checked(&want[..]).unwrap();
        assert_eq!(
            (h.version(), h.traffic_class(), h.payload_len()),
            (6, 0xb8, 16)
        );
        assert_eq!((h.next_header(), h.hop_limit()), (50, 255));
        assert_eq!(
            (h.src(), h.dst()),
            (Ipv6Addr::from(src), Ipv6Addr::from(dst))
        );
        let repr = Ipv6Repr::parse(&h).unwrap();
        assert_eq!(
            (repr.traffic_class, repr.flow_label, repr.payload_len),
            (0xb8, 0x12345, 16)
        );
        let mut b = [SENTINEL; 40];
        repr.emit(&mut Ipv6Header::new_unchecked(&mut b[..]));
        assert_eq!(b[..], want[..40]);
        assert!(
            Ipv6Header::new_checked(&want[..55]).is_err(),
            "payload cut short"
        );
    }

    #[test]
    fn scapys_ipv6_extension_headers_split_where_esp_goes() {
        // RFC 4303 §3.1.1: after hop-by-hop, destination options before routing, routing
        let p = scapy_v6_ext(false);
        let s = ipv6_split(&p, None).unwrap();
        assert_eq!((s.offset, s.nh_at, s.next_header), (64, 56, 17));
        assert!(!s.is_fragment());
        let info = PacketInfo::parse(&p).unwrap();
        assert_eq!(
            (info.protocol, info.src_port, info.dst_port),
            (17, Some(7), Some(9))
        );
        // a fragment header stops the walk
        let f = scapy_v6_ext(true);
        let s = ipv6_split(&f, None).unwrap();
        assert!(s.is_fragment());
        assert_eq!(f[s.nh_at], proto::IPV6_FRAG);
    }
}
