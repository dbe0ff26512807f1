//! Where the fields of the transport headers lie, for code that reads a TCP or UDP
//! header in place (the gateway's receive offload): offsets in the header, as the
//! `field` modules of smoltcp's `wire`, and the pseudo-header both checksums cover.

/// TCP header fields (RFC 9293 §3.1).
pub mod tcp {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const PORTS: Range<usize> = 0..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    /// Data offset in the high 4 bits: the header's length in 32-bit words.
    pub const DATA_OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const CHECKSUM: Range<usize> = 16..18;
    /// The fixed header, before options.
    pub const HEADER_LEN: usize = 20;
    pub const FLAG_PSH: u8 = 0x08;
    pub const FLAG_ACK: u8 = 0x10;
}

/// UDP header fields (RFC 768).
pub mod udp {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const PORTS: Range<usize> = 0..4;
    pub const LEN: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
    pub const HEADER_LEN: usize = 8;
}

/// The pseudo-header TCP's and UDP's checksums cover (RFC 9293 §3.1, RFC 768; RFC 8200
/// §8.1 for IPv6): source and destination address, zero, protocol, transport length.
/// `ip` is the packet from its IP header on (version 4 or 6).
pub fn pseudo_header(ip: &[u8], proto: u8, l4_len: usize) -> Vec<u8> {
    use super::ip::{v4, v6};
    let addrs = if ip[0] >> 4 == 6 {
        &ip[v6::SRC.start..v6::DST.end]
    } else {
        &ip[v4::SRC.start..v4::DST.end]
    };
    let mut p = addrs.to_vec();
    if ip[0] >> 4 == 6 {
        p.extend_from_slice(&(l4_len as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, proto]);
    } else {
        p.extend_from_slice(&[0, proto]);
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP datagram over IPv4 as scapy builds it (10.0.0.1:1234 -> 10.0.0.2:53, "hi";
    /// scapy's checksums 0x66cc and 0x7e67): the fields where the offsets say, and the
    /// pseudo-header and datagram summing to all ones.
    #[test]
    fn scapys_udp_over_ipv4_verifies_over_the_pseudo_header() {
        let pkt: [u8; 30] = [
            0x45, 0, 0, 0x1e, 0, 1, 0, 0, 0x40, 0x11, 0x66, 0xcc, 10, 0, 0, 1, 10, 0, 0, 2, 0x04,
            0xd2, 0x00, 0x35, 0x00, 0x0a, 0x7e, 0x67, b'h', b'i',
        ];
        let l4 = &pkt[20..];
        assert_eq!(l4[udp::LEN], [0, 10]);
        assert_eq!(l4[udp::PORTS], [0x04, 0xd2, 0, 53]);
        assert_eq!(l4[udp::CHECKSUM], [0x7e, 0x67]);
        let covered = [pseudo_header(&pkt, 17, l4.len()), l4.to_vec()].concat();
        assert_eq!(crate::wire::checksum(&covered), 0);
        assert_eq!(crate::wire::checksum(&pkt[..20]), 0, "IPv4 header checksum");
    }

    /// A TCP segment over IPv6 as scapy builds it ([fd00::1]:40000 -> [fd00::2]:80,
    /// seq 7, ack 9, PSH+ACK, "xyz"; scapy's checksum 0x06ab).
    #[test]
    fn scapys_tcp_over_ipv6_verifies_over_the_pseudo_header() {
        let mut pkt = vec![0x60, 0, 0, 0, 0, 0x17, 6, 0x40];
        pkt.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        pkt.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        pkt.extend_from_slice(&[
            0x9c, 0x40, 0, 0x50, 0, 0, 0, 7, 0, 0, 0, 9, 0x50, 0x18, 0x20, 0, 0x06, 0xab, 0, 0,
            b'x', b'y', b'z',
        ]);
        let l4 = &pkt[40..];
        assert_eq!(l4[tcp::SEQ], [0, 0, 0, 7]);
        assert_eq!(l4[tcp::ACK], [0, 0, 0, 9]);
        assert_eq!(usize::from(l4[tcp::DATA_OFFSET] >> 4) * 4, tcp::HEADER_LEN);
        assert_eq!(l4[tcp::FLAGS], tcp::FLAG_PSH | tcp::FLAG_ACK);
        assert_eq!(l4[tcp::CHECKSUM], [0x06, 0xab]);
        let covered = [pseudo_header(&pkt, 6, l4.len()), l4.to_vec()].concat();
        assert_eq!(crate::wire::checksum(&covered), 0);
    }
}
