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
}

impl DirEngine {
    /// Build the engine for one direction of `cfg`. SAs of `old` whose definition is
    /// unchanged move over live (sequence numbers, replay window and counters kept).
    pub fn build(cfg: &Config, direction: Direction, old: Option<DirEngine>) -> DirEngine {
        let mut engine = Engine::new();
        if cfg.stage_timing {
            engine.set_clock(Some(clock));
        }
        let mut old = old;
        let mut sas = Vec::new();
        for spec in cfg.sas.iter().filter(|s| s.config.direction == direction) {
            let kept = old.as_mut().and_then(|o| {
                let i = o
                    .sas
                    .iter()
                    .position(|e| !e.expired && e.spec.same_as(spec))?;
                let e = o.sas.remove(i);
                o.engine.remove_sa(e.id).map(|sa| (sa, e.soft_logged))
            });
            let (id, soft_logged) = match kept {
                Some((sa, soft)) => (engine.insert_sa(sa), soft),
                None => (engine.add_sa(&spec.config), false),
            };
            // The config was validated: SPIs are unique per direction, keys fit.
            let id = id.expect("validated SA");
            sas.push(SaEntry {
                id,
                name: spec.name.clone(),
                spec: spec.clone(),
                lifetime: spec.lifetime,
                soft_logged,
                expired: false,
                retired: None,
            });
        }
        let id_of = |name: &str| sas.iter().find(|e| e.name == name).expect("validated").id;
        let mut bundles = Vec::new();
        for b in cfg.bundles.iter().filter(|b| b.direction == direction) {
            let ipcomp = b.ipcomp_cpi.map(|cpi| {
                engine
                    .add_ipcomp(ipsec::IpcompConfig::new(cpi))
                    .expect("validated CPI")
            });
            let bundle = ipsec::Bundle {
                ipcomp,
                esp: id_of(&b.esp),
                ah: b.ah.as_deref().map(id_of),
            };
            let id = engine.add_bundle(bundle).expect("validated bundle");
            bundles.push((b.name.clone(), id, ipcomp));
        }
        for p in cfg.policies.iter().filter(|p| p.direction == direction) {
            let action = match &p.action {
                PolicyAction::Bypass => Action::Bypass,
                PolicyAction::Discard => Action::Discard,
                PolicyAction::Protect(name) => Action::Protect(id_of(name)),
                PolicyAction::ProtectBundle(name) => {
                    let (_, id, _) = bundles
                        .iter()
                        .find(|(n, _, _)| n == name)
                        .expect("validated");
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
        DirEngine {
            direction,
            engine,
            sas,
            ipcomps,
        }
    }

    /// An engine with nothing in it (a placeholder while a reload builds the next one).
    fn empty(direction: Direction) -> DirEngine {
        DirEngine {
            direction,
            engine: Engine::new(),
            sas: Vec::new(),
            ipcomps: Vec::new(),
        }
    }

    /// After an SA sealed or opened a packet: enforce its lifetimes (RFC 4301 §4.4.2.1).
    fn after(&mut self, id: SaId) {
        let Some(e) = self.sas.iter_mut().find(|e| e.id == id && !e.expired) else {
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

/// The outside: where sealed packets go and protected packets come from.
pub struct Outside {
    raw_send: Socket,
    esp_recv: Socket,
    ah_recv: Socket,
    udp: Option<UdpSocket>,
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
        Ok(Outside {
            raw_send,
            esp_recv,
            ah_recv,
            udp,
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

#[derive(Default)]
struct Messages {
    addrs: Vec<SockAddr>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

impl Messages {
    fn clear(&mut self) {
        self.addrs.clear();
        self.iovs.clear();
        self.hdrs.clear();
    }

    /// One datagram: `data` to `addr`. `data` must stay put until `send` (it does: it is
    /// in the worker's buffers, untouched until the batch has gone).
    fn push(&mut self, addr: SockAddr, data: &[u8]) {
        self.addrs.push(addr);
        self.iovs.push(libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        });
    }

    fn send(&mut self, fd: RawFd, io: &mut Io) {
        sendmmsg_all(fd, &self.addrs, &mut self.iovs, &mut self.hdrs, io);
    }
}

/// sendmmsg(2) until every message has gone or been refused; counts both.
fn sendmmsg_all(
    fd: RawFd,
    addrs: &[SockAddr],
    iovs: &mut [libc::iovec],
    hdrs: &mut Vec<libc::mmsghdr>,
    io: &mut Io,
) {
    hdrs.clear();
    for (addr, iov) in addrs.iter().zip(iovs.iter_mut()) {
        // SAFETY: zeroed msghdr/mmsghdr are valid values of the types (null pointers,
        // zero lengths); the fields set below point into `addrs` and `iovs`, which
        // outlive the sendmmsg calls.
        let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
        h.msg_hdr.msg_name = addr.as_ptr() as *mut libc::c_void;
        h.msg_hdr.msg_namelen = addr.len();
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        hdrs.push(h);
    }
    let mut at = 0;
    while at < hdrs.len() {
        let rest = &mut hdrs[at..];
        // SAFETY: `rest` is a valid array of `rest.len()` mmsghdr whose name and iovec
        // pointers are valid for the call (see above); the kernel writes only msg_len.
        let n = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            io.send_errors += 1; // the first message was refused: skip it, send the rest
            at += 1;
            continue;
        }
        for h in &rest[..n as usize] {
            io.tx_packets += 1;
            io.tx_bytes += u64::from(h.msg_len);
        }
        at += n as usize;
    }
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
    /// The start of every wakeup, either direction: take a new config if one came,
    /// publish the counters when due, then wait (bounded) for input. `Ok(false)`: none
    /// yet — look at the stop flag again.
    fn wake(
        &mut self,
        io: &Io,
        last: &mut Instant,
        pfds: &mut [libc::pollfd],
        ready: &mut [bool],
    ) -> io::Result<bool> {
        if let Ok(cfg) = self.reload.try_recv() {
            let dir = self.engine.direction;
            let old = std::mem::replace(&mut self.engine, DirEngine::empty(dir));
            self.engine = DirEngine::build(&cfg, dir, Some(old));
        }
        if last.elapsed() >= PUBLISH_EVERY {
            self.engine.publish(io, &self.shared);
            *last = Instant::now();
        }
        poll_readable(pfds, ready)
    }
}

/// TUN → SPD → seal → outside. The TUN device is non-blocking: the worker drains it per
/// wakeup and polls only when it is empty. With offloads (IFF_VNET_HDR), one read may
/// bring a TCP or UDP super-packet of up to 64 KiB, which tun-rs splits into MTU-sized
/// packets (as the kernel would have before handing them over one read each).
pub fn run_outbound(mut w: Worker) {
    let slots = tun_rs::IDEAL_BATCH_SIZE;
    let mut original = vec![0u8; tun_rs::VIRTIO_NET_HDR_LEN + MAX_PACKET];
    let size = HEADROOM + usize::from(w.mtu) + TAILROOM + 64;
    let mut bufs: Vec<Vec<u8>> = (0..slots).map(|_| vec![0u8; size]).collect();
    let mut sizes = vec![0usize; slots];
    let mut batch = SendBatch::default();
    let mut io = Io::default();
    let mut last = Instant::now();
    let mut pfds = pollfds(&[w.tun.as_raw_fd()]);
    let mut ready = [false];
    if let Err(e) = w.tun.set_nonblocking(true) {
        eprintln!("ipsec-gw: cannot make the TUN device non-blocking: {e}");
        return;
    }
    'run: while !w.stop.load(Ordering::Relaxed) {
        match w.wake(&io, &mut last, &mut pfds, &mut ready) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                eprintln!("ipsec-gw: poll on the TUN device failed: {e}");
                break;
            }
        }
        for _ in 0..BATCH {
            let n = match w
                .tun
                .recv_multiple(&mut original, &mut bufs, &mut sizes, HEADROOM)
            {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("ipsec-gw: reading the TUN device failed: {e}");
                    break 'run;
                }
            };
            for (b, (buf, &len)) in bufs.iter_mut().zip(&sizes).take(n).enumerate() {
                io.rx_packets += 1;
                io.rx_bytes += len as u64;
                let Ok(mut pkt) = PacketBuf::new(buf, HEADROOM, len) else {
                    continue;
                };
                match w.engine.engine.outbound(&mut pkt) {
                    Ok(Outbound::Sealed { sa }) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                        w.engine.after(sa);
                    }
                    Ok(Outbound::SealedBundle { .. }) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()))
                    }
                    Ok(Outbound::Bypass) => {
                        io.bypassed += 1;
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                    }
                    Err(_) => {} // a named drop, counted by the engine
                }
            }
            w.outside.send_batch(&mut batch, &bufs, &mut io);
        }
    }
    w.engine.publish(&io, &w.shared);
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
}

