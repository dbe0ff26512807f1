//! One direction's SAs as the gateway keeps them: the engine built from the config,
//! each SA's lifetimes and sequence-number state (reserved ahead, persisted), and the
//! counters published for `ipsec-gw stats`.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use ipsec::sa::Direction;
use ipsec::sad::SaId;

use ipsec::{Engine, SaError};

pub use super::build_error::BuildError;
use build::{add_bundles, add_policies, BundleSas, Removed};

mod build;

use crate::config::{Config, Lifetime};
use crate::seqstate::{self, SeqState};
use crate::stats::{DirStats, Io, IpcompStats, SaStats, Shared, StageStat};

fn clock() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One direction's engine and what the gateway keeps about each of its SAs.
pub struct DirEngine {
    pub(super) direction: Direction,
    pub engine: Engine,
    sas: Vec<SaEntry>,
    /// Each SA's place in `sas`, by its engine id: `after` runs per packet, and a scan of
    /// thousands of SAs there cost every packet of a many-tunnel gateway.
    by_id: std::collections::HashMap<SaId, usize>,
    /// Inbound: how often the state is written (every SA's reservations together).
    in_writes: seqstate::WriteRate,
    /// (bundle name, IPComp association id) of bundles with IPComp.
    pub(super) ipcomps: Vec<(String, usize)>,
    /// The SAs of each bundle (engine bundle id -> its layers), for their lifetimes.
    bundle_sas: Vec<BundleSas>,
    /// Where this direction's sequence numbers outlive the process (None: a dry build,
    /// for `--check` and reload validation).
    state: Option<SeqState>,
    /// The other direction's state, read on every build: a key seen there counts here.
    other: Option<seqstate::Reader>,
    /// What the SAs earlier reloads took away had counted.
    removed: Removed,
}

struct SaEntry {
    id: SaId,
    name: String,
    spec: crate::config::SaSpec,
    lifetime: Lifetime,
    soft_logged: bool,
    expired: bool,
    /// The SA after its hard lifetime: out of the engine, kept for its final counters.
    retired: Option<ipsec::Sa>,
    /// Its entries in the state file: one per secret its keys hold (`keys_of`).
    keys: Vec<crate::seqstate::Key>,
    /// Inbound: the numbers reserved per write (1 to `RESERVE_IN`, following the rate),
    /// and when the last was written, with the highest number accepted then.
    block: u64,
    written: Option<(Instant, u64)>,
    /// Outbound: the highest sequence number reserved in the state file; inbound: the
    /// highest accepted number last written there.
    stored: u64,
}

impl SaEntry {
    /// Raise every entry of this SA's keys in `st` (values only rise; expired stays).
    fn raise(&self, st: &mut SeqState, value: u64, expired: bool) {
        for k in &self.keys {
            st.raise(k, value, expired);
        }
    }
}

/// The old engine's live SAs by SPI, and those already moved over: each new SA finds
/// the first unchanged old one of its SPI (`same_as` holds only between equal SPIs)
/// without a pass over all of them — 4,096 tunnels' reload compared and shifted them
/// pair by pair, most of its second.
#[derive(Default)]
struct Kept {
    by_spi: HashMap<u32, Vec<usize>>,
    taken: Vec<bool>,
}

impl Kept {
    fn of(old: Option<&DirEngine>) -> Kept {
        let mut k = Kept::default();
        if let Some(o) = old {
            for (i, e) in o.sas.iter().enumerate().filter(|(_, e)| !e.expired) {
                k.by_spi.entry(e.spec.config.spi).or_default().push(i);
            }
            k.taken = vec![false; o.sas.len()];
        }
        k
    }

    /// The first old SA not yet moved whose definition is `spec`'s, now moved.
    fn first_same(&mut self, old: &DirEngine, spec: &crate::config::SaSpec) -> Option<usize> {
        let i = *self
            .by_spi
            .get(&spec.config.spi)?
            .iter()
            .find(|&&i| !self.taken[i] && old.sas[i].spec.same_as(spec))?;
        self.taken[i] = true;
        Some(i)
    }
}

