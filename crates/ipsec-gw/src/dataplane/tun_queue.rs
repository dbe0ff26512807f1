//! `tun_queue = "auto"`: the TUN device's queue (its txqueuelen) set by what the outbound
//! worker reads from it. Linux's TUN queue is a count of packets, not a time or a size:
//! with offloads one entry may be a 64 KB GSO super-packet (a TCP sender's bulk), so 500
//! of them stand at tens of milliseconds and TCP fills them all, while a burst of small
//! packets needs the places (docs/gateway.md, "The TUN device's queue": at 16 packets
//! RRUL's RTT p50 fell from 17-21 ms to 0.4 ms with the same TCP throughput, and the 64-B
//! NDR to 0). So each window of about 100 ms the worker looks at the bytes it read: more
//! than half of them in TCP super-packets (the kernel's TSO/GRO: gso_type TCPV4/TCPV6 —
//! not UDP's, which a generator's bursts are), the queue is SHORT_TUN_QUEUE; it is
//! LONG_TUN_QUEUE again only after LONG_AFTER windows in a row without (or with too
//! little read to tell): each change costs the device a pause (the kernel deactivates its
//! qdisc to resize; one that flapped every window held probes for up to 190 ms) and a
//! shrink drops what no longer fits. The device is changed only when the answer does (an
//! ioctl, SIOCSIFTXQLEN).

use std::time::{Duration, Instant};

use crate::config::{LONG_TUN_QUEUE, SHORT_TUN_QUEUE};

/// How often the answer is taken again.
pub(super) const WINDOW: Duration = Duration::from_millis(100);
/// Fewer bytes read in a window than this (about 10 Mbit/s): too little to call it bulk.
pub(super) const MIN_BYTES: u64 = 128 * 1024;

/// Windows in a row without TCP's bulk before the queue is long again.
pub(super) const LONG_AFTER: u32 = 10;

/// Whether a window's reads were TCP's bulk: `gso` of its `bytes` came in TCP
/// super-packets.
pub(super) fn bulk(bytes: u64, gso: u64) -> bool {
    bytes >= MIN_BYTES && gso * 2 > bytes
}

/// One window's counts, and the queue the device has now.
pub(super) struct AutoQueue {
    since: Instant,
    bytes: u64,
    gso: u64,
    /// Windows in a row without bulk.
    calm: u32,
    pub(super) len: u32,
    /// The kernel refused a change (said once in the log).
    pub(super) refused: bool,
}

impl AutoQueue {
    pub(super) fn new(now: Instant) -> AutoQueue {
        AutoQueue {
            since: now,
            bytes: 0,
            gso: 0,
            calm: 0,
            len: LONG_TUN_QUEUE,
            refused: false,
        }
    }

    /// One read of `bytes`; `tcp_gso`: a TCP super-packet.
    pub(super) fn read(&mut self, bytes: u64, tcp_gso: bool) {
        self.bytes += bytes;
        if tcp_gso {
            self.gso += bytes;
        }
    }

    /// At a window's end, the queue to set when it differs from the device's; the next
    /// window starts.
    pub(super) fn due(&mut self, now: Instant) -> Option<u32> {
        if now.duration_since(self.since) < WINDOW {
            return None;
        }
        if bulk(self.bytes, self.gso) {
            self.calm = 0;
        } else {
            self.calm = self.calm.saturating_add(1);
        }
        let want = match self.calm {
            0 => SHORT_TUN_QUEUE,
            n if n >= LONG_AFTER => LONG_TUN_QUEUE,
            _ => self.len,
        };
        (self.since, self.bytes, self.gso) = (now, 0, 0);
        (want != self.len).then_some(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TCP's bulk in super-packets shortens the queue at once; it is long again only
    /// after LONG_AFTER windows without (whole packets, UDP, or a trickle), and the
    /// device is asked only when the answer changes, at most once a window.
    #[test]
    fn the_queue_is_short_while_tcp_super_packets_bring_most_bytes() {
        assert!(!bulk(0, 0));
        assert!(!bulk(MIN_BYTES - 1, MIN_BYTES - 1)); // a trickle
        assert!(bulk(MIN_BYTES, MIN_BYTES));
        assert!(!bulk(10 * MIN_BYTES, 5 * MIN_BYTES)); // half: not most
        assert!(bulk(10 * MIN_BYTES, 5 * MIN_BYTES + 1));

        let t0 = Instant::now();
        let mut q = AutoQueue::new(t0);
        let window = |q: &mut AutoQueue, i: u32, tcp: bool| {
            for _ in 0..10 {
                q.read(65_000, tcp); // a super-packet: TCP's, or a UDP generator's
                q.read(60, false); // ACKs the other way, or a probe
            }
            q.due(t0 + WINDOW * i)
        };
        assert_eq!(q.due(t0 + WINDOW / 2), None, "not before the window ends");
        assert_eq!(
            window(&mut q, 1, false),
            None,
            "UDP's super-packets: long, as it is"
        );
        assert_eq!(window(&mut q, 2, true), Some(SHORT_TUN_QUEUE));
        q.len = SHORT_TUN_QUEUE; // the worker set it
        assert_eq!(
            window(&mut q, 3, true),
            None,
            "unchanged: the device is not asked"
        );
        for i in 4..4 + LONG_AFTER - 1 {
            assert_eq!(
                window(&mut q, i, false),
                None,
                "window {i}: not yet long again"
            );
        }
        assert_eq!(
            window(&mut q, 3 + LONG_AFTER, true),
            None,
            "bulk again: still short"
        );
        for i in 4 + LONG_AFTER..4 + 2 * LONG_AFTER - 1 {
            assert_eq!(q.due(t0 + WINDOW * i), None, "idle window {i}");
        }
        assert_eq!(
            q.due(t0 + WINDOW * (3 + 2 * LONG_AFTER)),
            Some(LONG_TUN_QUEUE)
        );
        q.len = LONG_TUN_QUEUE;
        assert_eq!(
            q.due(t0 + WINDOW * (4 + 2 * LONG_AFTER)),
            None,
            "idle: long, as it is"
        );
    }
}