impl RecvBatch {
    fn new() -> RecvBatch {
        RecvBatch {
            bufs: (0..RECV_BATCH)
                .map(|_| vec![0u8; HEADROOM + MAX_PACKET + TAILROOM])
                .collect(),
            // SAFETY: zeroed sockaddr_storage / iovec / mmsghdr are valid values.
            addrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            iovs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            hdrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
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

/// Outside → SAD → open → inner policy → TUN.
pub fn run_inbound(mut w: Worker) {
    let mut rx = RecvBatch::new();
    let mut io = Io::default();
    let mut last = Instant::now();
    let mut fds = vec![
        w.outside.esp_recv.as_raw_fd(),
        w.outside.ah_recv.as_raw_fd(),
    ];
    if let Some(u) = &w.outside.udp {
        fds.push(u.as_raw_fd());
    }
    let mut ready = vec![false; fds.len()];
    let mut pfds = pollfds(&fds);
    // Opened packets wait here (after room for the virtio header) to be written to the TUN
    // device together: with offloads, tun-rs coalesces TCP/UDP segments (GRO) into fewer,
    // larger writes.
    let hdr = tun_rs::VIRTIO_NET_HDR_LEN;
    let mut out: Vec<Vec<u8>> = (0..BATCH)
        .map(|_| Vec::with_capacity(hdr + usize::from(w.mtu) + 64))
        .collect();
    let mut pending = 0usize;
    let mut gro = tun_rs::GROTable::default();
    while !w.stop.load(Ordering::Relaxed) {
        match w.wake(&io, &mut last, &mut pfds, &mut ready) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                eprintln!("ipsec-gw: poll on the outer sockets failed: {e}");
                break;
            }
        }
        for (i, &fd) in fds.iter().enumerate() {
            if !ready[i] {
                continue;
            }
            let udp = i == 2;
            let next = if i == 1 { 51 } else { 50 };
            // Drain what is queued on this socket, a bounded number of batches at a time.
            for _ in 0..BATCH / RECV_BATCH {
                let got = rx.recv(fd);
                for k in 0..got {
                    let n = rx.len(k);
                    let src = rx.source(k).unwrap_or(w.outside.remote);
                    let buf = &mut rx.bufs[k];
                    io.rx_packets += 1;
                    io.rx_bytes += n as u64;
                    let at = HEADROOM;
                    // RFC 3948 §2.2: a zero "SPI" is IKE's non-ESP marker; one 0xFF byte
                    // is a NAT keepalive. Neither is ours to open.
                    if udp && (n < 8 || buf[at..at + 4] == [0, 0, 0, 0]) {
                        io.not_esp += 1;
                        continue;
                    }
                    // UDP, and raw IPv6 sockets, give what follows the IP header only:
                    // a header goes before it, so the engine sees a whole packet.
                    let (head, len) = match w.outside.local {
                        IpAddr::V4(dst) if udp => {
                            let IpAddr::V4(s4) = src else { continue };
                            let h = HEADROOM - 20;
                            write_ipv4_header(&mut buf[h..h + 20], n, s4, dst);
                            (h, n + 20)
                        }
                        IpAddr::V6(dst) => {
                            let IpAddr::V6(s6) = src else { continue };
                            let h = HEADROOM - 40;
                            write_ipv6_header(&mut buf[h..h + 40], n, next, s6, dst);
                            (h, n + 40)
                        }
                        IpAddr::V4(_) => (at, n), // raw IPv4: the header came with it
                    };
                    let Ok(mut pkt) = PacketBuf::new(buf, head, len) else {
                        continue;
                    };
                    match w.engine.engine.inbound(&mut pkt) {
                        Ok(Inbound::Opened { sa, .. }) => {
                            let o = &mut out[pending];
                            o.clear();
                            o.resize(hdr, 0);
                            o.extend_from_slice(pkt.data());
                            pending += 1;
                            io.tx_packets += 1;
                            io.tx_bytes += pkt.len() as u64;
                            w.engine.after(sa);
                            if pending == out.len() {
                                flush(&w.tun, &mut gro, &mut out[..pending], &mut io);
                                pending = 0;
                            }
                        }
                        Ok(Inbound::Bypass) => io.bypassed += 1, // not expected here
                        Err(_) => {} // a named drop, counted by the engine
                    }
                }
                if got < RECV_BATCH {
                    break; // drained
                }
            }
        }
        if pending > 0 {
            flush(&w.tun, &mut gro, &mut out[..pending], &mut io);
            pending = 0;
        }
    }
    w.engine.publish(&io, &w.shared);
}

/// Write the opened packets to the TUN device, coalesced where offloads allow.
fn flush(tun: &SyncDevice, gro: &mut tun_rs::GROTable, bufs: &mut [Vec<u8>], io: &mut Io) {
    if tun
        .send_multiple(gro, bufs, tun_rs::VIRTIO_NET_HDR_LEN)
        .is_err()
    {
        io.send_errors += 1;
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
