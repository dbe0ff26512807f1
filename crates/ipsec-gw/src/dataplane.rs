//! The data path: the TUN device on the inside, raw IP sockets (and optionally UDP 4500,
//! RFC 3948) on the outside, the engine between.
//!
//! Two workers, one per direction, each owning its own [`Engine`] with that direction's
//! SAs and policies: the outbound worker (TUN → seal → socket) alone touches outbound
//! SAs, so sequence numbers stay unique and increasing without a lock; the inbound worker
//! (socket → open → TUN) alone touches inbound SAs and their replay windows. Each worker
//! handles packets in the order it reads them, so per-flow order is kept.
//!
//! Fails closed: traffic a protect policy matches whose SA is missing or expired is
//! dropped and counted by the engine (`no_sa`), never sent in clear.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipsec::engine::{Inbound, Outbound};
use ipsec::sa::Direction;
use ipsec::sad::SaId;
use ipsec::spd::{Action, SpdRule};
use ipsec::{Engine, PacketBuf, HEADROOM, TAILROOM};
use socket2::{Domain, Protocol as SockProto, SockAddr, Socket, Type};
use tun_rs::SyncDevice;

use crate::config::{Config, Lifetime, PolicyAction};
use crate::gro::Coalescer;
use crate::seqstate::{self, SeqState};
use crate::stats::{DirStats, Io, IpcompStats, SaStats, Shared, StageStat};

/// RFC 3948 §2: ESP in UDP to and from port 4500.
pub const NAT_T_PORT: u16 = 4500;
const MAX_PACKET: usize = 65_535;
const POLL_MS: i32 = 200;
/// Packets handled per wakeup before the worker looks at its stop flag and reloads.
const BATCH: usize = 64;
const PUBLISH_EVERY: Duration = Duration::from_millis(100);
const IPPROTO_ESP: i32 = 50;
const IPPROTO_AH: i32 = 51;

