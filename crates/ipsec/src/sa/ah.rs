//! AH (RFC 4302): outbound seal and inbound open, tunnel and transport mode, IPv4 and
//! IPv6, with the HMAC integrity algorithms (md5 on SAs marked legacy, sha1, sha256,
//! sha384, sha512) and AES-GMAC (RFC 4543 §4).
//!
//! With GMAC the Authentication Data is an 8-byte IV (the 64-bit sequence number, unique
//! under the key as the sequence number is) followed by the 16-byte tag; the header is 36
//! bytes over IPv4 and 40 over IPv6 (4 bytes of padding for 8-byte alignment, RFC 4543
//! erratum 3643). The tag is GMAC with nonce salt ‖ IV over the same AH-authenticated
//! data an HMAC covers, in which only the tag field is zeroed: the IV is authenticated
//! (RFC 4543 §7).
//!
//! The ICV covers the whole IP packet (§3.3.3): the IP header(s) with their mutable
//! fields zeroed (§3.3.3.1), the AH header with a zero ICV field, and the payload; with
//! ESN the high 32 bits of the sequence number are appended (§2.5.1, §3.3.2.1). The
//! headers are zeroed in a scratch copy, so the packet keeps its real TTL, DSCP and so on.
//! Sequence numbers, ESN inference and anti-replay are the SA's, shared with ESP:
//! checked before the ICV, committed after it verified (§3.4.3).

use aws_lc_rs::constant_time::verify_slices_are_equal;

use super::{Mode, Sa};
use crate::buf::PacketBuf;
use crate::constants::{
    proto, AH_FIXED_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, MAX_ICV_LEN, MAX_PACKET,
};
use crate::drop::DropReason;
use crate::locate::{
    ipsec_location, outer_header_len, rewrite_ip_header, TransportSplit, TunnelInner,
};
use crate::stage::Stage;
use crate::wire::ah::{AhHeader, AhRepr};
use crate::wire::ip::{ext, opt, v4, v6, IpPacket, Ipv4Header, IPV4_DF};

/// Longest IP header region (IPv6 with extension headers) AH covers here: it is zeroed
/// in a stack copy of this size. Longer is [`DropReason::UnsupportedHeader`].
pub const MAX_AH_IP_HEADER: usize = 512;

/// IPv4 options whose value does not change in transit (RFC 4302 Appendix A.1), by option
/// number (the low 5 bits of the type): end of list, no-op, security, extended security,
/// commercial security, router alert, sender-directed multi-destination delivery. All
/// others are zeroed whole for the ICV.
const IMMUTABLE_IPV4_OPTIONS: [u8; 7] = [0, 1, 2, 5, 6, 20, 21];

/// AH header length for an ICV of `icv_len` bytes: 12 + ICV, padded to a multiple of
/// 4 bytes (IPv4) or 8 bytes (IPv6), RFC 4302 §2.2 and §3.3.3.2.1.
pub fn ah_length(icv_len: usize, v4: bool) -> usize {
    let align = if v4 { 4 } else { 8 };
    (AH_FIXED_LEN + icv_len).div_ceil(align) * align
}

impl Sa {
    fn ah_len(&self, v4: bool) -> usize {
        ah_length(self.suite.integrity.auth_data_len(), v4)
    }

    /// Offset of the ICV (GMAC: the tag, after the IV) from the start of the AH header.
    fn ah_icv_offset(&self) -> usize {
        AhHeader::<&[u8]>::icv_offset() + self.suite.integrity.iv_len()
    }

    /// Write the IV GMAC carries (the 64-bit sequence number) into a fresh AH header.
    fn ah_write_iv(&self, ah: &mut [u8], seq: u64) {
        let at = AhHeader::<&[u8]>::icv_offset();
        let n = self.suite.integrity.iv_len();
        ah[at..at + n].copy_from_slice(&seq.to_be_bytes()[..n]);
    }

    pub(crate) fn seal_ah(&mut self, pkt: &mut PacketBuf<'_>) -> Result<(), DropReason> {
        match self.mode {
            Mode::Tunnel => self.seal_ah_tunnel(pkt),
            Mode::Transport => self.seal_ah_transport(pkt),
        }
    }

