//! The anti-replay window (RFC 4303 §3.4.3, the RFC 6479 ring) against a naive model: a
//! set of every number committed, the highest one, and the floor a resume sets (every
//! number up to it counts as received). Each `check` must agree with the model, for any
//! window size, order of numbers, resume, and numbers near 2^32 and 2^64; and ESN
//! inference (RFC 4303 Appendix A2.2) must agree with its plain statement: the number
//! congruent to the low half in [top - W + 1, top - W + 1 + 2^32), if that is a valid
//! 64-bit number. Nothing may panic.

#![no_main]

use std::collections::BTreeSet;

use ipsec::{DropReason, ReplayWindow};
use libfuzzer_sys::fuzz_target;

struct Model {
    size: u64,
    enabled: bool,
    top: u64,
    floor: u64,
    seen: BTreeSet<u64>,
}

impl Model {
    fn check(&self, seq: u64) -> Result<(), DropReason> {
        if seq == 0 {
            return Err(DropReason::ZeroSequence);
        }
        if !self.enabled || seq > self.top {
            return Ok(());
        }
        if self.top - seq >= self.size {
            return Err(DropReason::ReplayTooOld);
        }
        if seq <= self.floor || self.seen.contains(&seq) {
            return Err(DropReason::Replay);
        }
        Ok(())
    }

    fn commit(&mut self, seq: u64) {
        self.top = self.top.max(seq);
        self.seen.insert(seq);
    }

    fn resume(&mut self, top: u64) {
        if top > self.top {
            self.top = top;
            self.floor = top;
        }
    }

    fn infer_esn(&self, lo: u32) -> Option<u64> {
        let bottom = i128::from(self.top) - self.size as i128 + 1;
        let span = 1i128 << 32;
        // the number ≡ lo (mod 2^32) in [bottom, bottom + 2^32)
        let n = bottom + (i128::from(lo) - bottom).rem_euclid(span);
        (0..=i128::from(u64::MAX)).contains(&n).then_some(n as u64)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let sizes = [32u32, 64, 96, 128, 1024, 4096, 65536];
    let size = sizes[usize::from(first & 7) % sizes.len()];
    let enabled = first & 0x80 == 0;
    let mut w = if enabled {
        ReplayWindow::new(size).unwrap()
    } else {
        ReplayWindow::disabled()
    };
    let mut m = Model {
        size: u64::from(w.size()),
        enabled,
        top: 0,
        floor: 0,
        seen: BTreeSet::new(),
    };
    // Start near an edge: 0, just under 2^32, or far up.
    let base = match first >> 4 & 3 {
        0 => 0u64,
        1 => (1 << 32) - 200,
        2 => u64::MAX - 100_000,
        _ => 1 << 40,
    };
    for op in rest.chunks_exact(5) {
        let delta = i64::from(i32::from_be_bytes([op[1], op[2], op[3], op[4]]) >> (op[0] & 0x1f));
        let from = if op[0] & 0x20 != 0 { m.top } else { base };
        let seq = from.wrapping_add_signed(delta);
        match op[0] >> 6 {
            0 | 1 => {
                // check, then commit what passed (as the SA does after a good ICV)
                let got = w.check(seq);
                assert_eq!(
                    got,
                    m.check(seq),
                    "check({seq}) top {} size {}",
                    m.top,
                    m.size
                );
                if got.is_ok() {
                    w.commit(seq);
                    m.commit(seq);
                }
            }
            2 => {
                w.resume(seq);
                m.resume(seq);
            }
            _ => {
                let lo = seq as u32;
                assert_eq!(
                    w.infer_esn(lo),
                    m.infer_esn(lo),
                    "infer_esn({lo}) top {}",
                    m.top
                );
            }
        }
        assert_eq!(w.top(), m.top);
    }
});