impl DirEngine {
    /// Build the engine for one direction of `cfg`. SAs of `old` whose definition is
    /// unchanged move over live (sequence numbers, replay window and counters kept); the
    /// others resume from the sequence state (outbound above every number they may have
    /// used, inbound refusing every number they accepted) and outbound numbers are
    /// reserved ahead before any packet goes. An SA the state records as expired stays
    /// expired. `state`: the direction's state file (ignored when `old` has one); None
    /// builds without one (a check). Errors name the SA and what is wrong.
    pub fn build(
        cfg: &Config,
        direction: Direction,
        old: Option<DirEngine>,
        state: Option<(SeqState, seqstate::Reader)>,
    ) -> Result<DirEngine, BuildError> {
        let mut engine = Engine::new();
        if cfg.stage_timing {
            engine.set_clock(Some(clock));
        }
        let mut old = old;
        // The direction's own counters (drops before an SA was known, bypassed packets)
        // go on across a reload: a reload is no reason to forget a drop.
        if let Some(o) = &old {
            engine.counters = o.engine.counters.clone();
        }
        let (state, reader) = match state {
            Some((s, r)) => (Some(s), Some(r)),
            None => (None, None),
        };
        let mut state = old.as_mut().and_then(|o| o.state.take()).or(state);
        let reader = old.as_mut().and_then(|o| o.other.take()).or(reader);
        // A key is a key in either direction: what the other direction's state records
        // under it counts too (its worker writes it; read through descriptors opened at
        // start).
        let other = match (&state, &reader) {
            (Some(_), Some(r)) => Some(r.read().map_err(BuildError::OtherState)?),
            _ => None,
        };
        let mut kept = Kept::of(old.as_ref());
        let mut sas = Vec::new();
        for spec in cfg.sas.iter().filter(|s| s.config.direction == direction) {
            sas.push(Self::sa_entry(
                &mut engine,
                spec,
                direction,
                (&mut old, &mut kept),
                &state,
                &other,
            )?);
        }
        // What must be on disk before any packet of this engine goes: a new outbound SA's
        // first reservation (its sequence numbers never used twice, across a crash too).
        // A reload that brings none — new inbound SAs, SAs taken away: each rekey's first
        // and last step, and the other direction's every step — writes without waiting
        // for the disk (as the inbound path does every 100 ms): an fsync on the worker's
        // thread held its packets up to 9 ms here, three reloads a rekey, each direction.
        let live = sas.iter().filter(|e| !e.expired).count();
        let moved = kept.taken.iter().filter(|&&t| t).count();
        let durable = old.is_none() || (direction == Direction::Out && live > moved);
        if let Some(st) = state.as_mut() {
            for e in &sas {
                e.raise(st, e.stored, e.expired);
            }
            let written = if durable { st.save() } else { st.save_quick() };
            written.map_err(|e| BuildError::State {
                path: st.path().to_path_buf(),
                source: e,
            })?;
        }
        let removed = build::removed(old.as_ref(), &kept);
        let (bundles, bundle_sas) = add_bundles(&mut engine, cfg, direction, &sas)?;
        add_policies(&mut engine, cfg, direction, &sas, &bundles)?;
        for e in sas.iter_mut().filter(|e| e.expired) {
            e.retired = engine.remove_sa(e.id);
        }
        let ipcomps = bundles
            .iter()
            .filter_map(|(n, _, c)| c.map(|c| (n.clone(), c)))
            .collect();
        let mut by_id = std::collections::HashMap::with_capacity(sas.len());
        for (i, e) in sas.iter().enumerate() {
            by_id.entry(e.id).or_insert(i); // the first, as a scan in order finds
        }
        Ok(DirEngine {
            direction,
            engine,
            sas,
            by_id,
            in_writes: seqstate::WriteRate::default(),
            ipcomps,
            bundle_sas,
            state,
            other: reader,
            removed,
        })
    }

