//! Per-SA expanded keys and the seal/open primitives ESP calls.

use ::hmac::Mac as _;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
};
use aws_lc_rs::constant_time::verify_slices_are_equal;
use aws_lc_rs::hmac as awshmac;
use aws_lc_rs::iv::FixedLength;
use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit, KeyInit};
use zeroize::Zeroizing;

use super::{Integrity, MacPrimitive, Primitive, SecretBytes, Suite, SuiteError};
use crate::constants::ESP_HEADER_LEN;
use crate::drop::DropReason;
use crate::stage::{Stage, StageTimes};

// One per SA, never moved on the hot path: boxing the large variant would only add a
// pointer chase per packet.
#[allow(clippy::large_enum_variant)]
enum Cipher {
    Null,
    Cbc {
        enc: EncryptingKey,
        dec: DecryptingKey,
        ivs: CbcIvs,
    },
    /// GCM and ChaCha20-Poly1305: nonce = salt ‖ IV (RFC 4106 §4, RFC 7634 §2).
    Aead {
        key: LessSafeKey,
        salt: Zeroizing<[u8; 4]>,
    },
    /// GMAC: GCM with everything as AAD and no ciphertext (RFC 4543 §3).
    Gmac {
        key: LessSafeKey,
        salt: Zeroizing<[u8; 4]>,
    },
    /// Legacy DES / 3DES in CBC mode (RustCrypto; aws-lc-rs has neither).
    LegacyCbc(LegacyBlock, CbcIvs),
}

/// CBC IVs without a random-number call per packet.
///
/// RFC 3602 §2.1 asks for IVs an attacker cannot predict before the packet is sent (a
/// predictable IV lets a chosen-plaintext attacker test guesses, as in BEAST), not for
/// fresh randomness each time. NIST SP 800-38A appendix C gives the standard way: encrypt
/// a nonce with a block cipher. Linux's ESP does this with `eseqiv` / `echainiv`
/// (crypto/echainiv.c: the sequence number mixed with a secret salt, encrypted). We take
/// the sequence number, which never repeats under an SA, as the nonce and encrypt it
/// under an AES-128 key drawn once per SA from the system's generator and used for
/// nothing else: IV(seq) = AES-128(K_iv, 0…0 ‖ seq), so IVs are distinct, pseudo-random
/// and unknown until sent; a restart draws a new K_iv. They are made [`IV_BATCH`] at a
/// time as one AES-CTR keystream from counter block `0…0 ‖ base` (CTR pipelines where
/// CBC cannot): ~4 ns a packet instead of ~400 ns for `rand::fill` at 64 bytes
/// (`bench --stages` at 492fd88) or ~25 ns for one serial extra block. DES and 3DES take
/// the first 8 bytes.
pub struct CbcIvs {
    key: EncryptingKey,
    /// The sequence number of `blocks`' first IV, when `filled`.
    base: u64,
    filled: bool,
    blocks: Zeroizing<[u8; IV_BATCH * 16]>,
}

/// IVs derived per keystream call (a power of two: batches start at multiples of it).
pub const IV_BATCH: usize = 32;

impl CbcIvs {
    fn fresh() -> Result<Self, SuiteError> {
        let mut key = Zeroizing::new([0u8; 16]);
        aws_lc_rs::rand::fill(&mut key[..]).map_err(|_| SuiteError::Random)?;
        Self::with_key(&key)
    }

    fn with_key(key: &[u8; 16]) -> Result<Self, SuiteError> {
        let unbound = UnboundCipherKey::new(&aws_lc_rs::cipher::AES_128, key)
            .map_err(|_| SuiteError::Random)?;
        Ok(CbcIvs {
            key: EncryptingKey::ctr(unbound).map_err(|_| SuiteError::Random)?,
            base: 0,
            filled: false,
            blocks: Zeroizing::new([0u8; IV_BATCH * 16]),
        })
    }

