//! Where the data path hands a packet to the cryptography: sealing and opening whole
//! (`seal`, `open`), or in two halves around a crew's batch (`seal_deferred`; `start`
//! and `finish`, `crew.rs`). Both builds are here, and nowhere else:
//!
//! - the normal build calls the direction's engine (`crates/ipsec/src/engine.rs`);
//! - the I/O-ceiling build (`--features io-ceiling`, made only by
//!   `benchmarks/io_ceiling.py`, into its own target directory) frames packets exactly as
//!   ESP with AES-GCM-16 would — outer IPv4 header, SPI and sequence number, an 8-byte IV,
//!   padding, trailer, a 16-byte ICV — but copies nothing and encrypts nothing.
//!   Everything else (TUN offloads, batching, UDP GSO/GRO, GRO into the TUN device, the
//!   threads) is the gateway's own, so the benchmark can say how much of plain forwarding
//!   the data path keeps before any cryptography. NOTHING IS PROTECTED: the gateway says
//!   so at start-up ([`CEILING_WARNING`]), and the normal build has none of this.

use ipsec::engine::{Inbound, InboundStart, Outbound};
use ipsec::sad::SaId;
use ipsec::{CryptoJob, DropReason, PacketBuf};

use super::sas::DirEngine;

pub use build::*;

/// The I/O-ceiling build's start-up warning; `None` in the normal build.
pub const CEILING_WARNING: Option<&str> = build::WARNING;

/// The normal build: the direction's engine.
#[cfg(not(feature = "io-ceiling"))]
mod build {
    use super::*;

    pub(super) const WARNING: Option<&str> = None;

    /// Seal whole: SPD, SA or bundle, ESP/AH, outer header (RFC 4303 §3.1, RFC 4302 §3).
    #[inline]
    pub fn seal(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Outbound, DropReason> {
        engine.engine.outbound(pkt)
    }

    /// Seal in two halves: everything but the cipher and ICV now, those by the crew.
    #[inline]
    pub fn seal_deferred(
        engine: &mut DirEngine,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<(Outbound, Option<CryptoJob>), DropReason> {
        engine.engine.outbound_deferred(pkt)
    }

    /// Open whole: SAD, replay check, ICV, replay commit, inner policy (RFC 4303 §3.4).
    #[inline]
    pub fn open(engine: &mut DirEngine, pkt: &mut PacketBuf<'_>) -> Result<Inbound, DropReason> {
        engine.engine.inbound(pkt)
    }

    /// Opening's first half: SAD lookup and replay check, before the crew verifies the
    /// ICV (RFC 4303 §3.4.3: the window is checked before and committed after).
    #[inline]
    pub fn start(
        engine: &mut DirEngine,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<InboundStart, DropReason> {
        engine.engine.inbound_start(pkt)
    }

    /// Opening's second half, after the crew: replay commit and inner policy.
    #[inline]
    pub fn finish(
        engine: &mut DirEngine,
        pkt: &mut PacketBuf<'_>,
        sa: SaId,
        job: &CryptoJob,
        crypto: Result<(), DropReason>,
    ) -> Result<Inbound, DropReason> {
        engine.engine.inbound_finish(pkt, sa, job, crypto)
    }
}

/// The I/O-ceiling build: framing without cryptography (see the module's comment).
#[cfg(feature = "io-ceiling")]
mod build {
    use ipsec::constants::{proto, IPV4_HEADER_LEN};
    use ipsec::sa::Direction;
    use ipsec::wire::ip::{Ipv4Header, Ipv4Repr, IPV4_DF};

    use super::*;

    pub(super) const WARNING: Option<&str> = Some(
        "an io-ceiling build (benchmarks/io_ceiling.py): packets are framed as ESP but NOT \
         ENCRYPTED OR AUTHENTICATED — a benchmark of the data path only",
    );

    /// Outer IPv4 + ESP header + IV in front; pad length, next header and ICV behind.
    const FRONT: usize = 20 + 8 + 8;
    const ICV: usize = 16;

    /// Frame the packet as the direction's first SA would seal it (tunnel mode, IPv4
    /// outer; RFC 4303 §2's layout).
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
        if total > ipsec::constants::MAX_PACKET {
            return Err(DropReason::TooBig); // the outer total length would wrap
        }
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

    /// No crew work: all of it now.
    pub fn seal_deferred(
        engine: &mut DirEngine,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<(Outbound, Option<CryptoJob>), DropReason> {
        seal(engine, pkt).map(|o| (o, None))
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

    /// No cryptography to share out: opened whole at the start.
    pub fn start(
        engine: &mut DirEngine,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<InboundStart, DropReason> {
        open(engine, pkt).map(InboundStart::Done)
    }

    pub fn finish(
        _: &mut DirEngine,
        _: &mut PacketBuf<'_>,
        _: SaId,
        _: &CryptoJob,
        _: Result<(), DropReason>,
    ) -> Result<Inbound, DropReason> {
        Err(DropReason::CryptoError) // never: this build's start opens whole
    }
}
