//! CBC: the per-SA IV generator (RFC 3602 §2.1 unpredictable IVs without a random call
//! per packet) and the legacy DES / 3DES block ciphers aws-lc-rs lacks.

use aws_lc_rs::cipher::{EncryptingKey, EncryptionContext, UnboundCipherKey};
use aws_lc_rs::iv::FixedLength;
use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit};
use zeroize::Zeroizing;

use super::SuiteError;
use crate::drop::DropReason;

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
    pub(super) fn fresh() -> Result<Self, SuiteError> {
        let mut key = Zeroizing::new([0u8; 16]);
        aws_lc_rs::rand::fill(&mut key[..]).map_err(|_| SuiteError::Random)?;
        Self::with_key(&key)
    }

    pub(super) fn with_key(key: &[u8; 16]) -> Result<Self, SuiteError> {
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
    pub(super) fn write(&mut self, seq: u64, out: &mut [u8]) -> Result<(), DropReason> {
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
pub(super) enum LegacyBlock {
    Des(des::Des),
    Tdes(des::TdesEde3),
}

impl LegacyBlock {
    pub(super) fn encrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<(), DropReason> {
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

    pub(super) fn decrypt(&self, iv: &[u8], data: &mut [u8]) -> Result<(), DropReason> {
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