    /// Write IV(seq), cut to `out.len()` (16 or 8 bytes), into `out`.
    fn write(&mut self, seq: u64, out: &mut [u8]) -> Result<(), DropReason> {
        let base = seq & !(IV_BATCH as u64 - 1);
        if !self.filled || base != self.base {
            // The batch's counter blocks are base … base + IV_BATCH - 1 in the low 64
            // bits; base is aligned, so the low 32 bits never wrap inside a batch.
            self.blocks.fill(0);
            let mut counter = [0u8; 16];
            counter[8..].copy_from_slice(&base.to_be_bytes());
            self.filled = false;
            self.key
                .less_safe_encrypt(
                    &mut self.blocks[..],
                    EncryptionContext::Iv128(FixedLength::from(counter)),
                )
                .map_err(|_| DropReason::CryptoError)?;
            (self.base, self.filled) = (base, true);
        }
        let at = (seq - base) as usize * 16;
        let n = out.len();
        out.copy_from_slice(&self.blocks[at..at + n]);
        Ok(())
    }
}

/// A DES-family key schedule, expanded once per SA and cloned into each packet's CBC
/// state (RustCrypto's types zeroise nothing, so these are dropped with the SA).
#[derive(Clone)]
#[allow(clippy::large_enum_variant)] // one per SA, as `Cipher`
enum LegacyBlock {
    Des(des::Des),
    Tdes(des::TdesEde3),
}

impl LegacyBlock {
    fn encrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<(), DropReason> {
        let n = data.len();
        let r = match self {
            LegacyBlock::Des(k) => cbc::Encryptor::inner_iv_slice_init(k.clone(), iv)
                .map(|e| e.encrypt_padded_mut::<NoPadding>(data, n).is_ok()),
            LegacyBlock::Tdes(k) => cbc::Encryptor::inner_iv_slice_init(k.clone(), iv)
                .map(|e| e.encrypt_padded_mut::<NoPadding>(data, n).is_ok()),
        };
        match r {
            Ok(true) => Ok(()),
            Ok(false) => Err(DropReason::BadCiphertextLength),
            Err(_) => Err(DropReason::BadIv),
        }
    }

    fn decrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<(), DropReason> {
        let r = match self {
            LegacyBlock::Des(k) => cbc::Decryptor::inner_iv_slice_init(k.clone(), iv)
                .map(|d| d.decrypt_padded_mut::<NoPadding>(data).is_ok()),
            LegacyBlock::Tdes(k) => cbc::Decryptor::inner_iv_slice_init(k.clone(), iv)
                .map(|d| d.decrypt_padded_mut::<NoPadding>(data).is_ok()),
        };
        match r {
            Ok(true) => Ok(()),
            Ok(false) => Err(DropReason::BadCiphertextLength),
            Err(_) => Err(DropReason::BadIv),
        }
    }
}

/// An integrity key, set up once per SA: an HMAC (aws-lc-rs, or RustCrypto for MD5,
/// which aws-lc-rs lacks), or AH's AES-GMAC (RFC 4543 §4).
#[allow(clippy::large_enum_variant)] // one per SA, as `Cipher`
enum MacKey {
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

/// Where the IV of a sealed packet comes from.
#[derive(Clone, Copy, Debug)]
pub enum IvSource<'a> {
    /// CBC: the sequence number encrypted under a secret per-SA IV key ([`CbcIvs`]:
    /// unpredictable, as RFC 3602 §2.1 requires); combined modes: the
    /// 64-bit sequence number, unique under the key because sequence numbers never
    /// repeat within an SA (RFC 4106 §3.1).
    Generate,
    /// A fixed IV, for known-answer tests only.
    Fixed(&'a [u8]),
}

/// An SA's expanded keys. aws-lc frees (and cleanses) its key schedules on drop; the
/// salts we hold ourselves are zeroised.
pub struct CipherState {
    suite: Suite,
    cipher: Cipher,
    mac: Option<MacKey>,
}

impl core::fmt::Debug for CipherState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "CipherState({}, <keys redacted>)", self.suite.name())
    }
}

fn check_len(
    what: &'static str,
    algorithm: &'static str,
    expected: usize,
    key: &SecretBytes,
) -> Result<(), SuiteError> {
    if key.len() != expected {
        return Err(SuiteError::KeyLength {
            what,
            algorithm,
            expected,
            got: key.len(),
        });
    }
    Ok(())
}

