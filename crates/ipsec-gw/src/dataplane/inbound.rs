//! Outside → SAD → open → inner policy → TUN.

use super::codel::{Codel, INTERVAL_NS, TARGET_NS};
use crate::sys::realtime_ns;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};

use ipsec::constants::{proto, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use ipsec::engine::{Inbound, InboundStart};
use ipsec::wire::ip::{Ipv4Header, Ipv4Repr, Ipv6Header, Ipv6Repr, IPV4_DF};
use ipsec::{PacketBuf, HEADROOM, TAILROOM};
use tun_rs::SyncDevice;

use super::crew::{Crew, JobSlot};
use super::crypto::{finish, open, start};
use super::outside::Outside;
use super::sas::DirEngine;
use super::BATCH;
use crate::gro::TunSink;
use crate::stats::Io;
use crate::sys::{resident, RecvBatch, RECV_BATCH};
use ipsec::MAX_PACKET;

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
    let Some(mut pkt) = frame(engine, local, (buf, at, n), from, io) else {
        return;
    };
    match open(engine, &mut pkt) {
        Ok(Inbound::Opened { sa, .. }) => {
            // its number recorded (`DirEngine::reserve`) before the packet goes on
            if engine.after_opened(sa) {
                sink.push(pkt.data(), io);
            }
        }
        Ok(Inbound::Bypass) => io.bypassed += 1, // not expected here
        Err(_) => {}                             // a named drop, counted by the engine
    }
}

/// One ESP/AH packet as the engine takes it — `buf[at..at + n]` as its socket gave it,
/// with at least 40 bytes before it — counted on arrival; `None` when it is not one for
/// the engine (a named drop, or not ESP at all).
fn frame<'b>(
    engine: &mut DirEngine,
    local: IpAddr,
    (buf, at, n): (&'b mut [u8], usize, usize),
    from: Arrival,
    io: &mut Io,
) -> Option<PacketBuf<'b>> {
    io.rx_packets += 1;
    io.rx_bytes += n as u64;
    // RFC 3948 §2.2: a zero "SPI" is IKE's non-ESP marker; one 0xFF byte is a NAT
    // keepalive. Neither is ours to open.
    if from.udp && (n < 8 || buf[at..at + 4] == [0, 0, 0, 0]) {
        io.not_esp += 1;
        return None;
    }
    // UDP, and raw IPv6 sockets, give what follows the IP header only: a header goes
    // before it, so the engine sees a whole packet.
    let (head, len) = match (local, from.src) {
        (IpAddr::V4(dst), IpAddr::V4(src)) if from.udp => {
            // RFC 791: as if it had come raw — protocol 50, the peer as source, DF.
            let h = at - IPV4_HEADER_LEN;
            let outer = Ipv4Repr {
                src,
                dst,
                protocol: proto::ESP,
                payload_len: n,
                tos: 0,
                ident: 0,
                flags_frag: IPV4_DF,
                ttl: 64,
            };
            outer.emit(&mut Ipv4Header::new_unchecked(&mut buf[h..at]));
            (h, n + IPV4_HEADER_LEN)
        }
        (IpAddr::V6(dst), IpAddr::V6(src)) => {
            // RFC 8200 §3: traffic class and flow label 0 — AH's ICV treats them as zero
            // anyway (RFC 4302 §3.3.3.1.2) — hop limit 64.
            let h = at - IPV6_HEADER_LEN;
            let outer = Ipv6Repr {
                src,
                dst,
                next_header: from.next,
                payload_len: n,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            outer.emit(&mut Ipv6Header::new_unchecked(&mut buf[h..at]));
            (h, n + IPV6_HEADER_LEN)
        }
        (IpAddr::V4(_), _) if !from.udp => (at, n), // raw IPv4: the header came with it
        _ => {
            // from an address of the other family (a v4-mapped peer on a v6 socket):
            // not from this gateway's peer, a named drop all the same
            engine.count_drop(None, ipsec::DropReason::MalformedIp);
            return None;
        }
    };
    match PacketBuf::new(buf, head, len) {
        Ok(pkt) => Some(pkt),
        Err(_) => {
            engine.count_drop(None, ipsec::DropReason::TooBig);
            None
        }
    }
}

