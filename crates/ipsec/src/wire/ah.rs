//! The AH header (RFC 4302 §2): next header, payload length, reserved, SPI, sequence
//! number, then the ICV (and, for IPv4/IPv6 alignment, its padding).

use crate::constants::AH_FIXED_LEN;
use crate::drop::DropReason;

mod field {
    use core::ops::Range;
    pub const NEXT_HEADER: usize = 0;
    /// RFC 4302 §2.2: AH length in 32-bit words, minus 2.
    pub const PAYLOAD_LEN: usize = 1;
    pub const RESERVED: Range<usize> = 2..4;
    pub const SPI: Range<usize> = 4..8;
    pub const SEQ: Range<usize> = 8..12;
    pub const ICV: usize = 12;
}

/// A checked view of an AH header (fixed part, ICV field and padding).
#[derive(Debug)]
pub struct AhHeader<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> AhHeader<T> {
    /// Fails with [`DropReason::Truncated`] if shorter than the fixed part or than the
    /// length the header gives itself, and [`DropReason::MalformedAh`] if that length is
    /// shorter than the fixed part.
    pub fn new_checked(buf: T) -> Result<Self, DropReason> {
        let b = buf.as_ref();
        if b.len() < AH_FIXED_LEN {
            return Err(DropReason::Truncated);
        }
        let h = AhHeader(buf);
        if h.header_len() < AH_FIXED_LEN {
            return Err(DropReason::MalformedAh);
        }
        if h.header_len() > h.0.as_ref().len() {
            return Err(DropReason::Truncated);
        }
        Ok(h)
    }
    pub fn next_header(&self) -> u8 {
        self.0.as_ref()[field::NEXT_HEADER]
    }
    /// The whole header's length in bytes: (payload length + 2) × 4.
    pub fn header_len(&self) -> usize {
        (usize::from(self.0.as_ref()[field::PAYLOAD_LEN]) + 2) * 4
    }
    pub fn spi(&self) -> u32 {
        u32::from_be_bytes(self.0.as_ref()[field::SPI].try_into().unwrap())
    }
    /// The low 32 bits of the sequence number (all of it without ESN).
    pub fn seq(&self) -> u32 {
        u32::from_be_bytes(self.0.as_ref()[field::SEQ].try_into().unwrap())
    }
    /// Offset of the ICV field from the start of the header.
    pub const fn icv_offset() -> usize {
        field::ICV
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AhHeader<T> {
    pub fn set_next_header(&mut self, next_header: u8) {
        self.0.as_mut()[field::NEXT_HEADER] = next_header;
    }
    /// The header's length in bytes (a multiple of 4, at least 12), written as RFC 4302
    /// §2.2 counts it: 32-bit words minus 2.
    pub fn set_header_len(&mut self, len: usize) {
        self.0.as_mut()[field::PAYLOAD_LEN] = (len / 4 - 2) as u8;
    }
    /// RFC 4302 §2.3: reserved, zero.
    pub fn clear_reserved(&mut self) {
        self.0.as_mut()[field::RESERVED].fill(0);
    }
    pub fn set_spi(&mut self, spi: u32) {
        self.0.as_mut()[field::SPI].copy_from_slice(&spi.to_be_bytes());
    }
    pub fn set_seq(&mut self, seq: u32) {
        self.0.as_mut()[field::SEQ].copy_from_slice(&seq.to_be_bytes());
    }
    /// Zero the ICV field and its padding, up to `len` (RFC 4302 §3.3.3.1: the ICV is
    /// zero while it is computed).
    pub fn clear_icv(&mut self, len: usize) {
        self.0.as_mut()[field::ICV..len].fill(0);
    }
}

impl<T: AsRef<[u8]>> AhHeader<T> {
    /// A view for writing a header into fresh bytes (no length checks).
    pub fn new_unchecked(buf: T) -> Self {
        AhHeader(buf)
    }
}

/// An AH header's fixed fields (RFC 4302 §2), smoltcp-style; the ICV is the SA's to
/// compute and write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhRepr {
    pub next_header: u8,
    /// The whole header's length in bytes, ICV and padding included: a multiple of 4
    /// (IPv4) or 8 (IPv6), at least 12.
    pub header_len: usize,
    pub spi: u32,
    /// The low 32 bits of the sequence number.
    pub seq: u32,
}

impl AhRepr {
    /// The fields of a header (its fixed part: whether the ICV field follows in the
    /// buffer is the caller's to check, `AhHeader::new_checked`). A view made unchecked
    /// may hold anything: a buffer shorter than the fixed part is
    /// [`DropReason::Truncated`]; a header claiming less than it
    /// [`DropReason::MalformedAh`].
    pub fn parse<T: AsRef<[u8]>>(h: &AhHeader<T>) -> Result<Self, DropReason> {
        if h.0.as_ref().len() < AH_FIXED_LEN {
            return Err(DropReason::Truncated);
        }
        if h.header_len() < AH_FIXED_LEN {
            return Err(DropReason::MalformedAh);
        }
        Ok(AhRepr {
            next_header: h.next_header(),
            header_len: h.header_len(),
            spi: h.spi(),
            seq: h.seq(),
        })
    }
    pub const fn header_len(&self) -> usize {
        self.header_len
    }
    /// Write all `header_len` bytes: the fixed fields, reserved zero (§2.3) and a zero
    /// ICV field (§3.3.3.1) for the ICV to be computed over.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AhHeader<T>) {
        h.set_next_header(self.next_header);
        h.set_header_len(self.header_len);
        h.clear_reserved();
        h.set_spi(self.spi);
        h.set_seq(self.seq);
        h.clear_icv(self.header_len);
    }
}