fn split_salt(key: &[u8]) -> (&[u8], Zeroizing<[u8; 4]>) {
    let (k, s) = key.split_at(key.len() - 4);
    (k, Zeroizing::new(s.try_into().unwrap()))
}

impl CipherState {
    pub fn new(
        suite: Suite,
        enc_key: &SecretBytes,
        integ_key: &SecretBytes,
    ) -> Result<Self, SuiteError> {
        let e = suite.encryption;
        check_len("encryption", e.name(), e.key_len(), enc_key)?;
        check_len(
            "integrity",
            suite.integrity.name(),
            suite.integrity.key_len(),
            integ_key,
        )?;
        let bad = || SuiteError::KeyLength {
            what: "encryption",
            algorithm: e.name(),
            expected: e.key_len(),
            got: enc_key.len(),
        };
        let k = enc_key.expose();
        let cipher = match e.spec().primitive {
            Primitive::Null => Cipher::Null,
            Primitive::AesCbc(alg) => {
                let enc = EncryptingKey::cbc(UnboundCipherKey::new(alg, k).map_err(|_| bad())?)
                    .map_err(|_| bad())?;
                let dec = DecryptingKey::cbc(UnboundCipherKey::new(alg, k).map_err(|_| bad())?)
                    .map_err(|_| bad())?;
                Cipher::Cbc {
                    enc,
                    dec,
                    ivs: CbcIvs::fresh()?,
                }
            }
            Primitive::TripleDesCbc => {
                // RFC 2451 §2.3: K1 = K2 or K2 = K3 degenerates to single DES.
                if k[..8] == k[8..16] || k[8..16] == k[16..24] {
                    return Err(SuiteError::DegenerateKey);
                }
                Cipher::LegacyCbc(
                    LegacyBlock::Tdes(des::TdesEde3::new_from_slice(k).map_err(|_| bad())?),
                    CbcIvs::fresh()?,
                )
            }
            Primitive::DesCbc => Cipher::LegacyCbc(
                LegacyBlock::Des(des::Des::new_from_slice(k).map_err(|_| bad())?),
                CbcIvs::fresh()?,
            ),
            Primitive::Aead(alg) => {
                let (k, salt) = split_salt(k);
                let key = LessSafeKey::new(UnboundKey::new(alg, k).map_err(|_| bad())?);
                Cipher::Aead { key, salt }
            }
            Primitive::Gmac(alg) => {
                let (k, salt) = split_salt(k);
                let key = LessSafeKey::new(UnboundKey::new(alg, k).map_err(|_| bad())?);
                Cipher::Gmac { key, salt }
            }
        };
        let mac = mac_key(suite.integrity, integ_key.expose()).ok_or(SuiteError::KeyLength {
            what: "integrity",
            algorithm: suite.integrity.name(),
            expected: suite.integrity.key_len(),
            got: integ_key.len(),
        });
        let mac = match suite.integrity.spec().primitive {
            MacPrimitive::Null => None,
            MacPrimitive::Hmac(_) | MacPrimitive::HmacMd5 | MacPrimitive::Gmac(_) => Some(mac?),
        };
        Ok(CipherState { suite, cipher, mac })
    }

    pub fn suite(&self) -> Suite {
        self.suite
    }

    /// Replace a CBC SA's secret IV key (see [`CbcIvs`]): for known-answer tests of the
    /// IV derivation only. Returns false for a suite without CBC.
    #[doc(hidden)]
    pub fn set_cbc_iv_key_for_tests(&mut self, key: [u8; 16]) -> bool {
        match &mut self.cipher {
            Cipher::Cbc { ivs, .. } | Cipher::LegacyCbc(_, ivs) => {
                *ivs = CbcIvs::with_key(&key).expect("AES-128 takes a 16-byte key");
                true
            }
            Cipher::Null | Cipher::Aead { .. } | Cipher::Gmac { .. } => false,
        }
    }