/// What became of a packet in a crew batch before the crew ran.
#[derive(Clone, Copy)]
enum Fate {
    /// Dropped (counted) or not for the TUN device.
    Gone,
    /// Opened whole already (AH, a bundle): `buf[head..head + len]` goes up in turn.
    Opened { head: usize, len: usize },
    /// Its job is in `jobs`: finish it, then it goes up in turn.
    Job { head: usize, len: usize },
}

/// With several crypto workers: up to SLOTS packets started (SAD lookup, replay check)
/// by the worker, opened together by the crew, then finished (replay commit, inner
/// policy) and handed to the TUN device by the worker in the order they came
/// (`crew.rs`). A whole datagram's buffer is swapped in (no copy); each segment of a
/// coalesced (UDP GRO) datagram is copied into a slot of its own, since opening in place
/// writes a header over the end of the segment before it.
struct CrewBatch {
    crew: Crew,
    bufs: Vec<Vec<u8>>,
    jobs: Vec<JobSlot>,
    fates: Vec<Fate>,
    n: usize,
}

/// Packets per crew batch.
const SLOTS: usize = BATCH;

impl CrewBatch {
    fn new(crew: Crew) -> CrewBatch {
        CrewBatch {
            crew,
            bufs: (0..SLOTS)
                .map(|_| resident(HEADROOM + MAX_PACKET + TAILROOM))
                .collect(),
            jobs: vec![None; SLOTS],
            fates: vec![Fate::Gone; SLOTS],
            n: 0,
        }
    }

    /// Start the packet now in slot `n`'s buffer at `at` (`len` bytes as it came).
    fn start(
        &mut self,
        engine: &mut DirEngine,
        local: IpAddr,
        (at, len): (usize, usize),
        from: Arrival,
        io: &mut Io,
    ) {
        let i = self.n;
        self.n += 1;
        self.fates[i] = Fate::Gone;
        let Some(mut pkt) = frame(engine, local, (&mut self.bufs[i][..], at, len), from, io) else {
            return;
        };
        self.fates[i] = match start(engine, &mut pkt) {
            Ok(InboundStart::Open { sa, job }) => {
                self.jobs[i] = Some((sa, job, Ok(())));
                Fate::Job {
                    head: pkt.head(),
                    len: pkt.len(),
                }
            }
            Ok(InboundStart::Done(Inbound::Opened { sa, .. })) => {
                if engine.after_opened(sa) {
                    Fate::Opened {
                        head: pkt.head(),
                        len: pkt.len(),
                    }
                } else {
                    Fate::Gone
                }
            }
            Ok(InboundStart::Done(Inbound::Bypass)) => {
                io.bypassed += 1; // not expected here
                Fate::Gone
            }
            Err(_) => Fate::Gone, // a named drop, counted by the engine
        };
    }

    /// A free slot for the next packet: when all are taken, the batch is opened first.
    fn make_room(&mut self, engine: &mut DirEngine, sink: &mut TunSink, io: &mut Io) {
        if self.n == SLOTS {
            self.flush(engine, sink, io);
        }
    }

    /// The crew opens what was started; the worker finishes each packet in turn and
    /// queues it for the TUN device.
    fn flush(&mut self, engine: &mut DirEngine, sink: &mut TunSink, io: &mut Io) {
        let n = self.n;
        if n == 0 {
            return;
        }
        self.n = 0;
        self.crew
            .run(engine, &mut self.bufs[..n], &mut self.jobs[..n], false);
        for i in 0..n {
            let job = self.jobs[i].take();
            let buf = &mut self.bufs[i][..];
            match (self.fates[i], job) {
                (Fate::Opened { head, len }, _) => sink.push(&buf[head..head + len], io),
                (Fate::Job { head, len }, Some((sa, job, crypto))) => {
                    let Ok(mut pkt) = PacketBuf::new(buf, head, len) else {
                        continue;
                    };
                    if finish(engine, &mut pkt, sa, &job, crypto).is_ok() && engine.after_opened(sa)
                    {
                        sink.push(pkt.data(), io);
                    }
                }
                _ => {}
            }
        }
    }
}

