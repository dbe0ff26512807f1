//! Per-stage cost counters: where a packet's time goes, split so the lab can map it onto
//! the Tisovsky–Baronak model (study 2, eq. 1–3).
//!
//! The core reads no clock: the caller lends one ([`Clock`], a function returning
//! monotonic nanoseconds) to switch timing on. Off (the default) every timing point is a
//! single predictable branch on a `None`; the benchmark shows the cost both ways.
//!
//! Stages and the model's terms:
//! - per packet, t_fix: `policy_lookup`, `sa_lookup`, `replay_check`, `replay_update`,
//!   `header` (ESP/AH/IPComp headers and the outer IP header), `padding` (ESP padding and
//!   trailer, written and checked), `iv` (generating the IV), `copy` (moving headers and
//!   payloads in the buffer);
//! - per byte, L_alg / R_alg: `cipher` (encryption or decryption, AEAD included), `mac`
//!   (HMAC or GMAC, or AH's ICV), `compress`, `decompress`.

use core::fmt;

/// Monotonic nanoseconds, supplied by the caller (the core has no clock of its own).
pub type Clock = fn() -> u64;

macro_rules! stages {
    ($( $(#[$m:meta])* $name:ident = $label:literal ),* $(,)?) => {
        /// A step of packet processing whose time is counted.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Stage { $( $(#[$m])* $name ),* }

        impl Stage {
            pub const ALL: &'static [Stage] = &[ $( Stage::$name ),* ];
            pub const COUNT: usize = Stage::ALL.len();
            pub fn label(self) -> &'static str {
                match self { $( Stage::$name => $label ),* }
            }
        }
    };
}

stages! {
    PolicyLookup = "policy_lookup",
    SaLookup = "sa_lookup",
    ReplayCheck = "replay_check",
    ReplayUpdate = "replay_update",
    Header = "header",
    Padding = "padding",
    Iv = "iv",
    Copy = "copy",
    Cipher = "cipher",
    Mac = "mac",
    Compress = "compress",
    Decompress = "decompress",
}

impl Stage {
    /// True for the stages whose cost grows with the packet (the model's L_alg / R_alg).
    pub fn per_byte(self) -> bool {
        matches!(
            self,
            Stage::Cipher | Stage::Mac | Stage::Compress | Stage::Decompress
        )
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Nanoseconds and calls per stage, and the clock that fills them (none: off).
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    clock: Option<Clock>,
    /// What one clock reading costs (calibrated when the clock is lent): taken off each
    /// stage, so a short stage is not mostly the timer.
    read_ns: u64,
    ns: [u64; Stage::COUNT],
    calls: [u64; Stage::COUNT],
}

impl StageTimes {
    /// Timing off: every [`StageTimes::start`] / [`StageTimes::stop`] is a branch on `None`.
    pub const fn off() -> Self {
        StageTimes {
            clock: None,
            read_ns: 0,
            ns: [0; Stage::COUNT],
            calls: [0; Stage::COUNT],
        }
    }

    /// Switch timing on with `clock`, or off with `None`. Totals are kept. The cost of a
    /// clock reading is calibrated here: the median gap between back-to-back readings.
    pub fn set_clock(&mut self, clock: Option<Clock>) {
        self.clock = clock;
        self.read_ns = clock.map_or(0, |c| {
            let mut gaps = [0u64; 31];
            for g in gaps.iter_mut() {
                let a = c();
                *g = c().saturating_sub(a);
            }
            gaps.sort_unstable();
            gaps[gaps.len() / 2]
        });
    }

    /// The calibrated cost of one clock reading, ns (0 when off).
    pub fn read_ns(&self) -> u64 {
        self.read_ns
    }

    pub fn enabled(&self) -> bool {
        self.clock.is_some()
    }

    /// A timestamp to pass to [`StageTimes::stop`] (0 when off).
    #[inline]
    pub fn start(&self) -> u64 {
        match self.clock {
            Some(c) => c(),
            None => 0,
        }
    }

    /// Add the time since `t0` to `stage`; returns the new timestamp, so consecutive
    /// stages can chain without reading the clock twice.
    #[inline]
    pub fn stop(&mut self, stage: Stage, t0: u64) -> u64 {
        match self.clock {
            Some(c) => {
                let t = c();
                self.ns[stage as usize] += t.saturating_sub(t0).saturating_sub(self.read_ns);
                self.calls[stage as usize] += 1;
                t
            }
            None => 0,
        }
    }

    /// Add time measured elsewhere (the engine's lookups, attributed to the SA).
    pub fn add(&mut self, stage: Stage, ns: u64) {
        self.ns[stage as usize] += ns;
        self.calls[stage as usize] += 1;
    }

    pub fn ns(&self, stage: Stage) -> u64 {
        self.ns[stage as usize]
    }

    pub fn calls(&self, stage: Stage) -> u64 {
        self.calls[stage as usize]
    }

    /// Stages with at least one call, as (label, ns, calls).
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64, u64)> + '_ {
        Stage::ALL
            .iter()
            .filter(|s| self.calls(**s) > 0)
            .map(|s| (s.label(), self.ns(*s), self.calls(*s)))
    }
}
