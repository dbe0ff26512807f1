//! Integrity: HMAC keys (aws-lc-rs, RustCrypto for MD5), AH's AES-GMAC, and the ICV over
//! an ESP packet with the ESN high half appended (RFC 4303 §2.2.1).

use ::hmac::Mac as _;
use aws_lc_rs::aead::{LessSafeKey, UnboundKey};
use aws_lc_rs::hmac as awshmac;
use zeroize::Zeroizing;

use super::aead::split_salt;
use super::{Integrity, MacPrimitive};
use crate::drop::DropReason;

/// An integrity key, set up once per SA: an HMAC (aws-lc-rs, or RustCrypto for MD5,
/// which aws-lc-rs lacks), or AH's AES-GMAC (RFC 4543 §4).
#[allow(clippy::large_enum_variant)] // one per SA, as `Cipher`
pub(super) enum MacKey {
    AwsLc(awshmac::Key),
    Md5(::hmac::Hmac<md5::Md5>),
    Gmac {
        key: LessSafeKey,
        salt: Zeroizing<[u8; 4]>,
    },
}

/// An untruncated HMAC output (up to SHA-512's 64 bytes).
pub struct Icv {
    bytes: [u8; 64],
    len: usize,
}

impl AsRef<[u8]> for Icv {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The integrity key for `i`; `None` for `null`, and for a GMAC key of the wrong length.
pub(super) fn mac_key(i: Integrity, key: &[u8]) -> Option<MacKey> {
    match i.spec().primitive {
        MacPrimitive::Null => None,
        MacPrimitive::Gmac(alg) => {
            if key.len() != i.key_len() {
                return None;
            }
            let (k, salt) = split_salt(key);
            Some(MacKey::Gmac {
                key: LessSafeKey::new(UnboundKey::new(alg, k).ok()?),
                salt,
            })
        }
        // HMAC takes a key of any length (RFC 2104 §2): this cannot fail.
        MacPrimitive::HmacMd5 => Some(MacKey::Md5(
            <::hmac::Hmac<md5::Md5> as ::hmac::Mac>::new_from_slice(key)
                .expect("HMAC accepts any key"),
        )),
        MacPrimitive::Hmac(alg) => Some(MacKey::AwsLc(awshmac::Key::new(*alg, key))),
    }
}

impl Integrity {
    /// The untruncated and truncated ICV of `data` under a key of any length, through the
    /// same HMAC path ESP uses (for known-answer tests against RFC 2202 / RFC 4231, whose
    /// keys are not all of the length RFC 4868 requires of an SA). Empty for `null` and
    /// for GMAC (not an HMAC; see [`CipherState::ah_gmac`]).
    pub fn icv(self, key: &[u8], data: &[u8]) -> (Vec<u8>, Vec<u8>) {
        if self.is_gmac() {
            return (Vec::new(), Vec::new());
        }
        let Some(mac) = mac_key(self, key) else {
            return (Vec::new(), Vec::new());
        };
        let tag = hmac_icv(&mac, &[data], 0, false);
        (
            tag.as_ref().to_vec(),
            tag.as_ref()[..self.icv_len()].to_vec(),
        )
    }
}

/// ESP's ICV: the HMAC of `data` (with the ESN high half, as [`hmac_icv`]) truncated to
/// `out.len()` and written straight into `out`, with no intermediate tag buffer. AH's
/// GMAC is no ESP integrity algorithm (`Sa::new` refuses it): a crypto error here.
pub(super) fn hmac_into(
    mac: &MacKey,
    data: &[u8],
    seq: u64,
    esn: bool,
    out: &mut [u8],
) -> Result<(), DropReason> {
    let hi = ((seq >> 32) as u32).to_be_bytes();
    match mac {
        MacKey::AwsLc(k) => {
            let mut ctx = awshmac::Context::with_key(k);
            ctx.update(data);
            if esn {
                ctx.update(&hi);
            }
            out.copy_from_slice(&ctx.sign().as_ref()[..out.len()]);
        }
        MacKey::Md5(_) => {
            let tag = hmac_icv(mac, &[data], seq, esn);
            out.copy_from_slice(&tag.as_ref()[..out.len()]);
        }
        MacKey::Gmac { .. } => return Err(DropReason::CryptoError),
    }
    Ok(())
}

/// RFC 4303 §2.2.1 / §3.3.2.1: with ESN the high 32 bits are appended, after the next
/// header field, to the bytes the ICV covers (but not sent).
pub(super) fn hmac_icv(mac: &MacKey, parts: &[&[u8]], seq: u64, esn: bool) -> Icv {
    let hi = ((seq >> 32) as u32).to_be_bytes();
    let mut out = Icv {
        bytes: [0; 64],
        len: 0,
    };
    match mac {
        MacKey::AwsLc(k) => {
            let mut ctx = awshmac::Context::with_key(k);
            for p in parts {
                ctx.update(p);
            }
            if esn {
                ctx.update(&hi);
            }
            let tag = ctx.sign();
            out.len = tag.as_ref().len();
            out.bytes[..out.len].copy_from_slice(tag.as_ref());
        }
        MacKey::Gmac { .. } => {} // not an HMAC: `icv_over` and `hmac_into` refuse it
        MacKey::Md5(k) => {
            // The keyed inner/outer states are cloned, not recomputed, per packet.
            let mut ctx = k.clone();
            for p in parts {
                ctx.update(p);
            }
            if esn {
                ctx.update(&hi);
            }
            let tag = ctx.finalize().into_bytes();
            out.len = tag.len();
            out.bytes[..out.len].copy_from_slice(&tag);
        }
    }
    out
}
