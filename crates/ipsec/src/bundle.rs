//! SA bundles (RFC 4301 §4.5): one policy protecting with several SAs, applied outbound in
//! the order IPComp → ESP → AH (RFC 3173 §3: compression before encryption; AH outermost)
//! and undone inbound in reverse, each layer with its own SA, SPI/CPI, counters and replay
//! state.
//!
//! A bundle here is tunnel mode and always has ESP: ESP's SA builds the outer header
//! (around the inner packet, or around what IPComp made of it: ESP next header 108), and
//! AH is inserted after that outer header, covering it and the ESP packet, as Linux and
//! strongSwan put "AH + ESP" on the wire: outer IP | AH | ESP | \[IPComp\] | inner IP.
//! Study 1's "AH + ESP" is `esp: aes128, ah: sha1`; its "IPComp + ESP" is
//! `ipcomp, esp: aes128-sha1`.

use crate::buf::PacketBuf;
use crate::constants::proto;
use crate::crypto::state::IvSource;
use crate::drop::DropReason;
use crate::ipcomp::{Compressed, IpcompSa};
use crate::locate::TunnelInner;
use crate::sa::{BundleError, Mode, Protocol, Sa};
use crate::wire::ip::{IpPacket, PacketInfo};

/// The layers of one bundle, borrowed for one packet.
pub struct Layers<'a> {
    pub ipcomp: Option<&'a mut IpcompSa>,
    pub esp: &'a mut Sa,
    pub ah: Option<&'a mut Sa>,
}

/// Why a set of SAs cannot form a bundle.
pub fn check(esp: &Sa, ah: Option<&Sa>) -> Result<(), BundleError> {
    if esp.protocol() != Protocol::Esp {
        return Err(BundleError::NotEsp(esp.spi()));
    }
    if esp.mode() != Mode::Tunnel {
        return Err(BundleError::EspNotTunnel);
    }
    if let Some(ah) = ah {
        if ah.protocol() != Protocol::Ah {
            return Err(BundleError::NotAh(ah.spi()));
        }
        if ah.direction() != esp.direction() {
            return Err(BundleError::DirectionsDiffer);
        }
    }
    Ok(())
}

impl Layers<'_> {
    /// Seal the inner IP packet in `pkt` through every layer.
    pub fn seal(&mut self, pkt: &mut PacketBuf<'_>, iv: IvSource<'_>) -> Result<(), DropReason> {
        let mut payload = TunnelInner::parse(pkt.data())?;
        let head = pkt.head();
        pkt.set(head, payload.len)?;
        if let Some(c) = self.ipcomp.as_deref_mut() {
            let r = c.compress_payload(pkt.raw(), head, payload.len, payload.next_header);
            if let Compressed::Yes(n) = count_ipcomp(c, r)? {
                payload.next_header = proto::IPCOMP;
                payload.len = n;
                pkt.set(head, n)?;
            }
        }
        let r = self.esp.seal_tunnel_payload(pkt, payload, iv);
        self.esp.count(r)?;
        if let Some(ah) = self.ah.as_deref_mut() {
            let r = ah.seal_ah_transport(pkt);
            ah.count(r)?;
        }
        Ok(())
    }

    /// Open a packet that came through this bundle: AH (if the bundle has it) must be the
    /// outermost layer and cover ESP, ESP must carry the inner packet or IPComp, and IPComp
    /// only if the bundle has it. Anything else is [`DropReason::BundleMismatch`].
    pub fn open(&mut self, pkt: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        let outermost = if self.ah.is_some() {
            proto::AH
        } else {
            proto::ESP
        };
        if PacketInfo::parse(pkt.data())?.protocol != outermost {
            return Err(DropReason::BundleMismatch);
        }
        if let Some(ah) = self.ah.as_deref_mut() {
            let r = ah.open_ah(pkt);
            if ah.count(r)? != proto::ESP {
                // AH verified, but covers something other than the bundle's ESP
                ah.counters.drops.count(DropReason::BundleMismatch);
                return Err(DropReason::BundleMismatch);
            }
        }
        let r = self.esp.open_tunnel(pkt, self.ipcomp.is_some());
        let next_header = self.esp.count(r)?;
        if next_header != proto::IPCOMP {
            return Ok(next_header); // sent uncompressed (too small or incompressible)
        }
        let c = self
            .ipcomp
            .as_deref_mut()
            .ok_or(DropReason::BundleMismatch)?;
        let (head, len) = (pkt.head(), pkt.len());
        let (n, inner_nh) = c.decompress_payload(pkt.raw(), head, len)?;
        let want = match inner_nh {
            proto::IPV4 => 4,
            proto::IPV6 => 6,
            _ => {
                c.counters.drops.count(DropReason::BadNextHeader);
                return Err(DropReason::BadNextHeader);
            }
        };
        let inner = &pkt.raw()[head..head + n];
        let ok = IpPacket::parse(inner)
            .map(|p| p.packet_len() == n && p.version() == want)
            .unwrap_or(false);
        if !ok {
            c.counters.drops.count(DropReason::MalformedInner);
            return Err(DropReason::MalformedInner);
        }
        pkt.set(head, n)?;
        Ok(inner_nh)
    }
}

fn count_ipcomp<T>(c: &mut IpcompSa, r: Result<T, DropReason>) -> Result<T, DropReason> {
    if let Err(d) = r {
        c.counters.drops.count(d);
    }
    r
}
