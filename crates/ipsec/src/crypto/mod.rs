//! Cipher and integrity suites for ESP, named as strongSwan/IKEv2 proposals.
//!
//! One enum-dispatched [`CipherState`] per SA instead of trait objects: the set of
//! suites is closed, the match compiles to a jump, and the hot path stays free of
//! virtual calls. Keys are expanded once, when the SA is built (aws-lc-rs key
//! objects hold the expanded schedules); raw key bytes live only in [`SecretBytes`],
//! which zeroises on drop and never prints.

mod aead;
mod cbc;
pub mod job;
mod mac;
pub mod state;
pub mod table;

pub use state::CipherState;
pub use table::{EncryptionSpec, IntegritySpec, Kind, MacPrimitive, Primitive};

use core::fmt;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// ESP encryption (or combined-mode) algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encryption {
    /// ENCR_NULL (RFC 2410): integrity only.
    Null,
    /// AES-CBC (RFC 3602) with a 128/192/256-bit key.
    Aes128Cbc,
    Aes192Cbc,
    Aes256Cbc,
    /// AES-GCM with a 16-byte ICV (RFC 4106).
    Aes128Gcm16,
    Aes256Gcm16,
    /// ChaCha20-Poly1305 (RFC 7634).
    ChaCha20Poly1305,
    /// AES-GMAC, authentication only (RFC 4543 ENCR_NULL_AUTH_AES_GMAC).
    Aes128Gmac,
    Aes256Gmac,
    /// Legacy: 3DES-CBC (RFC 2451), 64-bit blocks; weak by today's standards.
    TripleDesCbc,
    /// Legacy: DES-CBC (RFC 2405), 56-bit key; broken.
    DesCbc,
}

/// Integrity algorithm: ESP's (for non-combined encryption) and AH's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Integrity {
    Null,
    /// HMAC-SHA1-96 (RFC 2404).
    HmacSha1_96,
    /// HMAC-SHA-256-128, -384-192, -512-256 (RFC 4868).
    HmacSha256_128,
    HmacSha384_192,
    HmacSha512_256,
    /// Legacy: HMAC-MD5-96 (RFC 2403).
    HmacMd5_96,
    /// AES-GMAC for AH only (RFC 4543 §4, AUTH_AES_128_GMAC / AUTH_AES_256_GMAC): the
    /// Authentication Data is an 8-byte IV and the untruncated 16-byte tag. RFC 4543
    /// §5.3: "This transform MUST NOT be used with ESP" (ESP has ENCR_NULL_AUTH_AES_GMAC,
    /// [`Encryption::Aes128Gmac`], instead).
    AuthAes128Gmac,
    AuthAes256Gmac,
}

impl Encryption {
    pub fn from_name(name: &str) -> Option<Self> {
        table::ENCRYPTIONS
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.id)
    }
    #[inline]
    pub fn name(self) -> &'static str {
        self.spec().name
    }
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        table::ENCRYPTIONS.iter().map(|r| r.name)
    }
    /// Combined mode: confidentiality and integrity in one (no separate integrity algorithm).
    #[inline]
    pub fn is_aead(self) -> bool {
        self.spec().is_aead()
    }
    /// Key material length in bytes, the salt included for the combined modes
    /// (RFC 4106 §8.1, RFC 4543 §6, RFC 7634 §4).
    #[inline]
    pub fn key_len(self) -> usize {
        self.spec().key_len + self.spec().salt_len
    }
    /// Explicit IV carried in each packet.
    #[inline]
    pub fn iv_len(self) -> usize {
        self.spec().iv_len
    }
    /// Salt bytes at the end of the key material (0 outside the combined modes).
    #[inline]
    pub fn salt_len(self) -> usize {
        self.spec().salt_len
    }
    /// Cipher block size the plaintext is padded to (1 for stream/counter modes).
    #[inline]
    pub fn block_len(self) -> usize {
        self.spec().block_len
    }
    /// Broken or weak: accepted only on an SA explicitly marked legacy.
    #[inline]
    pub fn is_legacy(self) -> bool {
        self.spec().legacy
    }
    /// ICV of a combined mode (0 for non-combined ciphers).
    #[inline]
    pub fn aead_icv_len(self) -> usize {
        self.spec().icv_len
    }
}