    /// Open AH. A tunnel-mode SA decapsulates an inner IPv4/IPv6 packet; when AH covers
    /// ESP or IPComp instead (the outer layer of a bundle), or in transport mode, AH is
    /// removed and the IP header kept.
    pub(crate) fn open_ah(&mut self, pkt: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        let loc = ipsec_location(pkt.data(), proto::AH)?;
        let (head, hdr_len) = (pkt.head(), loc.offset);
        let ah_len = {
            let h = AhHeader::new_checked(&pkt.data()[hdr_len..hdr_len + loc.len])?;
            if h.header_len() != self.ah_len(loc.v4) {
                return Err(DropReason::MalformedAh);
            }
            if h.spi() != self.spi {
                return Err(DropReason::UnknownSpi);
            }
            h.header_len()
        };
        let t0 = self.stages.start();
        let (next_header, seq_lo) = {
            let h = AhHeader::new_checked(&pkt.data()[hdr_len..])?;
            (h.next_header(), h.seq())
        };
        let seq = if self.esn {
            self.replay
                .infer_esn(seq_lo)
                .ok_or(DropReason::ReplayTooOld)?
        } else {
            u64::from(seq_lo)
        };
        self.replay.check(seq)?;
        self.stages.stop(Stage::ReplayCheck, t0);
        let raw = pkt.raw();
        let ah_at = head + hdr_len;
        let end = ah_at + loc.len;
        let n = self.suite.integrity.icv_len();
        let icv_at = ah_at + self.ah_icv_offset();
        let mut got = [0u8; MAX_ICV_LEN];
        got[..n].copy_from_slice(&raw[icv_at..icv_at + n]);
        raw[icv_at..icv_at + n].fill(0);
        let want = self.ah_icv(raw, head, ah_at, end, loc.v4, seq, None)?;
        verify_slices_are_equal(&want[..n], &got[..n]).map_err(|_| DropReason::IcvFailure)?;
        let t = self.stages.start();
        self.replay.commit(seq);
        let t = self.stages.stop(Stage::ReplayUpdate, t);
        let payload_at = ah_at + ah_len;
        let payload_len = end - payload_at;
        let tunnel =
            self.mode == Mode::Tunnel && !matches!(next_header, proto::ESP | proto::IPCOMP);
        if tunnel {
            let inner = &raw[payload_at..end];
            let want_version = match next_header {
                proto::IPV4 => 4,
                proto::IPV6 => 6,
                _ => return Err(DropReason::BadNextHeader),
            };
            let p = IpPacket::parse(inner).map_err(|_| DropReason::MalformedInner)?;
            if p.version() != want_version {
                return Err(DropReason::MalformedInner);
            }
            let inner_len = p.packet_len();
            pkt.set(payload_at, inner_len)?;
            self.stages.stop(Stage::Header, t);
        } else {
            // Close the gap AH leaves and point the IP header at the upper layer.
            let new_head = payload_at - hdr_len;
            raw.copy_within(head..head + hdr_len, new_head);
            let t = self.stages.stop(Stage::Copy, t);
            let ip = &mut raw[new_head..payload_at];
            rewrite_ip_header(ip, loc.v4, loc.nh_at, next_header, payload_len);
            pkt.set(new_head, hdr_len + payload_len)?;
            self.stages.stop(Stage::Header, t);
        }
        self.counters.packets += 1;
        self.counters.bytes += payload_len as u64;
        Ok(next_header)
    }

