//! The engine: SPD, SAD and SAs together — the outbound and inbound paths of
//! docs/architecture.md, I/O-free.
//!
//! outbound: SPD lookup → SA → ESP or AH seal (→ outer header)
//! inbound:  parse outer + SPI → SAD lookup (SPI, destination, ESP or AH) → replay
//!           check → ICV verify / AEAD open → replay update → inner policy check
//!
//! The engine fails closed: a packet a protect rule matches whose SA is missing is
//! dropped ([`DropReason::NoSa`]), never sent in clear; a clear packet arriving where inbound
//! policy requires protection is dropped ([`DropReason::PolicyMismatch`]).

use crate::buf::PacketBuf;
use crate::bundle::{self, Layers};
use crate::constants::proto;
use crate::crypto::job::{CryptoJob, Later, Now, When};
use crate::crypto::state::IvSource;
use crate::drop::{DropCounters, DropReason};
use crate::ipcomp::{IpcompConfig, IpcompSa};
use crate::locate::ipsec_location;
use crate::sa::{BundleError, Direction, Sa, SaConfig, SaError};
use crate::sad::{SaId, Sad, SadKey};
use crate::spd::{Action, Spd};
use crate::stage::{Clock, Stage};
use crate::wire::ah::peek_spi as ah_peek_spi;
use crate::wire::esp::peek_spi;
use crate::wire::PacketInfo;

/// Outcome of [`Engine::outbound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outbound {
    /// `pkt` now holds the ESP or AH packet to send.
    Sealed { sa: SaId },
    /// `pkt` now holds the packet a bundle made.
    SealedBundle { bundle: usize },
    /// Policy says send in clear; `pkt` is unchanged.
    Bypass,
}

/// Outcome of [`Engine::inbound`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// `pkt` now holds the decrypted packet to deliver.
    Opened { sa: SaId, next_header: u8 },
    /// A clear packet that policy lets through; `pkt` is unchanged.
    Bypass,
}

/// Outcome of [`Engine::inbound_start`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboundStart {
    /// Handled whole, as [`Engine::inbound`] would.
    Done(Inbound),
    /// A lone ESP SA's packet, checked against the replay window: run `job` with the
    /// SA's keys, then [`Engine::inbound_finish`].
    Open { sa: SaId, job: CryptoJob },
}

/// Where [`Engine::inbound_locate`] got with a packet.
enum Located {
    Clear(Inbound),
    Sa { id: SaId, bundle: Option<usize> },
}

/// Engine-wide counters for packets refused before an SA was known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    pub bypassed_out: u64,
    pub bypassed_in: u64,
    pub drops: DropCounters,
}

/// An SA bundle (see [`crate::bundle`]): ESP in tunnel mode, optionally IPComp inside it
/// and AH outside it. The ids are the engine's ([`Engine::add_sa`], [`Engine::add_ipcomp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ipcomp: Option<usize>,
    pub esp: SaId,
    pub ah: Option<SaId>,
}

#[derive(Debug, Default)]
pub struct Engine {
    /// Lent for per-stage timing; copied to every SA and IPComp association.
    clock: Option<Clock>,
    sas: Vec<Option<Sa>>,
    ipcomps: Vec<IpcompSa>,
    bundles: Vec<Bundle>,
    sad: Sad,
    pub spd_out: Spd,
    pub spd_in: Spd,
    pub counters: EngineCounters,
}

impl Engine {
    pub fn new() -> Self {
        Engine::default()
    }

    /// Build and register an SA. Inbound SAs go into the SAD under (SPI, tunnel
    /// destination if any, ESP or AH); a second inbound SA with the same key is refused.
    pub fn add_sa(&mut self, cfg: &SaConfig) -> Result<SaId, SaError> {
        self.insert_sa(Sa::new(cfg)?)
    }

