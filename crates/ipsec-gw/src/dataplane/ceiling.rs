//! The I/O ceiling: a build (`--features io-ceiling`, made only by
//! `benchmarks/io_ceiling.py`, into its own target directory) whose "seal" and "open" frame
//! packets exactly as ESP with AES-GCM-16 would — outer IPv4 header, SPI and sequence
//! number, an 8-byte IV, padding, trailer, a 16-byte ICV — but copy nothing and encrypt
//! nothing. Everything else (TUN offloads, batching, UDP GSO/GRO, GRO into the TUN device,
//! the threads) is the gateway's own, so the benchmark can say how much of plain
//! forwarding the data path keeps before any cryptography. NOTHING IS PROTECTED: the
//! gateway says so at start-up, and the normal build has none of this.

use ipsec::constants::{proto, IPV4_HEADER_LEN};
use ipsec::engine::{Inbound, Outbound};
use ipsec::sa::Direction;
use ipsec::wire::ip::{Ipv4Header, Ipv4Repr, IPV4_DF};
use ipsec::{DropReason, PacketBuf};

use super::DirEngine;

/// Outer IPv4 + ESP header + IV in front; pad length, next header and ICV behind.
const FRONT: usize = 20 + 8 + 8;
const ICV: usize = 16;

/// Frame the packet as the direction's first SA would seal it (tunnel mode, IPv4 outer).
pub fn seal(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Outbound, DropReason> {
    let (id, spi, ends) = engine
        .engine
        .sas()
        .find(|(_, sa)| sa.direction() == Direction::Out)
        .map(|(id, sa)| (id, sa.spi(), sa.tunnel()))
        .ok_or(DropReason::NoSa)?;
    let (Some(ends), (head, len)) = (ends, (pkt.head(), pkt.len())) else {
        return Err(DropReason::NoSa);
    };
    let (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) = (ends.src, ends.dst) else {
        return Err(DropReason::NoSa);
    };
    let pad = (4 - (len + 2) % 4) % 4;
    let total = FRONT + len + pad + 2 + ICV;
    if head < FRONT || pkt.tailroom() < pad + 2 + ICV {
        return Err(DropReason::NoRoom);
    }
    let next = if pkt.data().first().is_some_and(|b| b >> 4 == 6) {
        41
    } else {
        4
    };
    let at = head - FRONT;
    let raw = pkt.raw();
    let h = &mut raw[at..at + FRONT];
    let outer = Ipv4Repr {
        src,
        dst,
        protocol: proto::ESP,
        payload_len: total - IPV4_HEADER_LEN,
        tos: 0,
        ident: 0,
        flags_frag: IPV4_DF,
        ttl: 64,
    };
    outer.emit(&mut Ipv4Header::new_unchecked(&mut h[..IPV4_HEADER_LEN]));
    h[20..24].copy_from_slice(&spi.to_be_bytes());
    h[24..36].fill(0);
    let t = head + len;
    raw[t..t + pad].fill(0);
    raw[t + pad] = pad as u8;
    raw[t + pad + 1] = next;
    pkt.set(at, total)?;
    Ok(Outbound::Sealed { sa: id })
}

/// Take the frame `seal` made off again.
pub fn open(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Inbound, DropReason> {
    let id = engine
        .engine
        .sas()
        .find(|(_, sa)| sa.direction() == Direction::In)
        .map(|(id, _)| id)
        .ok_or(DropReason::NoSa)?;
    let (head, len) = (pkt.head(), pkt.len());
    let d = pkt.data();
    let ihl = usize::from(d.first().copied().unwrap_or(0) & 0x0f) * 4;
    if len < ihl + 16 + 2 + ICV {
        return Err(DropReason::Truncated);
    }
    let pad = usize::from(d[len - ICV - 2]);
    let next_header = d[len - ICV - 1];
    let inner = (len - ihl - 16 - 2 - ICV)
        .checked_sub(pad)
        .ok_or(DropReason::Truncated)?;
    pkt.set(head + ihl + 16, inner)?;
    Ok(Inbound::Opened {
        sa: id,
        next_header,
    })
}
