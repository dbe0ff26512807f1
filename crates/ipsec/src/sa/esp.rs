//! ESP (RFC 4303): outbound seal and inbound open, tunnel and transport mode, IPv4 and
//! IPv6 inner and outer in any combination.
//!
//! All work happens in the caller's buffer: sealing writes the ESP header and IV into
//! the headroom and padding, trailer and ICV into the tailroom; opening verifies
//! before it decrypts, and commits the replay window only after the ICV verified
//! (RFC 4303 §3.4.3).

use core::net::IpAddr;
use core::ops::Range;

use super::Sa;
use crate::buf::PacketBuf;
use crate::constants::{proto, ESP_HEADER_LEN, ESP_TRAILER_LEN, MAX_PACKET};
use crate::crypto::job::{CryptoJob, Now, When};
use crate::crypto::state::CipherState;
use crate::crypto::state::IvSource;
use crate::drop::DropReason;
pub use crate::locate::{esp_location, ipsec_location, EspLocation};
pub(crate) use crate::locate::{outer_header_len, rewrite_ip_header, TransportSplit, TunnelInner};
use crate::stage::Stage;
use crate::wire::esp::{read_trailer, write_trailer, EspHeader};
use crate::wire::ip::{IpPacket, Ipv4Header, Ipv4Repr, Ipv6Header, Ipv6Repr};

pub use crate::crypto::state::IvSource as Iv;

/// What opening an ESP packet yielded, as offsets into the caller's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedEsp {
    /// The payload: inner packet (tunnel) or upper-layer data (transport).
    pub payload: Range<usize>,
    pub next_header: u8,
    /// Full (ESN-inferred) sequence number.
    pub seq: u64,
}

/// Whether opening checks the replay window again before it commits: only a job run
/// away from the SA ([`Sa::open_finish`]) needs to; opening on the SA's own thread
/// changed nothing between the check and the commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recheck {
    Yes,
    No,
}

impl Sa {
    /// The SA's keys, for [`CryptoJob`]s run away from the SA.
    pub fn keys(&self) -> &CipherState {
        &self.keys
    }

    /// ESP alone: `buf[esp_at + 8 + iv_len ..][..payload_len]` is the payload; write the
    /// header, IV, padding, trailer and ICV around it. Returns the ESP packet's length.
    pub fn seal_esp(
        &mut self,
        buf: &mut [u8],
        esp_at: usize,
        payload_len: usize,
        next_header: u8,
        iv: IvSource<'_>,
    ) -> Result<usize, DropReason> {
        self.seal_esp_when::<Now>(buf, esp_at, payload_len, next_header, iv)
            .map(|(len, _)| len)
    }

    /// [`Sa::seal_esp`], or (`When::Later`) all of it but the encryption and ICV, which
    /// come back as a job. The packet counts as sealed once its number is taken.
    fn seal_esp_when<W: When>(
        &mut self,
        buf: &mut [u8],
        esp_at: usize,
        payload_len: usize,
        next_header: u8,
        iv: IvSource<'_>,
    ) -> Result<(usize, W::Job), DropReason> {
        let s = self.suite;
        let pad = s.pad_len(payload_len);
        let payload_at = esp_at + ESP_HEADER_LEN + s.iv_len();
        let ct_end = payload_at + payload_len + pad + ESP_TRAILER_LEN;
        let end = ct_end + s.icv_len();
        if end > buf.len() {
            return Err(DropReason::NoRoom);
        }
        let t = self.stages.start();
        let seq = self.take_seq()?;
        let mut h = EspHeader::new_checked(&mut buf[esp_at..]).map_err(|_| DropReason::NoRoom)?;
        h.set_spi(self.spi);
        h.set_seq(seq as u32);
        let t = self.stages.stop(Stage::Header, t);
        write_trailer(&mut buf[payload_at + payload_len..ct_end], next_header);
        let t = self.stages.stop(Stage::Padding, t);
        self.keys.write_iv(buf, esp_at, seq, iv)?;
        self.stages.stop(Stage::Iv, t);
        let job = CryptoJob {
            esp_at,
            end: ct_end,
            seq,
            esn: self.esn,
        };
        let job = W::finish(&self.keys, &mut self.stages, buf, job)?;
        self.counters.packets += 1;
        self.counters.bytes += payload_len as u64;
        Ok((end - esp_at, job))
    }