    /// One SA of the direction: kept live from `old` when its definition is unchanged,
    /// else added and resumed from the sequence state (`state`, this direction's; `other`,
    /// the other direction's, as read at this build).
    fn sa_entry(
        engine: &mut Engine,
        spec: &crate::config::SaSpec,
        direction: Direction,
        (old, taken): (&mut Option<DirEngine>, &mut Kept),
        state: &Option<SeqState>,
        other: &Option<SeqState>,
    ) -> Result<SaEntry, BuildError> {
        let c = &spec.config;
        let keys = seqstate::keys_of(c);
        let kept = old.as_mut().and_then(|o| {
            let i = taken.first_same(o, spec)?;
            let e = &o.sas[i];
            o.engine
                .remove_sa(e.id)
                .map(|sa| (sa, e.soft_logged, e.stored))
        });
        let named = |e: SaError| BuildError::Sa {
            name: spec.name.clone(),
            spi: c.spi,
            source: e,
        };
        let entry = seqstate::highest(state.as_ref(), other.as_ref(), &keys);
        let was_kept = kept.is_some();
        // One sender per key (RFC 4303 §3.3.3): a key the peer sent under is never
        // one to send under (what it used past what reached us is unknown), nor one
        // this gateway sent under a key to receive under.
        if !was_kept && other.as_ref().is_some_and(|o| o.records_any(&keys)) {
            return Err(BuildError::KeyOfOtherDirection {
                name: spec.name.clone(),
                spi: c.spi,
                direction,
            });
        }
        let (id, soft_logged, mut stored_value, expired) = match kept {
            Some((sa, soft, v)) => (engine.insert_sa(sa).map_err(named)?, soft, v, false),
            None => {
                let id = engine.add_sa(c).map_err(named)?;
                let sa = engine.sa_mut(id).expect("just added");
                resume(sa, spec, direction, entry, state)?;
                (id, false, entry.value, entry.expired)
            }
        };
        // An expired SA stays in the engine until its bundles and policies are
        // built (they must name it), then leaves it: its id is never reused, so
        // whatever named it fails closed (RFC 4301 §4.4.2.1).
        // A new or resumed outbound SA reserves its first block now, before it seals
        // anything; one kept live over a reload goes on with its reservation.
        if direction == Direction::Out && !expired && !was_kept && state.is_some() {
            let used = engine.sa(id).expect("live").next_seq() - 1;
            stored_value = stored_value.max(used.saturating_add(seqstate::RESERVE));
        }
        Ok(SaEntry {
            id,
            name: spec.name.clone(),
            spec: spec.clone(),
            lifetime: spec.lifetime,
            soft_logged,
            expired,
            retired: None,
            keys,
            block: 1,
            written: None,
            stored: stored_value,
        })
    }

    /// Build both directions' engines of `cfg` without touching anything: what `--check`
    /// and a reload run first, so that a config they accept is one the gateway runs.
    pub fn check(cfg: &Config) -> Result<(), BuildError> {
        for dir in [Direction::Out, Direction::In] {
            DirEngine::build(cfg, dir, None, None)?;
        }
        Ok(())
    }

    /// The keys of SA `id` for a [`ipsec::CryptoJob`]: a live SA's, or one that reached
    /// its hard lifetime since (its last packets were numbered before it stopped).
    pub(super) fn keys(&self, id: SaId) -> Option<&ipsec::crypto::CipherState> {
        self.engine
            .sa(id)
            .or_else(|| {
                self.sas
                    .iter()
                    .find(|e| e.id == id)
                    .and_then(|e| e.retired.as_ref())
            })
            .map(ipsec::Sa::keys)
    }

    /// An engine with nothing in it (a placeholder while a reload builds the next one).
    pub(super) fn empty(direction: Direction) -> DirEngine {
        DirEngine {
            direction,
            engine: Engine::new(),
            sas: Vec::new(),
            by_id: std::collections::HashMap::new(),
            in_writes: seqstate::WriteRate::default(),
            ipcomps: Vec::new(),
            bundle_sas: Vec::new(),
            state: None,
            other: None,
            removed: Default::default(),
        }
    }

    /// After a bundle sealed or opened a packet: each of its SAs' lifetimes and
    /// sequence reservations, as for a lone SA.
    pub(super) fn after_bundle(&mut self, bundle: usize) -> bool {
        // copied out (two ids, no allocation): `after` needs `self` mutably
        let ids = self
            .bundle_sas
            .iter()
            .find(|(b, _)| *b == bundle)
            .map_or([None; 2], |(_, ids)| *ids);
        let mut recorded = true;
        for id in ids.into_iter().flatten() {
            recorded &= self.after(id);
        }
        recorded
    }

