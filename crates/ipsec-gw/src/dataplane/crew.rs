//! The crypto crew: threads that run the cipher and ICV work of one batch together
//! (issue 18), so that one SA's packets — one TCP flow — are sealed and opened on
//! several cores.
//!
//! The worker keeps everything that changes an SA, in the order it read the packets:
//! the SPD lookup, the sequence number (one counter, so no number is taken twice),
//! CBC IVs, lifetimes and the reservation in the state file before any packet goes;
//! inbound, the replay check before and the commit after the ICV (RFC 4303 §3.4.3).
//! Only [`CryptoJob`]s, which read the SA's keys and write their own packet's buffer,
//! go to the crew; the worker waits for the whole batch and sends it in the order it
//! was read, so the packets of a flow leave as they came. This is Linux's pcrypt
//! (parallel AEAD, serial order) within one batch; wireguard-go pipelines batches
//! instead, which `parallel::InOrder` would allow next.
//!
//! The crew is a rayon pool: rayon splits a batch among its threads with work stealing
//! and borrows the batch's buffers safely for the duration (no `unsafe`, no allocation
//! per packet).

use ipsec::sad::SaId;
use ipsec::{CryptoJob, DropReason};
use rayon::prelude::*;

use super::sas::DirEngine;

/// One packet's cryptography, and how it went.
pub(super) type JobSlot = Option<(SaId, CryptoJob, Result<(), DropReason>)>;

/// Fewest packets a crew thread takes at once: below this, handing over costs more
/// than the cipher work of small packets.
const MIN_PER_THREAD: usize = 2;

pub(super) struct Crew {
    pool: rayon::ThreadPool,
}

impl Crew {
    /// A crew of `threads` named `{name}-N`; `None` for 1 (the worker alone).
    pub(super) fn new(threads: usize, name: &'static str) -> Result<Option<Crew>, String> {
        if threads <= 1 {
            return Ok(None);
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(move |i| format!("{name}-{i}"))
            .build()
            .map(|pool| Some(Crew { pool }))
            .map_err(|e| format!("cannot start {threads} crypto workers: {e}"))
    }

    /// Run every job of the batch — `jobs[i]` on `bufs[i]` — on the crew, sealing or
    /// opening with the SA's keys (a live SA's, or one that reached its hard lifetime
    /// during this batch: its packets before that were numbered and must go).
    pub(super) fn run(
        &self,
        engine: &DirEngine,
        bufs: &mut [Vec<u8>],
        jobs: &mut [JobSlot],
        seal: bool,
    ) {
        self.pool.install(|| {
            bufs.par_iter_mut()
                .zip(jobs.par_iter_mut())
                .with_min_len(MIN_PER_THREAD)
                .for_each(|(buf, slot)| {
                    if let Some((sa, job, result)) = slot {
                        *result = match engine.keys(*sa) {
                            Some(k) if seal => job.seal(k, buf),
                            Some(k) => job.open(k, buf),
                            None => Err(DropReason::NoSa),
                        };
                    }
                });
        });
    }
}