    fn seal_ah_tunnel(&mut self, pkt: &mut PacketBuf<'_>) -> Result<(), DropReason> {
        let t = self.tunnel.ok_or(DropReason::NoSa)?;
        let inner = TunnelInner::parse(pkt.data())?;
        let v4 = t.dst.is_ipv4();
        let (outer_len, ah_len) = (outer_header_len(t.dst), self.ah_len(v4));
        let head = pkt.head();
        if head < outer_len + ah_len {
            return Err(DropReason::NoRoom);
        }
        let total = outer_len + ah_len + inner.len;
        if total > MAX_PACKET {
            return Err(DropReason::TooBig);
        }
        let t = self.stages.start();
        let seq = self.take_seq()?;
        let (outer_at, ah_at) = (head - outer_len - ah_len, head - ah_len);
        let meta = TunnelInner {
            next_header: proto::AH,
            len: ah_len + inner.len,
            ..inner
        };
        let raw = pkt.raw();
        self.emit_outer(&mut raw[outer_at..ah_at], &meta)?;
        let ah = AhRepr {
            next_header: inner.next_header,
            header_len: ah_len,
            spi: self.spi,
            seq: seq as u32,
        };
        ah.emit(&mut AhHeader::new_unchecked(&mut raw[ah_at..head]));
        self.ah_write_iv(&mut raw[ah_at..head], seq);
        self.stages.stop(Stage::Header, t);
        let end = head + inner.len;
        let icv = self.ah_icv(raw, outer_at, ah_at, end, v4, seq, None)?;
        let n = self.suite.integrity.icv_len();
        let icv_at = ah_at + self.ah_icv_offset();
        raw[icv_at..icv_at + n].copy_from_slice(&icv[..n]);
        self.counters.packets += 1;
        self.counters.bytes += inner.len as u64;
        pkt.set(outer_at, total)
    }

    /// AH inserted after the IP header (transport mode, and the outer layer of a bundle,
    /// where it covers the ESP packet's outer header).
    pub(crate) fn seal_ah_transport(&mut self, pkt: &mut PacketBuf<'_>) -> Result<(), DropReason> {
        let sp = TransportSplit::parse(pkt.data())?;
        let ah_len = self.ah_len(sp.v4);
        let payload_len = sp.pkt_len - sp.hdr_len;
        let head = pkt.head();
        if head < ah_len {
            return Err(DropReason::NoRoom);
        }
        if sp.pkt_len + ah_len > MAX_PACKET {
            return Err(DropReason::TooBig);
        }
        // The header as the receiver will see it, zeroed for the ICV: built (and checked)
        // before anything moves, so a refused packet is left as it came.
        let mut scratch = [0u8; MAX_AH_IP_HEADER];
        let zeroed = zeroed_headers(&pkt.data()[..sp.hdr_len], sp.v4, &mut scratch)?;
        // An IPv4 identification of 0 with DF clear is one Linux replaces when the packet
        // goes out (`Sa::next_ip_id`), after the ICV covered it: the packet gets one first.
        let unnumbered = sp.v4 && {
            let h = Ipv4Header::new_unchecked(pkt.data());
            h.ident() == 0 && h.flags_frag() & IPV4_DF == 0
        };
        let new_id = unnumbered.then(|| self.next_ip_id());
        if let Some(id) = new_id {
            Ipv4Header::new_unchecked(&mut *zeroed).set_ident(id);
        }
        rewrite_ip_header(zeroed, sp.v4, sp.nh_at, proto::AH, ah_len + payload_len);
        if sp.v4 {
            zeroed[v4::CHECKSUM].fill(0); // the checksum rewrite_ip_header filled in
        }
        let seq = self.take_seq()?;
        let new_head = head - ah_len;
        let ah_at = new_head + sp.hdr_len;
        let raw = pkt.raw();
        let t = self.stages.start();
        raw.copy_within(head..head + sp.hdr_len, new_head);
        let t = self.stages.stop(Stage::Copy, t);
        let ah = AhRepr {
            next_header: sp.next_header,
            header_len: ah_len,
            spi: self.spi,
            seq: seq as u32,
        };
        ah.emit(&mut AhHeader::new_unchecked(
            &mut raw[ah_at..ah_at + ah_len],
        ));
        self.ah_write_iv(&mut raw[ah_at..ah_at + ah_len], seq);
        let ip = &mut raw[new_head..ah_at];
        if let Some(id) = new_id {
            Ipv4Header::new_unchecked(&mut *ip).set_ident(id);
        }
        rewrite_ip_header(ip, sp.v4, sp.nh_at, proto::AH, ah_len + payload_len);
        self.stages.stop(Stage::Header, t);
        let end = ah_at + ah_len + payload_len;
        let icv = self.ah_icv(raw, new_head, ah_at, end, sp.v4, seq, Some(zeroed))?;
        let n = self.suite.integrity.icv_len();
        let icv_at = ah_at + self.ah_icv_offset();
        raw[icv_at..icv_at + n].copy_from_slice(&icv[..n]);
        self.counters.packets += 1;
        self.counters.bytes += payload_len as u64;
        pkt.set(new_head, sp.hdr_len + ah_len + payload_len)
    }