    /// After a packet opened through SA `id`: the lifetimes of every SA of its bundle
    /// when it is a bundle's outermost SA (the engine reports that one), else its own.
    /// False when its number could not be recorded (the SA stopped): the packet is then
    /// not handed on but dropped, counted as `no_sa` — a restart could accept it again.
    #[must_use]
    pub(super) fn after_opened(&mut self, id: SaId) -> bool {
        let bundle = self
            .bundle_sas
            .iter()
            .find(|(_, ids)| ids.contains(&Some(id)))
            .map(|(b, _)| *b);
        let recorded = match bundle {
            Some(b) => self.after_bundle(b),
            None => self.after(id),
        };
        if !recorded {
            self.count_drop(None, ipsec::DropReason::NoSa);
        }
        recorded
    }

    /// Count a packet dropped for `reason`: on SA `sa` when it names one the engine
    /// still holds, else on the direction's engine (no SA known, or it stopped since).
    #[inline]
    pub(super) fn count_drop(&mut self, sa: Option<SaId>, reason: ipsec::DropReason) {
        match sa.and_then(|id| self.engine.sa_mut(id)) {
            Some(s) => s.counters.drops.count(reason),
            None => self.engine.counters.drops.count(reason),
        }
    }

    /// Mark an SA expired in the state file (a reload or restart must not revive it).
    fn record_expired(&mut self, i: usize) {
        let Some(st) = self.state.as_mut() else {
            return;
        };
        let e = &self.sas[i];
        e.raise(st, e.stored, true);
        if let Err(err) = st.save() {
            eprintln!(
                "ipsec-gw: cannot record SA {}'s expiry in {}: {err}",
                e.name,
                st.path().display()
            );
        }
    }

    /// Before a number above the SA's reservation is used, reserve the next block in the
    /// state file. Outbound: before it seals the number (written and fsync'd; if that
    /// fails the SA stops, fail closed: no packet ever carries a number the state file
    /// does not cover). Inbound: after the number's ICV verified and before the packet
    /// is handed on (written without an fsync: it survives a crash of the process, not a
    /// power cut — see `seqstate`); a restart after an unclean stop refuses everything up
    /// to the reservation, so no packet accepted before the crash is accepted again. If
    /// that write fails the SA stops too: a restart could not keep that promise.
    /// False when the write failed: the packet that needed it must not go on.
    fn reserve(&mut self, i: usize) -> bool {
        if self.state.is_none() {
            return true;
        }
        let e = &self.sas[i];
        let Some(sa) = self.engine.sa(e.id) else {
            return true;
        };
        let want = match self.direction {
            Direction::Out => {
                let used = sa.next_seq() - 1;
                if used.saturating_add(seqstate::RESERVE / 2) < e.stored {
                    return true;
                }
                used.saturating_add(seqstate::RESERVE)
            }
            Direction::In => {
                let top = sa.replay_window().top();
                if top <= e.stored {
                    return true;
                }
                // the block follows the SA's rate: writes come about every
                // IN_WRITE_GAP, and a crash refuses about that long of genuine traffic
                // (a packet or none at a few a second, at most RESERVE_IN at line rate)
                // — and the state's, with many SAs (`seqstate::IN_WRITES_PER_S`)
                let now = Instant::now();
                let rate = self.in_writes.per_s(now);
                self.in_writes.note(now);
                let e = &mut self.sas[i];
                let own = e
                    .written
                    .map(|(t, was)| (now.duration_since(t), top.saturating_sub(was)));
                e.block = seqstate::next_in_block(e.block, own, rate);
                e.written = Some((now, top));
                top.saturating_add(e.block - 1)
            }
        };
        let e = &self.sas[i];
        let st = self.state.as_mut().expect("checked");
        e.raise(st, want, false);
        let saved = match self.direction {
            Direction::Out => st.save(),
            Direction::In => st.save_quick(),
        };
        match saved {
            Ok(()) => {
                self.sas[i].stored = want;
                true
            }
            Err(err) => {
                let e = &mut self.sas[i];
                let (what, drop) = match self.direction {
                    Direction::Out => ("reserve sequence numbers", "no_sa"),
                    Direction::In => (
                        "record the sequence numbers it accepts",
                        "the packet no_sa, later ones unknown_spi",
                    ),
                };
                eprintln!(
                    "ipsec-gw: SA {} (spi 0x{:x}) stops: cannot {what} in {}: {err}; its \
                     traffic is now dropped ({drop}), never sent or accepted with a number \
                     that could repeat",
                    e.name,
                    e.spec.config.spi,
                    st.path().display()
                );
                e.expired = true;
                e.retired = self.engine.remove_sa(e.id);
                false
            }
        }
    }