fn clock() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One direction's engine and what the gateway keeps about each of its SAs.
pub struct DirEngine {
    direction: Direction,
    pub engine: Engine,
    sas: Vec<SaEntry>,
    /// (bundle name, IPComp association id) of bundles with IPComp.
    ipcomps: Vec<(String, usize)>,
    /// The SAs of each bundle (engine bundle id -> its layers), for their lifetimes.
    bundle_sas: Vec<(usize, [Option<SaId>; 2])>,
    /// Where this direction's sequence numbers outlive the process (None: a dry build,
    /// for `--check` and reload validation).
    state: Option<SeqState>,
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
    /// (SPI, key fingerprint): the SA's line in the state file.
    key: crate::seqstate::Key,
    /// Outbound: the highest sequence number reserved in the state file; inbound: the
    /// highest accepted number last written there.
    stored: u64,
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
        state: Option<SeqState>,
    ) -> Result<DirEngine, String> {
        let mut engine = Engine::new();
        if cfg.stage_timing {
            engine.set_clock(Some(clock));
        }
        let mut old = old;
        let mut state = old.as_mut().and_then(|o| o.state.take()).or(state);
        let mut sas = Vec::new();
        for spec in cfg.sas.iter().filter(|s| s.config.direction == direction) {
            let c = &spec.config;
            let key = (
                c.spi,
                seqstate::fingerprint(direction, c.spi, c.enc_key.expose(), c.integ_key.expose()),
            );
            let kept = old.as_mut().and_then(|o| {
                let i = o
                    .sas
                    .iter()
                    .position(|e| !e.expired && e.spec.same_as(spec))?;
                let e = o.sas.remove(i);
                o.engine
                    .remove_sa(e.id)
                    .map(|sa| (sa, e.soft_logged, e.stored))
            });
            let named = |e: String| format!("sa {} (spi 0x{:x}): {e}", spec.name, c.spi);
            let stored = state.as_ref().and_then(|s| s.get(&key));
            let was_kept = kept.is_some();
            let (id, soft_logged, mut stored_value, expired) = match kept {
                Some((sa, soft, v)) => (
                    engine.insert_sa(sa).map_err(|e| named(e.to_string()))?,
                    soft,
                    v,
                    false,
                ),
                None => {
                    let id = engine.add_sa(c).map_err(|e| named(e.to_string()))?;
                    let entry = stored.unwrap_or_default();
                    let sa = engine.sa_mut(id).expect("just added");
                    if entry.value > 0 && !entry.expired {
                        match direction {
                            Direction::Out => {
                                sa.set_next_seq(entry.value.saturating_add(1))
                                    .map_err(|e| named(e.to_string()))?;
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
                    (id, false, entry.value, entry.expired)
                }
            };
            let retired = if expired { engine.remove_sa(id) } else { None };
            // A new or resumed outbound SA reserves its first block now, before it seals
            // anything; one kept live over a reload goes on with its reservation.
            if direction == Direction::Out && !expired && !was_kept && state.is_some() {
                let used = engine.sa(id).expect("live").next_seq() - 1;
                stored_value = stored_value.max(used.saturating_add(seqstate::RESERVE));
            }
            sas.push(SaEntry {
                id,
                name: spec.name.clone(),
                spec: spec.clone(),
                lifetime: spec.lifetime,
                soft_logged,
                expired,
                retired,
                key,
                stored: stored_value,
            });
        }
        if let Some(st) = state.as_mut() {
            for e in &sas {
                st.raise(&e.key, e.stored, e.expired);
            }
            // before any packet of this engine goes: the reservations are on disk
            st.save().map_err(|e| {
                format!(
                    "cannot write the sequence state {}: {e} (without it a restart would \
                     reuse sequence numbers under the same keys; refusing to run)",
                    st.path().display()
                )
            })?;
        }
        let id_of = |name: &str| -> Result<SaId, String> {
            sas.iter()
                .find(|e| e.name == name)
                .map(|e| e.id)
                .ok_or_else(|| format!("no SA named {name:?} in this direction"))
        };
        let mut bundles = Vec::new();
        let mut bundle_sas = Vec::new();
        for b in cfg.bundles.iter().filter(|b| b.direction == direction) {
            let named = |e: String| format!("bundle {}: {e}", b.name);
            let ipcomp = match b.ipcomp_cpi {
                Some(cpi) => Some(
                    engine
                        .add_ipcomp(ipsec::IpcompConfig::new(cpi))
                        .map_err(|e| named(e.to_string()))?,
                ),
                None => None,
            };
            let esp = id_of(&b.esp).map_err(named)?;
            let ah = match b.ah.as_deref() {
                Some(n) => Some(id_of(n).map_err(named)?),
                None => None,
            };
            let bundle = ipsec::Bundle { ipcomp, esp, ah };
            let id = engine
                .add_bundle(bundle)
                .map_err(|e| named(e.to_string()))?;
            bundles.push((b.name.clone(), id, ipcomp));
            bundle_sas.push((id, [Some(esp), ah]));
        }
        for p in cfg.policies.iter().filter(|p| p.direction == direction) {
            let action = match &p.action {
                PolicyAction::Bypass => Action::Bypass,
                PolicyAction::Discard => Action::Discard,
                PolicyAction::Protect(name) => Action::Protect(id_of(name)?),
                PolicyAction::ProtectBundle(name) => {
                    let (_, id, _) = bundles
                        .iter()
                        .find(|(n, _, _)| n == name)
                        .ok_or_else(|| format!("no bundle named {name:?} in this direction"))?;
                    Action::ProtectBundle(*id)
                }
            };
            let rule = SpdRule {
                selector: p.selector.clone(),
                action,
            };
            match direction {
                Direction::Out => engine.spd_out.push(rule),
                Direction::In => engine.spd_in.push(rule),
            }
        }
        let ipcomps = bundles
            .iter()
            .filter_map(|(n, _, c)| c.map(|c| (n.clone(), c)))
            .collect();
        Ok(DirEngine {
            direction,
            engine,
            sas,
            ipcomps,
            bundle_sas,
            state,
        })
    }

    /// Build both directions' engines of `cfg` without touching anything: what `--check`
    /// and a reload run first, so that a config they accept is one the gateway runs.
    pub fn check(cfg: &Config) -> Result<(), String> {
        for dir in [Direction::Out, Direction::In] {
            DirEngine::build(cfg, dir, None, None)?;
        }
        Ok(())
    }

    /// An engine with nothing in it (a placeholder while a reload builds the next one).
    fn empty(direction: Direction) -> DirEngine {
        DirEngine {
            direction,
            engine: Engine::new(),
            sas: Vec::new(),
            ipcomps: Vec::new(),
            bundle_sas: Vec::new(),
            state: None,
        }
    }

    /// After a bundle sealed or opened a packet: each of its SAs' lifetimes and
    /// sequence reservations, as for a lone SA.
    fn after_bundle(&mut self, bundle: usize) {
        // copied out (two ids, no allocation): `after` needs `self` mutably
        let ids = self
            .bundle_sas
            .iter()
            .find(|(b, _)| *b == bundle)
            .map_or([None; 2], |(_, ids)| *ids);
        for id in ids.into_iter().flatten() {
            self.after(id);
        }
    }

    /// After a packet opened through SA `id`: the lifetimes of every SA of its bundle
    /// when it is a bundle's outermost SA (the engine reports that one), else its own.
    fn after_opened(&mut self, id: SaId) {
        let bundle = self
            .bundle_sas
            .iter()
            .find(|(_, ids)| ids.contains(&Some(id)))
            .map(|(b, _)| *b);
        match bundle {
            Some(b) => self.after_bundle(b),
            None => self.after(id),
        }
    }

    /// Mark an SA expired in the state file (a reload or restart must not revive it).
    fn record_expired(&mut self, i: usize) {
        let Some(st) = self.state.as_mut() else {
            return;
        };
        let e = &self.sas[i];
        st.raise(&e.key, e.stored, true);
        if let Err(err) = st.save() {
            eprintln!(
                "ipsec-gw: cannot record SA {}'s expiry in {}: {err}",
                e.name,
                st.path().display()
            );
        }
    }

    /// Outbound: before the SA's numbers reach its reservation, reserve the next block
    /// (written and fsync'd). If that write fails the SA stops (fail closed): no packet
    /// ever carries a number the state file does not cover.
    fn reserve(&mut self, i: usize) {
        if self.direction != Direction::Out || self.state.is_none() {
            return;
        }
        let e = &self.sas[i];
        let Some(sa) = self.engine.sa(e.id) else {
            return;
        };
        let used = sa.next_seq() - 1;
        if used.saturating_add(seqstate::RESERVE / 2) < e.stored {
            return;
        }
        let want = used.saturating_add(seqstate::RESERVE);
        let st = self.state.as_mut().expect("checked");
        st.raise(&e.key, want, false);
        match st.save() {
            Ok(()) => self.sas[i].stored = want,
            Err(err) => {
                let e = &mut self.sas[i];
                eprintln!(
                    "ipsec-gw: SA {} (spi 0x{:x}) stops: cannot reserve sequence numbers in {}: \
                     {err}; its traffic is now dropped (no_sa), never sent with a number that \
                     could repeat",
                    e.name,
                    e.spec.config.spi,
                    st.path().display()
                );
                e.expired = true;
                e.retired = self.engine.remove_sa(e.id);
            }
        }
    }

    /// At a clean stop: outbound, give back the unused part of each reservation (no
    /// packet went out above the last number taken), so a clean restart skips nothing;
    /// inbound, write the highest accepted numbers.
    pub fn release(&mut self) {
        if self.direction == Direction::In {
            self.persist_tops();
            if let Some(st) = self.state.as_ref() {
                if let Err(err) = st.save() {
                    eprintln!(
                        "ipsec-gw: cannot write the inbound sequence state {}: {err}",
                        st.path().display()
                    );
                }
            }
            return;
        }
        let Some(st) = self.state.as_mut() else {
            return;
        };
        for e in &mut self.sas {
            let Some(sa) = self.engine.sa(e.id) else {
                continue;
            };
            let used = sa.next_seq() - 1;
            let prev = st.get(&e.key).unwrap_or_default();
            e.stored = used;
            st.set(
                e.key.clone(),
                seqstate::Entry {
                    value: used,
                    expired: prev.expired || e.expired,
                },
            );
        }
        if let Err(err) = st.save() {
            eprintln!(
                "ipsec-gw: cannot write the outbound sequence state {}: {err} (the \
                 reservations on disk stand: a restart skips them)",
                st.path().display()
            );
        }
    }

    /// Inbound: write each SA's highest accepted number when it moved (at most every
    /// publish interval, and when the worker stops).
    fn persist_tops(&mut self) {
        if self.direction != Direction::In || self.state.is_none() {
            return;
        }
        let mut changed = false;
        for e in &mut self.sas {
            let Some(sa) = self.engine.sa(e.id) else {
                continue;
            };
            let top = sa.replay_window().top();
            if top > e.stored {
                e.stored = top;
                changed = true;
            }
        }
        if !changed {
            return;
        }
        let st = self.state.as_mut().expect("checked");
        for e in &self.sas {
            st.raise(&e.key, e.stored, e.expired);
        }
        if let Err(err) = st.save_quick() {
            eprintln!(
                "ipsec-gw: cannot write the inbound sequence state {}: {err}",
                st.path().display()
            );
        }
    }

    /// After an SA sealed or opened a packet: enforce its lifetimes (RFC 4301 §4.4.2.1).
    fn after(&mut self, id: SaId) {
        let Some(i) = self.sas.iter().position(|e| e.id == id && !e.expired) else {
            return;
        };
        self.reserve(i);
        let Some(e) = self.sas.get_mut(i).filter(|e| !e.expired) else {
            return;
        };
        let Some(sa) = self.engine.sa(id) else { return };
        let (bytes, packets) = (sa.counters.bytes, sa.counters.packets);
        let over = |limit: Option<u64>, v: u64| limit.is_some_and(|l| v >= l);
        if over(e.lifetime.hard_bytes, bytes) || over(e.lifetime.hard_packets, packets) {
            eprintln!(
                "ipsec-gw: SA {} (spi 0x{:x}) reached its hard lifetime after {packets} \
                 packets, {bytes} bytes: it stops; its traffic is now dropped (no_sa)",
                e.name, e.spec.config.spi
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
    }

    fn snapshot(&self, io: &Io) -> DirStats {
        let mut st = DirStats {
            io: io.clone(),
            ..DirStats::default()
        };
        for (label, n) in self.engine.counters.drops.nonzero() {
            st.drops.insert(label, n);
        }
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

    fn publish(&self, io: &Io, shared: &Shared) {
        let snap = self.snapshot(io);
        let slot = match self.direction {
            Direction::Out => &shared.outbound,
            Direction::In => &shared.inbound,
        };
        *slot.lock().expect("stats lock") = snap;
    }
}

/// Seal with the direction's engine — or, in the I/O-ceiling build, frame without
/// cryptography ([`crate::ceiling`]).
#[cfg(not(feature = "io-ceiling"))]
fn seal(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Outbound, ipsec::DropReason> {
    engine.engine.outbound(pkt)
}

/// Open with the direction's engine (or, in the I/O-ceiling build, unframe).
#[cfg(not(feature = "io-ceiling"))]
fn open(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Inbound, ipsec::DropReason> {
    engine.engine.inbound(pkt)
}

#[cfg(feature = "io-ceiling")]
use crate::ceiling::{open, seal};

/// The outside: where sealed packets go and protected packets come from.
pub struct Outside {
    raw_send: Socket,
    esp_recv: Socket,
    ah_recv: Socket,
    udp: Option<UdpSocket>,
    /// UDP GSO on the 4500 socket: several ESP packets per send (Linux 4.18+).
    pub udp_gso: bool,
    /// UDP GRO on the 4500 socket: several ESP packets per receive (Linux 5.0+).
    pub udp_gro: bool,
    peer: SocketAddr,
    local: IpAddr,
    remote: IpAddr,
}

impl Outside {
    pub fn open(cfg: &Config) -> io::Result<Outside> {
        let (local, remote) = (cfg.local, cfg.remote);
        let domain = if local.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        // IPPROTO_RAW: we write whole packets, the engine's outer header included
        // (IP_HDRINCL, and its IPv6 equivalent, are implied); the kernel fills the IPv4
        // header checksum.
        let raw_send = Socket::new(domain, Type::RAW, Some(SockProto::from(libc::IPPROTO_RAW)))?;
        let esp_recv = Socket::new(domain, Type::RAW, Some(SockProto::from(IPPROTO_ESP)))?;
        let ah_recv = Socket::new(domain, Type::RAW, Some(SockProto::from(IPPROTO_AH)))?;
        let udp = if cfg.udp_encap {
            let u = UdpSocket::bind(SocketAddr::new(local, NAT_T_PORT))?;
            big_buffers(u.as_raw_fd());
            Some(u)
        } else {
            None
        };
        for s in [&raw_send, &esp_recv, &ah_recv] {
            big_buffers(s.as_raw_fd());
        }
        // Our own outer packets carry the mark and so skip the table that routes into
        // the TUN device (which may hold the peer's address: host-to-host).
        raw_send.set_mark(cfg.fwmark)?;
        if let Some(u) = &udp {
            socket2::SockRef::from(u).set_mark(cfg.fwmark)?;
        }
        // Only what is addressed to this gateway's outer address (several gateways may
        // share a host, each with its own address).
        let here = SockAddr::from(SocketAddr::new(local, 0));
        esp_recv.bind(&here)?;
        ah_recv.bind(&here)?;
        // UDP offloads with the TUN ones (`offload`), where the kernel has them.
        let offload = |opt, set| {
            cfg.offload
                && udp
                    .as_ref()
                    .is_some_and(|u| udp_option(u.as_raw_fd(), opt, set))
        };
        let udp_gso = offload(libc::UDP_SEGMENT, false);
        let udp_gro = offload(libc::UDP_GRO, true);
        Ok(Outside {
            raw_send,
            esp_recv,
            ah_recv,
            udp,
            udp_gso,
            udp_gro,
            peer: cfg.udp_peer(),
            local,
            remote,
        })
    }

    /// Where one outer packet (IPv4 or IPv6, as the engine built it) goes: raw, or — ESP
    /// with UDP encapsulation — its ESP part in a UDP datagram to the peer's port 4500
    /// (RFC 3948 §2.1). `None`: too short to be an IP packet.
    fn route(&self, pkt: &[u8]) -> Option<(bool, usize, SockAddr)> {
        let v6 = pkt.first().is_some_and(|b| b >> 4 == 6);
        let (header, protocol) = if v6 {
            (40, pkt.get(6))
        } else {
            (
                pkt.first().map_or(0, |b| usize::from(b & 0x0f) * 4),
                pkt.get(9),
            )
        };
        match (&self.udp, protocol) {
            (Some(_), Some(&50)) if pkt.len() > header => {
                Some((true, header, SockAddr::from(self.peer)))
            }
            _ if v6 && pkt.len() >= 40 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(&pkt[24..40]);
                Some((
                    false,
                    0,
                    SockAddr::from(SocketAddr::new(IpAddr::from(a), 0)),
                ))
            }
            _ if !v6 && pkt.len() >= 20 => {
                let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
                Some((false, 0, SockAddr::from(SocketAddrV4::new(dst, 0))))
            }
            _ => None,
        }
    }

    /// Send a wakeup's outer packets — `(buffer, head, len)` of each, in order — with one
    /// sendmmsg(2) per socket (UDP 4500 and raw) rather than a system call each. A
    /// packet the kernel refuses is counted (`send_errors`) and the rest still go.
    fn send_batch(&self, batch: &mut SendBatch, bufs: &[Vec<u8>], io: &mut Io) {
        batch.udp.clear();
        batch.raw.clear();
        for &(b, head, len) in &batch.pkts {
            let pkt = &bufs[b][head..head + len];
            let Some((udp, skip, addr)) = self.route(pkt) else {
                io.send_errors += 1;
                continue;
            };
            let to = if udp { &mut batch.udp } else { &mut batch.raw };
            to.push(addr, &pkt[skip..]);
        }
        if let Some(u) = &self.udp {
            batch.udp.send(u.as_raw_fd(), io);
        }
        batch.raw.send(self.raw_send.as_raw_fd(), io);
        batch.pkts.clear();
    }
}

/// A wakeup's outer packets, and the sendmmsg(2) arrays for each socket, kept between
/// wakeups (no allocation per packet or per batch once they have grown to its size).
#[derive(Default)]
struct SendBatch {
    pkts: Vec<(usize, usize, usize)>,
    udp: Messages,
    raw: Messages,
}

/// UDP GSO limits: segments per send (the kernel's UDP_MAX_SEGMENTS is 64 before Linux
/// 6.1, 128 after) and UDP payload bytes per send (an IP packet's 65,535 less headers).
const GSO_MAX_SEGMENTS: usize = 64;
const GSO_MAX_BYTES: usize = 65_535 - 40 - 8;

/// One sendmmsg(2) message: `n` consecutive iovecs from `first`, to `addr`. With UDP GSO
/// several ESP packets of `seg` bytes (the last may be shorter) go as one message the
/// kernel cuts into datagrams of `seg` bytes — late, after one trip through the stack.
struct Message {
    addr: SockAddr,
    first: usize,
    n: usize,
    seg: usize,
    bytes: usize,
    /// A shorter packet ended this message: nothing more may join it.
    closed: bool,
}

#[derive(Default)]
struct Messages {
    /// Join packets into UDP GSO messages (only for the UDP socket, when the kernel has
    /// UDP_SEGMENT; switched off for good if a GSO send is refused).
    gso: bool,
    msgs: Vec<Message>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// One control buffer per message, for its UDP_SEGMENT cmsg (aligned like cmsghdr).
    ctrl: Vec<[u64; 4]>,
}

impl Messages {
    fn clear(&mut self) {
        self.msgs.clear();
        self.iovs.clear();
        self.hdrs.clear();
    }

    /// One datagram: `data` to `addr`. `data` must stay put until `send` (it does: it is
    /// in the worker's buffers, untouched until the batch has gone).
    fn push(&mut self, addr: SockAddr, data: &[u8]) {
        let len = data.len();
        self.iovs.push(libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: len,
        });
        if self.gso {
            if let Some(m) = self.msgs.last_mut() {
                if !m.closed
                    && len <= m.seg
                    && m.n < GSO_MAX_SEGMENTS
                    && m.bytes + len <= GSO_MAX_BYTES
                    && m.addr == addr
                {
                    m.n += 1;
                    m.bytes += len;
                    m.closed = len < m.seg;
                    return;
                }
            }
        }
        self.msgs.push(Message {
            addr,
            first: self.iovs.len() - 1,
            n: 1,
            seg: len,
            bytes: len,
            closed: false,
        });
    }

    /// sendmmsg(2) until every message has gone or been refused; counts both. A GSO
    /// message the kernel refuses goes again one datagram at a time, and GSO stops.
    fn send(&mut self, fd: RawFd, io: &mut Io) {
        self.hdrs.clear();
        if self.ctrl.len() < self.msgs.len() {
            self.ctrl.resize(self.msgs.len(), [0; 4]);
        }
        for (m, ctrl) in self.msgs.iter().zip(self.ctrl.iter_mut()) {
            // SAFETY: zeroed msghdr/mmsghdr are valid values of the types (null pointers,
            // zero lengths); the fields set below point into `msgs`, `iovs` and `ctrl`,
            // which neither move nor change size until the sendmmsg calls are over.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = m.addr.as_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_namelen = m.addr.len();
            h.msg_hdr.msg_iov = &mut self.iovs[m.first];
            h.msg_hdr.msg_iovlen = m.n;
            if m.n > 1 {
                set_udp_segment(&mut h.msg_hdr, ctrl, m.seg as u16);
            }
            self.hdrs.push(h);
        }
        let mut at = 0;
        while at < self.hdrs.len() {
            let rest = &mut self.hdrs[at..];
            // SAFETY: `rest` is a valid array of `rest.len()` mmsghdr whose name, iovec
            // and control pointers are valid for the call (see above); the kernel writes
            // only msg_len.
            let n = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The first message was refused. A GSO one the kernel will not cut
                // (EMSGSIZE, EINVAL before Linux 6.x: a segment over the path MTU; EINVAL:
                // no GSO for this route; EIO: no checksum offload) goes again datagram by
                // datagram, and GSO stops for good; otherwise (a full queue, no route)
                // its datagrams are counted lost.
                let m = &self.msgs[at];
                let unsupported = matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EIO | libc::EMSGSIZE)
                );
                if m.n > 1 && unsupported {
                    self.gso = false;
                    eprintln!("ipsec-gw: UDP GSO refused ({e}): one datagram per send from now on");
                    for iov in &self.iovs[m.first..m.first + m.n] {
                        send_one(fd, &m.addr, iov, io);
                    }
                } else {
                    io.send_errors += m.n as u64;
                }
                at += 1;
                continue;
            }
            for (h, m) in rest[..n as usize].iter().zip(&self.msgs[at..]) {
                io.tx_packets += m.n as u64;
                io.tx_bytes += u64::from(h.msg_len);
                io.gso_sends += u64::from(m.n > 1);
            }
            at += n as usize;
        }
    }
}

/// A UDP_SEGMENT control message (UDP GSO, Linux 4.18+: the kernel cuts the payload into
/// datagrams of `seg` bytes) in `ctrl`, attached to `h`.
fn set_udp_segment(h: &mut libc::msghdr, ctrl: &mut [u64; 4], seg: u16) {
    let space = std::mem::size_of_val(ctrl);
    h.msg_control = ctrl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE(2) (24 bytes on 64-bit Linux) fits in `ctrl` (32 bytes, aligned
    // as cmsghdr); CMSG_FIRSTHDR of a msghdr whose control buffer is that large is
    // non-null and points into `ctrl`, as does CMSG_DATA.
    unsafe {
        let len = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize;
        debug_assert!(len <= space);
        h.msg_controllen = len;
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
    }
}

/// One datagram with sendto(2); counted as sent or refused.
fn send_one(fd: RawFd, addr: &SockAddr, iov: &libc::iovec, io: &mut Io) {
    // SAFETY: `iov` points at `iov_len` readable bytes in the worker's buffers; `addr` is
    // a valid socket address of `addr.len()` bytes.
    let n = unsafe { libc::sendto(fd, iov.iov_base, iov.iov_len, 0, addr.as_ptr(), addr.len()) };
    if n < 0 {
        io.send_errors += 1;
    } else {
        io.tx_packets += 1;
        io.tx_bytes += n as u64;
    }
}

/// Whether the kernel offers a UDP socket option (UDP_SEGMENT / UDP_GRO): turn it on
/// (`set`: UDP_GRO) or just ask for it (UDP_SEGMENT, set per send) — as wireguard-go
/// probes its offloads.
fn udp_option(fd: RawFd, opt: libc::c_int, set: bool) -> bool {
    let mut v: libc::c_int = 1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and a pointer to a c_int of the size passed.
    let rc = unsafe {
        if set {
            libc::setsockopt(
                fd,
                libc::SOL_UDP,
                opt,
                (&v as *const libc::c_int).cast(),
                len,
            )
        } else {
            libc::getsockopt(
                fd,
                libc::SOL_UDP,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        }
    };
    rc == 0
}

/// A zeroed buffer of `len` bytes whose pages are already resident (each written once):
/// the gateway's memory at start is what it keeps, rather than growing as traffic first
/// reaches deeper into its buffers (a fresh zeroed allocation is mapped lazily).
pub fn resident(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        // SAFETY: `i < len`: in bounds of the allocation. Volatile, so the write of a zero
        // the allocator already put there is not elided.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
    }
    v
}

/// Socket buffers of SOCKET_BUFFER bytes (beyond net.core.[rw]mem_max: we run as root):
/// a burst must wait in the socket, not be dropped before the worker reads it.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

fn big_buffers(fd: RawFd) {
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        // SAFETY: a valid fd and a pointer to a c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&SOCKET_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            eprintln!(
                "ipsec-gw: warning: cannot enlarge a socket buffer: {}",
                io::Error::last_os_error()
            );
        }
    }
}