    /// The HMAC of `parts` in order, with the ESN high half appended (AH, RFC 4302
    /// §3.3.3.1: zeroed IP headers, AH header with a zero ICV, payload). `None` when the
    /// suite has no HMAC.
    pub fn icv_over(&self, parts: &[&[u8]], seq: u64, esn: bool) -> Option<Icv> {
        match self.mac.as_ref()? {
            MacKey::Gmac { .. } => None,
            m => Some(hmac_icv(m, parts, seq, esn)),
        }
    }

    /// AH's AES-GMAC tag (RFC 4543 §4): GCM under the SA's key with nonce salt ‖ `iv`,
    /// no plaintext, and `aad` — the whole AH-authenticated data, the IV in it and the
    /// ICV field zeroed — as the additional authenticated data. `None` unless the
    /// integrity algorithm is GMAC.
    pub fn ah_gmac(&self, iv: &[u8; 8], aad: &[u8]) -> Option<[u8; 16]> {
        let Some(MacKey::Gmac { key, salt }) = &self.mac else {
            return None;
        };
        let tag = key
            .seal_in_place_separate_tag(nonce(salt, iv), Aad::from(aad), &mut [])
            .ok()?;
        tag.as_ref().try_into().ok()
    }

    /// Encrypt and authenticate an ESP packet in place.
    ///
    /// `buf[esp..end]` holds the ESP header, room for the IV, and the plaintext with its
    /// padding and trailer already written; the ICV is written to `buf[end..end + icv_len]`.
    /// For GMAC with ESN, the 4 bytes before `esp` are borrowed and restored.
    pub fn seal(
        &mut self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
        iv: IvSource<'_>,
    ) -> Result<(), DropReason> {
        self.seal_staged(buf, esp, end, seq, esn, iv, &mut StageTimes::off())
    }

    /// [`CipherState::seal`], timing the IV, cipher and MAC stages into `st`.
    #[allow(clippy::too_many_arguments)]
    pub fn seal_staged(
        &mut self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
        iv: IvSource<'_>,
        st: &mut StageTimes,
    ) -> Result<(), DropReason> {
        let t = st.start();
        self.write_iv(buf, esp, seq, iv)?;
        st.stop(Stage::Iv, t);
        self.seal_body_staged(buf, esp, end, seq, esn, st)
    }

    /// The IV of the packet numbered `seq` into `buf[esp + 8 ..]`: the one step of
    /// sealing that changes the SA's state (a CBC SA's IV batch), so that the rest,
    /// [`CipherState::seal_body`], can run on any thread.
    #[inline]
    pub fn write_iv(
        &mut self,
        buf: &mut [u8],
        esp: usize,
        seq: u64,
        iv: IvSource<'_>,
    ) -> Result<(), DropReason> {
        let iv_at = esp + ESP_HEADER_LEN;
        let iv_len = self.suite.iv_len();
        let ct_at = iv_at + iv_len;
        if ct_at > buf.len() {
            return Err(DropReason::NoRoom);
        }
        match iv {
            IvSource::Fixed(v) if v.len() != iv_len => return Err(DropReason::BadIv),
            IvSource::Fixed(v) => buf[iv_at..ct_at].copy_from_slice(v),
            IvSource::Generate => match &mut self.cipher {
                Cipher::Null => {}
                Cipher::Cbc { ivs, .. } | Cipher::LegacyCbc(_, ivs) => {
                    ivs.write(seq, &mut buf[iv_at..ct_at])?
                }
                Cipher::Aead { .. } | Cipher::Gmac { .. } => {
                    buf[iv_at..ct_at].copy_from_slice(&seq.to_be_bytes())
                }
            },
        }
        Ok(())
    }

    /// Encrypt and authenticate an ESP packet whose IV is already in place
    /// ([`CipherState::write_iv`]); the ICV goes to `buf[end..end + icv_len]`. Reads the
    /// keys only: several threads may seal packets of one SA at once.
    pub fn seal_body(
        &self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
    ) -> Result<(), DropReason> {
        self.seal_body_staged(buf, esp, end, seq, esn, &mut StageTimes::off())
    }

