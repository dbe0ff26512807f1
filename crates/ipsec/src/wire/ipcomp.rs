//! The IPComp header (RFC 3173 §2.2): next header, flags, Compression Parameter Index,
//! then the compressed payload.

use crate::constants::IPCOMP_HEADER_LEN;
use crate::drop::DropReason;

mod field {
    use core::ops::Range;
    pub const NEXT_HEADER: usize = 0;
    /// RFC 3173 §2.2: reserved, set to zero, ignored on receipt.
    pub const FLAGS: usize = 1;
    pub const CPI: Range<usize> = 2..4;
    pub const PAYLOAD: usize = 4;
}

/// A view of an IPComp header and the compressed data after it.
#[derive(Debug)]
pub struct IpcompHeader<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> IpcompHeader<T> {
    /// Fails with [`DropReason::Truncated`] if shorter than the 4-byte header.
    pub fn new_checked(buf: T) -> Result<Self, DropReason> {
        let h = IpcompHeader(buf);
        h.check_len()?;
        Ok(h)
    }
    /// A view for writing a header into fresh bytes (no length check).
    pub fn new_unchecked(buf: T) -> Self {
        IpcompHeader(buf)
    }
    fn check_len(&self) -> Result<(), DropReason> {
        if self.0.as_ref().len() < IPCOMP_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        Ok(())
    }
    pub fn next_header(&self) -> u8 {
        self.0.as_ref()[field::NEXT_HEADER]
    }
    pub fn flags(&self) -> u8 {
        self.0.as_ref()[field::FLAGS]
    }
    pub fn cpi(&self) -> u16 {
        u16::from_be_bytes(self.0.as_ref()[field::CPI].try_into().unwrap())
    }
    /// The compressed data: everything after the header.
    pub fn payload(&self) -> &[u8] {
        &self.0.as_ref()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IpcompHeader<T> {
    pub fn set_next_header(&mut self, next_header: u8) {
        self.0.as_mut()[field::NEXT_HEADER] = next_header;
    }
    pub fn set_flags(&mut self, flags: u8) {
        self.0.as_mut()[field::FLAGS] = flags;
    }
    pub fn set_cpi(&mut self, cpi: u16) {
        self.0.as_mut()[field::CPI].copy_from_slice(&cpi.to_be_bytes());
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.0.as_mut()[field::PAYLOAD..]
    }
}

/// An IPComp header as its fields (RFC 3173 §2.2); the flags are always zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcompRepr {
    /// The protocol of the data before compression.
    pub next_header: u8,
    pub cpi: u16,
}

impl IpcompRepr {
    /// The fields of a header, flags ignored as RFC 3173 §2.2 asks; shorter than the
    /// header is [`DropReason::Truncated`].
    pub fn parse<T: AsRef<[u8]>>(h: &IpcompHeader<T>) -> Result<Self, DropReason> {
        h.check_len()?;
        Ok(IpcompRepr {
            next_header: h.next_header(),
            cpi: h.cpi(),
        })
    }
    /// The header's length: 4.
    pub const fn header_len(&self) -> usize {
        IPCOMP_HEADER_LEN
    }
    /// Header and `payload_len` bytes of compressed data.
    pub const fn buffer_len(&self, payload_len: usize) -> usize {
        IPCOMP_HEADER_LEN + payload_len
    }
    /// Write the header (flags zero, RFC 3173 §2.2) into the first 4 bytes of the view.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut IpcompHeader<T>) {
        h.set_next_header(self.next_header);
        h.set_flags(0);
        h.set_cpi(self.cpi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENTINEL: u8 = 0xa5;

    /// RFC 3173 §2.2's layout with RFC 2394's well-known CPI for DEFLATE (2, RFC 3173
    /// §3.3) over an IPv4 packet (next header 4), then a negotiated CPI 0x3000 over UDP
    /// with the reserved flags set by a sender, which a receiver ignores.
    const HEADERS: [([u8; 4], u8, u8, u16); 2] = [
        ([0x04, 0x00, 0x00, 0x02], 4, 0, 2),
        ([0x11, 0xff, 0x30, 0x00], 17, 0xff, 0x3000),
    ];

    #[test]
    fn headers_read_field_by_field_and_flags_are_ignored() {
        for (bytes, nh, flags, cpi) in HEADERS {
            let mut with_data = bytes.to_vec();
            with_data.extend_from_slice(&[0xcb, 0x2c]);
            let h = IpcompHeader::new_checked(&with_data[..]).unwrap();
            assert_eq!((h.next_header(), h.flags(), h.cpi()), (nh, flags, cpi));
            assert_eq!(h.payload(), [0xcb, 0x2c]);
            let r = IpcompRepr::parse(&h).unwrap();
            assert_eq!(
                r,
                IpcompRepr {
                    next_header: nh,
                    cpi
                }
            );
            assert_eq!((r.header_len(), r.buffer_len(2)), (4, 6));
        }
    }

    #[test]
    fn emit_writes_every_header_byte_and_round_trips() {
        for (bytes, nh, _, cpi) in HEADERS {
            let r = IpcompRepr {
                next_header: nh,
                cpi,
            };
            let mut b = [SENTINEL; 6];
            r.emit(&mut IpcompHeader::new_unchecked(&mut b[..]));
            // flags written as zero whatever the sender of `bytes` put there
            assert_eq!(b[..4], [bytes[0], 0, bytes[2], bytes[3]]);
            assert_eq!(b[4..], [SENTINEL; 2], "the payload is the caller's");
            let back = IpcompRepr::parse(&IpcompHeader::new_checked(&b[..]).unwrap());
            assert_eq!(back, Ok(r));
        }
    }

    #[test]
    fn shorter_than_the_header_is_truncated() {
        let b = [0x04, 0x00, 0x00];
        assert_eq!(
            IpcompHeader::new_checked(&b[..]).err(),
            Some(DropReason::Truncated)
        );
        assert_eq!(
            IpcompRepr::parse(&IpcompHeader::new_unchecked(&b[..])),
            Err(DropReason::Truncated)
        );
    }
}