    /// The untruncated ICV over `raw[ip_at..end]`, whose AH header at `ah_at` has a zero
    /// ICV field. `zeroed` is the IP header region already zeroed, if the caller has it.
    /// GMAC takes its AAD in one piece, so for it the zeroed header is laid over the real
    /// one (and, with ESN, the high half of the sequence number after the payload, in the
    /// buffer's tailroom) while the tag is computed, and both are put back after.
    #[allow(clippy::too_many_arguments)]
    fn ah_icv(
        &mut self,
        raw: &mut [u8],
        ip_at: usize,
        ah_at: usize,
        end: usize,
        v4: bool,
        seq: u64,
        zeroed: Option<&mut [u8]>,
    ) -> Result<[u8; 64], DropReason> {
        let t = self.stages.start();
        let mut scratch = [0u8; MAX_AH_IP_HEADER];
        let hdr: &[u8] = match zeroed {
            Some(z) => z,
            None => zeroed_headers(&raw[ip_at..ah_at], v4, &mut scratch)?,
        };
        let t = self.stages.stop(Stage::Header, t);
        let mut out = [0u8; 64];
        if self.suite.integrity.is_gmac() {
            let tag = self.ah_gmac(raw, ip_at, ah_at, end, hdr, seq)?;
            out[..16].copy_from_slice(&tag);
        } else {
            let icv = self
                .keys
                .icv_over(&[hdr, &raw[ah_at..end]], seq, self.esn)
                .ok_or(DropReason::CryptoError)?;
            out[..icv.as_ref().len()].copy_from_slice(icv.as_ref());
        }
        self.stages.stop(Stage::Mac, t);
        Ok(out)
    }

    /// RFC 4543 §4 with RFC 4302 §3.3.3: the GMAC tag over `zeroed_hdr ‖ raw[ah_at..end]`
    /// (‖ the sequence number's high half with ESN, RFC 4302 §2.5.1).
    fn ah_gmac(
        &self,
        raw: &mut [u8],
        ip_at: usize,
        ah_at: usize,
        end: usize,
        zeroed_hdr: &[u8],
        seq: u64,
    ) -> Result<[u8; 16], DropReason> {
        let hi_len = if self.esn { 4 } else { 0 };
        let iv_at = ah_at + AhHeader::<&[u8]>::icv_offset();
        let iv: [u8; 8] = raw[iv_at..iv_at + 8].try_into().unwrap();
        let hi = ((seq >> 32) as u32).to_be_bytes();
        if raw.len() < end + hi_len {
            // No tailroom for the ESN half (a caller's exact-size buffer): lay the AAD out
            // in a copy. The gateway's buffers always have room, so this stays off its path.
            let mut aad = Vec::with_capacity(end - ip_at + 4);
            aad.extend_from_slice(zeroed_hdr);
            aad.extend_from_slice(&raw[ah_at..end]);
            aad.extend_from_slice(&hi);
            return self.keys.ah_gmac(&iv, &aad).ok_or(DropReason::CryptoError);
        }
        let hl = ah_at - ip_at;
        let mut saved = [0u8; MAX_AH_IP_HEADER];
        saved[..hl].copy_from_slice(&raw[ip_at..ah_at]);
        raw[ip_at..ah_at].copy_from_slice(zeroed_hdr);
        let mut tail = [0u8; 4];
        tail[..hi_len].copy_from_slice(&raw[end..end + hi_len]);
        raw[end..end + hi_len].copy_from_slice(&hi[..hi_len]);
        let tag = self.keys.ah_gmac(&iv, &raw[ip_at..end + hi_len]);
        raw[end..end + hi_len].copy_from_slice(&tail[..hi_len]);
        raw[ip_at..ah_at].copy_from_slice(&saved[..hl]);
        tag.ok_or(DropReason::CryptoError)
    }
}

