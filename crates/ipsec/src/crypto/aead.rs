//! The combined modes' inputs: the nonce (salt ‖ IV) and the AAD of GCM, ChaCha20-
//! Poly1305 (RFC 4106 §5, RFC 7634 §2.1) and GMAC (RFC 4543 §3.3).

use aws_lc_rs::aead::Nonce;
use zeroize::Zeroizing;

use crate::drop::DropReason;
use crate::wire::esp::EspHeader;

pub(super) fn nonce(salt: &[u8; 4], iv: &[u8]) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(salt);
    n[4..].copy_from_slice(iv);
    Nonce::assume_unique_for_key(n)
}

/// RFC 4106 §5 / RFC 7634 §2.1: AAD = SPI ‖ seq (32-bit), or SPI ‖ seq_hi ‖ seq_lo with ESN.
/// `header` is the ESP header (at least its 8 bytes); `a` is laid out as the AAD, not
/// as the packet.
pub(super) fn aead_aad(header: &[u8], seq: u64, esn: bool) -> ([u8; 12], usize) {
    let h = EspHeader::new_unchecked(header);
    let mut a = [0u8; 12];
    a[..4].copy_from_slice(&h.spi().to_be_bytes());
    if esn {
        a[4..8].copy_from_slice(&((seq >> 32) as u32).to_be_bytes());
        a[8..12].copy_from_slice(&h.seq().to_be_bytes());
        (a, 12)
    } else {
        a[4..8].copy_from_slice(&h.seq().to_be_bytes());
        (a, 8)
    }
}

/// RFC 4543 §3.3: the GMAC AAD is SPI ‖ seq (‖ seq as 64 bits with ESN) ‖ IV ‖ payload ‖
/// padding ‖ pad length ‖ next header: the whole packet but the ICV. With ESN the
/// high half is not on the wire, so we lay the AAD out contiguously by borrowing the 4
/// bytes before the ESP header (headroom or the outer header) and restore them after.
pub(super) fn with_gmac_aad<R>(
    buf: &mut [u8],
    esp: usize,
    end: usize,
    seq: u64,
    esn: bool,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, DropReason> {
    if !esn {
        return Ok(f(&buf[esp..end]));
    }
    if esp < 4 {
        return Err(DropReason::NoRoom);
    }
    // The 4 bytes before ESP are not a header field here: whatever lies there (headroom
    // or the outer header's last bytes), kept aside and put back.
    let saved: [u8; 4] = buf[esp - 4..esp].try_into().unwrap();
    let spi = EspHeader::new_unchecked(&buf[esp..]).spi();
    buf[esp - 4..esp].copy_from_slice(&spi.to_be_bytes());
    // For the length of `f`, the SPI's place holds the high half of the sequence number.
    EspHeader::new_unchecked(&mut buf[esp..]).set_spi((seq >> 32) as u32);
    let r = f(&buf[esp - 4..end]);
    EspHeader::new_unchecked(&mut buf[esp..]).set_spi(spi);
    buf[esp - 4..esp].copy_from_slice(&saved);
    Ok(r)
}

/// An AEAD's key material split into the key and the 4-byte salt after it (RFC 4106 §8.1,
/// RFC 4543 §8, RFC 7634 §4: KEYMAT = key ‖ salt).
pub(super) fn split_salt(key: &[u8]) -> (&[u8], Zeroizing<[u8; 4]>) {
    let (k, s) = key.split_at(key.len() - 4);
    (k, Zeroizing::new(s.try_into().unwrap()))
}