    /// ESP alone: verify, replay-check and decrypt `buf[esp_at..esp_at + esp_len]`.
    pub fn open_esp(
        &mut self,
        buf: &mut [u8],
        esp_at: usize,
        esp_len: usize,
    ) -> Result<OpenedEsp, DropReason> {
        let job = self.open_esp_check(buf, esp_at, esp_len)?;
        let st = &mut self.stages;
        self.keys
            .open_staged(buf, esp_at, job.end, job.seq, self.esn, st)?;
        self.open_esp_finish(buf, &job, Recheck::No)
    }

    /// Opening, before the ICV: lengths, SPI, the full sequence number (ESN inferred,
    /// RFC 4303 Appendix A2) and the replay check (§3.4.3). Changes nothing.
    #[inline]
    fn open_esp_check(
        &mut self,
        buf: &[u8],
        esp_at: usize,
        esp_len: usize,
    ) -> Result<CryptoJob, DropReason> {
        let s = self.suite;
        let (iv_len, icv_len) = (s.iv_len(), s.icv_len());
        let end = esp_at
            .checked_add(esp_len)
            .filter(|e| *e <= buf.len())
            .ok_or(DropReason::Truncated)?;
        if esp_len < ESP_HEADER_LEN + iv_len + ESP_TRAILER_LEN + icv_len {
            return Err(DropReason::Truncated);
        }
        let ct_len = esp_len - ESP_HEADER_LEN - iv_len - icv_len;
        // RFC 4303 §2.4: a whole number of alignment units; a power of two, so a mask
        // (a division here cost open ~10 % at 64 B)
        if ct_len & (s.align() - 1) != 0 {
            return Err(DropReason::BadCiphertextLength);
        }
        let h = EspHeader::new_checked(&buf[esp_at..end])?;
        if h.spi() != self.spi {
            return Err(DropReason::UnknownSpi);
        }
        let t = self.stages.start();
        let seq = if self.esn {
            self.replay
                .infer_esn(h.seq())
                .ok_or(DropReason::ReplayTooOld)?
        } else {
            u64::from(h.seq())
        };
        self.replay.check(seq)?;
        self.stages.stop(Stage::ReplayCheck, t);
        Ok(CryptoJob {
            esp_at,
            end,
            seq,
            esn: self.esn,
        })
    }

    /// Opening, after the ICV verified and the payload was decrypted: the replay window
    /// committed (§3.4.3: only now), then the trailer. A job run away from the SA
    /// ([`Recheck::Yes`]) is checked again first: a packet with the same number may have
    /// been committed since the first check — its twin in the same batch, opened on
    /// another thread.
    #[inline]
    fn open_esp_finish(
        &mut self,
        buf: &[u8],
        job: &CryptoJob,
        recheck: Recheck,
    ) -> Result<OpenedEsp, DropReason> {
        let (esp_at, end, seq) = (job.esp_at, job.end, job.seq);
        let t = self.stages.start();
        if recheck == Recheck::Yes {
            self.replay.check(seq)?;
        }
        self.replay.commit(seq);
        let t = self.stages.stop(Stage::ReplayUpdate, t);
        let payload_at = esp_at + ESP_HEADER_LEN + self.suite.iv_len();
        let ct_end = end - self.suite.icv_len();
        let (payload_len, next_header) = read_trailer(&buf[payload_at..ct_end])?;
        let payload_end = payload_at + payload_len;
        self.stages.stop(Stage::Padding, t);
        self.counters.packets += 1;
        self.counters.bytes += (payload_end - payload_at) as u64;
        Ok(OpenedEsp {
            payload: payload_at..payload_end,
            next_header,
            seq,
        })
    }

    /// Room the ESP header and IV need in front of the payload.
    #[inline]
    fn esp_head_len(&self) -> usize {
        ESP_HEADER_LEN + self.suite.iv_len()
    }

    /// Bytes ESP adds behind a payload of `len`.
    #[inline]
    fn esp_tail_len(&self, len: usize) -> usize {
        self.suite.pad_len(len) + ESP_TRAILER_LEN + self.suite.icv_len()
    }

    pub(crate) fn seal_tunnel<W: When>(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        iv: IvSource<'_>,
    ) -> Result<W::Job, DropReason> {
        let inner = TunnelInner::parse(pkt.data())?;
        self.seal_tunnel_when::<W>(pkt, inner, iv)
    }