/// Copy the IP header region (IPv4 header with options, or IPv6 header with the
/// extension headers before AH) into `scratch` and zero what may change in transit,
/// RFC 4302 §3.3.3.1. Returns the zeroed copy.
pub fn zeroed_headers<'s>(
    hdr: &[u8],
    v4: bool,
    scratch: &'s mut [u8; MAX_AH_IP_HEADER],
) -> Result<&'s mut [u8], DropReason> {
    if hdr.len() > MAX_AH_IP_HEADER {
        return Err(DropReason::UnsupportedHeader);
    }
    let h = &mut scratch[..hdr.len()];
    h.copy_from_slice(hdr);
    if v4 {
        zero_ipv4(h)?;
    } else {
        zero_ipv6(h)?;
    }
    Ok(h)
}

/// §3.3.3.1.1: DSCP/ECN, flags and fragment offset, TTL and checksum are mutable;
/// options other than the immutable ones are zeroed whole (§3.3.3.1.1.2).
fn zero_ipv4(h: &mut [u8]) -> Result<(), DropReason> {
    if h.len() < IPV4_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    h[v4::TOS] = 0;
    h[v4::FLAGS_FRAG].fill(0);
    h[v4::TTL] = 0;
    h[v4::CHECKSUM].fill(0);
    let mut i = IPV4_HEADER_LEN;
    while i < h.len() {
        let kind = h[i + opt::TYPE];
        match kind {
            0 => break, // end of option list; what follows is padding
            1 => i += 1,
            _ => {
                let len = usize::from(*h.get(i + opt::LEN).ok_or(DropReason::MalformedIp)?);
                if len < 2 || i + len > h.len() {
                    return Err(DropReason::MalformedIp);
                }
                if !IMMUTABLE_IPV4_OPTIONS.contains(&(kind & 0x1f)) {
                    h[i..i + len].fill(0);
                }
                i += len;
            }
        }
    }
    Ok(())
}

