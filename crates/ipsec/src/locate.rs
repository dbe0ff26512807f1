//! Where things are in an IP packet, for the IPsec code: what tunnel mode needs of the
//! packet it wraps, where transport mode inserts its header, where an ESP or AH header
//! sits, and rewriting an IP header's protocol and lengths around one.

use std::net::IpAddr;

use crate::constants::{proto, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use crate::drop::DropReason;
use crate::wire::ip::{ipv6_split, v4, IpPacket, Ipv4Header, Ipv6Header, IPV4_DF};

/// What tunnel mode needs to know of the packet it wraps (or of the payload it builds an
/// outer header for).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TunnelInner {
    /// Next header of the outer layer: IP-in-IP 4 or 41 for the inner packet.
    pub next_header: u8,
    /// DSCP and ECN, copied outward (RFC 4301 §5.1.2.1, RFC 6040 normal mode).
    pub tos: u8,
    /// DF of an IPv4 inner header, copied outward (RFC 4301 §8.1).
    pub df: u16,
    pub len: usize,
}

impl TunnelInner {
    pub(crate) fn parse(pkt: &[u8]) -> Result<Self, DropReason> {
        let inner = IpPacket::parse(pkt)?;
        let (next_header, df) = match &inner {
            IpPacket::V4(h) => (proto::IPV4, h.flags_frag() & IPV4_DF),
            IpPacket::V6(_) => (proto::IPV6, 0),
        };
        Ok(TunnelInner {
            next_header,
            tos: inner.tos(),
            df,
            len: inner.packet_len(),
        })
    }
}

/// The length of the outer IP header a tunnel to `dst` puts in front (no options or
/// extension headers).
pub(crate) fn outer_header_len(dst: IpAddr) -> usize {
    if dst.is_ipv4() {
        IPV4_HEADER_LEN
    } else {
        IPV6_HEADER_LEN
    }
}

/// Where transport mode inserts its header: after the IPv4 header (options included) or
/// after the IPv6 extension headers that must precede it (RFC 4303 §3.1.1, RFC 4302 §3.1.1).
pub(crate) struct TransportSplit {
    pub hdr_len: usize,
    /// Offset of the byte naming the upper layer (IPv4 protocol or the last next header).
    pub nh_at: usize,
    pub next_header: u8,
    pub pkt_len: usize,
    pub v4: bool,
}

impl TransportSplit {
    pub(crate) fn parse(data: &[u8]) -> Result<Self, DropReason> {
        Ok(match IpPacket::parse(data)? {
            IpPacket::V4(h) => {
                if h.is_fragment() {
                    return Err(DropReason::Fragment);
                }
                TransportSplit {
                    hdr_len: h.header_len(),
                    nh_at: v4::PROTOCOL,
                    next_header: h.protocol(),
                    pkt_len: h.total_len() as usize,
                    v4: true,
                }
            }
            IpPacket::V6(h) => {
                let s = ipv6_split(data, None)?;
                if s.is_fragment() {
                    return Err(DropReason::Fragment);
                }
                TransportSplit {
                    hdr_len: s.offset,
                    nh_at: s.nh_at,
                    next_header: s.next_header,
                    pkt_len: IPV6_HEADER_LEN + h.payload_len() as usize,
                    v4: false,
                }
            }
        })
    }
}

/// Set the protocol / next-header byte at `nh_at` and the length fields of the IP header
/// `ip` (all `ip.len()` bytes of it, extension headers included) for a payload of
/// `payload_len` bytes; IPv4 gets a fresh header checksum.
pub(crate) fn rewrite_ip_header(
    ip: &mut [u8],
    v4: bool,
    nh_at: usize,
    next_header: u8,
    payload_len: usize,
) {
    let hdr_len = ip.len();
    // `nh_at` is a field offset a view gave (IPv4's protocol, or the next header of the
    // last IPv6 header kept in front, from `ipv6_split`): one byte, whichever header it is.
    ip[nh_at] = next_header;
    if v4 {
        let mut h = Ipv4Header::new_unchecked(ip);
        h.set_total_len((hdr_len + payload_len) as u16);
        h.fill_checksum();
    } else {
        Ipv6Header::new_unchecked(ip)
            .set_payload_len((hdr_len - IPV6_HEADER_LEN + payload_len) as u16);
    }
}

/// Where the ESP (or AH) packet sits inside an IP packet whose payload is ESP (or AH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EspLocation {
    /// Offset of the ESP / AH header: the IP header length, extension headers included.
    pub offset: usize,
    /// Length of the ESP packet (ICV included), or of AH and what follows it.
    pub len: usize,
    /// Offset of the byte that says "ESP" (IPv4 protocol or the last next header).
    pub nh_at: usize,
    pub v4: bool,
}

/// Find the ESP packet inside an IP packet whose payload is ESP.
pub fn esp_location(pkt: &[u8]) -> Result<EspLocation, DropReason> {
    ipsec_location(pkt, proto::ESP)
}

/// Find the `protocol` (ESP or AH) header inside an IP packet.
pub fn ipsec_location(pkt: &[u8], protocol: u8) -> Result<EspLocation, DropReason> {
    match IpPacket::parse(pkt)? {
        IpPacket::V4(h) => {
            if h.protocol() != protocol {
                return Err(DropReason::BadNextHeader);
            }
            if h.is_fragment() {
                return Err(DropReason::Fragment);
            }
            let offset = h.header_len();
            Ok(EspLocation {
                offset,
                len: h.total_len() as usize - offset,
                nh_at: v4::PROTOCOL,
                v4: true,
            })
        }
        IpPacket::V6(h) => {
            let s = ipv6_split(pkt, Some(protocol))?;
            if s.is_fragment() {
                return Err(DropReason::Fragment);
            }
            if s.next_header != protocol {
                return Err(DropReason::BadNextHeader);
            }
            let len = IPV6_HEADER_LEN + h.payload_len() as usize - s.offset;
            Ok(EspLocation {
                offset: s.offset,
                len,
                nh_at: s.nh_at,
                v4: false,
            })
        }
    }
}
