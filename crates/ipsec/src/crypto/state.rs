//! Per-SA expanded keys and the seal/open primitives ESP calls.

use aws_lc_rs::aead::{Aad, LessSafeKey, UnboundKey};
use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
};
use aws_lc_rs::constant_time::verify_slices_are_equal;
use aws_lc_rs::iv::FixedLength;
use cbc::cipher::KeyInit;
use zeroize::Zeroizing;

use super::{MacPrimitive, Primitive, SecretBytes, Suite, SuiteError};
use crate::constants::ESP_HEADER_LEN;
use crate::drop::DropReason;
use crate::stage::{Stage, StageTimes};

use super::aead::{aead_aad, nonce, split_salt, with_gmac_aad};
use super::cbc::LegacyBlock;
pub use super::cbc::{CbcIvs, IV_BATCH};
pub use super::mac::Icv;
use super::mac::{hmac_icv, hmac_into, mac_key, MacKey};

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