/// §3.3.3.1.2: traffic class, flow label and hop limit are mutable; in hop-by-hop and
/// destination options, the data of options whose type has the "may change" bit (0x20,
/// RFC 8200 §4.2) is zeroed. A routing header is covered as it will arrive only when it
/// has no segments left; otherwise the sender would have to predict it (not supported).
fn zero_ipv6(h: &mut [u8]) -> Result<(), DropReason> {
    if h.len() < IPV6_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    // version stays; traffic class and flow label go
    let w = u32::from_be_bytes(h[v6::VER_TC_FLOW].try_into().unwrap()) & 0xf000_0000;
    h[v6::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    h[v6::HOP_LIMIT] = 0;
    let mut nh = h[v6::NEXT_HEADER];
    let mut off = IPV6_HEADER_LEN;
    while off < h.len() {
        if off + 8 > h.len() {
            return Err(DropReason::MalformedIp);
        }
        let len = ext::len(&h[off..]);
        if off + len > h.len() {
            return Err(DropReason::MalformedIp);
        }
        match nh {
            proto::HOPOPT | proto::IPV6_OPTS => zero_ipv6_options(&mut h[off + 2..off + len])?,
            proto::IPV6_ROUTE if h[off + ext::ROUTING_SEGMENTS_LEFT] == 0 => {}
            proto::IPV6_ROUTE => return Err(DropReason::UnsupportedHeader),
            proto::IPV6_FRAG => return Err(DropReason::Fragment),
            _ => return Err(DropReason::MalformedIp),
        }
        nh = h[off + ext::NEXT_HEADER];
        off += len;
    }
    Ok(())
}

fn zero_ipv6_options(opts: &mut [u8]) -> Result<(), DropReason> {
    let mut i = 0;
    while i < opts.len() {
        let kind = opts[i + opt::TYPE];
        if kind == 0 {
            i += 1; // Pad1
            continue;
        }
        let len = usize::from(*opts.get(i + opt::LEN).ok_or(DropReason::MalformedIp)?);
        if i + 2 + len > opts.len() {
            return Err(DropReason::MalformedIp);
        }
        if kind & 0x20 != 0 {
            opts[i + 2..i + 2 + len].fill(0);
        }
        i += 2 + len;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ah_lengths_follow_the_alignment_rules() {
        // HMAC-SHA1-96 / MD5-96: 24 either way; SHA-256-128: 28 (IPv4) / 32 (IPv6).
        assert_eq!(ah_length(12, true), 24);
        assert_eq!(ah_length(12, false), 24);
        assert_eq!(ah_length(16, true), 28);
        assert_eq!(ah_length(16, false), 32);
        assert_eq!(ah_length(24, false), 40);
        assert_eq!(ah_length(32, true), 44);
        assert_eq!(ah_length(32, false), 48);
    }

    #[test]
    fn ipv4_mutable_fields_and_options_are_zeroed() {
        // TOS 0xb8, DF + offset, TTL 64, checksum, then options: router alert (148,
        // immutable), a timestamp (68, mutable), NOP, EOL.
        let mut h = vec![
            0x48, 0xb8, 0, 40, 0x12, 0x34, 0x40, 0x05, 64, 51, 0xab, 0xcd, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        h.extend([148, 4, 0, 0, 68, 8, 5, 0, 1, 2, 3, 4, 1, 0, 0, 0]);
        h[0] = 0x40 | (h.len() / 4) as u8;
        let mut s = [0u8; MAX_AH_IP_HEADER];
        let z = zeroed_headers(&h, true, &mut s).unwrap().to_vec();
        assert_eq!(z[1], 0);
        assert_eq!(&z[4..6], &[0x12, 0x34]); // identification is immutable
        assert_eq!(&z[6..9], &[0, 0, 0]);
        assert_eq!(&z[10..12], &[0, 0]);
        assert_eq!(&z[12..20], &h[12..20]);
        assert_eq!(&z[20..24], &[148, 4, 0, 0]);
        assert_eq!(&z[24..32], &[0; 8]);
        assert_eq!(&z[32..36], &[1, 0, 0, 0]);
        // A truncated option is a named drop.
        let mut bad = h[..20].to_vec();
        bad.extend([68, 12, 0, 0]);
        assert_eq!(
            zeroed_headers(&bad, true, &mut s).unwrap_err(),
            DropReason::MalformedIp
        );
    }

    #[test]
    fn ipv6_mutable_fields_and_options_are_zeroed() {
        let mut h = vec![0u8; 40];
        h[0] = 0x6a; // version 6, traffic class 0xab, flow label 0xcdef5
        h[1] = 0xbc;
        h[2] = 0xde;
        h[3] = 0xf5;
        h[6] = proto::IPV6_OPTS;
        h[7] = 64;
        // Destination options: an option with the change bit (0x3e), one without (0x1e),
        // then Pad1.
        h.extend([51, 0, 0x3e, 1, 0xaa, 0x1e, 1, 0xbb]);
        let mut s = [0u8; MAX_AH_IP_HEADER];
        let z = zeroed_headers(&h, false, &mut s).unwrap().to_vec();
        assert_eq!(&z[..4], &[0x60, 0, 0, 0]);
        assert_eq!(z[7], 0);
        assert_eq!(&z[40..], &[51, 0, 0x3e, 1, 0, 0x1e, 1, 0xbb]);
        // A routing header with segments left cannot be predicted: unsupported.
        let mut r = h[..40].to_vec();
        r[6] = proto::IPV6_ROUTE;
        r.extend([51, 0, 4, 1, 0, 0, 0, 0]);
        assert_eq!(
            zeroed_headers(&r, false, &mut s).unwrap_err(),
            DropReason::UnsupportedHeader
        );
        r[43] = 0;
        assert!(zeroed_headers(&r, false, &mut s).is_ok());
    }
}
