//! The two pieces a data path with several crypto workers per direction needs (issue 18),
//! each correct on its own and tested here before any worker uses them:
//!
//! - [`SeqCounter`]: one outbound SA's sequence counter shared by the workers. A worker
//!   takes a contiguous block of numbers per batch with one atomic update, not one per
//!   packet; no number is ever handed out twice, and none beyond the last usable one
//!   (RFC 4303 §3.3.3: without ESN 2^32 - 1, with ESN 2^64 - 1; the SA must not cycle).
//!   With AES-GCM, ChaCha20-Poly1305 and GMAC the sequence number is the nonce (RFC 4106
//!   §3.1), so this is the property the gateway's safety rests on.
//! - [`InOrder`]: release of batches in the order they were read, whatever order the
//!   workers finish them in (wireguard-go's `device/send.go` and `receive.go` do this
//!   with a locked batch container per element and a sequential sender that waits on the
//!   oldest; here a ticket per batch and a bounded window of tickets). Per-flow packet
//!   order is kept, and on the inbound side the sequential stage is where the replay
//!   window is checked again and committed after the ICV (RFC 4303 §3.4.3).
//!
//! Both take a lock or an atomic per batch, never per packet.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// One outbound SA's sequence counter, shared by the workers that seal under it.
#[derive(Debug)]
pub struct SeqCounter {
    /// The last number handed out (0: none yet; numbers start at 1, RFC 4303 §3.3.3).
    last: AtomicU64,
    /// The last usable number.
    limit: u64,
}

impl SeqCounter {
    /// A counter whose next number is `last + 1`; `esn`: 64-bit sequence numbers
    /// (RFC 4303 §2.2.1), else 32-bit.
    pub fn new(last: u64, esn: bool) -> Self {
        SeqCounter {
            last: AtomicU64::new(last),
            limit: if esn { u64::MAX } else { u64::from(u32::MAX) },
        }
    }

    /// The last number handed out so far (0: none).
    pub fn last(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    /// Up to `n` consecutive numbers for one batch, or `None` when the SA has none left
    /// (the batch's packets are then dropped as `sequence_exhausted`, never sealed with a
    /// repeated number). Fewer than `n` when fewer remain.
    pub fn take(&self, n: u64) -> Option<RangeInclusive<u64>> {
        if n == 0 {
            return None;
        }
        let limit = self.limit;
        let prev = self
            .last
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                (last < limit).then(|| last + n.min(limit - last))
            })
            .ok()?;
        Some(prev + 1..=prev + n.min(limit - prev))
    }
}

/// Ordered release: a sequential reader takes a [`ticket`](InOrder::ticket) per batch in
/// the order it reads them, workers [`complete`](InOrder::complete) tickets in any order,
/// and a sequential writer gets them back with [`next`](InOrder::next) strictly in ticket
/// order. At most `window` tickets are out at once: the reader waits for the writer (the
/// queue between them is bounded, as a ring of batch slots is).
#[derive(Debug)]
pub struct InOrder<T> {
    state: Mutex<State<T>>,
    /// Signalled when a ticket completes (the writer waits) and when one is released (the
    /// reader waits).
    changed: Condvar,
    window: u64,
}

#[derive(Debug)]
struct State<T> {
    /// The next ticket the reader gets.
    issued: u64,
    /// The next ticket the writer releases.
    released: u64,
    /// Completed tickets not yet released.
    done: BTreeMap<u64, T>,
}

/// A ticket that was never issued, or completed twice: a bug in the caller.
#[derive(Debug, PartialEq, Eq)]
pub struct BadTicket(pub u64);

impl<T> InOrder<T> {
    /// At most `window` (at least 1) tickets out at once.
    pub fn new(window: usize) -> Self {
        InOrder {
            state: Mutex::new(State {
                issued: 0,
                released: 0,
                done: BTreeMap::new(),
            }),
            changed: Condvar::new(),
            window: window.max(1) as u64,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A worker that panicked while holding the lock left the map consistent (every
        // change is one insert or one remove): go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state once `ready` holds, waiting up to `timeout` for it (`None`: it did not).
    fn wait_for(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&State<T>) -> bool,
    ) -> Option<MutexGuard<'_, State<T>>> {
        let (s, _) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |s| !ready(s))
            .unwrap_or_else(|e| e.into_inner());
        ready(&s).then_some(s)
    }

