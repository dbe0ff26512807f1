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
//! The helpers are a rayon pool; the batch is cut into parts, one per thread that has
//! enough work for it, the worker running the first part itself (`in_place_scope`
//! borrows the batch's buffers safely for the duration: no `unsafe`, one task per part,
//! nothing allocated per packet). A batch too small to share (ACKs) stays on the worker.

use ipsec::sad::SaId;
use ipsec::{CryptoJob, DropReason};

use super::sas::DirEngine;

/// One packet's cryptography, and how it went.
pub(super) type JobSlot = Option<(SaId, CryptoJob, Result<(), DropReason>)>;

/// Fewest packets, and bytes of ESP, worth a thread of their own: below these, waking a
/// helper costs more than it saves (an AES-GCM core seals 8 KiB in a few µs, about what
/// a wakeup costs), and a batch of ACKs is sealed by the worker alone.
const MIN_PACKETS_PER_THREAD: usize = 4;
const MIN_BYTES_PER_THREAD: usize = 8 << 10;

/// The worker and its helpers: `threads` in all, the worker one of them.
pub(super) struct Crew {
    pool: rayon::ThreadPool,
    threads: usize,
}

impl Crew {
    /// A crew of `threads` — the worker and `threads - 1` helpers named `{name}-N`;
    /// `None` for 1 (the worker alone).
    pub(super) fn new(threads: usize, name: &'static str) -> Result<Option<Crew>, String> {
        if threads <= 1 {
            return Ok(None);
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads - 1)
            .thread_name(move |i| format!("{name}-{i}"))
            .build()
            .map(|pool| Some(Crew { pool, threads }))
            .map_err(|e| format!("cannot start {} crypto workers: {e}", threads - 1))
    }

    /// Run every job of the batch — `jobs[i]` on `bufs[i]` — sealing or opening with the
    /// SA's keys (a live SA's, or one that reached its hard lifetime during this batch:
    /// its packets before that were numbered and must go). The batch is cut into as many
    /// parts as it has work for (at most `threads`); the helpers take all parts but the
    /// first, which the worker runs itself, and the worker returns when all are done.
    pub(super) fn run(
        &self,
        engine: &DirEngine,
        bufs: &mut [Vec<u8>],
        jobs: &mut [JobSlot],
        seal: bool,
    ) {
        let (mut packets, mut bytes) = (0, 0);
        for (_, job, _) in jobs.iter().flatten() {
            packets += 1;
            bytes += job.end - job.esp_at;
        }
        let parts = self
            .threads
            .min(packets / MIN_PACKETS_PER_THREAD)
            .min(bytes / MIN_BYTES_PER_THREAD);
        if parts <= 1 {
            return run_part(engine, bufs, jobs, seal);
        }
        let per = bufs.len().min(jobs.len()).div_ceil(parts);
        self.pool.in_place_scope(|scope| {
            let mut all = bufs.chunks_mut(per).zip(jobs.chunks_mut(per));
            let first = all.next();
            for (b, j) in all {
                scope.spawn(move |_| run_part(engine, b, j, seal));
            }
            if let Some((b, j)) = first {
                run_part(engine, b, j, seal);
            }
        });
    }
}

/// One part of a batch, on whichever thread runs it.
fn run_part(engine: &DirEngine, bufs: &mut [Vec<u8>], jobs: &mut [JobSlot], seal: bool) {
    for (buf, slot) in bufs.iter_mut().zip(jobs.iter_mut()) {
        if let Some((sa, job, result)) = slot {
            *result = match engine.keys(*sa) {
                Some(k) if seal => job.seal(k, buf),
                Some(k) => job.open(k, buf),
                None => Err(DropReason::NoSa),
            };
        }
    }
}
