//! Anti-replay window (RFC 4303 §3.4.3) as a ring bitmap that never shifts
//! (RFC 6479), and Extended Sequence Number inference (RFC 4303 Appendix A2).
//!
//! Contract: `check` before the ICV is verified, `commit` only after it verified;
//! one window belongs to one SA and is used by one thread at a time (`&mut self`).

use crate::drop::DropReason;

/// Window size used when a configuration does not say.
pub const DEFAULT_WINDOW: u32 = 1024;
/// Smallest window RFC 4303 §3.4.3 allows.
pub const MIN_WINDOW: u32 = 32;
/// Largest window we accept.
pub const MAX_WINDOW: u32 = 1 << 16;

const WORD_BITS: u64 = 64;

/// A window size [`ReplayWindow::new`] refuses: not a multiple of 32 in
/// [`MIN_WINDOW`]..=[`MAX_WINDOW`]. The caller's mistake (a configuration's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadWindowSize(pub u32);

impl core::fmt::Display for BadWindowSize {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "replay window {} must be a multiple of 32 from {MIN_WINDOW} to {MAX_WINDOW} \
             (or disabled explicitly)",
            self.0
        )
    }
}

impl std::error::Error for BadWindowSize {}

/// The receive window of one inbound SA.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    /// Highest sequence number committed so far (0: none yet).
    top: u64,
    /// Window size W: numbers in `top - W + 1 ..= top` are tracked.
    size: u64,
    /// Ring of bits indexed by `seq mod (words * 64)`; at least one word more than the
    /// window so a word can be cleared whole when the window advances (RFC 6479 §2).
    bitmap: Box<[u64]>,
    enabled: bool,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow::new(DEFAULT_WINDOW).unwrap()
    }
}