    /// Register a live SA taken from another engine ([`Engine::remove_sa`]), keeping its
    /// sequence number, replay window and counters — how a gateway reloads its
    /// configuration without resetting SAs that did not change.
    ///
    /// Ids are never reused within an engine: a removed SA's id stays empty, so every
    /// policy and bundle that named it fails closed (`no_sa`) instead of reaching the
    /// next SA added (RFC 4301 §4.4.2.1: traffic of an SA past its hard lifetime is
    /// dropped, never carried by another SA).
    pub fn insert_sa(&mut self, mut sa: Sa) -> Result<SaId, SaError> {
        sa.stages.set_clock(self.clock);
        let id = self.sas.len();
        if sa.direction == Direction::In {
            let key = SadKey {
                spi: sa.spi,
                dst: sa.tunnel.map(|t| t.dst),
                protocol: sa.protocol.number(),
            };
            if self.sad.contains(&key) {
                return Err(SaError::DuplicateSpi(sa.spi));
            }
            self.sad.insert(key, id);
        }
        self.sas.push(Some(sa));
        Ok(id)
    }

    /// Remove an SA. Policies that point to it now fail closed.
    pub fn remove_sa(&mut self, id: SaId) -> Option<Sa> {
        let sa = self.sas.get_mut(id)?.take()?;
        if sa.direction == Direction::In {
            let key = SadKey {
                spi: sa.spi,
                dst: sa.tunnel.map(|t| t.dst),
                protocol: sa.protocol.number(),
            };
            self.sad.remove(&key);
        }
        Some(sa)
    }

    /// Add an IPComp association for use in bundles; returns its id.
    pub fn add_ipcomp(&mut self, cfg: IpcompConfig) -> Result<usize, SaError> {
        let mut c = IpcompSa::new(cfg).map_err(SaError::Ipcomp)?;
        c.stages.set_clock(self.clock);
        self.ipcomps.push(c);
        Ok(self.ipcomps.len() - 1)
    }

    pub fn ipcomp(&self, id: usize) -> Option<&IpcompSa> {
        self.ipcomps.get(id)
    }

    /// Register a bundle for [`Action::ProtectBundle`]; its SAs must exist and fit
    /// together (ESP tunnel, AH of the same direction).
    pub fn add_bundle(&mut self, b: Bundle) -> Result<usize, SaError> {
        let esp = self
            .sa(b.esp)
            .ok_or(SaError::Bundle(BundleError::NoSuchEsp))?;
        let ah = match b.ah {
            Some(id) => Some(self.sa(id).ok_or(SaError::Bundle(BundleError::NoSuchAh))?),
            None => None,
        };
        bundle::check(esp, ah).map_err(SaError::Bundle)?;
        if b.ipcomp.is_some_and(|i| i >= self.ipcomps.len()) {
            return Err(SaError::Bundle(BundleError::NoSuchIpcomp));
        }
        if self
            .bundles
            .iter()
            .any(|x| x.esp == b.esp || (b.ah.is_some() && x.ah == b.ah))
        {
            return Err(SaError::Bundle(BundleError::SaInAnotherBundle));
        }
        self.bundles.push(b);
        Ok(self.bundles.len() - 1)
    }

