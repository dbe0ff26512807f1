//! The ESP header (RFC 4303 §2): SPI and sequence number, then the payload.

use crate::constants::{ESP_HEADER_LEN, ESP_TRAILER_LEN};
use crate::drop::DropReason;

mod field {
    use core::ops::Range;
    pub const SPI: Range<usize> = 0..4;
    pub const SEQ: Range<usize> = 4..8;
}

/// A checked view of an ESP packet (header + everything after it).
#[derive(Debug)]
pub struct EspHeader<T: AsRef<[u8]>>(T);

impl<T: AsRef<[u8]>> EspHeader<T> {
    /// Fails with [`DropReason::Truncated`] if shorter than the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Self, DropReason> {
        if buf.as_ref().len() < ESP_HEADER_LEN {
            return Err(DropReason::Truncated);
        }
        Ok(EspHeader(buf))
    }
    /// A view without the length check, for bytes the caller has already bounded (at
    /// least the 8-byte header).
    pub fn new_unchecked(buf: T) -> Self {
        EspHeader(buf)
    }
    pub fn spi(&self) -> u32 {
        u32::from_be_bytes(self.0.as_ref()[field::SPI].try_into().unwrap())
    }
    /// The low 32 bits of the sequence number (all of it without ESN).
    pub fn seq(&self) -> u32 {
        u32::from_be_bytes(self.0.as_ref()[field::SEQ].try_into().unwrap())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EspHeader<T> {
    pub fn set_spi(&mut self, spi: u32) {
        self.0.as_mut()[field::SPI].copy_from_slice(&spi.to_be_bytes());
    }
    pub fn set_seq(&mut self, seq: u32) {
        self.0.as_mut()[field::SEQ].copy_from_slice(&seq.to_be_bytes());
    }
}

/// Read the SPI of an ESP packet without building a view (used for SAD lookup).
pub fn peek_spi(esp: &[u8]) -> Result<u32, DropReason> {
    Ok(EspHeader::new_checked(esp)?.spi())
}

/// Write the ESP trailer (RFC 4303 §2.4–2.6) into `t`, the bytes after the payload up to
/// the ICV: the default padding 1, 2, 3, … (`t.len() - 2` bytes of it), the pad length,
/// the next header.
pub fn write_trailer(t: &mut [u8], next_header: u8) {
    let pad = t.len() - ESP_TRAILER_LEN;
    for (i, b) in t[..pad].iter_mut().enumerate() {
        *b = (i + 1) as u8;
    }
    t[pad] = pad as u8;
    t[pad + 1] = next_header;
}

/// Read the trailer at the end of `plain` (a decrypted payload with its padding, pad
/// length and next header): the payload's length and the next header. The padding must
/// be the default 1, 2, 3, … (RFC 4303 §2.4: the receiver checks it when the sender
/// used the default) and fit: otherwise [`DropReason::BadPadding`].
pub fn read_trailer(plain: &[u8]) -> Result<(usize, u8), DropReason> {
    let n = plain.len();
    if n < ESP_TRAILER_LEN {
        return Err(DropReason::BadPadding);
    }
    let (next_header, pad) = (plain[n - 1], usize::from(plain[n - 2]));
    if pad + ESP_TRAILER_LEN > n {
        return Err(DropReason::BadPadding);
    }
    let payload = n - ESP_TRAILER_LEN - pad;
    if plain[payload..payload + pad]
        .iter()
        .enumerate()
        .any(|(i, b)| *b != (i + 1) as u8)
    {
        return Err(DropReason::BadPadding);
    }
    Ok((payload, next_header))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ESP(spi=0xdeadbeef, seq=0x01020304, data=b"\xaa\xbb")` as scapy builds it.
    const SCAPY_ESP: [u8; 10] = [0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 0xaa, 0xbb];

    #[test]
    fn scapys_esp_header_reads_and_writes_field_by_field() {
        let h = EspHeader::new_checked(&SCAPY_ESP[..]).unwrap();
        assert_eq!((h.spi(), h.seq()), (0xdead_beef, 0x0102_0304));
        assert_eq!(peek_spi(&SCAPY_ESP), Ok(0xdead_beef));
        let mut b = [0u8; 10];
        b[8..].copy_from_slice(&[0xaa, 0xbb]);
        let mut w = EspHeader::new_checked(&mut b[..]).unwrap();
        w.set_spi(0xdead_beef);
        w.set_seq(0x0102_0304);
        assert_eq!(b, SCAPY_ESP);
        assert_eq!(
            EspHeader::new_checked(&SCAPY_ESP[..7]).err(),
            Some(DropReason::Truncated)
        );
    }

    /// The plaintext after ESP's header, as scapy pads it: ESP-NULL in transport mode
    /// around UDP 1 -> 2 "hello" (13 bytes, 1 byte of padding to 4-byte alignment), and
    /// AES-CBC's 16-byte block around UDP "hi" (10 bytes, padding 1 2 3 4, next header 4).
    #[test]
    fn scapys_esp_trailers_read_and_write_the_same() {
        let udp_hello = [
            0, 1, 0, 2, 0, 0x0d, 0xa7, 0xf8, b'h', b'e', b'l', b'l', b'o',
        ];
        let null_plain = [&udp_hello[..], &[0x01, 0x01, 0x11]].concat();
        assert_eq!(read_trailer(&null_plain), Ok((13, 17)));
        let mut t = [0u8; 3];
        write_trailer(&mut t, 17);
        assert_eq!(t, [0x01, 0x01, 0x11]);

        let udp_hi = [0, 1, 0, 2, 0, 0x0a, 0, 0, b'h', b'i'];
        let cbc_plain = [&udp_hi[..], &[1, 2, 3, 4, 4, 4]].concat();
        assert_eq!(read_trailer(&cbc_plain), Ok((10, 4)));
        let mut t = [0u8; 6];
        write_trailer(&mut t, 4);
        assert_eq!(t, [1, 2, 3, 4, 4, 4]);

        // RFC 4303 §2.4: padding that is not 1, 2, 3, … or longer than the payload
        let mut bad = cbc_plain.clone();
        bad[12] = 9;
        assert_eq!(read_trailer(&bad), Err(DropReason::BadPadding));
        assert_eq!(read_trailer(&[200, 4]), Err(DropReason::BadPadding));
    }
}