    /// Tunnel mode over a payload that is the inner packet or, in a bundle, what IPComp
    /// made of it: `pkt` starts with `payload.len` bytes of protocol `payload.next_header`;
    /// DSCP/ECN and DF for the outer header come from `payload` too.
    pub(crate) fn seal_tunnel_payload(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        payload: TunnelInner,
        iv: IvSource<'_>,
    ) -> Result<(), DropReason> {
        self.seal_tunnel_when::<Now>(pkt, payload, iv)
    }

    fn seal_tunnel_when<W: When>(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        payload: TunnelInner,
        iv: IvSource<'_>,
    ) -> Result<W::Job, DropReason> {
        let t = self.tunnel.ok_or(DropReason::NoSa)?;
        let TunnelInner {
            next_header,
            tos,
            df,
            len: inner_len,
        } = payload;
        let outer_len = outer_header_len(t.dst);
        let head = pkt.head();
        let front = outer_len + self.esp_head_len();
        if head < front || pkt.tailroom() + (pkt.len() - inner_len) < self.esp_tail_len(inner_len) {
            return Err(DropReason::NoRoom);
        }
        let total = front + inner_len + self.esp_tail_len(inner_len);
        if total > MAX_PACKET {
            return Err(DropReason::TooBig);
        }
        let esp_at = head - self.esp_head_len();
        let (esp_len, job) =
            self.seal_esp_when::<W>(pkt.raw(), esp_at, inner_len, next_header, iv)?;
        let outer_at = esp_at - outer_len;
        let meta = TunnelInner {
            next_header: proto::ESP,
            tos,
            df,
            len: esp_len,
        };
        let t = self.stages.start();
        self.emit_outer(&mut pkt.raw()[outer_at..esp_at], &meta)?;
        self.stages.stop(Stage::Header, t);
        pkt.set(outer_at, outer_len + esp_len)?;
        Ok(job)
    }

    /// Write the tunnel's outer IP header into `buf` (its exact length) for a payload of
    /// `payload.len` bytes of protocol `payload.next_header`, with the inner packet's
    /// DSCP/ECN and DF.
    pub(crate) fn emit_outer(
        &mut self,
        buf: &mut [u8],
        payload: &TunnelInner,
    ) -> Result<(), DropReason> {
        let t = self.tunnel.ok_or(DropReason::NoSa)?;
        let ttl = self.outer_ttl;
        match (t.src, t.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let id = self.next_ip_id();
                Ipv4Repr {
                    src,
                    dst,
                    protocol: payload.next_header,
                    payload_len: payload.len,
                    tos: payload.tos,
                    ident: id,
                    flags_frag: payload.df,
                    ttl,
                }
                .emit(&mut Ipv4Header::new_unchecked(buf));
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => Ipv6Repr {
                src,
                dst,
                next_header: payload.next_header,
                payload_len: payload.len,
                hop_limit: ttl,
                traffic_class: payload.tos,
                flow_label: 0,
            }
            .emit(&mut Ipv6Header::new_unchecked(buf)),
            _ => return Err(DropReason::NoSa),
        }
        Ok(())
    }

    pub(crate) fn seal_transport<W: When>(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        iv: IvSource<'_>,
    ) -> Result<W::Job, DropReason> {
        let TransportSplit {
            hdr_len,
            nh_at,
            next_header,
            pkt_len,
            v4,
        } = TransportSplit::parse(pkt.data())?;
        let payload_len = pkt_len - hdr_len;
        let head = pkt.head();
        let grow = self.esp_head_len();
        if head < grow || pkt.tailroom() + (pkt.len() - pkt_len) < self.esp_tail_len(payload_len) {
            return Err(DropReason::NoRoom);
        }
        if hdr_len + grow + payload_len + self.esp_tail_len(payload_len) > MAX_PACKET {
            return Err(DropReason::TooBig);
        }
        let new_head = head - grow;
        let raw = pkt.raw();
        let t = self.stages.start();
        raw.copy_within(head..head + hdr_len, new_head);
        self.stages.stop(Stage::Copy, t);
        let esp_at = new_head + hdr_len;
        let (esp_len, job) =
            match self.seal_esp_when::<W>(raw, esp_at, payload_len, next_header, iv) {
                Ok(r) => r,
                Err(d) => {
                    // Put the header back where it was: a refused packet is left as it came.
                    raw.copy_within(new_head..new_head + hdr_len, head);
                    return Err(d);
                }
            };
        rewrite_ip_header(&mut raw[new_head..esp_at], v4, nh_at, proto::ESP, esp_len);
        pkt.set(new_head, hdr_len + esp_len)?;
        Ok(job)
    }