/// Outside → SAD → open → inner policy → TUN: the inbound direction's buffers and
/// counters, kept for the worker's life.
pub(super) struct InboundPath {
    rx: RecvBatch,
    /// A datagram the kernel coalesced (UDP GRO) is opened one segment at a time, where
    /// it lies — or, when the direction has IPComp (whose opening may grow a packet into
    /// the next segment), each copied here first.
    segment: Vec<u8>,
    sink: TunSink,
    /// With several crypto workers (`crew.rs`).
    crew: Option<CrewBatch>,
    pub(super) io: Io,
    /// The outer sockets, in the order `drain`'s `ready` refers to: raw ESP, raw AH, and
    /// UDP 4500 when encapsulating.
    pub(super) fds: Vec<RawFd>,
    /// `aqm`: CoDel on each of those sockets' receive queues (codel.rs), and the start of
    /// its monotonic clock.
    codel: Option<Vec<Codel>>,
    since: std::time::Instant,
}

impl InboundPath {
    pub(super) fn new(outside: &Outside, tun: &SyncDevice, crew: Option<Crew>) -> InboundPath {
        let mut fds = vec![outside.esp_recv.as_raw_fd(), outside.ah_recv.as_raw_fd()];
        if let Some(u) = &outside.udp {
            fds.push(u.as_raw_fd());
        }
        let codel = outside
            .aqm
            .then(|| vec![Codel::new(TARGET_NS, INTERVAL_NS); fds.len()]);
        InboundPath {
            codel,
            since: std::time::Instant::now(),
            fds,
            rx: RecvBatch::new(),
            segment: resident(HEADROOM + MAX_PACKET + TAILROOM),
            sink: TunSink::new(tun, BATCH),
            crew: crew.map(CrewBatch::new),
            io: Io::default(),
        }
    }

