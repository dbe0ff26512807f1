//! CoDel (RFC 8289) on the outer sockets' receive queues: the gateway's own active queue
//! management where the kernel's qdiscs are not in the path (a socket's receive buffer
//! is a plain tail-drop FIFO of up to its size: 4 MiB here, tens of milliseconds at a
//! gigabit).
//!
//! Each datagram's sojourn time is how long it waited in the socket: the time it is taken
//! less the kernel's receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME; a datagram stamped
//! before a step of that clock counts as not having waited). CoDel's own times (`now`)
//! are the monotonic clock's, so a step of the wall clock cannot suspend it. When the
//! sojourn time stays above
//! `target` for a whole `interval`, the queue is a standing one: datagrams are dropped as
//! they are taken, the next drop `interval / sqrt(count)` after the last (§5.5's control
//! law), until one is taken below `target` or the queue is empty. One packet per decision:
//! of a datagram the kernel coalesced (UDP GRO), its first segment. A dropped packet is
//! never opened; it is counted in the inbound `io` as `queue_delay_drops` (and in
//! `rx_packets`), and TCP inside the tunnel slows down as from any loss.

/// Nanoseconds.
pub type Nanos = u64;

/// RFC 8289 §4.2's defaults: 5 ms and 100 ms.
pub const TARGET_NS: Nanos = 5_000_000;
pub const INTERVAL_NS: Nanos = 100_000_000;

/// One queue's CoDel state (RFC 8289 §5, per datagram as it is taken from the queue).
#[derive(Clone, Debug)]
pub struct Codel {
    target: Nanos,
    interval: Nanos,
    /// When the sojourn time will have been above target for an interval (0: it is not
    /// above target now).
    first_above: Nanos,
    /// In the dropping state: when the next datagram is dropped.
    drop_next: Nanos,
    /// Drops since entering the dropping state; `last_count` its value when it was last
    /// entered (§5.6: a queue that returns soon starts from about where it left).
    count: u32,
    last_count: u32,
    dropping: bool,
}

impl Codel {
    pub fn new(target: Nanos, interval: Nanos) -> Codel {
        Codel {
            target,
            interval,
            first_above: 0,
            drop_next: 0,
            count: 0,
            last_count: 0,
            dropping: false,
        }
    }

    /// RFC 8289 §5.5: the time of the next drop, `interval / sqrt(count)` after `t`.
    fn control_law(&self, t: Nanos) -> Nanos {
        t + (self.interval as f64 / f64::from(self.count.max(1)).sqrt()) as Nanos
    }

    /// §5.3's dodequeue: whether the sojourn time has been above target for an interval.
    /// `drained`: the queue is empty after this datagram (nothing stands in it).
    fn ok_to_drop(&mut self, now: Nanos, sojourn: Nanos, drained: bool) -> bool {
        if sojourn < self.target || drained {
            self.first_above = 0;
            return false;
        }
        if self.first_above == 0 {
            self.first_above = now + self.interval;
            return false;
        }
        now >= self.first_above
    }