    /// At a clean stop: outbound, give back the unused part of each reservation (no
    /// packet went out above the last number taken), so a clean restart skips nothing;
    /// inbound likewise, the highest number accepted in place of the reservation, so a
    /// clean restart refuses nothing new. Written durably.
    pub fn release(&mut self) {
        let Some(st) = self.state.as_mut() else {
            return;
        };
        for e in self.sas.iter_mut().filter(|e| !e.expired) {
            let Some(sa) = self.engine.sa(e.id) else {
                continue;
            };
            let used = match self.direction {
                Direction::Out => sa.next_seq() - 1,
                Direction::In => sa.replay_window().top(),
            };
            e.stored = used;
            for k in &e.keys {
                let prev = st.get(k).unwrap_or_default();
                st.set(
                    k.clone(),
                    seqstate::Entry {
                        value: used,
                        expired: prev.expired || e.expired,
                    },
                );
            }
        }
        if let Err(err) = st.save() {
            eprintln!(
                "ipsec-gw: cannot write the {} sequence state {}: {err} (the reservations on \
                 disk stand: a restart skips them)",
                match self.direction {
                    Direction::Out => "outbound",
                    Direction::In => "inbound",
                },
                st.path().display()
            );
        }
    }

    /// A fresh state in `dir` whose writes all fail, as on a full disk (tests).
    #[cfg(test)]
    pub(in crate::dataplane) fn fail_state_writes(&mut self, dir: &Path) {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let mut st = SeqState::open(&dir.join("s"), self.direction, true).unwrap();
        st.fail_writes();
        self.state = Some(st);
    }

    /// After an SA sealed or opened a packet: enforce its lifetimes (RFC 4301 §4.4.2.1).
    /// False when the packet must not go on: its number could not be recorded, or the
    /// SA stopped before it (a packet opened in the same batch, after its SA's hard
    /// lifetime or a failed write: the SA is gone for it too).
    pub(super) fn after(&mut self, id: SaId) -> bool {
        let Some(i) = self
            .by_id
            .get(&id)
            .copied()
            .filter(|&i| !self.sas[i].expired)
        else {
            return false;
        };
        if !self.reserve(i) {
            return false;
        }
        let Some(e) = self.sas.get_mut(i).filter(|e| !e.expired) else {
            return true;
        };
        let Some(sa) = self.engine.sa(id) else {
            return true;
        };
        let (bytes, packets) = (sa.counters.bytes, sa.counters.packets);
        let over = |limit: Option<u64>, v: u64| limit.is_some_and(|l| v >= l);
        if over(e.lifetime.hard_bytes, bytes) || over(e.lifetime.hard_packets, packets) {
            eprintln!(
                "ipsec-gw: SA {} (spi 0x{:x}) reached its hard lifetime after {packets} \
                 packets, {bytes} bytes: it stops; its traffic is now dropped ({})",
                e.name,
                e.spec.config.spi,
                match self.direction {
                    Direction::Out => "no_sa",
                    Direction::In => "unknown_spi",
                }
            );
            e.expired = true;
            e.retired = self.engine.remove_sa(id);
            self.record_expired(i);
        } else if !e.soft_logged
            && (over(e.lifetime.soft_bytes, bytes) || over(e.lifetime.soft_packets, packets))
        {
            eprintln!(
                "ipsec-gw: SA {} (spi 0x{:x}) reached its soft lifetime after {packets} \
                 packets, {bytes} bytes",
                e.name, e.spec.config.spi
            );
            e.soft_logged = true;
        }
        true
    }

