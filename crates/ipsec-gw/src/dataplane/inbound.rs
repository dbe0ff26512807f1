//! Outside → SAD → open → inner policy → TUN.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};

use ipsec::constants::{proto, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use ipsec::engine::Inbound;
use ipsec::wire::ip::{Ipv4Header, Ipv6Header};
use ipsec::{PacketBuf, HEADROOM, TAILROOM};
use tun_rs::SyncDevice;

use super::outside::Outside;
use super::sas::DirEngine;
use super::{open, BATCH, MAX_PACKET};
use crate::gro::Coalescer;
use crate::stats::Io;
use crate::sys::{self, resident, RecvBatch, RECV_BATCH};

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
            sys::write_packet(fd, b)
        });
        io.tun_writes += writes;
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
            // RFC 791: as if it had come raw — protocol 50, the peer as source, DF.
            let h = at - IPV4_HEADER_LEN;
            let total = (n + IPV4_HEADER_LEN) as u16;
            Ipv4Header::new_unchecked(&mut buf[h..at]).emit(
                0,
                total,
                0,
                0x4000,
                64,
                proto::ESP,
                src,
                dst,
            );
            (h, n + IPV4_HEADER_LEN)
        }
        (IpAddr::V6(dst), IpAddr::V6(src)) => {
            // RFC 8200 §3: traffic class and flow label 0 — AH's ICV treats them as zero
            // anyway (RFC 4302 §3.3.3.1.2) — hop limit 64.
            let h = at - IPV6_HEADER_LEN;
            Ipv6Header::new_unchecked(&mut buf[h..at])
                .emit(0, 0, n as u16, from.next, 64, src, dst);
            (h, n + IPV6_HEADER_LEN)
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
pub(super) struct InboundPath {
    rx: RecvBatch,
    /// A datagram the kernel coalesced (UDP GRO) is opened one segment at a time, where
    /// it lies — or, when the direction has IPComp (whose opening may grow a packet into
    /// the next segment), each copied here first.
    segment: Vec<u8>,
    sink: TunSink,
    pub(super) io: Io,
    /// The outer sockets, in the order `drain`'s `ready` refers to: raw ESP, raw AH, and
    /// UDP 4500 when encapsulating.
    pub(super) fds: Vec<RawFd>,
}

impl InboundPath {
    pub(super) fn new(outside: &Outside, tun: &SyncDevice) -> InboundPath {
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

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut sink = TunSink {
            gro: Coalescer::new(4, false, false),
            fd: -1,
        };
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
}