impl Integrity {
    pub fn from_name(name: &str) -> Option<Self> {
        table::INTEGRITIES
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.id)
    }
    #[inline]
    pub fn name(self) -> &'static str {
        self.spec().name
    }
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        table::INTEGRITIES.iter().map(|r| r.name)
    }
    /// Broken or weak: accepted only on an SA explicitly marked legacy.
    #[inline]
    pub fn is_legacy(self) -> bool {
        self.spec().legacy
    }
    /// Key material length: the HMAC key (the hash output length), or GMAC's AES key
    /// and 4-byte salt (RFC 4543 §5.4).
    #[inline]
    pub fn key_len(self) -> usize {
        self.spec().key_len + self.spec().salt_len
    }
    /// Truncated ICV length (GMAC's tag is never truncated, RFC 4543 §3.4).
    #[inline]
    pub fn icv_len(self) -> usize {
        self.spec().icv_len
    }
    /// Salt bytes at the end of the key material (GMAC's 4, else 0).
    #[inline]
    pub fn salt_len(self) -> usize {
        self.spec().salt_len
    }
    /// AES-GMAC, which only AH takes as an integrity algorithm.
    #[inline]
    pub fn is_gmac(self) -> bool {
        matches!(self.spec().primitive, table::MacPrimitive::Gmac(_))
    }
    /// The IV AH carries in front of the ICV: 8 bytes for GMAC (RFC 4543 §4), else none.
    #[inline]
    pub fn iv_len(self) -> usize {
        self.spec().iv_len
    }
    /// AH's Authentication Data: the IV (GMAC) and the ICV, before alignment padding.
    #[inline]
    pub fn auth_data_len(self) -> usize {
        self.iv_len() + self.icv_len()
    }
}

/// A validated pairing of encryption and integrity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Suite {
    pub encryption: Encryption,
    pub integrity: Integrity,
}

/// Why a suite or its keys were refused. Messages name the algorithm and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SuiteError {
    UnknownEncryption(String),
    UnknownIntegrity(String),
    /// A combined-mode cipher given a separate integrity algorithm.
    AeadWithIntegrity {
        encryption: &'static str,
        integrity: &'static str,
    },
    /// Neither confidentiality nor integrity.
    NullNull,
    KeyLength {
        what: &'static str,
        algorithm: &'static str,
        expected: usize,
        got: usize,
    },
    /// A broken or weak algorithm on an SA not marked legacy.
    Legacy(&'static str),
    /// 3DES keys with K1 = K2 or K2 = K3: the cipher collapses to single DES.
    DegenerateKey,
    /// The system's random generator failed while drawing a CBC IV key.
    Random,
}

impl fmt::Display for SuiteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuiteError::UnknownEncryption(n) => write!(
                f,
                "unknown encryption algorithm {n:?} (known: {})",
                Encryption::all_names().collect::<Vec<_>>().join(", ")
            ),
            SuiteError::UnknownIntegrity(n) => write!(
                f,
                "unknown integrity algorithm {n:?} (known: {})",
                Integrity::all_names().collect::<Vec<_>>().join(", ")
            ),
            SuiteError::AeadWithIntegrity { encryption, integrity } => write!(
                f,
                "{encryption} is a combined-mode (AEAD) algorithm with its own ICV; \
                 it cannot be paired with integrity {integrity} (use integrity null)"
            ),
            SuiteError::NullNull => {
                f.write_str("encryption null with integrity null protects nothing; refused")
            }
            SuiteError::KeyLength { what, algorithm, expected, got } => write!(
                f,
                "{what} key for {algorithm} must be {expected} bytes ({} hex digits), got {got} bytes",
                expected * 2
            ),
            SuiteError::Legacy(a) => write!(
                f,
                "{a} is a legacy algorithm (broken or weak): it is accepted only on an SA \
                 marked legacy, to reproduce older studies; never use it to protect traffic"
            ),
            SuiteError::DegenerateKey => f.write_str(
                "3des key has K1 = K2 or K2 = K3, which makes it single DES (RFC 2451 §2.3): refused",
            ),
            SuiteError::Random => {
                f.write_str("the system's random generator failed drawing the SA's CBC IV key")
            }
        }
    }
}