    fn snapshot(&self, io: &Io) -> DirStats {
        let mut st = DirStats {
            io: io.clone(),
            ..DirStats::default()
        };
        for (label, n) in self.engine.counters.drops.nonzero() {
            st.drops.insert(label, n);
        }
        let r = &self.removed;
        st.removed_sas = crate::stats::RemovedStats {
            sas: r.sas,
            packets: r.packets,
            bytes: r.bytes,
            drops: r.drops.nonzero().collect(),
        };
        for e in &self.sas {
            let mut s = SaStats {
                name: e.name.clone(),
                spi: format!("0x{:08x}", e.spec.config.spi),
                protocol: e.spec.config.protocol.name(),
                suite: e.spec.config.suite.name(),
                state: if e.expired { "expired" } else { "active" },
                soft_lifetime_reached: e.soft_logged,
                ..SaStats::default()
            };
            let live = if e.expired {
                None
            } else {
                self.engine.sa(e.id)
            };
            if let Some(sa) = live.or(e.retired.as_ref()) {
                s.packets = sa.counters.packets;
                s.bytes = sa.counters.bytes;
                for (label, n) in sa.counters.drops.nonzero() {
                    s.drops.insert(label, n);
                }
                for (label, ns, calls) in sa.stages.nonzero() {
                    s.stages.insert(label, StageStat { ns, calls });
                }
            }
            st.sas.push(s);
        }
        for (bundle, id) in &self.ipcomps {
            if let Some(c) = self.engine.ipcomp(*id) {
                let n = &c.counters;
                st.ipcomp.push(IpcompStats {
                    bundle: bundle.clone(),
                    cpi: c.config().cpi,
                    compressed: n.compressed,
                    incompressible: n.incompressible,
                    too_small: n.too_small,
                    bytes_in: n.bytes_in,
                    bytes_out: n.bytes_out,
                    decompressed: n.decompressed,
                    drops: n.drops.nonzero().collect(),
                });
            }
        }
        st
    }

    pub(super) fn publish(&self, io: &Io, shared: &Shared) {
        let mut snap = self.snapshot(io);
        let slot = match self.direction {
            Direction::Out => &shared.outbound,
            Direction::In => &shared.inbound,
        };
        let mut slot = slot.lock().expect("stats lock");
        snap.published = slot.published + 1;
        *slot = snap;
    }
}