    #[inline]
    pub(crate) fn seal_body_staged(
        &self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
        st: &mut StageTimes,
    ) -> Result<(), DropReason> {
        let mut t = st.start();
        let iv_at = esp + ESP_HEADER_LEN;
        let ct_at = iv_at + self.suite.iv_len();
        if end < ct_at || end + self.suite.icv_len() > buf.len() {
            return Err(DropReason::NoRoom);
        }
        match &self.cipher {
            Cipher::Null => {}
            Cipher::Cbc { enc, .. } => {
                let ctx = EncryptionContext::Iv128(FixedLength::from(
                    <[u8; 16]>::try_from(&buf[iv_at..ct_at]).unwrap(),
                ));
                enc.less_safe_encrypt(&mut buf[ct_at..end], ctx)
                    .map_err(|_| DropReason::CryptoError)?;
            }
            Cipher::LegacyCbc(k, _) => {
                let (head, ct) = buf[..end].split_at_mut(ct_at);
                k.encrypt(&head[iv_at..], ct)?;
            }
            Cipher::Aead { key, salt } => {
                let nonce = nonce(salt, &buf[iv_at..ct_at]);
                let aad = aead_aad(&buf[esp..iv_at], seq, esn);
                let (aad, ct) = (Aad::from(&aad.0[..aad.1]), &mut buf[ct_at..end]);
                let tag = key
                    .seal_in_place_separate_tag(nonce, aad, ct)
                    .map_err(|_| DropReason::CryptoError)?;
                buf[end..end + 16].copy_from_slice(tag.as_ref());
            }
            Cipher::Gmac { key, salt } => {
                let nonce = nonce(salt, &buf[iv_at..ct_at]);
                let tag = with_gmac_aad(buf, esp, end, seq, esn, |aad| {
                    key.seal_in_place_separate_tag(nonce, Aad::from(aad), &mut [])
                })?
                .map_err(|_| DropReason::CryptoError)?;
                buf[end..end + 16].copy_from_slice(tag.as_ref());
            }
        }
        t = st.stop(self.cipher_stage(), t);
        if let Some(mac) = &self.mac {
            let n = self.suite.integrity.icv_len();
            let (covered, icv) = buf.split_at_mut(end);
            hmac_into(mac, &covered[esp..], seq, esn, &mut icv[..n])?;
            st.stop(Stage::Mac, t);
        }
        Ok(())
    }

    /// GMAC is all authentication: its time is the MAC's; every other cipher's, the cipher's.
    fn cipher_stage(&self) -> Stage {
        if matches!(self.cipher, Cipher::Gmac { .. }) {
            Stage::Mac
        } else {
            Stage::Cipher
        }
    }

    /// Verify and decrypt an ESP packet in place: `buf[esp..end]` is the whole ESP packet,
    /// ICV included. On success the plaintext (padding and trailer included) is at
    /// `buf[esp + 8 + iv_len .. end - icv_len]`. Nothing is decrypted unless the ICV verified.
    pub fn open(
        &self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
    ) -> Result<(), DropReason> {
        self.open_staged(buf, esp, end, seq, esn, &mut StageTimes::off())
    }