    /// Drain the sockets `ready` marks (a bounded number of batches each), open what came
    /// and write it to the TUN device.
    pub(super) fn drain(&mut self, ready: &[bool], engine: &mut DirEngine, outside: &Outside) {
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
                // CoDel's clock is the monotonic one; the sojourn, the wall clock's (that
                // of the kernel's stamps)
                let (now, wall) = match self.codel {
                    Some(_) => (self.since.elapsed().as_nanos() as u64, realtime_ns()),
                    None => (0, 0),
                };
                for k in 0..got {
                    let n = rx.len(k);
                    let gro = rx.gro_segment(k).filter(|&g| udp && g < n);
                    // where its (first) packet starts: past the first segment when CoDel
                    // dropped that one
                    let mut first = HEADROOM;
                    if let (Some(codel), Some(at)) = (self.codel.as_mut(), rx.received_at(k)) {
                        // the last of a batch that did not fill: the queue is empty
                        let drained = got < RECV_BATCH && k + 1 == got;
                        if codel[i].drop(now, wall.saturating_sub(at), drained) {
                            // one packet per decision, received and never opened
                            let len = gro.map_or(n, |g| g.min(n));
                            io.rx_packets += 1;
                            io.rx_bytes += len as u64;
                            io.queue_delay_drops += 1;
                            if gro.is_none() || len >= n {
                                continue;
                            }
                            first = HEADROOM + len;
                        }
                    }
                    let from = Arrival {
                        udp,
                        next,
                        src: rx.source(k).unwrap_or(outside.remote),
                    };
                    if let Some(c) = self.crew.as_mut() {
                        let Some(g) = gro else {
                            // a whole datagram: its buffer changes places with the slot's
                            c.make_room(engine, &mut self.sink, io);
                            std::mem::swap(&mut rx.bufs[k], &mut c.bufs[c.n]);
                            c.start(engine, local, (HEADROOM, n), from, io);
                            continue;
                        };
                        io.gro_receives += 1;
                        let end = HEADROOM + n;
                        for at in (first..end).step_by(g) {
                            let len = g.min(end - at);
                            c.make_room(engine, &mut self.sink, io);
                            // to the slot's headroom, as the single-thread path does: at
                            // its place in the datagram, a segment near the end would
                            // leave IPComp no room to decompress into (a drop blamed on
                            // the peer, `decompressed_too_big`)
                            c.bufs[c.n][HEADROOM..HEADROOM + len]
                                .copy_from_slice(&rx.bufs[k][at..at + len]);
                            c.start(engine, local, (HEADROOM, len), from, io);
                        }
                        continue;
                    }
                    match gro {
                        None => {
                            let pkt = (&mut rx.bufs[k][..], HEADROOM, n);
                            open_one(engine, local, pkt, from, &mut self.sink, io);
                        }
                        Some(g) => {
                            io.gro_receives += 1;
                            let in_place = engine.ipcomps.is_empty();
                            let end = HEADROOM + n;
                            for at in (first..end).step_by(g) {
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
        if let Some(c) = self.crew.as_mut() {
            c.flush(engine, &mut self.sink, io);
        }
        self.sink.flush(io);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gro::Coalescer;
    use ipsec::sa::Direction;
    use ipsec::DropReason;

    fn engine() -> DirEngine {
        let good = crate::config::tests::GOOD;
        let cfg = crate::config::parse(good, std::path::Path::new("gw.toml")).unwrap();
        DirEngine::build(&cfg, Direction::In, None, None).unwrap()
    }

    /// The gateway's own refusals before the engine sees a packet are named, counted
    /// drops: a datagram from an address of the other family (a v4-mapped peer on a v6
    /// socket) is `malformed_ip`; one that does not fit its buffer is `too_big`.
    #[test]
    fn what_the_gateway_refuses_is_a_named_counted_drop() {
        let mut e = engine();
        let mut sink = TunSink::detached(Coalescer::new(4, false, false));
        let mut io = Io::default();
        let mut buf = vec![0u8; 256];
        let v6 = Arrival {
            udp: true,
            next: 50,
            src: "2001:db8::2".parse().unwrap(),
        };
        buf[100..104].copy_from_slice(&0x2002u32.to_be_bytes());
        let local: IpAddr = "192.0.2.1".parse().unwrap();
        open_one(&mut e, local, (&mut buf, 100, 40), v6, &mut sink, &mut io);
        assert_eq!(e.engine.counters.drops.get(DropReason::MalformedIp), 1);
        let raw_v4 = Arrival {
            udp: false,
            next: 50,
            src: "192.0.2.2".parse().unwrap(),
        };
        // 200 bytes said to start at 100 of a 256-byte buffer
        open_one(
            &mut e,
            local,
            (&mut buf, 100, 200),
            raw_v4,
            &mut sink,
            &mut io,
        );
        assert_eq!(e.engine.counters.drops.get(DropReason::TooBig), 1);
        assert_eq!(io.rx_packets, 2);
        assert!(sink.gro.is_empty(), "nothing went towards the TUN device");
    }

    /// A packet whose number the inbound state cannot record (a full disk) is not
    /// handed on: a restart could accept it again. Its SA stops, and it and every later
    /// packet are dropped, named and counted — one thread or a crew alike. Before, the
    /// packet whose write failed still went up. With the state writable (here: none, a
    /// dry build) all of them go up, in both paths.
    #[test]
    fn a_packet_whose_number_cannot_be_recorded_is_dropped_not_delivered() {
        use crate::dataplane::crew::tests::{inner, pair, slot};
        let local: IpAddr = "192.0.2.2".parse().unwrap();
        let from = Arrival {
            udp: false,
            next: 50,
            src: "192.0.2.1".parse().unwrap(),
        };
        for crew in [false, true] {
            for failing in [false, true] {
                let (mut out, mut inb) = pair();
                let tmp = tempfile::tempdir().unwrap();
                if failing {
                    inb.fail_state_writes(tmp.path());
                }
                let mut esp = Vec::new();
                let mut buf = slot();
                for i in 0..20u32 {
                    inner(&mut buf, 100, i);
                    let mut pkt = PacketBuf::new(&mut buf, HEADROOM, 100).unwrap();
                    out.engine.outbound(&mut pkt).unwrap();
                    esp.push(pkt.data().to_vec());
                }
                let mut sink = TunSink::detached(Coalescer::new(2 * SLOTS, false, false));
                let mut io = Io::default();
                if crew {
                    let crew = crate::dataplane::crew::Crew::new(8, "t").unwrap().unwrap();
                    let mut c = CrewBatch::new(crew);
                    for p in &esp {
                        let n = c.n;
                        c.bufs[n][HEADROOM..HEADROOM + p.len()].copy_from_slice(p);
                        c.start(&mut inb, local, (HEADROOM, p.len()), from, &mut io);
                    }
                    c.flush(&mut inb, &mut sink, &mut io);
                } else {
                    for p in &esp {
                        let mut b = slot();
                        b[HEADROOM..HEADROOM + p.len()].copy_from_slice(p);
                        open_one(
                            &mut inb,
                            local,
                            (&mut b, HEADROOM, p.len()),
                            from,
                            &mut sink,
                            &mut io,
                        );
                    }
                }
                let mut up = 0;
                sink.gro.flush(|_| {
                    up += 1;
                    true
                });
                let d = &inb.engine.counters.drops;
                let (no_sa, gone) = (d.get(DropReason::NoSa), d.get(DropReason::UnknownSpi));
                if failing {
                    // the packet whose write failed (and any opened beside it in the
                    // crew's batch) `no_sa`, those after it find no SA (`unknown_spi`)
                    assert!(
                        up == 0 && no_sa >= 1 && no_sa + gone == 20,
                        "{crew} {up} {no_sa} {gone}"
                    );
                } else {
                    assert_eq!((up, no_sa, gone), (20, 0, 0), "crew {crew}");
                }
            }
        }
    }

    /// Issue 18's inbound properties, on the crew batch the gateway runs (8 threads):
    /// packets opened together go up in the order they came whatever order the threads
    /// finish in; a twin in the same batch is a `replay` (the window is checked again
    /// at commit, RFC 4303 §3.4.3); a forged copy ahead of its packet is an
    /// `icv_failure` that commits nothing, so the genuine packet is still accepted.
    #[test]
    fn a_crew_opens_in_arrival_order_and_refuses_twins_and_forgeries() {
        use crate::dataplane::crew::tests::{inner, pair, slot, Lcg};
        let (mut out, mut inb) = pair();
        let mut rng = Lcg(0x2545_f491_4f6c_dd1d);
        let mut arrivals = Vec::new();
        let (mut want, mut twins, mut forged) = (Vec::new(), 0, 0);
        let mut buf = slot();
        for i in 0..1000u32 {
            let len = 28 + rng.below(1400);
            inner(&mut buf, len, i);
            want.push(buf[HEADROOM..HEADROOM + len].to_vec());
            let mut pkt = PacketBuf::new(&mut buf, HEADROOM, len).unwrap();
            out.engine.outbound(&mut pkt).unwrap();
            let esp = pkt.data().to_vec();
            if i % 11 == 5 {
                let mut bad = esp.clone();
                *bad.last_mut().unwrap() ^= 1; // the ICV's last byte
                arrivals.push(bad);
                forged += 1;
            }
            arrivals.push(esp.clone());
            if i % 7 == 3 {
                arrivals.push(esp); // its twin, right behind it: the same batch
                twins += 1;
            }
        }
        let crew = crate::dataplane::crew::Crew::new(8, "t").unwrap().unwrap();
        let mut c = CrewBatch::new(crew);
        let mut sink = TunSink::detached(Coalescer::new(2 * SLOTS, false, false));
        let mut io = Io::default();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let local: IpAddr = "192.0.2.2".parse().unwrap();
        let from = Arrival {
            udp: false,
            next: 50,
            src: "192.0.2.1".parse().unwrap(),
        };
        let mut collect = |c: &mut CrewBatch, e: &mut DirEngine, sink: &mut TunSink| {
            c.flush(e, sink, &mut Io::default());
            let failed = sink.gro.flush(|b| {
                got.push(b.to_vec());
                true
            });
            assert_eq!(failed, 0);
        };
        for (k, p) in arrivals.iter().enumerate() {
            if c.n == SLOTS || k % 97 == 0 {
                collect(&mut c, &mut inb, &mut sink); // batches of varying length
            }
            let n = c.n;
            c.bufs[n][HEADROOM..HEADROOM + p.len()].copy_from_slice(p);
            c.start(&mut inb, local, (HEADROOM, p.len()), from, &mut io);
        }
        collect(&mut c, &mut inb, &mut sink);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "packet {i} is not the one sent {i}th");
        }
        let (_, sa) = inb.engine.sas().next().unwrap();
        assert_eq!(sa.counters.drops.get(DropReason::Replay), twins);
        assert_eq!(sa.counters.drops.get(DropReason::IcvFailure), forged);
        assert_eq!(sa.counters.packets, 1000);
    }
}