    fn layers(&mut self, id: usize) -> Option<Layers<'_>> {
        let b = *self.bundles.get(id)?;
        let ipcomp = match b.ipcomp {
            Some(i) => Some(self.ipcomps.get_mut(i)?),
            None => None,
        };
        let (esp, ah) = match b.ah {
            Some(a) => {
                let [e, a] = self.sas.get_disjoint_mut([b.esp, a]).ok()?;
                (e.as_mut()?, Some(a.as_mut()?))
            }
            None => (self.sas.get_mut(b.esp)?.as_mut()?, None),
        };
        Some(Layers { ipcomp, esp, ah })
    }

    /// The bundle whose outermost layer is SA `id`, or `Err` if `id` is an inner layer
    /// of a bundle (a packet that skipped the outer layers).
    fn bundle_of(&self, id: SaId) -> Result<Option<usize>, DropReason> {
        for (i, b) in self.bundles.iter().enumerate() {
            if b.ah == Some(id) || (b.ah.is_none() && b.esp == id) {
                return Ok(Some(i));
            }
            if b.esp == id {
                return Err(DropReason::BundleMismatch);
            }
        }
        Ok(None)
    }

    /// Switch per-stage timing on (with a clock in monotonic ns) or off, for the engine's
    /// lookups and every SA and IPComp association, present and future.
    pub fn set_clock(&mut self, clock: Option<Clock>) {
        self.clock = clock;
        for sa in self.sas.iter_mut().flatten() {
            sa.stages.set_clock(clock);
        }
        for c in &mut self.ipcomps {
            c.stages.set_clock(clock);
        }
    }

    fn now(&self) -> u64 {
        self.clock.map_or(0, |c| c())
    }

    /// Time since `t0` (0 when timing is off).
    fn since(&self, t0: u64) -> u64 {
        self.clock.map_or(0, |c| c().saturating_sub(t0))
    }

    pub fn sa(&self, id: SaId) -> Option<&Sa> {
        self.sas.get(id)?.as_ref()
    }
    pub fn sa_mut(&mut self, id: SaId) -> Option<&mut Sa> {
        self.sas.get_mut(id)?.as_mut()
    }
    pub fn sas(&self) -> impl Iterator<Item = (SaId, &Sa)> {
        self.sas
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
    }

    fn drop_here(&mut self, d: DropReason) -> DropReason {
        self.counters.drops.count(d);
        d
    }

    /// Apply outbound policy to the IP packet in `pkt`.
    pub fn outbound(&mut self, pkt: &mut PacketBuf<'_>) -> Result<Outbound, DropReason> {
        self.outbound_when::<Now>(pkt).map(|(o, ())| o)
    }

    /// As [`Engine::outbound`], but a packet a lone ESP SA protects is left for the
    /// caller to encrypt: the job that comes with `Sealed` is run with that SA's
    /// [`Sa::keys`] (on any thread) before the packet goes out. The SPD lookup, the
    /// sequence number, header, trailer, IV and counters are done here, in order. A
    /// bundle, an AH SA, and any SA while stage timing is on are sealed at once (no job).
    pub fn outbound_deferred(
        &mut self,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<(Outbound, Option<CryptoJob>), DropReason> {
        if self.clock.is_none() {
            self.outbound_when::<Later>(pkt)
        } else {
            self.outbound_when::<Now>(pkt).map(|(o, ())| (o, None))
        }
    }

    /// Outbound policy, a lone ESP SA's cryptography done now or handed back (`W`).
    fn outbound_when<W: When>(
        &mut self,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<(Outbound, W::Job), DropReason> {
        let t0 = self.now();
        let info = PacketInfo::parse(pkt.data()).map_err(|d| self.drop_here(d))?;
        let action = self.spd_out.lookup(&info);
        let lookup_ns = self.since(t0);
        match action {
            Action::Bypass => {
                self.counters.bypassed_out += 1;
                Ok((Outbound::Bypass, W::none()))
            }
            Action::Discard => Err(self.drop_here(DropReason::PolicyDiscard)),
            Action::Protect(id) => match self.sas.get_mut(id).and_then(Option::as_mut) {
                Some(sa) if sa.direction == Direction::Out => {
                    if sa.stages.enabled() {
                        sa.stages.add(Stage::PolicyLookup, lookup_ns);
                    }
                    let job = sa.seal_when::<W>(pkt, IvSource::Generate)?;
                    Ok((Outbound::Sealed { sa: id }, job))
                }
                _ => Err(self.drop_here(DropReason::NoSa)),
            },
            Action::ProtectBundle(b) => match self.layers(b) {
                Some(mut l) if l.esp.direction == Direction::Out => {
                    if l.esp.stages.enabled() {
                        l.esp.stages.add(Stage::PolicyLookup, lookup_ns);
                    }
                    l.seal(pkt, IvSource::Generate)?;
                    Ok((Outbound::SealedBundle { bundle: b }, W::none()))
                }
                _ => Err(self.drop_here(DropReason::NoSa)),
            },
        }
    }

    /// Apply inbound processing to the IP packet in `pkt` as received from outside.
    pub fn inbound(&mut self, pkt: &mut PacketBuf<'_>) -> Result<Inbound, DropReason> {
        match self.inbound_locate(pkt)? {
            Located::Clear(r) => Ok(r),
            Located::Sa { id, bundle } => self.inbound_open(pkt, id, bundle),
        }
    }

    /// Inbound for a packet [`Engine::inbound_locate`] found the SA (or bundle) of:
    /// open it whole, then the inner policy check.
    fn inbound_open(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        id: SaId,
        bundle: Option<usize>,
    ) -> Result<Inbound, DropReason> {
        let (next_header, want) = match bundle {
            Some(b) => {
                let Some(mut l) = self.layers(b) else {
                    return Err(self.drop_here(DropReason::UnknownSpi));
                };
                (l.open(pkt)?, Action::ProtectBundle(b))
            }
            None => {
                let Some(sa) = self.sas.get_mut(id).and_then(Option::as_mut) else {
                    return Err(self.drop_here(DropReason::UnknownSpi));
                };
                (sa.open(pkt)?, Action::Protect(id))
            }
        };
        self.inbound_policy(pkt, id, next_header, want)
    }

    /// Inbound in two halves, for opening on several threads. This one does what
    /// [`Engine::inbound`] does before the ICV for a packet of a lone ESP SA — SAD
    /// lookup, sequence number, replay check — and returns the job that verifies and
    /// decrypts it with that SA's [`Sa::keys`]; [`Engine::inbound_finish`] then
    /// commits the replay window and checks the inner policy. Every other packet (clear,
    /// AH, a bundle, any while stage timing is on) is handled whole here:
    /// [`InboundStart::Done`].
    pub fn inbound_start(&mut self, pkt: &mut PacketBuf<'_>) -> Result<InboundStart, DropReason> {
        let (id, bundle) = match self.inbound_locate(pkt)? {
            Located::Clear(r) => return Ok(InboundStart::Done(r)),
            Located::Sa { id, bundle } => (id, bundle),
        };
        let lone_esp = |sa: &Sa| sa.protocol() == crate::sa::Protocol::Esp;
        match self.sas.get_mut(id).and_then(Option::as_mut) {
            Some(sa) if bundle.is_none() && self.clock.is_none() && lone_esp(sa) => {
                let job = sa.open_start(pkt)?;
                Ok(InboundStart::Open { sa: id, job })
            }
            // AH, a bundle, stage timing on: the whole path, as ever
            _ => self.inbound_open(pkt, id, bundle).map(InboundStart::Done),
        }
    }

    /// The last half of a packet [`Engine::inbound_start`] began, given how its job
    /// went: replay commit, trailer, inner packet and the inner policy check, exactly as
    /// [`Engine::inbound`] does after the ICV. A packet whose SA left the SAD since
    /// (its hard lifetime reached by an earlier packet) is dropped as `UnknownSpi`.
    pub fn inbound_finish(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        sa: SaId,
        job: &CryptoJob,
        crypto: Result<(), DropReason>,
    ) -> Result<Inbound, DropReason> {
        let Some(s) = self.sas.get_mut(sa).and_then(Option::as_mut) else {
            return Err(self.drop_here(DropReason::UnknownSpi));
        };
        let next_header = s.open_finish(pkt, job, crypto)?;
        self.inbound_policy(pkt, sa, next_header, Action::Protect(sa))
    }

    /// Inbound up to the SA: a clear packet's fate by policy, or the SA (and bundle) an
    /// ESP or AH packet is for.
    fn inbound_locate(&mut self, pkt: &PacketBuf<'_>) -> Result<Located, DropReason> {
        let t0 = self.now();
        let info = PacketInfo::parse(pkt.data()).map_err(|d| self.drop_here(d))?;
        let protocol = info.protocol;
        if protocol != proto::ESP && protocol != proto::AH {
            // A clear packet: only bypass policy may let it in (fail closed).
            return match self.spd_in.lookup(&info) {
                Action::Bypass => {
                    self.counters.bypassed_in += 1;
                    Ok(Located::Clear(Inbound::Bypass))
                }
                Action::Discard => Err(self.drop_here(DropReason::PolicyDiscard)),
                Action::Protect(_) | Action::ProtectBundle(_) => {
                    Err(self.drop_here(DropReason::PolicyMismatch))
                }
            };
        }
        let spi = ipsec_location(pkt.data(), protocol)
            .and_then(|loc| {
                let at = &pkt.data()[loc.offset..];
                if protocol == proto::AH {
                    ah_peek_spi(at)
                } else {
                    peek_spi(at)
                }
            })
            .map_err(|d| self.drop_here(d))?;
        let Some(id) = self.sad.lookup(spi, info.dst, protocol) else {
            return Err(self.drop_here(DropReason::UnknownSpi));
        };
        let bundle = self.bundle_of(id).map_err(|d| self.drop_here(d))?;
        let lookup_ns = self.since(t0);
        if let Some(sa) = self.sas.get_mut(id).and_then(Option::as_mut) {
            if sa.stages.enabled() {
                sa.stages.add(Stage::SaLookup, lookup_ns);
            }
        }
        Ok(Located::Sa { id, bundle })
    }

    /// Inbound after opening: RFC 4301 §5.2 step 4, the decrypted packet must match the
    /// policy of the SA (or bundle) it came by.
    fn inbound_policy(
        &mut self,
        pkt: &PacketBuf<'_>,
        id: SaId,
        next_header: u8,
        want: Action,
    ) -> Result<Inbound, DropReason> {
        let t1 = self.now();
        // A transport-mode SA that opens to IP-in-IP (next header 4 or 41) would hand the
        // host a packet to decapsulate whose inner source the peer chose freely — the
        // policy checked above covers only the outer addresses. Only a policy that names
        // that protocol itself lets it in.
        let ip_in_ip =
            (next_header == proto::IPV4 || next_header == proto::IPV6) && self.transport_sa(id);
        let ok = PacketInfo::parse(pkt.data())
            .map(|info| match self.spd_in.rule(&info) {
                Some(r) if r.admits(want) => !ip_in_ip || r.selector.protocol == Some(next_header),
                _ => false,
            })
            .unwrap_or(false);
        let policy_ns = self.since(t1);
        if let Some(sa) = self.sas.get_mut(id).and_then(Option::as_mut) {
            if sa.stages.enabled() {
                sa.stages.add(Stage::PolicyLookup, policy_ns);
            }
        }
        if !ok {
            let sa = self.sas[id].as_mut().expect("looked up above");
            sa.counters.drops.count(DropReason::PolicyMismatch);
            return Err(DropReason::PolicyMismatch);
        }
        Ok(Inbound::Opened {
            sa: id,
            next_header,
        })
    }

    /// Whether the SA (or the bundle's ESP SA) `id` is in transport mode.
    fn transport_sa(&self, id: SaId) -> bool {
        self.sas
            .get(id)
            .and_then(Option::as_ref)
            .is_some_and(|sa| sa.mode() == crate::sa::Mode::Transport)
    }

    /// Outbound for a batch: `results[i]` is the outcome of `pkts[i]`.
    pub fn outbound_batch(
        &mut self,
        pkts: &mut [PacketBuf<'_>],
        results: &mut [Result<Outbound, DropReason>],
    ) {
        for (p, r) in pkts.iter_mut().zip(results.iter_mut()) {
            *r = self.outbound(p);
        }
    }

    /// Inbound for a batch: `results[i]` is the outcome of `pkts[i]`.
    pub fn inbound_batch(
        &mut self,
        pkts: &mut [PacketBuf<'_>],
        results: &mut [Result<Inbound, DropReason>],
    ) {
        for (p, r) in pkts.iter_mut().zip(results.iter_mut()) {
            *r = self.inbound(p);
        }
    }
}
