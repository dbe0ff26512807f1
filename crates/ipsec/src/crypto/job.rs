//! The cryptographic half of an ESP packet as a value: what is left of sealing or
//! opening once the SA's own state has been used, so that it can run on another thread
//! ([`CryptoJob`]), and whether a seal runs it at once or hands it back (`When`).

use super::state::CipherState;
use crate::drop::DropReason;
use crate::stage::StageTimes;

/// The cryptographic half of sealing or opening one ESP packet: what is left once the
/// SA's own state has been used (sequence number taken or replay-checked, header,
/// trailer and IV written). It reads only the SA's keys ([`crate::Sa::keys`]), so the packets
/// of one SA can be encrypted and verified on several threads at once while every
/// change to the SA stays with one thread (RFC 4303 §3.3.3 and §3.4.3: numbers taken
/// in order, the window checked before and committed after the ICV).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CryptoJob {
    /// Where the ESP header starts in the packet's buffer.
    pub esp_at: usize,
    /// Sealing: the end of the ciphertext (the ICV goes after it); opening: the end of
    /// the ESP packet, ICV included.
    pub end: usize,
    /// The full sequence number (the ESN's high half included).
    pub seq: u64,
    pub esn: bool,
}

impl CryptoJob {
    /// Encrypt and write the ICV ([`CipherState::seal_body`]).
    pub fn seal(&self, keys: &CipherState, buf: &mut [u8]) -> Result<(), DropReason> {
        keys.seal_body(buf, self.esp_at, self.end, self.seq, self.esn)
    }

    /// Verify the ICV and, only if it verified, decrypt ([`CipherState::open`]).
    pub fn open(&self, keys: &CipherState, buf: &mut [u8]) -> Result<(), DropReason> {
        keys.open(buf, self.esp_at, self.end, self.seq, self.esn)
    }
}

/// Whether a seal runs its cryptography at once ([`Now`]) or hands it back as a
/// [`CryptoJob`] ([`Later`]). A type, not a value: each path is compiled on its own, and
/// sealing now returns nothing more than `Result<(), DropReason>` — no job carried back
/// through every return. A runtime flag and an `Option<CryptoJob>` on every return cost
/// the AEAD seal 5-8 % at 64 B (`benchmarks/engine_ab.py 683ac1b --b 95e4664`; the
/// 40-byte result was copied through memory at each level, and read back wider than it
/// was written).
pub(crate) trait When {
    /// What a seal hands back: nothing ([`Now`]) or the job, if any ([`Later`]).
    type Job;
    /// Finish the ESP seal whose `job` is ready: run it now, or hand it back.
    fn finish(
        keys: &CipherState,
        stages: &mut StageTimes,
        buf: &mut [u8],
        job: CryptoJob,
    ) -> Result<Self::Job, DropReason>;
    /// What a seal that leaves no job (AH) hands back.
    fn none() -> Self::Job;
}

/// Seal now: encrypt and write the ICV before returning.
pub(crate) struct Now;
/// Seal later: return the encryption and ICV as a [`CryptoJob`].
pub(crate) struct Later;

impl When for Now {
    type Job = ();
    #[inline]
    fn finish(
        keys: &CipherState,
        stages: &mut StageTimes,
        buf: &mut [u8],
        job: CryptoJob,
    ) -> Result<(), DropReason> {
        keys.seal_body_staged(buf, job.esp_at, job.end, job.seq, job.esn, stages)
    }
    #[inline]
    fn none() {}
}

impl When for Later {
    type Job = Option<CryptoJob>;
    #[inline]
    fn finish(
        _: &CipherState,
        _: &mut StageTimes,
        _: &mut [u8],
        job: CryptoJob,
    ) -> Result<Option<CryptoJob>, DropReason> {
        Ok(Some(job))
    }
    #[inline]
    fn none() -> Option<CryptoJob> {
        None
    }
}
