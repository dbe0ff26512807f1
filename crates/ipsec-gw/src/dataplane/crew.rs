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
//! (parallel AEAD, serial order) within one batch. wireguard-go pipelines batches
//! instead (a reader hands batches on while a sequential writer releases them in
//! order); that needs the sequence counter shared between threads and a ticket per
//! batch, and would let reading overlap the cryptography — worth it only once a
//! many-core measurement shows the worker's own serial part as the limit.
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

#[cfg(test)]
pub(super) mod tests {
    use std::net::Ipv4Addr;
    use std::path::Path;

    use ipsec::constants::proto;
    use ipsec::engine::Outbound;
    use ipsec::sa::Direction;
    use ipsec::wire::ip::{Ipv4Header, Ipv4Repr, IPV4_DF};
    use ipsec::{PacketBuf, HEADROOM, TAILROOM};

    use super::*;
    use crate::config::{parse, tests::GOOD};

    /// gwA's outbound engine (GOOD: SA "out", SPI 0x1001, AES-GCM-16, 10.1/24 → 10.2/24)
    /// and gwB's inbound engine with the same SA: GOOD with the addresses, the SAs'
    /// directions and the policies' directions mirrored.
    pub(in crate::dataplane) fn pair() -> (DirEngine, DirEngine) {
        let a = parse(GOOD, Path::new("gw-a.toml")).unwrap();
        let mut b = GOOD.to_string();
        for (from, to) in [
            (
                "local = \"192.0.2.1\"\nremote = \"192.0.2.2\"",
                "local = \"192.0.2.2\"\nremote = \"192.0.2.1\"",
            ),
            ("routes = [\"10.2.0.0/24\"]", "routes = [\"10.1.0.0/24\"]"),
            ("direction = \"out\"\nspi", "direction = \"IN\"\nspi"),
            ("direction = \"in\"\nspi", "direction = \"out\"\nspi"),
            ("direction = \"out\"\nsrc", "direction = \"IN\"\nsrc"),
            ("direction = \"in\"\nsrc", "direction = \"out\"\nsrc"),
            ("\"IN\"", "\"in\""),
        ] {
            assert!(b.contains(from), "{from:?}");
            b = b.replace(from, to);
        }
        let b = parse(&b, Path::new("gw-b.toml")).unwrap();
        (
            DirEngine::build(&a, Direction::Out, None, None).unwrap(),
            DirEngine::build(&b, Direction::In, None, None).unwrap(),
        )
    }

    /// A small deterministic generator (xorshift), so a failure repeats.
    pub(in crate::dataplane) struct Lcg(pub u64);

    impl Lcg {
        pub(in crate::dataplane) fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Write at `buf[HEADROOM..]` an IPv4/UDP packet of `len` bytes, 10.1.0.1 → 10.2.0.1,
    /// whose payload is `tag` repeated (so each packet is told apart by its bytes).
    pub(in crate::dataplane) fn inner(buf: &mut [u8], len: usize, tag: u32) {
        let p = &mut buf[HEADROOM..HEADROOM + len];
        for (i, b) in p.iter_mut().enumerate() {
            *b = tag.to_be_bytes()[i % 4];
        }
        let header = Ipv4Repr {
            src: Ipv4Addr::new(10, 1, 0, 1),
            dst: Ipv4Addr::new(10, 2, 0, 1),
            protocol: proto::UDP,
            payload_len: len - 20,
            tos: 0,
            ident: tag as u16,
            flags_frag: IPV4_DF,
            ttl: 64,
        };
        header.emit(&mut Ipv4Header::new_unchecked(&mut p[..20]));
    }

    pub(in crate::dataplane) fn slot() -> Vec<u8> {
        vec![0; HEADROOM + 1500 + TAILROOM + 64]
    }

    /// Issue 18's first property, on the crew the gateway runs: batches of 1..64 packets
    /// of random sizes (so the 8 threads finish their parts in varying order) sealed by a
    /// crew come out byte for byte as one thread sealing them one at a time makes them —
    /// the same sequence number (the AES-GCM nonce, RFC 4106 §3.1) on the same packet —
    /// and, in the order they were read, numbered 1, 2, 3, … with none taken twice.
    #[test]
    fn a_crew_seals_as_one_thread_would_numbering_in_the_order_read() {
        let (mut crewed, _) = pair();
        let (mut alone, _) = pair();
        let crew = Crew::new(8, "t").unwrap().unwrap();
        let mut rng = Lcg(0x9e37_79b9_7f4a_7c15);
        let mut bufs: Vec<Vec<u8>> = (0..64).map(|_| slot()).collect();
        let mut jobs: Vec<JobSlot> = vec![None; 64];
        let mut reference = slot();
        let (mut last, mut shared) = (0u32, 0);
        for batch in 0..300u32 {
            let n = 1 + rng.below(64);
            let mut want = Vec::with_capacity(n);
            let mut at = Vec::with_capacity(n);
            for b in 0..n {
                // the first part of a batch heavier than the rest now and then
                let len = if b < n / 8 && batch % 3 == 0 {
                    1400
                } else {
                    28 + rng.below(1400)
                };
                let tag = batch << 8 | b as u32;
                inner(&mut bufs[b], len, tag);
                let mut pkt = PacketBuf::new(&mut bufs[b], HEADROOM, len).unwrap();
                let (o, job) = crewed.engine.outbound_deferred(&mut pkt).unwrap();
                let Outbound::Sealed { sa } = o else {
                    panic!("not sealed by the lone SA")
                };
                at.push((pkt.head(), pkt.len()));
                jobs[b] = Some((sa, job.expect("a lone ESP SA's job"), Ok(())));
                inner(&mut reference, len, tag);
                let mut r = PacketBuf::new(&mut reference, HEADROOM, len).unwrap();
                alone.engine.outbound(&mut r).unwrap();
                want.push(r.data().to_vec());
            }
            if n >= 2 * MIN_PACKETS_PER_THREAD {
                shared += 1;
            }
            crew.run(&crewed, &mut bufs[..n], &mut jobs[..n], true);
            for (b, &(head, len)) in at.iter().enumerate() {
                let (_, _, result) = jobs[b].take().unwrap();
                assert_eq!(result, Ok(()));
                let got = &bufs[b][head..head + len];
                assert!(got == want[b].as_slice(), "batch {batch} packet {b}");
                // RFC 4303 §2.2: the sequence number follows the SPI
                let seq = u32::from_be_bytes(got[24..28].try_into().unwrap());
                assert_eq!(seq, last + 1, "batch {batch} packet {b}");
                last = seq;
            }
        }
        assert!(shared > 100, "only {shared} batches were shared out");
        let (_, sa) = crewed.engine.sas().next().unwrap();
        assert_eq!(sa.counters.packets, u64::from(last));
    }
}