fn pollfds(fds: &[RawFd]) -> Vec<libc::pollfd> {
    fds.iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// Wait up to POLL_MS for any of `pfds` to be readable; `ready[i]` says which.
fn poll_readable(pfds: &mut [libc::pollfd], ready: &mut [bool]) -> io::Result<bool> {
    for p in pfds.iter_mut() {
        p.revents = 0;
    }
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()` pollfd.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, POLL_MS) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    for (r, p) in ready.iter_mut().zip(pfds.iter()) {
        *r = p.revents & libc::POLLIN != 0;
        if p.revents & (libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(format!(
                "descriptor {} hung up or closed (revents 0x{:x})",
                p.fd, p.revents
            )));
        }
        if p.revents & libc::POLLERR != 0 {
            // A socket's pending error (an ICMP error for a datagram sent earlier) is
            // taken and the socket goes on; the TUN device reports POLLERR only when
            // it is gone (deleted): fatal, or poll would return at once forever.
            let mut err: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: SO_ERROR writes one c_int into `err`, `len` says its size.
            let rc = unsafe {
                libc::getsockopt(
                    p.fd,
                    libc::SOL_SOCKET,
                    libc::SO_ERROR,
                    (&mut err as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if rc != 0 {
                return Err(io::Error::other(format!(
                    "descriptor {} (the TUN device) reports an error: the device is gone",
                    p.fd
                )));
            }
        }
    }
    Ok(n > 0)
}

pub struct Worker {
    pub tun: Arc<SyncDevice>,
    pub mtu: u16,
    pub outside: Arc<Outside>,
    pub shared: Arc<Shared>,
    pub stop: Arc<AtomicBool>,
    pub reload: Receiver<Arc<Config>>,
    pub engine: DirEngine,
}

impl Worker {
    /// Between wakeups, either direction: take a new config if one came, and publish the
    /// counters when due.
    fn tend(&mut self, io: &Io, last: &mut Instant) -> Result<(), String> {
        if let Ok(cfg) = self.reload.try_recv() {
            let dir = self.engine.direction;
            let old = std::mem::replace(&mut self.engine, DirEngine::empty(dir));
            // Checked by the main thread before it was sent (`DirEngine::check`): only
            // the state file can fail here. Fail closed: the worker stops, and the
            // gateway with it, rather than run on with no SAs.
            self.engine = DirEngine::build(&cfg, dir, Some(old), None)
                .map_err(|e| format!("reload failed: {e}"))?;
        }
        if last.elapsed() >= PUBLISH_EVERY {
            self.engine.persist_tops();
            self.engine.publish(io, &self.shared);
            *last = Instant::now();
        }
        Ok(())
    }
}

/// TUN → SPD → seal → outside: the outbound direction's buffers and counters, kept for
/// the worker's life. The TUN device is non-blocking: each wakeup drains it and the worker
/// polls only when it is empty. With offloads (IFF_VNET_HDR), one read may bring a TCP or
/// UDP super-packet of up to 64 KiB, which tun-rs splits into MTU-sized packets (as the
/// kernel would have before handing them over one read each).
struct OutboundPath {
    original: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    batch: SendBatch,
    io: Io,
}

impl OutboundPath {
    fn new(mtu: u16, outside: &Outside) -> OutboundPath {
        let slots = tun_rs::IDEAL_BATCH_SIZE;
        let size = HEADROOM + usize::from(mtu) + TAILROOM + 64;
        let mut batch = SendBatch::default();
        batch.udp.gso = outside.udp_gso;
        OutboundPath {
            original: resident(tun_rs::VIRTIO_NET_HDR_LEN + MAX_PACKET),
            bufs: (0..slots).map(|_| resident(size)).collect(),
            sizes: vec![0usize; slots],
            batch,
            io: Io::default(),
        }
    }

    /// Up to BATCH reads from the TUN device, each read's packets sealed and sent
    /// together. `Err`: the device failed (the worker stops).
    fn drain(
        &mut self,
        tun: &SyncDevice,
        engine: &mut DirEngine,
        outside: &Outside,
    ) -> io::Result<()> {
        let io = &mut self.io;
        for _ in 0..BATCH {
            let n = match tun.recv_multiple(
                &mut self.original,
                &mut self.bufs,
                &mut self.sizes,
                HEADROOM,
            ) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let batch = &mut self.batch;
            for (b, (buf, &len)) in self.bufs.iter_mut().zip(&self.sizes).take(n).enumerate() {
                io.rx_packets += 1;
                io.rx_bytes += len as u64;
                let Ok(mut pkt) = PacketBuf::new(buf, HEADROOM, len) else {
                    // longer than a slot (tun-rs split it wrongly): named, counted
                    engine
                        .engine
                        .counters
                        .drops
                        .count(ipsec::DropReason::TooBig);
                    continue;
                };
                match seal(engine, &mut pkt) {
                    Ok(Outbound::Sealed { sa }) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                        engine.after(sa);
                    }
                    Ok(Outbound::SealedBundle { bundle }) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                        engine.after_bundle(bundle);
                    }
                    Ok(Outbound::Bypass) => {
                        io.bypassed += 1;
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                    }
                    Err(_) => {} // a named drop, counted by the engine
                }
            }
            outside.send_batch(batch, &self.bufs, io);
        }
        Ok(())
    }
}

/// The loop every worker runs until told to stop: tend (reload, publish), wait for one
/// of `fds` to be readable, handle what is ready. Returns why it stopped when not told
/// to: a failed `tend` (a reload that could not be applied), `step` (the TUN device
/// failed) or `poll` (a descriptor gone).
fn serve<S>(
    state: &mut S,
    stop: &AtomicBool,
    fds: &[RawFd],
    tend: impl Fn(&mut S) -> Result<(), String>,
    step: impl Fn(&mut S, &[bool]) -> Result<(), String>,
) -> Option<String> {
    let mut ready = vec![false; fds.len()];
    let mut pfds = pollfds(fds);
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = tend(state) {
            return Some(e);
        }
        match poll_readable(&mut pfds, &mut ready) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return Some(format!("poll failed: {e}")),
        }
        if let Err(e) = step(state, &ready) {
            return Some(e);
        }
    }
    None
}

/// A worker stopped on its own: the gateway must not go on half alive (a supervisor —
/// systemd, the lab — sees it exit non-zero with the reason). Recorded for the main
/// thread, which a SIGTERM to this process wakes to tear down (TUN device, routing
/// rule) and exit 1.
fn worker_failed(shared: &Shared, stop: &AtomicBool, why: String) {
    eprintln!("ipsec-gw: a worker stopped: {why}");
    let mut f = shared.failed.lock().expect("failed lock");
    if f.is_none() {
        *f = Some(why);
    }
    drop(f);
    stop.store(true, Ordering::Relaxed);
    // SAFETY: kill(2) on our own PID with a valid signal number has no memory effects.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGTERM);
    }
}

/// The TUN device non-blocking, as the outbound drain needs it (it reads until
/// `WouldBlock`); `false`, logged, when the kernel refuses.
fn nonblocking(tun: &SyncDevice) -> bool {
    let r = tun.set_nonblocking(true);
    if let Err(e) = &r {
        eprintln!("ipsec-gw: cannot make the TUN device non-blocking: {e}");
    }
    r.is_ok()
}

fn reading_tun(e: io::Error) -> String {
    format!("reading the TUN device failed: {e}")
}

/// The outbound worker: TUN → seal → outside, on its own thread.
pub fn run_outbound(w: Worker) {
    if !nonblocking(&w.tun) {
        worker_failed(
            &w.shared,
            &w.stop,
            "the TUN device cannot be made non-blocking".into(),
        );
        return;
    }
    let fds = [w.tun.as_raw_fd()];
    let path = OutboundPath::new(w.mtu, &w.outside);
    serve_one(w, path, &fds, |w, path, _| {
        path.drain(&w.tun, &mut w.engine, &w.outside)
            .map_err(reading_tun)
    });
}

/// A direction's path: what it counted.
trait Counted {
    fn io(&self) -> &Io;
}

impl Counted for OutboundPath {
    fn io(&self) -> &Io {
        &self.io
    }
}

impl Counted for InboundPath {
    fn io(&self) -> &Io {
        &self.io
    }
}

/// One direction on its own thread: `serve` with that worker's tending (reload, publish),
/// `step` on each wakeup, and its counters published a last time when it stops.
fn serve_one<P: Counted>(
    w: Worker,
    path: P,
    fds: &[RawFd],
    step: impl Fn(&mut Worker, &mut P, &[bool]) -> Result<(), String>,
) {
    let stop = w.stop.clone();
    let mut st = (w, path, Instant::now());
    let why = serve(
        &mut st,
        &stop,
        fds,
        |(w, path, last)| w.tend(path.io(), last),
        |(w, path, _), ready| step(w, path, ready),
    );
    let (mut w, path, _) = st;
    w.engine.release();
    if let Some(why) = why {
        worker_failed(&w.shared, &stop, why);
    }
    w.engine.publish(path.io(), &w.shared);
}

/// Datagrams taken per recvmmsg(2).
const RECV_BATCH: usize = 16;

/// recvmmsg(2) arrays: each datagram lands after HEADROOM in its own buffer, so the
/// engine can put an IP header before it (UDP and raw IPv6 give no header) and open it in
/// place. Kept for the worker's life: nothing is allocated per packet.
struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Per datagram, room for a UDP_GRO control message (the segment size).
    ctrl: Vec<[u64; 4]>,
}

impl RecvBatch {
    fn new() -> RecvBatch {
        RecvBatch {
            bufs: (0..RECV_BATCH)
                .map(|_| resident(HEADROOM + MAX_PACKET + TAILROOM))
                .collect(),
            // SAFETY: zeroed sockaddr_storage / iovec / mmsghdr are valid values.
            addrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            iovs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            hdrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            ctrl: vec![[0; 4]; RECV_BATCH],
        }
    }

    /// Take what is queued on `fd`, up to RECV_BATCH datagrams, without blocking: how
    /// many (0 when none). Datagram `i` is in `bufs[i][HEADROOM..HEADROOM + len(i)]`.
    fn recv(&mut self, fd: RawFd) -> usize {
        for i in 0..RECV_BATCH {
            let b = &mut self.bufs[i][HEADROOM..HEADROOM + MAX_PACKET];
            self.iovs[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
            // SAFETY: zeroed mmsghdr is valid; the pointers set point into `self`'s
            // vectors, which neither move nor change size while the call runs.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.ctrl[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = std::mem::size_of_val(&self.ctrl[i]);
            self.hdrs[i] = h;
        }
        loop {
            // SAFETY: `hdrs` holds RECV_BATCH valid mmsghdr (see above); the kernel writes
            // at most iov_len bytes into each buffer and msg_namelen into each address.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    RECV_BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                return n as usize;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return 0; // EAGAIN: drained (or an error the next poll will show again)
            }
        }
    }

    fn len(&self, i: usize) -> usize {
        self.hdrs[i].msg_len as usize
    }

    fn source(&self, i: usize) -> Option<IpAddr> {
        sockaddr_ip(&self.addrs[i])
    }

    /// UDP GRO: the size of the segments datagram `i` was coalesced from, when the kernel
    /// coalesced it (a UDP_GRO control message; Linux 5.0+).
    fn gro_segment(&self, i: usize) -> Option<usize> {
        let h = &self.hdrs[i].msg_hdr;
        // SAFETY: after recvmmsg, `h`'s control pointer and length describe what the
        // kernel wrote into `self.ctrl[i]`; CMSG_FIRSTHDR/NXTHDR stay within it (they
        // return null past its end) and CMSG_DATA of a header they return points at its
        // data, which holds cmsg_len - CMSG_LEN(0) bytes.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    let data = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                    let p = libc::CMSG_DATA(c);
                    let size = if data >= 4 {
                        std::ptr::read_unaligned(p.cast::<i32>()) as usize
                    } else {
                        usize::from(std::ptr::read_unaligned(p.cast::<u16>()))
                    };
                    return (size > 0).then_some(size);
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        None
    }
}

/// The address of a sockaddr the kernel filled in (IPv4 or IPv6), if it is one.
fn sockaddr_ip(from: &libc::sockaddr_storage) -> Option<IpAddr> {
    match i32::from(from.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) into `from`.
            let a =
                unsafe { &*(from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6) into `from`.
            let a =
                unsafe { &*(from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(IpAddr::from(a.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

/// Opened packets wait here to be written to the TUN device together: with offloads,
/// a flow's segments are joined (GRO, [`Coalescer`]) into fewer, larger writes.
struct TunSink {
    gro: Coalescer,
    fd: RawFd,
}

impl TunSink {
    fn new(tun: &SyncDevice) -> TunSink {
        TunSink {
            gro: Coalescer::new(BATCH, tun.tcp_gso(), tun.udp_gso()),
            fd: tun.as_raw_fd(),
        }
    }

    fn push(&mut self, pkt: &[u8], io: &mut Io) {
        self.gro.push(pkt);
        io.tx_packets += 1;
        io.tx_bytes += pkt.len() as u64;
        if self.gro.is_full() {
            self.flush(io);
        }
    }

    /// Write the waiting packets to the TUN device, one write each (joined or not); a
    /// write the device refuses is counted in `send_errors`.
    fn flush(&mut self, io: &mut Io) {
        if self.gro.is_empty() {
            return;
        }
        let fd = self.fd;
        let mut writes = 0;
        io.send_errors += self.gro.flush(|b| {
            writes += 1;
            write_packet(fd, b)
        });
        io.tun_writes += writes;
    }
}

/// One write(2) of a whole packet (and its virtio-net header) to the TUN device.
fn write_packet(fd: RawFd, b: &[u8]) -> bool {
    loop {
        // SAFETY: `b` is a valid, readable slice of `b.len()` bytes.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n >= 0 {
            return n as usize == b.len();
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Where one outer datagram came from and what it is.
#[derive(Clone, Copy)]
struct Arrival {
    udp: bool,
    /// ESP (50) or AH (51): the raw socket it came on.
    next: u8,
    src: IpAddr,
}

/// Open one ESP/AH packet — `buf[at..at + n]`, as its socket gave it, with at least 40
/// bytes before it — and queue what comes out for the TUN device.
fn open_one(
    engine: &mut DirEngine,
    local: IpAddr,
    (buf, at, n): (&mut [u8], usize, usize),
    from: Arrival,
    sink: &mut TunSink,
    io: &mut Io,
) {
    io.rx_packets += 1;
    io.rx_bytes += n as u64;
    // RFC 3948 §2.2: a zero "SPI" is IKE's non-ESP marker; one 0xFF byte is a NAT
    // keepalive. Neither is ours to open.
    if from.udp && (n < 8 || buf[at..at + 4] == [0, 0, 0, 0]) {
        io.not_esp += 1;
        return;
    }
    // UDP, and raw IPv6 sockets, give what follows the IP header only: a header goes
    // before it, so the engine sees a whole packet.
    let (head, len) = match (local, from.src) {
        (IpAddr::V4(dst), IpAddr::V4(src)) if from.udp => {
            let h = at - 20;
            write_ipv4_header(&mut buf[h..h + 20], n, src, dst);
            (h, n + 20)
        }
        (IpAddr::V6(dst), IpAddr::V6(src)) => {
            let h = at - 40;
            write_ipv6_header(&mut buf[h..h + 40], n, from.next, src, dst);
            (h, n + 40)
        }
        (IpAddr::V4(_), _) if !from.udp => (at, n), // raw IPv4: the header came with it
        _ => {
            // from an address of the other family (a v4-mapped peer on a v6 socket):
            // not from this gateway's peer, a named drop all the same
            engine
                .engine
                .counters
                .drops
                .count(ipsec::DropReason::MalformedIp);
            return;
        }
    };
    let Ok(mut pkt) = PacketBuf::new(buf, head, len) else {
        engine
            .engine
            .counters
            .drops
            .count(ipsec::DropReason::TooBig);
        return;
    };
    match open(engine, &mut pkt) {
        Ok(Inbound::Opened { sa, .. }) => {
            sink.push(pkt.data(), io);
            engine.after_opened(sa);
        }
        Ok(Inbound::Bypass) => io.bypassed += 1, // not expected here
        Err(_) => {}                             // a named drop, counted by the engine
    }
}

/// Outside → SAD → open → inner policy → TUN: the inbound direction's buffers and
/// counters, kept for the worker's life.
struct InboundPath {
    rx: RecvBatch,
    /// A datagram the kernel coalesced (UDP GRO) is opened one segment at a time, where
    /// it lies — or, when the direction has IPComp (whose opening may grow a packet into
    /// the next segment), each copied here first.
    segment: Vec<u8>,
    sink: TunSink,
    io: Io,
    /// The outer sockets, in the order `drain`'s `ready` refers to: raw ESP, raw AH, and
    /// UDP 4500 when encapsulating.
    fds: Vec<RawFd>,
}

impl InboundPath {
    fn new(outside: &Outside, tun: &SyncDevice) -> InboundPath {
        let mut fds = vec![outside.esp_recv.as_raw_fd(), outside.ah_recv.as_raw_fd()];
        if let Some(u) = &outside.udp {
            fds.push(u.as_raw_fd());
        }
        InboundPath {
            fds,
            rx: RecvBatch::new(),
            segment: resident(HEADROOM + MAX_PACKET + TAILROOM),
            sink: TunSink::new(tun),
            io: Io::default(),
        }
    }

    /// Drain the sockets `ready` marks (a bounded number of batches each), open what came
    /// and write it to the TUN device.
    fn drain(&mut self, ready: &[bool], engine: &mut DirEngine, outside: &Outside) {
        let (rx, io) = (&mut self.rx, &mut self.io);
        let local = outside.local;
        for (i, &fd) in self.fds.iter().enumerate() {
            if !ready.get(i).copied().unwrap_or(false) {
                continue;
            }
            let udp = i == 2;
            let next = if i == 1 { 51 } else { 50 };
            for _ in 0..BATCH / RECV_BATCH {
                let got = rx.recv(fd);
                for k in 0..got {
                    let n = rx.len(k);
                    let from = Arrival {
                        udp,
                        next,
                        src: rx.source(k).unwrap_or(outside.remote),
                    };
                    match rx.gro_segment(k).filter(|&g| udp && g < n) {
                        None => {
                            let pkt = (&mut rx.bufs[k][..], HEADROOM, n);
                            open_one(engine, local, pkt, from, &mut self.sink, io);
                        }
                        Some(g) => {
                            io.gro_receives += 1;
                            let in_place = engine.ipcomps.is_empty();
                            let end = HEADROOM + n;
                            for at in (HEADROOM..end).step_by(g) {
                                let len = g.min(end - at);
                                // In place, the header opening puts before a segment
                                // covers the tail of the one before (already handed on),
                                // and nothing past the segment's end can be touched.
                                let pkt = if in_place {
                                    (&mut rx.bufs[k][..at + len], at, len)
                                } else {
                                    let seg = &mut self.segment;
                                    seg[HEADROOM..HEADROOM + len]
                                        .copy_from_slice(&rx.bufs[k][at..at + len]);
                                    (&mut seg[..], HEADROOM, len)
                                };
                                open_one(engine, local, pkt, from, &mut self.sink, io);
                            }
                        }
                    }
                }
                if got < RECV_BATCH {
                    break; // drained
                }
            }
        }
        self.sink.flush(io);
    }
}

/// The inbound worker: outside → open → TUN, on its own thread.
pub fn run_inbound(w: Worker) {
    let path = InboundPath::new(&w.outside, &w.tun);
    let fds = path.fds.clone();
    serve_one(w, path, &fds, |w, path, ready| {
        path.drain(ready, &mut w.engine, &w.outside);
        Ok(())
    });
}

/// One worker for both directions (`workers = 1`): one thread polls the TUN device and
/// the outer sockets together and drains whichever is ready — the same steps as the two
/// workers, with no hand-over between threads.
pub fn run_both(out: Worker, inb: Worker) {
    if !nonblocking(&out.tun) {
        worker_failed(
            &out.shared,
            &out.stop,
            "the TUN device cannot be made non-blocking".into(),
        );
        return;
    }
    let stop = out.stop.clone();
    let mut fds = vec![out.tun.as_raw_fd()];
    let ipath = InboundPath::new(&inb.outside, &inb.tun);
    fds.extend(&ipath.fds);
    let opath = OutboundPath::new(out.mtu, &out.outside);
    let now = Instant::now();
    let mut st = (out, opath, now, inb, ipath, now);
    let why = serve(
        &mut st,
        &stop,
        &fds,
        |(out, opath, last_out, inb, ipath, last_in)| {
            out.tend(&opath.io, last_out)?;
            inb.tend(&ipath.io, last_in)
        },
        |(out, opath, _, inb, ipath, _), ready| {
            if ready[0] {
                opath
                    .drain(&out.tun, &mut out.engine, &out.outside)
                    .map_err(reading_tun)?;
            }
            if ready[1..].iter().any(|&r| r) {
                ipath.drain(&ready[1..], &mut inb.engine, &inb.outside);
            }
            Ok(())
        },
    );
    let (mut out, opath, _, mut inb, ipath, _) = st;
    out.engine.release();
    inb.engine.release();
    out.engine.publish(&opath.io, &out.shared);
    inb.engine.publish(&ipath.io, &inb.shared);
    if let Some(why) = why {
        worker_failed(&out.shared, &stop, why);
    }
}

/// An IPv6 header (RFC 8200 §3) for an ESP or AH payload that arrived on a raw IPv6 or a
/// UDP socket (neither passes the header up): traffic class and flow label 0 — AH's ICV
/// treats them as zero anyway (RFC 4302 §3.3.3.1.2) — hop limit 64.
fn write_ipv6_header(h: &mut [u8], payload: usize, next: u8, src: Ipv6Addr, dst: Ipv6Addr) {
    h[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    h[4..6].copy_from_slice(&(payload as u16).to_be_bytes());
    h[6] = next;
    h[7] = 64;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
}

/// An IPv4 header (RFC 791) for an ESP payload that arrived in UDP, so the engine sees
/// the packet as if it had come raw: protocol 50, the peer as source.
fn write_ipv4_header(h: &mut [u8], payload: usize, src: Ipv4Addr, dst: Ipv4Addr) {
    let total = (payload + 20) as u16;
    h[0] = 0x45;
    h[1] = 0;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..8].copy_from_slice(&[0, 0, 0x40, 0]); // id 0, DF
    h[8] = 64;
    h[9] = 50;
    h[10..12].copy_from_slice(&[0, 0]);
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = 0;
    for w in h[..20].chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthesised_header_checksums_to_zero() {
        // RFC 1071: the one's-complement sum over a header with its checksum is 0xffff.
        let mut h = [0u8; 20];
        write_ipv4_header(
            &mut h,
            100,
            Ipv4Addr::new(192, 0, 2, 2),
            Ipv4Addr::new(192, 0, 2, 1),
        );
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 120);
        assert_eq!(h[9], 50);
    }
}
