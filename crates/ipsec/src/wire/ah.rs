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
    /// Write a header of `len` bytes (a multiple of 4, at least 12) with a zero ICV field
    /// (RFC 4302 §2.3: reserved is zero; §3.3.3.1: the ICV is zero while it is computed).
    pub fn emit(buf: T, next_header: u8, len: usize, spi: u32, seq: u32) -> Self {
        let mut h = AhHeader(buf);
        let b = h.0.as_mut();
        b[field::NEXT_HEADER] = next_header;
        b[field::PAYLOAD_LEN] = (len / 4 - 2) as u8;
        b[field::RESERVED].fill(0);
        b[field::SPI].copy_from_slice(&spi.to_be_bytes());
        b[field::SEQ].copy_from_slice(&seq.to_be_bytes());
        b[field::ICV..len].fill(0);
        h
    }
}

/// Read the SPI of an AH header without building a checked view (for SAD lookup).
pub fn peek_spi(ah: &[u8]) -> Result<u32, DropReason> {
    if ah.len() < AH_FIXED_LEN {
        return Err(DropReason::Truncated);
    }
    Ok(u32::from_be_bytes(ah[field::SPI].try_into().unwrap()))
}