impl ReplayWindow {
    /// A window of `size` packets; `size` must be a multiple of 32 in 32..=65536.
    pub fn new(size: u32) -> Result<Self, BadWindowSize> {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&size) || !size.is_multiple_of(32) {
            return Err(BadWindowSize(size));
        }
        let words = (u64::from(size).div_ceil(WORD_BITS) + 1).next_power_of_two() as usize;
        Ok(ReplayWindow {
            top: 0,
            size: size.into(),
            bitmap: vec![0u64; words].into_boxed_slice(),
            enabled: true,
        })
    }

    /// No replay protection (RFC 4303 §3.4.3 allows it only by explicit choice).
    /// Still tracks the highest number, which ESN inference needs.
    pub fn disabled() -> Self {
        ReplayWindow {
            enabled: false,
            ..ReplayWindow::default()
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }
    pub fn size(&self) -> u32 {
        self.size as u32
    }
    /// Highest sequence number accepted so far.
    pub fn top(&self) -> u64 {
        self.top
    }

    /// The bit of `seq` in the ring. The ring's length is a power of two (`new`), so
    /// `seq mod bits` is a mask: no division per packet (a 64-bit `div` is tens of
    /// cycles, a visible share of a 64-byte AEAD open).
    #[inline]
    fn bit_of(&self, seq: u64) -> u64 {
        seq & (self.bitmap.len() as u64 * WORD_BITS - 1)
    }

    /// May `seq` be accepted? Does not change the window.
    pub fn check(&self, seq: u64) -> Result<(), DropReason> {
        if seq == 0 {
            return Err(DropReason::ZeroSequence);
        }
        if !self.enabled || seq > self.top {
            return Ok(());
        }
        if self.top - seq >= self.size {
            return Err(DropReason::ReplayTooOld);
        }
        let bit = self.bit_of(seq);
        if self.bitmap[(bit / WORD_BITS) as usize] & (1 << (bit % WORD_BITS)) != 0 {
            return Err(DropReason::Replay);
        }
        Ok(())
    }

    /// Resume a window whose highest accepted number was `top` before a restart, not
    /// knowing which numbers below it arrived: every number up to `top` counts as
    /// received (refused as a replay or as too old), every number above it is new. A
    /// window already past `top` is left as it is.
    pub fn resume(&mut self, top: u64) {
        if top <= self.top {
            return;
        }
        self.top = top;
        if self.enabled {
            for w in self.bitmap.iter_mut() {
                *w = u64::MAX;
            }
            // the bits above `top` in its own word stand for numbers not yet seen (the
            // words after it are cleared by `commit` as the window moves into them)
            let word = (self.bit_of(top) / WORD_BITS) as usize;
            self.bitmap[word] &= u64::MAX >> (WORD_BITS - 1 - top % WORD_BITS);
        }
    }

    /// Record `seq` as received. Call only after its ICV verified and `check` passed.
    pub fn commit(&mut self, seq: u64) {
        if seq > self.top {
            if self.enabled {
                let words = self.bitmap.len() as u64;
                let (old, new) = (self.top / WORD_BITS, seq / WORD_BITS);
                for i in 1..=(new - old).min(words) {
                    self.bitmap[((old + i) & (words - 1)) as usize] = 0;
                }
            }
            self.top = seq;
        }
        if self.enabled {
            let bit = self.bit_of(seq);
            self.bitmap[(bit / WORD_BITS) as usize] |= 1 << (bit % WORD_BITS);
        }
    }

    /// The full 64-bit sequence number for a received low half (RFC 4303 Appendix A2.2),
    /// or `None` when the high half would fall below 0 or above 2^32 - 1 (no valid number).
    pub fn infer_esn(&self, seq_lo: u32) -> Option<u64> {
        let w = self.size as u32; // the inference uses W even when replay checks are off
        let tl = self.top as u32;
        let th = (self.top >> 32) as u32;
        let seq_hi = if tl >= w - 1 {
            // Case A: the window lies within one 2^32 block.
            if seq_lo >= tl - (w - 1) {
                th
            } else {
                th.checked_add(1)?
            }
        } else if seq_lo >= tl.wrapping_sub(w - 1) {
            // Case B: the window spans two blocks and seq_lo is in the lower one.
            th.checked_sub(1)?
        } else {
            th
        };
        Some((u64::from(seq_hi) << 32) | u64::from(seq_lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay edge-case table in the manner of the WireGuard kernel selftest:
    /// each row is (step, sequence number, expected result of check-then-commit).
    #[test]
    fn edge_case_table() {
        const W: u64 = 64;
        let mut w = ReplayWindow::new(W as u32).unwrap();
        let ok = Ok(());
        let table: &[(u32, u64, Result<(), DropReason>)] = &[
            (1, 0, Err(DropReason::ZeroSequence)), // 0 is never valid
            (2, 1, ok),                            // first packet
            (3, 1, Err(DropReason::Replay)),       // duplicate of the first
            (4, 2, ok),
            (5, 4, ok), // gap
            (6, 3, ok), // fills the gap out of order
            (7, 3, Err(DropReason::Replay)),
            (8, W, ok),                             // top = W: window now 1..=W
            (9, 1, Err(DropReason::Replay)),        // left edge, still tracked
            (10, W + 1, ok),                        // 1 falls out
            (11, 1, Err(DropReason::ReplayTooOld)), // just left of the window
            (12, 2, Err(DropReason::Replay)),       // left edge of the window, seen
            (13, 5, ok),                            // inside, unseen
            (14, 5, Err(DropReason::Replay)),
            (15, 3 * W, ok),                            // far jump clears everything
            (16, 2 * W + 1, ok),                        // left edge after the jump, unseen
            (17, 2 * W, Err(DropReason::ReplayTooOld)), // one left of the edge
            (18, 3 * W, Err(DropReason::Replay)),       // the top itself
            (19, 3 * W - 1, ok),                        // just below top
            (20, 1_000_000, ok),                        // very far jump
            (21, 1_000_000 - W + 1, ok),                // exactly the left edge
            (22, 1_000_000 - W, Err(DropReason::ReplayTooOld)),
            (23, 3 * W - 1, Err(DropReason::ReplayTooOld)), // old number seen before the jump
            (24, u64::from(u32::MAX), ok),                  // 32-bit top
            (25, u64::from(u32::MAX) + 1, ok),              // crossing 2^32 (ESN)
            (26, u64::from(u32::MAX), Err(DropReason::Replay)),
        ];
        for (step, seq, want) in table {
            let got = w.check(*seq);
            assert_eq!(got, *want, "step {step}: seq {seq}");
            if got.is_ok() {
                w.commit(*seq);
            }
        }
    }

    /// After a restart resumed at `top`, nothing up to `top` is accepted again (the
    /// receiver cannot know which of them arrived), and every number above it is, once,
    /// in any order — also those in `top`'s own bitmap word and across word boundaries.
    #[test]
    fn resume_refuses_everything_up_to_the_top_and_nothing_above() {
        for size in [32u32, 64, 1024] {
            for top in [1u64, 63, 64, 65, 127, 1000, u64::from(u32::MAX) - 5] {
                let mut w = ReplayWindow::new(size).unwrap();
                w.resume(top);
                assert_eq!(w.top(), top);
                let low = top.saturating_sub(u64::from(size) + 3).max(1);
                for seq in low..=top {
                    assert!(
                        w.check(seq).is_err(),
                        "size {size} top {top}: {seq} accepted"
                    );
                }
                // above the top, out of order: each accepted once
                let above: Vec<u64> = (top + 1..=top + 30).rev().collect();
                for &seq in &above {
                    assert_eq!(w.check(seq), Ok(()), "size {size} top {top}: {seq}");
                    w.commit(seq);
                    assert_eq!(w.check(seq), Err(DropReason::Replay));
                }
            }
        }
        // a window already past the resumed top is not moved back
        let mut w = ReplayWindow::new(64).unwrap();
        w.commit(500);
        w.resume(100);
        assert_eq!(w.top(), 500);
        assert_eq!(w.check(499), Ok(()));
    }

    /// Every number in the window is accepted exactly once, in any order, across the
    /// word boundaries of the bitmap.
    #[test]
    fn each_number_once_in_reverse_order() {
        for size in [32u32, 64, 96, 1024, 4096] {
            let mut w = ReplayWindow::new(size).unwrap();
            let top = 10_000u64;
            w.check(top).unwrap();
            w.commit(top);
            for seq in (top - u64::from(size) + 1..top).rev() {
                assert_eq!(w.check(seq), Ok(()), "size {size} seq {seq}");
                w.commit(seq);
                assert_eq!(w.check(seq), Err(DropReason::Replay));
            }
            assert_eq!(
                w.check(top - u64::from(size)),
                Err(DropReason::ReplayTooOld)
            );
        }
    }

    #[test]
    fn sizes_outside_the_range_are_refused() {
        for size in [16, 100, MAX_WINDOW * 2] {
            assert_eq!(ReplayWindow::new(size).err(), Some(BadWindowSize(size)));
        }
        assert!(ReplayWindow::new(4096).is_ok());
        assert_eq!(
            BadWindowSize(100).to_string(),
            "replay window 100 must be a multiple of 32 from 32 to 65536 (or disabled \
             explicitly)"
        );
    }

    #[test]
    fn disabled_window_accepts_duplicates_but_not_zero() {
        let mut w = ReplayWindow::disabled();
        assert!(!w.is_enabled());
        for _ in 0..3 {
            assert_eq!(w.check(7), Ok(()));
            w.commit(7);
        }
        assert_eq!(w.check(0), Err(DropReason::ZeroSequence));
        assert_eq!(w.top(), 7);
    }

    /// RFC 4303 Appendix A2.2 cases, window W = 64.
    #[test]
    fn esn_inference_table() {
        let w_at = |top: u64| {
            let mut w = ReplayWindow::new(64).unwrap();
            if top > 0 {
                w.commit(top);
            }
            w
        };
        let hi = |h: u64, l: u64| (h << 32) | l;
        let table: &[(u32, u64, u32, Option<u64>)] = &[
            // (row, top, received low half, inferred)
            (1, hi(0, 100), 101, Some(hi(0, 101))), // case A, ahead
            (2, hi(0, 100), 50, Some(hi(0, 50))),   // case A, inside the window
            (3, hi(0, 100), 37, Some(hi(0, 37))),   // case A, left edge (Tl - W + 1)
            (4, hi(0, 100), 36, Some(hi(1, 36))),   // case A, below: next block
            (5, hi(0, 0xffff_fff0), 5, Some(hi(1, 5))), // low half wrapped forward
            (6, hi(1, 10), 0xffff_fff0, Some(hi(0, 0xffff_fff0))), // case B: previous block
            (7, hi(1, 10), 11, Some(hi(1, 11))),    // case B, ahead
            (8, hi(1, 10), 0xffff_ffcb, Some(hi(0, 0xffff_ffcb))), // case B, left edge
            (9, hi(1, 10), 0xffff_ffca, Some(hi(1, 0xffff_ffca))), // case B, far ahead
            (10, hi(0, 10), 0xffff_fff0, None),     // case B with Th = 0: no such number
            (11, hi(0xffff_ffff, 100), 36, None),   // case A: Th + 1 overflows
            (12, hi(0, 63), 0, Some(hi(0, 0))),     // Tl = W - 1 exactly: case A, left edge
            (13, hi(0, 63), 1, Some(hi(0, 1))),     // ... and the first number inside
        ];
        for (row, top, lo, want) in table {
            assert_eq!(w_at(*top).infer_esn(*lo), *want, "row {row}");
        }
    }
}
