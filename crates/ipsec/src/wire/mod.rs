//! Zero-copy views of the headers the engine reads and writes, with checked parsing.
//!
//! As in smoltcp's `wire`: each header is a view over bytes, built only through a
//! checked constructor, with its field offsets kept in one `field` module; processing
//! code never indexes packets by hand.

pub mod ah;
pub mod esp;
pub mod ip;
pub mod l4;

pub use ah::AhHeader;
pub use esp::EspHeader;
pub use ip::{IpPacket, Ipv4Header, Ipv6Header, PacketInfo};

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