/// A new SA resumed from what the sequence state records under its keys (`entry`):
/// outbound above every number they may have used, inbound refusing every number they
/// accepted; one recorded expired stays expired (said here).
fn resume(
    sa: &mut ipsec::Sa,
    spec: &crate::config::SaSpec,
    direction: Direction,
    entry: seqstate::Entry,
    state: &Option<SeqState>,
) -> Result<(), BuildError> {
    let c = &spec.config;
    if entry.value > 0 && !entry.expired {
        match direction {
            Direction::Out => {
                // refused past the last usable number (RFC 4303
                // §3.3.3): an SA whose keys used it has none to send
                entry
                    .value
                    .checked_add(1)
                    .ok_or(ipsec::DropReason::SequenceExhausted)
                    .and_then(|next| sa.set_next_seq(next))
                    .map_err(|_| BuildError::SequenceSpent {
                        name: spec.name.clone(),
                        spi: c.spi,
                        used: entry.value,
                    })?;
                eprintln!(
                    "ipsec-gw: sa {}: resuming above sequence number {} (from {})",
                    spec.name,
                    entry.value,
                    state
                        .as_ref()
                        .map_or(Path::new("?"), |s| s.path())
                        .display()
                );
            }
            Direction::In => sa.resume_inbound(entry.value),
        }
    }
    if entry.expired {
        eprintln!(
            "ipsec-gw: sa {} (spi 0x{:x}) reached its hard lifetime before under \
                 these keys: it stays expired (give it new keys to use it again)",
            spec.name, c.spi
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(esn: bool) -> Config {
        let text = crate::config::tests::GOOD.replacen(
            "spi = 0x1001",
            &format!("spi = 0x1001\nesn = {esn}"),
            1,
        );
        crate::config::parse(&text, Path::new("/tmp/gw.toml")).unwrap()
    }

    /// States in `d` (a test's own directory) recording `value` for `c`'s first SA.
    fn state_at(d: &Path, c: &Config, value: u64) -> (SeqState, seqstate::Reader) {
        let mut out = SeqState::open(&d.join("s.out"), Direction::Out, true).unwrap();
        let inb = SeqState::open(&d.join("s.in"), Direction::In, true).unwrap();
        for fp in seqstate::keys_of(&c.sas[0].config) {
            out.set(
                fp,
                seqstate::Entry {
                    value,
                    expired: false,
                },
            );
        }
        out.save().unwrap();
        let reader = inb.reader().unwrap();
        (out, reader)
    }

    /// One sender per key: an SA's key (any one of its entries, whatever value it holds)
    /// recorded by the other direction's state is refused — outbound, the peer may have
    /// sent past what reached us; inbound, the peer would repeat what we sealed. The
    /// same entries in the SA's own direction's state resume above them instead.
    #[test]
    fn an_sa_under_a_key_of_the_other_direction_is_refused() {
        for esn in [false, true] {
            let c = cfg(esn);
            for (i, direction) in [(0, Direction::Out), (1, Direction::In)] {
                assert_eq!(c.sas[i].config.direction, direction);
                let other_dir = match direction {
                    Direction::Out => Direction::In,
                    Direction::In => Direction::Out,
                };
                let keys = seqstate::keys_of(&c.sas[i].config);
                for fp in keys.iter() {
                    for value in [0u64, 1, 5000] {
                        let tmp = tempfile::tempdir().unwrap();
                        let d = tmp.path();
                        let mine = SeqState::open(&d.join("s.mine"), direction, true).unwrap();
                        let mut other =
                            SeqState::open(&d.join("s.other"), other_dir, true).unwrap();
                        other.set(
                            fp.clone(),
                            seqstate::Entry {
                                value,
                                expired: false,
                            },
                        );
                        other.save().unwrap();
                        let e = DirEngine::build(
                            &c,
                            direction,
                            None,
                            Some((mine, other.reader().unwrap())),
                        )
                        .err()
                        .expect("refused");
                        assert!(matches!(e, BuildError::KeyOfOtherDirection { .. }), "{e}");
                        assert!(e.to_string().contains("give the SA new keys"), "{e}");
                    }
                }
            }
            // sent under before, by this gateway: resumes
            let tmp = tempfile::tempdir().unwrap();
            let st = state_at(tmp.path(), &c, 5000);
            assert!(DirEngine::build(&c, Direction::Out, None, Some(st)).is_ok());
        }
    }

    /// An inbound policy naming two SAs (`sa = ["in-2", "in"]`) is a rule of the engine
    /// that protects with the first and lets the second in beside it, by their ids.
    #[test]
    fn a_policy_of_two_sas_is_a_rule_naming_both() {
        let text = crate::config::tests::GOOD.replacen("sa = \"in\"", "sa = [\"in-2\", \"in\"]", 1)
            + "\n[[sa]]\nname = \"in-2\"\ndirection = \"in\"\nspi = 0x2003\n\
               encryption = \"aes128gcm16\"\n\
               enc_key = \"a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3\"\n";
        let c = crate::config::parse(&text, Path::new("/tmp/gw.toml")).unwrap();
        let d = DirEngine::build(&c, Direction::In, None, None).unwrap();
        let id = |n: &str| d.sas.iter().find(|e| e.name == n).unwrap().id;
        let rules = d.engine.spd_in.rules();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].action, ipsec::Action::Protect(id("in-2")));
        assert_eq!(rules[0].also, vec![id("in")]);
        assert!(rules[0].admits(ipsec::Action::Protect(id("in"))));
    }

    /// A reload keeps what the direction counted before it (an unknown SPI, a packet
    /// let through in clear): before, the new engine started from zero, and the drops of
    /// a rekey that broke before it made vanished at the reload that mended it.
    #[test]
    fn a_reload_keeps_the_directions_own_counters() {
        let c = cfg(false);
        let mut old = DirEngine::build(&c, Direction::In, None, None).unwrap();
        old.engine
            .counters
            .drops
            .count(ipsec::DropReason::UnknownSpi);
        old.engine
            .counters
            .drops
            .count(ipsec::DropReason::UnknownSpi);
        old.engine.counters.bypassed_in = 3;
        let new = DirEngine::build(&c, Direction::In, Some(old), None).unwrap();
        assert_eq!(
            new.engine.counters.drops.get(ipsec::DropReason::UnknownSpi),
            2
        );
        assert_eq!(new.engine.counters.bypassed_in, 3);
        assert_eq!(new.removed.sas, 0); // its SA was moved over, not removed
    }

    /// A reload waits for the disk only when a new outbound SA must have its first
    /// reservation there before it seals: not for an unchanged config, nor for a new
    /// inbound SA; a start always does.
    #[test]
    fn a_reload_syncs_the_state_only_for_a_new_outbound_sa() {
        let c = cfg(false);
        let rekeyed = |c: &Config, direction: Direction| {
            let mut r = c.clone();
            let i = r.sas.iter().position(|s| s.config.direction == direction);
            let spec = &mut r.sas[i.unwrap()];
            spec.config.spi += 0x100;
            let mut key = spec.config.enc_key.expose().to_vec();
            key[0] ^= 0x80;
            spec.config.enc_key = ipsec::crypto::SecretBytes::new(key);
            r
        };
        let synced = |d: &DirEngine| d.state.as_ref().unwrap().synced();
        for direction in [Direction::Out, Direction::In] {
            let tmp = tempfile::tempdir().unwrap();
            let mine = SeqState::open(&tmp.path().join("s.mine"), direction, true).unwrap();
            let other_dir = match direction {
                Direction::Out => Direction::In,
                Direction::In => Direction::Out,
            };
            let other = SeqState::open(&tmp.path().join("s.other"), other_dir, true).unwrap();
            let d = DirEngine::build(&c, direction, None, Some((mine, other.reader().unwrap())));
            let d = d.unwrap();
            assert_eq!(synced(&d), 1, "{direction:?}: a start");
            let d = DirEngine::build(&c, direction, Some(d), None).unwrap();
            assert_eq!(synced(&d), 1, "{direction:?}: nothing new");
            let c2 = rekeyed(&c, direction);
            let d = DirEngine::build(&c2, direction, Some(d), None).unwrap();
            let want = if direction == Direction::Out { 2 } else { 1 };
            assert_eq!(synced(&d), want, "{direction:?}: a new SA");
            // and the state holds the new SA's entry either way
            let keys = seqstate::keys_of(
                &c2.sas
                    .iter()
                    .find(|s| s.config.direction == direction)
                    .unwrap()
                    .config,
            );
            assert!(d.state.as_ref().unwrap().records_any(&keys));
        }
    }

    /// An SA a reload takes away (a rekey's old one) leaves its counts in the direction's
    /// `removed_sas`, summed over every reload; one moved over live is not counted there.
    #[test]
    fn the_counts_of_an_sa_a_reload_took_away_are_kept() {
        let c = cfg(false);
        let mut d = DirEngine::build(&c, Direction::In, None, None).unwrap();
        let mut rekeyed = c.clone();
        for round in 1..=2u64 {
            let id = d.sas[0].id;
            let sa = d.engine.sa_mut(id).unwrap();
            sa.counters.packets += 10;
            sa.counters.bytes += 1000;
            sa.counters.drops.count(ipsec::DropReason::Replay);
            // the next generation: another SPI and key for the inbound SA
            let i = rekeyed
                .sas
                .iter()
                .position(|s| s.config.direction == Direction::In);
            let spec = &mut rekeyed.sas[i.unwrap()];
            spec.config.spi += 1;
            let mut key = spec.config.enc_key.expose().to_vec();
            key[0] ^= round as u8;
            spec.config.enc_key = ipsec::crypto::SecretBytes::new(key);
            d = DirEngine::build(&rekeyed, Direction::In, Some(d), None).unwrap();
            let st = d.snapshot(&Io::default());
            assert_eq!(st.removed_sas.sas, round);
            assert_eq!(
                (st.removed_sas.packets, st.removed_sas.bytes),
                (10 * round, 1000 * round)
            );
            assert_eq!(st.removed_sas.drops.get("replay"), Some(&round));
            assert_eq!(st.sas[0].packets, 0); // the new SA's own count starts at 0
        }
    }

    /// RFC 4303 §3.3.3: without ESN the counter never cycles. An SA whose keys used
    /// number 2^32 - 1 has nothing left to send: refused at start (before, it started
    /// and dropped every packet); one number below, or with ESN, it starts.
    #[test]
    fn an_sa_whose_last_number_was_used_is_refused_at_start() {
        let c = cfg(false);
        let (spent, left) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let e = DirEngine::build(
            &c,
            Direction::Out,
            None,
            Some(state_at(spent.path(), &c, u32::MAX.into())),
        )
        .err()
        .expect("refused");
        assert!(matches!(e, BuildError::SequenceSpent { .. }), "{e}");
        assert!(e.to_string().contains("none is left to send"), "{e}");
        let ok = u64::from(u32::MAX) - 1;
        assert!(DirEngine::build(
            &c,
            Direction::Out,
            None,
            Some(state_at(left.path(), &c, ok))
        )
        .is_ok());
        let c = cfg(true);
        let tmp = tempfile::tempdir().unwrap();
        let st = state_at(tmp.path(), &c, u32::MAX.into());
        assert!(DirEngine::build(&c, Direction::Out, None, Some(st)).is_ok());
    }
}