/// Read the SPI of an AH header without building a checked view (for SAD lookup).
pub fn peek_spi(ah: &[u8]) -> Result<u32, DropReason> {
    if ah.len() < AH_FIXED_LEN {
        return Err(DropReason::Truncated);
    }
    Ok(u32::from_be_bytes(ah[field::SPI].try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AH as scapy signs it: HMAC-SHA1-96 over IPv4 (SPI 0x1000, seq 7, next header UDP;
    /// 12 + 12 bytes) and HMAC-SHA-256-128 over IPv6 (SPI 0x1001, seq 8; 12 + 16 bytes of
    /// ICV + 4 of padding to IPv6's 8-byte alignment, RFC 4302 §3.3.3.2.1).
    const SCAPY_AH4: [u8; 24] = [
        0x11, 0x04, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 7, 0x7e, 0x32, 0xd5, 0x09, 0xd4, 0xd4, 0xb8,
        0x6d, 0xc4, 0xfd, 0xca, 0xf1,
    ];
    const SCAPY_AH6: [u8; 32] = [
        0x11, 0x06, 0, 0, 0, 0, 0x10, 0x01, 0, 0, 0, 8, 0x3a, 0xda, 0xc2, 0xdb, 0x98, 0x2f, 0x49,
        0x14, 0x04, 0x08, 0x5a, 0x95, 0x24, 0xdc, 0x95, 0xc4, 0, 0, 0, 0,
    ];

    #[test]
    fn scapys_ah_headers_read_field_by_field() {
        for (b, len, spi, seq) in [
            (&SCAPY_AH4[..], 24, 0x1000, 7),
            (&SCAPY_AH6[..], 32, 0x1001, 8),
        ] {
            let h = AhHeader::new_checked(b).unwrap();
            assert_eq!((h.next_header(), h.header_len()), (17, len));
            assert_eq!((h.spi(), h.seq()), (spi, seq));
            assert_eq!(peek_spi(b), Ok(spi));
            assert_eq!(AhHeader::<&[u8]>::icv_offset(), 12);
        }
    }

    #[test]
    fn an_emitted_header_is_scapys_with_the_icv_zeroed() {
        for (want, spi, seq) in [(&SCAPY_AH4[..], 0x1000, 7), (&SCAPY_AH6[..], 0x1001, 8)] {
            // smoltcp's sentinel: a byte emit does not write stays 0xa5 and fails
            let mut b = vec![0xa5u8; want.len()];
            let r = AhRepr {
                next_header: 17,
                header_len: want.len(),
                spi,
                seq,
            };
            r.emit(&mut AhHeader::new_unchecked(&mut b[..]));
            let mut zeroed = want.to_vec();
            zeroed[12..].fill(0);
            assert_eq!(b, zeroed);
            // round trip, and scapy's own header parses to the same fields
            assert_eq!(
                AhRepr::parse(&AhHeader::new_checked(&b[..]).unwrap()),
                Ok(r)
            );
            assert_eq!(AhRepr::parse(&AhHeader::new_checked(want).unwrap()), Ok(r));
            assert_eq!(r.header_len(), want.len());
        }
        let mut short = SCAPY_AH4;
        short[1] = 0;
        assert_eq!(
            AhRepr::parse(&AhHeader::new_unchecked(&short[..])),
            Err(DropReason::MalformedAh)
        );
        for n in 0..AH_FIXED_LEN {
            let parsed = AhRepr::parse(&AhHeader::new_unchecked(&SCAPY_AH4[..n]));
            assert_eq!(parsed, Err(DropReason::Truncated), "{n} bytes: no panic");
        }
    }

    #[test]
    fn a_header_cut_short_or_claiming_too_little_is_refused() {
        assert_eq!(
            AhHeader::new_checked(&SCAPY_AH4[..11]).err(),
            Some(DropReason::Truncated)
        );
        assert_eq!(
            AhHeader::new_checked(&SCAPY_AH6[..28]).err(),
            Some(DropReason::Truncated),
            "the header says 32 bytes"
        );
        let mut short = SCAPY_AH4;
        short[1] = 0; // (0 + 2) × 4 = 8 bytes: less than the fixed part
        assert_eq!(
            AhHeader::new_checked(&short[..]).err(),
            Some(DropReason::MalformedAh)
        );
    }
}