    /// Tunnel mode, inbound. With `ipcomp` (inside a bundle) the payload may also be an
    /// IPComp header and its data (next header 108), left in `pkt` for IPComp to expand.
    pub(crate) fn open_tunnel(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        ipcomp: bool,
    ) -> Result<u8, DropReason> {
        let job = self.open_check(pkt)?;
        self.open_now(pkt, &job)?;
        self.open_tunnel_finish(pkt, &job, ipcomp, Recheck::No)
    }

    /// Opening an ESP packet, before the ICV: where it is, and [`Sa::open_esp_check`].
    #[inline]
    pub(crate) fn open_check(&mut self, pkt: &mut PacketBuf<'_>) -> Result<CryptoJob, DropReason> {
        let loc = esp_location(pkt.data())?;
        let at = pkt.head() + loc.offset;
        self.open_esp_check(pkt.raw(), at, loc.len)
    }

    /// The cryptographic half of opening, on this thread, timed into the SA's stages.
    #[inline]
    fn open_now(&mut self, pkt: &mut PacketBuf<'_>, job: &CryptoJob) -> Result<(), DropReason> {
        let st = &mut self.stages;
        self.keys
            .open_staged(pkt.raw(), job.esp_at, job.end, job.seq, job.esn, st)
    }

    /// Tunnel mode, after the ICV verified and the payload was decrypted.
    #[inline]
    pub(crate) fn open_tunnel_finish(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        job: &CryptoJob,
        ipcomp: bool,
        recheck: Recheck,
    ) -> Result<u8, DropReason> {
        let o = self.open_esp_finish(pkt.raw(), job, recheck)?;
        let payload = &pkt.raw()[o.payload.clone()];
        let inner_len = match o.next_header {
            proto::NO_NEXT_HEADER => return Err(DropReason::DummyPacket),
            proto::IPV4 | proto::IPV6 => {
                let inner = IpPacket::parse(payload).map_err(|_| DropReason::MalformedInner)?;
                let want = if o.next_header == proto::IPV4 { 4 } else { 6 };
                if !matches!((&inner, want), (IpPacket::V4(_), 4) | (IpPacket::V6(_), 6)) {
                    return Err(DropReason::MalformedInner);
                }
                // Any bytes after the inner packet are TFC padding (RFC 4303 §2.7).
                inner.packet_len()
            }
            proto::IPCOMP if ipcomp => o.payload.len(),
            _ => return Err(DropReason::BadNextHeader),
        };
        pkt.set(o.payload.start, inner_len)?;
        Ok(o.next_header)
    }

    pub(crate) fn open_transport(&mut self, pkt: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        let job = self.open_check(pkt)?;
        self.open_now(pkt, &job)?;
        self.open_transport_finish(pkt, &job, Recheck::No)
    }

    /// Transport mode, after the ICV verified and the payload was decrypted (the IP
    /// header in front is as it came: the cryptography does not touch it).
    pub(crate) fn open_transport_finish(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        job: &CryptoJob,
        recheck: Recheck,
    ) -> Result<u8, DropReason> {
        let loc = esp_location(pkt.data())?;
        let (head, hdr_len) = (pkt.head(), loc.offset);
        let o = self.open_esp_finish(pkt.raw(), job, recheck)?;
        if o.next_header == proto::NO_NEXT_HEADER {
            return Err(DropReason::DummyPacket);
        }
        // Move the IP header up against the payload and point it at the upper layer.
        let new_head = o.payload.start - hdr_len;
        let payload_len = o.payload.len();
        let raw = pkt.raw();
        let t = self.stages.start();
        raw.copy_within(head..head + hdr_len, new_head);
        let t = self.stages.stop(Stage::Copy, t);
        let ip = &mut raw[new_head..o.payload.start];
        rewrite_ip_header(ip, loc.v4, loc.nh_at, o.next_header, payload_len);
        self.stages.stop(Stage::Header, t);
        pkt.set(new_head, hdr_len + payload_len)?;
        Ok(o.next_header)
    }
}
