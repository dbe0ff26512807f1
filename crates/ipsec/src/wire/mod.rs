//! Zero-copy views of the headers the engine reads and writes, with checked parsing.
//!
//! As in smoltcp's `wire`: each header is a view over bytes (`Ipv4Header`, `Ipv6Header`,
//! `EspHeader`, `AhHeader`, `IpcompHeader`), built for untrusted bytes only through a
//! checked constructor, with its field offsets kept in one `field` module. Headers the
//! engine writes whole have a representation too — `Ipv4Repr`, `Ipv6Repr`, `AhRepr`,
//! `IpcompRepr`: a plain struct of the fields with `parse(&view)` and `emit(&mut view)`,
//! which writes every byte of the header and allocates nothing. Processing code never indexes packets
//! by hand: it reads and writes fields through these, and slices a packet only at offsets
//! they give (a header's length, the byte `ipv6_split` names as the next header).

pub mod ah;
pub mod esp;
pub mod ip;
pub mod ipcomp;
pub mod l4;

pub use ah::{AhHeader, AhRepr};
pub use esp::EspHeader;
pub use ip::{IpPacket, Ipv4Header, Ipv4Repr, Ipv6Header, Ipv6Repr, PacketInfo};
pub use ipcomp::{IpcompHeader, IpcompRepr};

/// RFC 1071 Internet checksum over `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksum_rfc1071_example() {
        // RFC 1071 §3: the bytes 00 01 f2 03 f4 f5 f6 f7 sum to 0xddf2 (checksum = !0xddf2).
        assert_eq!(
            super::checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }
}
