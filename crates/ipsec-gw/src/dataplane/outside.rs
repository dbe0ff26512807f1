//! The outside: raw ESP and AH sockets (and UDP 4500 with RFC 3948 encapsulation), where
//! sealed packets go and protected packets come from.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

use ipsec::constants::{proto, NAT_T_PORT};
use socket2::{Domain, Protocol as SockProto, SockAddr, Socket, Type};

use crate::config::Config;
use crate::stats::Io;
use crate::sys::{self, Messages};

/// The outside: where sealed packets go and protected packets come from.
pub struct Outside {
    raw_send: Socket,
    pub(super) esp_recv: Socket,
    pub(super) ah_recv: Socket,
    pub(super) udp: Option<UdpSocket>,
    /// UDP GSO on the 4500 socket: several ESP packets per send (Linux 4.18+).
    pub udp_gso: bool,
    /// UDP GRO on the 4500 socket: several ESP packets per receive (Linux 5.0+).
    pub udp_gro: bool,
    /// CoDel on the receive queues (`aqm`): each datagram carries its receive time.
    pub aqm: bool,
    peer: SocketAddr,
    pub(super) local: IpAddr,
    pub(super) remote: IpAddr,
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
        let esp_recv = Socket::new(
            domain,
            Type::RAW,
            Some(SockProto::from(i32::from(proto::ESP))),
        )?;
        let ah_recv = Socket::new(
            domain,
            Type::RAW,
            Some(SockProto::from(i32::from(proto::AH))),
        )?;
        let udp = if cfg.udp_encap {
            let u = UdpSocket::bind(SocketAddr::new(local, NAT_T_PORT))?;
            sys::big_buffers(u.as_raw_fd());
            Some(u)
        } else {
            None
        };
        for s in [&raw_send, &esp_recv, &ah_recv] {
            sys::big_buffers(s.as_raw_fd());
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
                    .is_some_and(|u| sys::udp_option(u.as_raw_fd(), opt, set))
        };
        // `aqm`: each datagram's receive time, for its time in the queue (codel.rs)
        if cfg.aqm {
            let mut fds = vec![esp_recv.as_raw_fd(), ah_recv.as_raw_fd()];
            fds.extend(udp.as_ref().map(|u| u.as_raw_fd()));
            if !fds.into_iter().all(sys::timestamps) {
                return Err(io::Error::other(format!(
                    "aqm: the kernel refused receive timestamps (SO_TIMESTAMPNS): {}",
                    io::Error::last_os_error()
                )));
            }
        }
        let udp_gso = offload(libc::UDP_SEGMENT, false);
        let udp_gro = offload(libc::UDP_GRO, true);
        Ok(Outside {
            raw_send,
            esp_recv,
            ah_recv,
            udp,
            udp_gso,
            udp_gro,
            aqm: cfg.aqm,
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
    pub(super) fn send_batch(&self, batch: &mut SendBatch, bufs: &[Vec<u8>], io: &mut Io) {
        let SendBatch {
            pkts,
            routed,
            udp,
            raw,
        } = batch;
        routed.clear();
        for &(b, head, len) in pkts.iter() {
            match self.route(&bufs[b][head..head + len]) {
                Some((via_udp, skip, addr)) => {
                    routed.push((via_udp, b, head + skip, len - skip, addr))
                }
                None => io.send_errors += 1,
            }
        }
        let via = |u: bool| {
            routed
                .iter()
                .filter(move |r| r.0 == u)
                .map(|(_, b, at, len, addr)| (addr, &bufs[*b][*at..*at + *len]))
        };
        if let Some(u) = &self.udp {
            udp.send_all(u.as_raw_fd(), io, via(true));
        }
        raw.send_all(self.raw_send.as_raw_fd(), io, via(false));
        pkts.clear();
    }
}

/// A wakeup's outer packets, and the sendmmsg(2) arrays for each socket, kept between
/// wakeups (no allocation per packet or per batch once they have grown to its size).
#[derive(Default)]
pub(super) struct SendBatch {
    /// (buffer, head, length) of each sealed packet, in order.
    pub(super) pkts: Vec<(usize, usize, usize)>,
    /// Each packet's way out: (UDP?, buffer, start, length, address).
    routed: Vec<(bool, usize, usize, usize, SockAddr)>,
    pub(super) udp: Messages,
    raw: Messages,
}