    /// A datagram taken at `now` after waiting `sojourn`: whether to drop it (§5.4).
    pub fn drop(&mut self, now: Nanos, sojourn: Nanos, drained: bool) -> bool {
        let ok = self.ok_to_drop(now, sojourn, drained);
        if self.dropping {
            if !ok {
                self.dropping = false;
                return false;
            }
            if now >= self.drop_next {
                self.count = self.count.saturating_add(1);
                self.drop_next = self.control_law(self.drop_next);
                return true;
            }
            return false;
        }
        if !ok {
            return false;
        }
        self.dropping = true;
        // §5.6: dropping again soon after the last time starts near that rate
        let delta = self.count.saturating_sub(self.last_count);
        self.count = if delta > 1 && now.saturating_sub(self.drop_next) < 16 * self.interval {
            delta
        } else {
            1
        };
        self.last_count = self.count;
        self.drop_next = self.control_law(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// Datagrams taken every `every` ns from `start` for `span` ns, each having waited
    /// `sojourn(t)`: the times of those dropped.
    fn run(
        c: &mut Codel,
        start: Nanos,
        span: Nanos,
        every: Nanos,
        sojourn: impl Fn(Nanos) -> Nanos,
    ) -> Vec<Nanos> {
        let mut dropped = vec![];
        let mut t = start;
        while t < start + span {
            if c.drop(t, sojourn(t), false) {
                dropped.push(t);
            }
            t += every;
        }
        dropped
    }

    #[test]
    fn a_short_queue_or_a_burst_shorter_than_the_interval_loses_nothing() {
        let mut c = Codel::new(TARGET_NS, INTERVAL_NS);
        // 4.9 ms of waiting for a second: below target
        assert!(run(&mut c, MS, 1000 * MS, MS / 10, |_| 4_900_000).is_empty());
        // a burst: 50 ms far above target, then back below: under one interval
        assert!(run(&mut c, 2000 * MS, 50 * MS, MS / 10, |_| 40 * MS).is_empty());
        assert!(run(&mut c, 2050 * MS, 500 * MS, MS / 10, |_| MS).is_empty());
    }

    #[test]
    fn a_standing_queue_is_dropped_from_after_one_interval_faster_and_faster() {
        let mut c = Codel::new(TARGET_NS, INTERVAL_NS);
        let start = 10_000 * MS;
        // 20 ms standing in the queue, datagrams every 0.1 ms, for a second
        let d = run(&mut c, start, 1000 * MS, MS / 10, |_| 20 * MS);
        // nothing in the first interval; the first drop right after it
        assert!(
            d[0] >= start + INTERVAL_NS && d[0] < start + INTERVAL_NS + MS,
            "{d:?}"
        );
        // then at interval / sqrt(count): gaps of 100, 100/sqrt(2), 100/sqrt(3), … ms
        let gaps: Vec<Nanos> = d.windows(2).map(|w| w[1] - w[0]).collect();
        for (i, g) in gaps.iter().enumerate().take(5) {
            let want = INTERVAL_NS as f64 / ((i + 1) as f64).sqrt();
            assert!(
                (*g as f64 - want).abs() <= (MS / 10) as f64,
                "{i}: {g} vs {want}"
            );
        }
        assert!(gaps.windows(2).all(|w| w[1] <= w[0]), "{gaps:?}");
        // as many as the law fits in the rest of the second
        let (mut t, mut k) = (d[0] as f64, 1.0f64);
        while t + INTERVAL_NS as f64 / k.sqrt() < (start + 1000 * MS) as f64 {
            t += INTERVAL_NS as f64 / k.sqrt();
            k += 1.0;
        }
        assert!(
            (d.len() as f64 - k).abs() <= 1.0,
            "{} drops, the law: {k}",
            d.len()
        );
    }

    #[test]
    fn dropping_stops_at_the_first_datagram_below_target_or_an_empty_queue() {
        let mut c = Codel::new(TARGET_NS, INTERVAL_NS);
        let d = run(&mut c, 0, 300 * MS, MS, |_| 20 * MS);
        assert!(!d.is_empty());
        assert!(!c.drop(300 * MS, MS, false)); // below target: out of the dropping state
        assert!(!c.dropping);
        assert!(!run(&mut c, 301 * MS, 50 * MS, MS, |_| 20 * MS)
            .iter()
            .any(|_| true));
        // above target again, but each datagram the last of its queue: nothing stands
        let mut t = 400 * MS;
        while t < 900 * MS {
            assert!(!c.drop(t, 20 * MS, true));
            t += MS;
        }
    }

    #[test]
    fn back_soon_after_it_resumes_near_the_last_drop_rate() {
        let mut c = Codel::new(TARGET_NS, INTERVAL_NS);
        let first = run(&mut c, 0, 2000 * MS, MS / 10, |_| 20 * MS);
        let n = first.len() as u32;
        assert!(n > 5);
        // a moment below target, then the queue stands again
        assert!(!c.drop(2000 * MS, MS, false));
        let again = run(&mut c, 2001 * MS, 400 * MS, MS / 10, |_| 20 * MS);
        // the first gap of the second episode is interval / sqrt(n - 1) (§5.6: count
        // resumes from the drops of the last episode), far shorter than a fresh start's
        // interval
        let gap = again[1] - again[0];
        let want = INTERVAL_NS as f64 / f64::from(n - 1).sqrt();
        assert!(
            (gap as f64 - want).abs() < 2.0 * MS as f64,
            "{gap} vs {want} ({n})"
        );
    }
}
