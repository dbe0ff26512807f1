//! One row per algorithm: every fact the engine, the lab, the model and the docs need
//! about it, in one place (as rustls builds one `SupportedCipherSuite` value per suite).
//!
//! [`Encryption::spec`] and [`Integrity::spec`] are the only matches on an algorithm's
//! name, and they are exhaustive: a new variant does not compile until it has a row. The
//! rest of the engine matches on the row's [`Primitive`] / [`MacPrimitive`], also
//! exhaustively, so a new *kind* of algorithm is pointed out by the compiler wherever
//! it must be handled. The Python side reads the same rows through
//! `ipsec_lab._native.algorithms()`.

use aws_lc_rs::{aead, cipher, hmac};

use super::{Encryption, Integrity};

/// How an ESP encryption algorithm is computed (what `CipherState` builds from it).
#[derive(Clone, Copy)]
pub enum Primitive {
    /// ENCR_NULL: the payload is carried as is.
    Null,
    /// AES in CBC mode (aws-lc-rs), key length from the algorithm.
    AesCbc(&'static cipher::Algorithm),
    /// Legacy DES / 3DES in CBC mode (RustCrypto; aws-lc-rs has neither).
    DesCbc,
    TripleDesCbc,
    /// A combined mode with ciphertext: AES-GCM or ChaCha20-Poly1305.
    Aead(&'static aead::Algorithm),
    /// AES-GMAC: GCM with everything as AAD and no ciphertext (RFC 4543 §3).
    Gmac(&'static aead::Algorithm),
}

/// How an integrity algorithm is computed.
#[derive(Clone, Copy)]
pub enum MacPrimitive {
    Null,
    /// HMAC from aws-lc-rs.
    Hmac(&'static hmac::Algorithm),
    /// HMAC-MD5 (RustCrypto; aws-lc-rs has no MD5).
    HmacMd5,
    /// AES-GMAC as AH's integrity algorithm (RFC 4543 §4).
    Gmac(&'static aead::Algorithm),
}

/// What the model calls the cipher's shape (`kind` in `model/transforms.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    None,
    Cbc,
    Aead,
    Gmac,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::None => "none",
            Kind::Cbc => "cbc",
            Kind::Aead => "aead",
            Kind::Gmac => "gmac",
        }
    }
}

/// An ESP encryption (or combined-mode) algorithm.
pub struct EncryptionSpec {
    pub id: Encryption,
    /// The strongSwan / IKEv2 proposal keyword, which is also ours.
    pub name: &'static str,
    /// What the RFCs and vendors call it (`AES-GCM-128`, `HMAC-SHA-256-128`).
    pub title: &'static str,
    pub rfc: &'static str,
    pub primitive: Primitive,
    /// Cipher key bytes, without the salt.
    pub key_len: usize,
    /// Salt bytes appended to the key (RFC 4106 §8.1, RFC 4543 §6, RFC 7634 §4).
    pub salt_len: usize,
    /// Explicit IV carried in each packet.
    pub iv_len: usize,
    /// ICV of a combined mode (0 where a separate integrity algorithm is needed).
    pub icv_len: usize,
    /// The cipher block the plaintext is padded to (1 for stream and counter modes).
    pub block_len: usize,
    /// Width of the block function, for the model's precise secured length (ChaCha20
    /// works in 64-byte blocks though it pads to 1).
    pub work_block: usize,
    /// Broken or weak: accepted only on an SA marked legacy.
    pub legacy: bool,
    /// The Linux kernel's crypto API name (`ip xfrm state … enc|aead NAME`).
    pub kernel: &'static str,
    /// Whether strongSwan's kernel-libipsec (its user-space ESP) implements it: it has
    /// no NULL_AES_GMAC ("unsupported AEAD algorithm").
    pub libipsec: bool,
}

impl EncryptionSpec {
    #[inline]
    pub fn kind(&self) -> Kind {
        match self.primitive {
            Primitive::Null => Kind::None,
            Primitive::AesCbc(_) | Primitive::DesCbc | Primitive::TripleDesCbc => Kind::Cbc,
            Primitive::Aead(_) => Kind::Aead,
            Primitive::Gmac(_) => Kind::Gmac,
        }
    }
    #[inline]
    pub fn is_aead(&self) -> bool {
        matches!(self.kind(), Kind::Aead | Kind::Gmac)
    }
    /// Alignment of ESP's payload, padding and trailer: the cipher block, at least 4
    /// (RFC 4303 §2.4).
    #[inline]
    pub fn align(&self) -> usize {
        self.block_len.max(crate::constants::ESP_MIN_ALIGN)
    }
}

/// An integrity algorithm: ESP's (with a non-combined cipher) and AH's.
pub struct IntegritySpec {
    pub id: Integrity,
    pub name: &'static str,
    /// What the RFCs and vendors call it (`AES-GCM-128`, `HMAC-SHA-256-128`).
    pub title: &'static str,
    pub rfc: &'static str,
    pub primitive: MacPrimitive,
    /// Key bytes without the salt: the hash output length for HMAC (RFC 2403 §3,
    /// RFC 2404 §3, RFC 4868 §2.1.1), the AES key for GMAC.
    pub key_len: usize,
    pub salt_len: usize,
    /// The IV AH carries before the ICV (8 for GMAC, RFC 4543 §4).
    pub iv_len: usize,
    /// Truncated ICV bytes on the wire (GMAC's tag is never truncated, RFC 4543 §3.4).
    pub icv_len: usize,
    /// The hash's block (HMAC) or GHASH's (GMAC), for the model's precise secured length.
    pub work_block: usize,
    /// Minimum Merkle-Damgård padding: 0x80 and the length field (0 for GMAC).
    pub md_pad: usize,
    /// Whether ESP may use it (RFC 4543 §5.3: AUTH_AES_*_GMAC "MUST NOT be used with ESP").
    pub esp: bool,
    /// Whether AH may use it (not `null`: AH is integrity).
    pub ah: bool,
    pub legacy: bool,
    /// The kernel's crypto API name (`auth-trunc NAME … BITS`); None where Linux has none.
    pub kernel: Option<&'static str>,
}

macro_rules! enc {
    ($id:ident, $name:literal, $title:literal, $rfc:literal, $prim:expr, key $k:literal, salt $s:literal,
     iv $iv:literal, icv $icv:literal, block $b:literal, work $w:literal, legacy $l:literal,
     kernel $kn:literal, libipsec $li:literal) => {
        EncryptionSpec {
            id: Encryption::$id,
            name: $name,
            title: $title,
            rfc: $rfc,
            primitive: $prim,
            key_len: $k,
            salt_len: $s,
            iv_len: $iv,
            icv_len: $icv,
            block_len: $b,
            work_block: $w,
            legacy: $l,
            kernel: $kn,
            libipsec: $li,
        }
    };
}

static E_NULL: EncryptionSpec = enc!(Null, "null", "NULL", "RFC 2410", Primitive::Null,
    key 0, salt 0, iv 0, icv 0, block 1, work 1, legacy false,
    kernel "ecb(cipher_null)", libipsec true);
static E_AES128: EncryptionSpec = enc!(Aes128Cbc, "aes128", "AES-CBC-128", "RFC 3602",
    Primitive::AesCbc(&cipher::AES_128),
    key 16, salt 0, iv 16, icv 0, block 16, work 16, legacy false,
    kernel "cbc(aes)", libipsec true);
static E_AES192: EncryptionSpec = enc!(Aes192Cbc, "aes192", "AES-CBC-192", "RFC 3602",
    Primitive::AesCbc(&cipher::AES_192),
    key 24, salt 0, iv 16, icv 0, block 16, work 16, legacy false,
    kernel "cbc(aes)", libipsec true);
static E_AES256: EncryptionSpec = enc!(Aes256Cbc, "aes256", "AES-CBC-256", "RFC 3602",
    Primitive::AesCbc(&cipher::AES_256),
    key 32, salt 0, iv 16, icv 0, block 16, work 16, legacy false,
    kernel "cbc(aes)", libipsec true);
static E_AES128GCM16: EncryptionSpec = enc!(Aes128Gcm16, "aes128gcm16", "AES-GCM-128", "RFC 4106",
    Primitive::Aead(&aead::AES_128_GCM),
    key 16, salt 4, iv 8, icv 16, block 1, work 16, legacy false,
    kernel "rfc4106(gcm(aes))", libipsec true);
static E_AES256GCM16: EncryptionSpec = enc!(Aes256Gcm16, "aes256gcm16", "AES-GCM-256", "RFC 4106",
    Primitive::Aead(&aead::AES_256_GCM),
    key 32, salt 4, iv 8, icv 16, block 1, work 16, legacy false,
    kernel "rfc4106(gcm(aes))", libipsec true);
static E_CHACHA: EncryptionSpec = enc!(ChaCha20Poly1305, "chacha20poly1305", "ChaCha20-Poly1305", "RFC 7634",
    Primitive::Aead(&aead::CHACHA20_POLY1305),
    key 32, salt 4, iv 8, icv 16, block 1, work 64, legacy false,
    kernel "rfc7539esp(chacha20,poly1305)", libipsec true);
static E_AES128GMAC: EncryptionSpec = enc!(Aes128Gmac, "aes128gmac", "AES-GMAC-128", "RFC 4543",
    Primitive::Gmac(&aead::AES_128_GCM),
    key 16, salt 4, iv 8, icv 16, block 1, work 16, legacy false,
    kernel "rfc4543(gcm(aes))", libipsec false);
static E_AES256GMAC: EncryptionSpec = enc!(Aes256Gmac, "aes256gmac", "AES-GMAC-256", "RFC 4543",
    Primitive::Gmac(&aead::AES_256_GCM),
    key 32, salt 4, iv 8, icv 16, block 1, work 16, legacy false,
    kernel "rfc4543(gcm(aes))", libipsec false);
// RFC 2451 §2.3: three 64-bit DES keys (parity bits included, not checked).
static E_3DES: EncryptionSpec = enc!(TripleDesCbc, "3des", "3DES-CBC", "RFC 2451", Primitive::TripleDesCbc,
    key 24, salt 0, iv 8, icv 0, block 8, work 8, legacy true,
    kernel "cbc(des3_ede)", libipsec true);
static E_DES: EncryptionSpec = enc!(DesCbc, "des", "DES-CBC", "RFC 2405", Primitive::DesCbc,
    key 8, salt 0, iv 8, icv 0, block 8, work 8, legacy true,
    kernel "cbc(des)", libipsec true);

/// Every encryption algorithm, in the order they are listed to users.
pub static ENCRYPTIONS: [&EncryptionSpec; 11] = [
    &E_NULL,
    &E_AES128,
    &E_AES192,
    &E_AES256,
    &E_AES128GCM16,
    &E_AES256GCM16,
    &E_CHACHA,
    &E_AES128GMAC,
    &E_AES256GMAC,
    &E_3DES,
    &E_DES,
];

macro_rules! integ {
    ($id:ident, $name:literal, $title:literal, $rfc:literal, $prim:expr, key $k:literal, salt $s:literal,
     iv $iv:literal, icv $icv:literal, work $w:literal, md_pad $md:literal, esp $esp:literal,
     ah $ah:literal, legacy $l:literal, kernel $kn:expr) => {
        IntegritySpec {
            id: Integrity::$id,
            name: $name,
            title: $title,
            rfc: $rfc,
            primitive: $prim,
            key_len: $k,
            salt_len: $s,
            iv_len: $iv,
            icv_len: $icv,
            work_block: $w,
            md_pad: $md,
            esp: $esp,
            ah: $ah,
            legacy: $l,
            kernel: $kn,
        }
    };
}

static I_NULL: IntegritySpec = integ!(Null, "null", "none", "RFC 4303", MacPrimitive::Null,
    key 0, salt 0, iv 0, icv 0, work 1, md_pad 0, esp true, ah false, legacy false,
    kernel None);
static I_SHA1: IntegritySpec = integ!(HmacSha1_96, "sha1", "HMAC-SHA1-96", "RFC 2404",
    MacPrimitive::Hmac(&hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY),
    key 20, salt 0, iv 0, icv 12, work 64, md_pad 9, esp true, ah true, legacy false,
    kernel Some("hmac(sha1)"));
static I_SHA256: IntegritySpec = integ!(HmacSha256_128, "sha256", "HMAC-SHA-256-128", "RFC 4868",
    MacPrimitive::Hmac(&hmac::HMAC_SHA256),
    key 32, salt 0, iv 0, icv 16, work 64, md_pad 9, esp true, ah true, legacy false,
    kernel Some("hmac(sha256)"));
static I_SHA384: IntegritySpec = integ!(HmacSha384_192, "sha384", "HMAC-SHA-384-192", "RFC 4868",
    MacPrimitive::Hmac(&hmac::HMAC_SHA384),
    key 48, salt 0, iv 0, icv 24, work 128, md_pad 17, esp true, ah true, legacy false,
    kernel Some("hmac(sha384)"));
static I_SHA512: IntegritySpec = integ!(HmacSha512_256, "sha512", "HMAC-SHA-512-256", "RFC 4868",
    MacPrimitive::Hmac(&hmac::HMAC_SHA512),
    key 64, salt 0, iv 0, icv 32, work 128, md_pad 17, esp true, ah true, legacy false,
    kernel Some("hmac(sha512)"));
static I_MD5: IntegritySpec = integ!(HmacMd5_96, "md5", "HMAC-MD5-96", "RFC 2403", MacPrimitive::HmacMd5,
    key 16, salt 0, iv 0, icv 12, work 64, md_pad 9, esp true, ah true, legacy true,
    kernel Some("hmac(md5)"));
static I_AES128GMAC: IntegritySpec = integ!(AuthAes128Gmac, "aes128gmac", "AES-GMAC-128", "RFC 4543",
    MacPrimitive::Gmac(&aead::AES_128_GCM),
    key 16, salt 4, iv 8, icv 16, work 16, md_pad 0, esp false, ah true, legacy false,
    kernel None);
static I_AES256GMAC: IntegritySpec = integ!(AuthAes256Gmac, "aes256gmac", "AES-GMAC-256", "RFC 4543",
    MacPrimitive::Gmac(&aead::AES_256_GCM),
    key 32, salt 4, iv 8, icv 16, work 16, md_pad 0, esp false, ah true, legacy false,
    kernel None);

/// Every integrity algorithm, in the order they are listed to users.
pub static INTEGRITIES: [&IntegritySpec; 8] = [
    &I_NULL,
    &I_SHA1,
    &I_SHA256,
    &I_SHA384,
    &I_SHA512,
    &I_MD5,
    &I_AES128GMAC,
    &I_AES256GMAC,
];

impl Encryption {
    /// This algorithm's row. The one exhaustive match on the name: a new variant does
    /// not compile without a row.
    #[inline]
    pub fn spec(self) -> &'static EncryptionSpec {
        match self {
            Encryption::Null => &E_NULL,
            Encryption::Aes128Cbc => &E_AES128,
            Encryption::Aes192Cbc => &E_AES192,
            Encryption::Aes256Cbc => &E_AES256,
            Encryption::Aes128Gcm16 => &E_AES128GCM16,
            Encryption::Aes256Gcm16 => &E_AES256GCM16,
            Encryption::ChaCha20Poly1305 => &E_CHACHA,
            Encryption::Aes128Gmac => &E_AES128GMAC,
            Encryption::Aes256Gmac => &E_AES256GMAC,
            Encryption::TripleDesCbc => &E_3DES,
            Encryption::DesCbc => &E_DES,
        }
    }
}

impl Integrity {
    /// This algorithm's row (the one exhaustive match on the name).
    #[inline]
    pub fn spec(self) -> &'static IntegritySpec {
        match self {
            Integrity::Null => &I_NULL,
            Integrity::HmacSha1_96 => &I_SHA1,
            Integrity::HmacSha256_128 => &I_SHA256,
            Integrity::HmacSha384_192 => &I_SHA384,
            Integrity::HmacSha512_256 => &I_SHA512,
            Integrity::HmacMd5_96 => &I_MD5,
            Integrity::AuthAes128Gmac => &I_AES128GMAC,
            Integrity::AuthAes256Gmac => &I_AES256GMAC,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_its_variants_and_names_are_unique() {
        for (i, row) in ENCRYPTIONS.iter().enumerate() {
            assert!(core::ptr::eq(row.id.spec(), *row), "{}", row.name);
            assert!(ENCRYPTIONS[..i]
                .iter()
                .all(|r| r.name != row.name && r.id != row.id));
            // An AEAD's ICV is its own; a CBC cipher's comes from the integrity algorithm.
            assert_eq!(row.is_aead(), row.icv_len > 0, "{}", row.name);
            assert_eq!(row.is_aead(), row.salt_len == 4, "{}", row.name);
            // ESP's padding and length check use masks (Suite::pad_len, Sa::open)
            assert!(row.align().is_power_of_two(), "{}", row.name);
        }
        for (i, row) in INTEGRITIES.iter().enumerate() {
            assert!(core::ptr::eq(row.id.spec(), *row), "{}", row.name);
            assert!(INTEGRITIES[..i]
                .iter()
                .all(|r| r.name != row.name && r.id != row.id));
        }
    }

    /// The variant after `e` in declaration order. The matches are exhaustive (no `_`
    /// arm): a new variant does not compile until it is placed here, and the test below
    /// then fails until its row is in `ENCRYPTIONS` / `INTEGRITIES` — a row left out of
    /// the list would be unknown to every name lookup, the CLI and Python.
    fn after_enc(e: Encryption) -> Option<Encryption> {
        use Encryption::*;
        match e {
            Null => Some(Aes128Cbc),
            Aes128Cbc => Some(Aes192Cbc),
            Aes192Cbc => Some(Aes256Cbc),
            Aes256Cbc => Some(Aes128Gcm16),
            Aes128Gcm16 => Some(Aes256Gcm16),
            Aes256Gcm16 => Some(ChaCha20Poly1305),
            ChaCha20Poly1305 => Some(Aes128Gmac),
            Aes128Gmac => Some(Aes256Gmac),
            Aes256Gmac => Some(TripleDesCbc),
            TripleDesCbc => Some(DesCbc),
            DesCbc => None,
        }
    }

    fn after_integ(i: Integrity) -> Option<Integrity> {
        use Integrity::*;
        match i {
            Null => Some(HmacSha1_96),
            HmacSha1_96 => Some(HmacSha256_128),
            HmacSha256_128 => Some(HmacSha384_192),
            HmacSha384_192 => Some(HmacSha512_256),
            HmacSha512_256 => Some(HmacMd5_96),
            HmacMd5_96 => Some(AuthAes128Gmac),
            AuthAes128Gmac => Some(AuthAes256Gmac),
            AuthAes256Gmac => None,
        }
    }

    #[test]
    fn every_variant_has_its_row_in_the_list() {
        let encs: Vec<_> =
            core::iter::successors(Some(Encryption::Null), |e| after_enc(*e)).collect();
        assert_eq!(encs.len(), ENCRYPTIONS.len());
        for e in encs {
            assert!(
                ENCRYPTIONS.iter().any(|r| r.id == e),
                "{e:?} is not in ENCRYPTIONS"
            );
        }
        let integs: Vec<_> =
            core::iter::successors(Some(Integrity::Null), |i| after_integ(*i)).collect();
        assert_eq!(integs.len(), INTEGRITIES.len());
        for i in integs {
            assert!(
                INTEGRITIES.iter().any(|r| r.id == i),
                "{i:?} is not in INTEGRITIES"
            );
        }
    }

    #[test]
    fn the_aws_lc_algorithm_takes_the_rows_key_length() {
        for row in ENCRYPTIONS {
            match row.primitive {
                Primitive::AesCbc(a) => {
                    let key = vec![7u8; row.key_len];
                    assert!(
                        cipher::UnboundCipherKey::new(a, &key).is_ok(),
                        "{}",
                        row.name
                    );
                    let short = &key[..row.key_len - 8];
                    assert!(
                        cipher::UnboundCipherKey::new(a, short).is_err(),
                        "{}",
                        row.name
                    );
                }
                Primitive::Aead(a) | Primitive::Gmac(a) => {
                    assert_eq!(a.key_len(), row.key_len, "{}", row.name)
                }
                Primitive::Null | Primitive::DesCbc | Primitive::TripleDesCbc => {}
            }
        }
        for row in INTEGRITIES {
            match row.primitive {
                // RFC 4868 §2.1.1 / RFC 2404 §3: the key is as long as the hash output.
                MacPrimitive::Hmac(a) => {
                    assert_eq!(
                        a.digest_algorithm().output_len(),
                        row.key_len,
                        "{}",
                        row.name
                    )
                }
                MacPrimitive::Gmac(a) => assert_eq!(a.key_len(), row.key_len, "{}", row.name),
                MacPrimitive::Null | MacPrimitive::HmacMd5 => {}
            }
        }
    }
}