    /// The next ticket, in reading order; `None` if `window` tickets stayed out for
    /// `timeout` (the reader then looks at its stop flag and tries again).
    pub fn ticket(&self, timeout: Duration) -> Option<u64> {
        let mut s = self.wait_for(timeout, |s| s.issued - s.released < self.window)?;
        s.issued += 1;
        Some(s.issued - 1)
    }

    /// A worker finished `ticket`'s batch.
    pub fn complete(&self, ticket: u64, item: T) -> Result<(), BadTicket> {
        let mut s = self.lock();
        if ticket < s.released || ticket >= s.issued || s.done.contains_key(&ticket) {
            return Err(BadTicket(ticket));
        }
        s.done.insert(ticket, item);
        drop(s);
        self.changed.notify_all();
        Ok(())
    }

    /// The oldest ticket's batch once it is complete, waiting up to `timeout` for it;
    /// `None` if it did not complete in time (or none is out).
    pub fn next(&self, timeout: Duration) -> Option<(u64, T)> {
        let mut s = self.wait_for(timeout, |s| s.done.contains_key(&s.released))?;
        let oldest = s.released;
        let item = s.done.remove(&oldest)?;
        s.released += 1;
        drop(s);
        self.changed.notify_all();
        Some((oldest, item))
    }

    /// Tickets issued and not yet released.
    pub fn outstanding(&self) -> u64 {
        let s = self.lock();
        s.issued - s.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::thread;

    /// xorshift64*: a seeded generator for the randomised cases (no dependency needed).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn sequence_numbers_are_unique_and_increasing_per_worker_across_threads() {
        for seed in 1..=20u64 {
            let c = Arc::new(SeqCounter::new(0, false));
            let workers: Vec<_> = (0..8u64)
                .map(|w| {
                    let c = Arc::clone(&c);
                    thread::spawn(move || {
                        let mut rng = Rng(seed * 1000 + w + 1);
                        let mut got = Vec::new();
                        for _ in 0..2000 {
                            let r = c.take(1 + rng.below(64)).expect("far from the limit");
                            got.extend(r);
                        }
                        got
                    })
                })
                .collect();
            let all: Vec<Vec<u64>> = workers.into_iter().map(|h| h.join().unwrap()).collect();
            let mut seen = HashSet::new();
            for got in &all {
                // each worker's numbers increase: a batch is sealed in order
                assert!(got.windows(2).all(|w| w[0] < w[1]), "seed {seed}");
                for &n in got {
                    assert!(
                        n >= 1 && seen.insert(n),
                        "seed {seed}: {n} handed out twice"
                    );
                }
            }
            // and together they are exactly 1..=last: no gap a crash could not explain
            let last = c.last();
            assert_eq!(seen.len() as u64, last, "seed {seed}");
            assert!(seen.contains(&1) && seen.contains(&last));
        }
    }

    #[test]
    fn the_counter_stops_at_the_last_usable_number_and_never_cycles() {
        // RFC 4303 §3.3.3: without ESN the last number is 2^32 - 1
        let c = SeqCounter::new(u64::from(u32::MAX) - 5, false);
        assert_eq!(c.take(4), Some(4_294_967_291..=4_294_967_294));
        assert_eq!(c.take(4), Some(4_294_967_295..=4_294_967_295)); // a short block
        assert_eq!(c.take(1), None);
        assert_eq!(c.take(64), None);
        assert_eq!(c.last(), u64::from(u32::MAX));
        // with ESN, 2^32 - 1 is just a number, and 2^64 - 1 the last
        let e = SeqCounter::new(u64::from(u32::MAX) - 1, true);
        assert_eq!(e.take(3), Some(4_294_967_295..=4_294_967_297));
        let e = SeqCounter::new(u64::MAX - 2, true);
        assert_eq!(e.take(8), Some(u64::MAX - 1..=u64::MAX));
        assert_eq!(e.take(1), None);
        assert_eq!(SeqCounter::new(0, false).take(0), None);
    }