    /// [`CipherState::open`], timing the MAC and cipher stages into `st`.
    pub fn open_staged(
        &self,
        buf: &mut [u8],
        esp: usize,
        end: usize,
        seq: u64,
        esn: bool,
        st: &mut StageTimes,
    ) -> Result<(), DropReason> {
        let mut t = st.start();
        let iv_at = esp + ESP_HEADER_LEN;
        let ct_at = iv_at + self.suite.iv_len();
        let ct_end = end - self.suite.icv_len();
        if let Some(mac) = &self.mac {
            let n = self.suite.integrity.icv_len();
            let mut tag = [0u8; 32];
            hmac_into(mac, &buf[esp..ct_end], seq, esn, &mut tag[..n])?;
            let ok = verify_slices_are_equal(&tag[..n], &buf[ct_end..ct_end + n]);
            t = st.stop(Stage::Mac, t);
            ok.map_err(|_| DropReason::IcvFailure)?;
        }
        match &self.cipher {
            Cipher::Null => {}
            Cipher::Cbc { dec, .. } => {
                let ctx = DecryptionContext::Iv128(FixedLength::from(
                    <[u8; 16]>::try_from(&buf[iv_at..ct_at]).unwrap(),
                ));
                dec.decrypt(&mut buf[ct_at..ct_end], ctx)
                    .map_err(|_| DropReason::BadCiphertextLength)?;
            }
            Cipher::LegacyCbc(k, _) => {
                let (head, ct) = buf[..ct_end].split_at_mut(ct_at);
                k.decrypt(&head[iv_at..], ct)?;
            }
            Cipher::Aead { key, salt } => {
                let nonce = nonce(salt, &buf[iv_at..ct_at]);
                let aad = aead_aad(&buf[esp..iv_at], seq, esn);
                key.open_in_place(nonce, Aad::from(&aad.0[..aad.1]), &mut buf[ct_at..end])
                    .map_err(|_| DropReason::IcvFailure)?;
            }
            Cipher::Gmac { key, salt } => {
                let nonce = nonce(salt, &buf[iv_at..ct_at]);
                let mut tag: [u8; 16] = buf[ct_end..end].try_into().unwrap();
                with_gmac_aad(buf, esp, ct_end, seq, esn, |aad| {
                    key.open_in_place(nonce, Aad::from(aad), &mut tag)
                        .map(|_| ())
                })?
                .map_err(|_| DropReason::IcvFailure)?;
            }
        }
        st.stop(self.cipher_stage(), t);
        Ok(())
    }
}

/// The integrity key for `i`; `None` for `null`, and for a GMAC key of the wrong length.
fn mac_key(i: Integrity, key: &[u8]) -> Option<MacKey> {
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

fn nonce(salt: &[u8; 4], iv: &[u8]) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(salt);
    n[4..].copy_from_slice(iv);
    Nonce::assume_unique_for_key(n)
}

/// RFC 4106 §5 / RFC 7634 §2.1: AAD = SPI ‖ seq (32-bit), or SPI ‖ seq_hi ‖ seq_lo with ESN.
fn aead_aad(header: &[u8], seq: u64, esn: bool) -> ([u8; 12], usize) {
    let mut a = [0u8; 12];
    a[..4].copy_from_slice(&header[..4]);
    if esn {
        a[4..8].copy_from_slice(&((seq >> 32) as u32).to_be_bytes());
        a[8..12].copy_from_slice(&header[4..8]);
        (a, 12)
    } else {
        a[4..8].copy_from_slice(&header[4..8]);
        (a, 8)
    }
}

/// ESP's ICV: the HMAC of `data` (with the ESN high half, as [`hmac_icv`]) truncated to
/// `out.len()` and written straight into `out`, with no intermediate tag buffer. AH's
/// GMAC is no ESP integrity algorithm (`Sa::new` refuses it): a crypto error here.
fn hmac_into(
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
fn hmac_icv(mac: &MacKey, parts: &[&[u8]], seq: u64, esn: bool) -> Icv {
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

/// RFC 4543 §3.3: the GMAC AAD is SPI ‖ seq (‖ seq as 64 bits with ESN) ‖ IV ‖ payload ‖
/// padding ‖ pad length ‖ next header: the whole packet but the ICV. With ESN the
/// high half is not on the wire, so we lay the AAD out contiguously by borrowing the 4
/// bytes before the ESP header (headroom or the outer header) and restore them after.
fn with_gmac_aad<R>(
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
    let saved: [u8; 4] = buf[esp - 4..esp].try_into().unwrap();
    let spi: [u8; 4] = buf[esp..esp + 4].try_into().unwrap();
    buf[esp - 4..esp].copy_from_slice(&spi);
    buf[esp..esp + 4].copy_from_slice(&((seq >> 32) as u32).to_be_bytes());
    let r = f(&buf[esp - 4..end]);
    buf[esp..esp + 4].copy_from_slice(&spi);
    buf[esp - 4..esp].copy_from_slice(&saved);
    Ok(r)
}