impl std::error::Error for SuiteError {}

impl Suite {
    pub fn new(encryption: Encryption, integrity: Integrity) -> Result<Self, SuiteError> {
        if encryption.is_aead() && integrity != Integrity::Null {
            return Err(SuiteError::AeadWithIntegrity {
                encryption: encryption.name(),
                integrity: integrity.name(),
            });
        }
        if encryption == Encryption::Null && integrity == Integrity::Null {
            return Err(SuiteError::NullNull);
        }
        Ok(Suite {
            encryption,
            integrity,
        })
    }

    pub fn from_names(encryption: &str, integrity: &str) -> Result<Self, SuiteError> {
        let e = Encryption::from_name(encryption)
            .ok_or_else(|| SuiteError::UnknownEncryption(encryption.into()))?;
        let i = Integrity::from_name(integrity)
            .ok_or_else(|| SuiteError::UnknownIntegrity(integrity.into()))?;
        Suite::new(e, i)
    }

    /// Parse a proposal as strongSwan writes it: `aes128gcm16`, `aes128-sha256`,
    /// `null-sha1`, `aes256` (CBC without integrity, as study 1's "enc only").
    pub fn parse(proposal: &str) -> Result<Self, SuiteError> {
        match proposal.split_once('-') {
            Some((e, i)) => Suite::from_names(e, i),
            None => Suite::from_names(proposal, "null"),
        }
    }

    /// Refuse a legacy algorithm unless the SA is marked legacy.
    pub fn check_legacy(&self, allowed: bool) -> Result<(), SuiteError> {
        if allowed {
            return Ok(());
        }
        if self.encryption.is_legacy() {
            return Err(SuiteError::Legacy(self.encryption.name()));
        }
        if self.integrity.is_legacy() {
            return Err(SuiteError::Legacy(self.integrity.name()));
        }
        Ok(())
    }

    /// Whether the suite authenticates what it carries (a combined-mode cipher, or an
    /// integrity algorithm): without it the sequence number is not authenticated.
    #[inline]
    pub fn has_integrity(&self) -> bool {
        self.encryption.is_aead() || self.integrity != Integrity::Null
    }

    #[inline]
    pub fn is_legacy(&self) -> bool {
        self.encryption.is_legacy() || self.integrity.is_legacy()
    }

    /// The proposal name, the inverse of [`Suite::parse`].
    #[inline]
    pub fn name(&self) -> String {
        if self.integrity == Integrity::Null {
            self.encryption.name().to_string()
        } else {
            format!("{}-{}", self.encryption.name(), self.integrity.name())
        }
    }

    #[inline]
    pub fn iv_len(&self) -> usize {
        self.encryption.iv_len()
    }
    #[inline]
    pub fn icv_len(&self) -> usize {
        self.encryption.aead_icv_len() + self.integrity.icv_len()
    }
    /// Alignment of pad + trailer: the cipher block, at least 4 (RFC 4303 §2.4).
    #[inline]
    pub fn align(&self) -> usize {
        self.encryption.spec().align()
    }
    /// Bytes padding adds for a payload of `payload_len` (RFC 4303 §2.4).
    #[inline]
    pub fn pad_len(&self, payload_len: usize) -> usize {
        let a = self.align();
        // `a` is a power of two (the table's test checks it): a mask, not two divisions.
        (payload_len + crate::constants::ESP_TRAILER_LEN).wrapping_neg() & (a - 1)
    }

    /// The suites the benchmark runs by default: each supported shape once.
    pub fn bench_defaults() -> Vec<Suite> {
        [
            "aes128gcm16",
            "aes256gcm16",
            "chacha20poly1305",
            "aes128gmac",
            "aes128-sha1",
            "aes128-sha256",
            "aes256-sha512",
            "null-sha256",
        ]
        .iter()
        .map(|p| Suite::parse(p).expect("built-in proposal"))
        .collect()
    }
}