    #[test]
    fn many_threads_at_the_limit_hand_out_each_remaining_number_once() {
        let c = Arc::new(SeqCounter::new(u64::from(u32::MAX) - 1000, false));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let c = Arc::clone(&c);
                thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(r) = c.take(7) {
                        got.extend(r);
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort_unstable();
        let want: Vec<u64> = (u64::from(u32::MAX) - 999..=u64::from(u32::MAX)).collect();
        assert_eq!(all, want);
    }

    #[test]
    fn batches_come_back_in_ticket_order_whatever_order_workers_finish() {
        const BATCHES: u64 = 3000;
        for seed in 1..=10u64 {
            let q = Arc::new(InOrder::<u64>::new(16));
            let (tx, rx) = std::sync::mpsc::channel::<u64>();
            let rx = Arc::new(Mutex::new(rx));
            // workers: finish tickets after a random short delay, in whatever order
            let workers: Vec<_> = (0..4u64)
                .map(|w| {
                    let (q, rx) = (Arc::clone(&q), Arc::clone(&rx));
                    thread::spawn(move || {
                        let mut rng = Rng(seed * 77 + w + 1);
                        loop {
                            let t = match rx.lock().unwrap().recv() {
                                Ok(t) => t,
                                Err(_) => return,
                            };
                            if rng.below(4) == 0 {
                                thread::sleep(Duration::from_micros(rng.below(300)));
                            }
                            q.complete(t, t * 10).unwrap();
                        }
                    })
                })
                .collect();
            let writer = {
                let q = Arc::clone(&q);
                thread::spawn(move || {
                    let mut order = Vec::new();
                    while (order.len() as u64) < BATCHES {
                        if let Some((t, item)) = q.next(Duration::from_secs(10)) {
                            assert_eq!(item, t * 10);
                            order.push(t);
                        } else {
                            panic!("a completed batch was never released");
                        }
                    }
                    order
                })
            };
            // the reader: tickets in reading order, never more than the window out
            for _ in 0..BATCHES {
                let t = q
                    .ticket(Duration::from_secs(10))
                    .expect("the writer drains");
                assert!(q.outstanding() <= 16);
                tx.send(t).unwrap();
            }
            drop(tx);
            let order = writer.join().unwrap();
            for w in workers {
                w.join().unwrap();
            }
            assert_eq!(order, (0..BATCHES).collect::<Vec<_>>(), "seed {seed}");
            assert_eq!(q.outstanding(), 0);
        }
    }

    #[test]
    fn the_reader_waits_while_the_window_is_full_and_the_writer_waits_for_the_oldest() {
        let q = InOrder::<&str>::new(2);
        let (a, b) = (q.ticket(Duration::ZERO), q.ticket(Duration::ZERO));
        assert_eq!((a, b), (Some(0), Some(1)));
        // full: no third ticket until one is released
        assert_eq!(q.ticket(Duration::from_millis(5)), None);
        // the newer batch is done first: it is not released before the older one
        q.complete(1, "second").unwrap();
        assert_eq!(q.next(Duration::from_millis(5)), None);
        q.complete(0, "first").unwrap();
        assert_eq!(q.next(Duration::ZERO), Some((0, "first")));
        assert_eq!(q.ticket(Duration::ZERO), Some(2));
        assert_eq!(q.next(Duration::ZERO), Some((1, "second")));
        assert_eq!(q.outstanding(), 1);
    }

    #[test]
    fn a_ticket_never_issued_or_completed_twice_is_refused() {
        let q = InOrder::<u8>::new(4);
        assert_eq!(q.complete(0, 1), Err(BadTicket(0))); // not issued
        let t = q.ticket(Duration::ZERO).unwrap();
        q.complete(t, 1).unwrap();
        assert_eq!(q.complete(t, 2), Err(BadTicket(t))); // twice, before release
        assert_eq!(q.next(Duration::ZERO), Some((t, 1)));
        assert_eq!(q.complete(t, 3), Err(BadTicket(t))); // after release
    }
}