/// Secret key bytes: zeroised on drop, redacted in `Debug`.
#[derive(Clone, Default, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    pub fn new(bytes: Vec<u8>) -> Self {
        SecretBytes(bytes)
    }
    pub fn from_slice(bytes: &[u8]) -> Self {
        SecretBytes(bytes.to_vec())
    }
    /// Parse hex (whitespace and `:` ignored, optional `0x`). The error never echoes the input.
    pub fn from_hex(s: &str) -> Result<Self, &'static str> {
        let s = s.trim();
        let s = s.strip_prefix("0x").unwrap_or(s);
        // Both the digits and the bytes are key material: zeroised on every way out.
        let digits: zeroize::Zeroizing<Vec<u8>> = zeroize::Zeroizing::new(
            s.bytes()
                .filter(|c| !c.is_ascii_whitespace() && *c != b':')
                .collect(),
        );
        if !digits.len().is_multiple_of(2) {
            return Err("hex key has an odd number of digits");
        }
        let mut out = zeroize::Zeroizing::new(Vec::with_capacity(digits.len() / 2));
        for pair in digits.chunks_exact(2) {
            let hi = (pair[0] as char)
                .to_digit(16)
                .ok_or("hex key has a non-hex character")?;
            let lo = (pair[1] as char)
                .to_digit(16)
                .ok_or("hex key has a non-hex character")?;
            out.push((hi * 16 + lo) as u8);
        }
        Ok(SecretBytes(std::mem::take(&mut *out)))
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<{} bytes redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposals_round_trip() {
        for p in [
            "aes128gcm16",
            "aes128-sha1",
            "null-sha512",
            "aes256",
            "chacha20poly1305",
            "3des-md5",
            "des-sha1",
            "null-md5",
        ] {
            assert_eq!(Suite::parse(p).unwrap().name(), p);
        }
    }

    #[test]
    fn legacy_is_refused_unless_allowed() {
        for (p, named) in [("3des-sha1", "3des"), ("des", "des"), ("null-md5", "md5")] {
            let s = Suite::parse(p).unwrap();
            assert!(s.is_legacy());
            assert_eq!(s.check_legacy(false), Err(SuiteError::Legacy(named)));
            assert_eq!(s.check_legacy(true), Ok(()));
        }
        let today = Suite::parse("aes128-sha1").unwrap();
        assert!(!today.is_legacy() && today.check_legacy(false).is_ok());
        // Never chosen by default.
        assert!(Suite::bench_defaults().iter().all(|s| !s.is_legacy()));
    }

    #[test]
    fn invalid_pairings_are_refused() {
        assert!(matches!(
            Suite::parse("aes128gcm16-sha256"),
            Err(SuiteError::AeadWithIntegrity { .. })
        ));
        assert_eq!(Suite::parse("null"), Err(SuiteError::NullNull));
        assert_eq!(Suite::parse("null-null"), Err(SuiteError::NullNull));
        assert!(matches!(
            Suite::parse("aes999-sha1"),
            Err(SuiteError::UnknownEncryption(_))
        ));
        assert!(matches!(
            Suite::parse("aes128-md4"),
            Err(SuiteError::UnknownIntegrity(_))
        ));
        let msg = Suite::parse("aes128gmac-sha1").unwrap_err().to_string();
        assert!(msg.contains("aes128gmac") && msg.contains("sha1"), "{msg}");
    }

    #[test]
    fn padding_is_minimal_and_aligned() {
        let cbc = Suite::parse("aes128-sha1").unwrap();
        assert_eq!(cbc.pad_len(14), 0);
        assert_eq!(cbc.pad_len(0), 14);
        assert_eq!(cbc.pad_len(15), 15);
        let gcm = Suite::parse("aes128gcm16").unwrap();
        assert_eq!(gcm.pad_len(2), 0);
        assert_eq!(gcm.pad_len(3), 3);
    }

    #[test]
    fn secrets_are_redacted_and_hex_errors_do_not_echo() {
        let k = SecretBytes::from_hex("0x00112233").unwrap();
        assert_eq!(k.expose(), &[0, 0x11, 0x22, 0x33]);
        assert!(!format!("{k:?}").contains("11"));
        let e = SecretBytes::from_hex("zz1122").unwrap_err();
        assert!(!e.contains("zz"));
    }
}
