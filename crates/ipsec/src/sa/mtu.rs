//! What fits: the largest inner IP packet an SA (or a bundle) seals into at most a given
//! number of bytes on the wire — the MTU a tunnel offers its hosts so that nothing is
//! fragmented after encapsulation (RFC 4301 §8: PMTU and fragmentation; RFC 4303 §3.3.4
//! notes that fragmenting ESP afterwards costs the receiver a reassembly).
//!
//! Exact in tunnel mode, not a bound: ESP's padding makes `pad + trailer` a multiple of the cipher's
//! alignment (RFC 4303 §2.4), so the largest fitting payload is found by rounding down
//! what remains after the fixed parts to that alignment, less the 2-byte trailer — as
//! Linux's `esp4_get_mtu` / `xfrm_state_mtu` do.

use crate::constants::{ESP_HEADER_LEN, ESP_TRAILER_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN};
use crate::sa::ah::ah_length;
use crate::sa::{Mode, Protocol, SaConfig};

/// UDP header of ESP in UDP (RFC 3948 §2.1).
pub const UDP_ENCAP_LEN: usize = 8;

/// The largest ESP payload `p` with `fixed + roundup(p + 2, align) <= room`, if any.
fn esp_payload(room: usize, fixed: usize, align: usize) -> Option<usize> {
    let left = room.checked_sub(fixed)?;
    (left / align * align).checked_sub(ESP_TRAILER_LEN)
}

impl SaConfig {
    /// The outer header this SA builds in tunnel mode: by its endpoints' family.
    fn outer_header_len(&self) -> usize {
        match self.tunnel {
            Some(t) if t.src.is_ipv6() => IPV6_HEADER_LEN,
            _ => IPV4_HEADER_LEN,
        }
    }

    /// The largest inner IP packet (its whole length, header included) that this
    /// outbound SA turns into an IP packet of at most `wire` bytes; 0 if none fits.
    /// `udp_encap`: ESP in UDP (8 more bytes). In transport mode the inner header
    /// stays in front, and what fits depends on its length: the answer is the least over
    /// every length an IPv4 or IPv6 header (with options or extension headers) can have.
    pub fn largest_inner(&self, wire: usize, udp_encap: bool) -> usize {
        let udp = if udp_encap { UDP_ENCAP_LEN } else { 0 };
        let s = &self.suite;
        match (self.protocol, self.mode) {
            (Protocol::Esp, Mode::Tunnel) => {
                let fixed =
                    self.outer_header_len() + udp + ESP_HEADER_LEN + s.iv_len() + s.icv_len();
                esp_payload(wire, fixed, s.align()).unwrap_or(0)
            }
            // The inner packet's own header stays in front, options and IPv6 extension
            // headers with it (`locate`), and the padding aligns what follows it: every
            // header length there can be (IPv4's 20-60 in steps of 4, IPv6's 40 and 8-byte
            // extension headers) is tried, so the answer fits whatever the packet carries.
            (Protocol::Esp, Mode::Transport) => (IPV4_HEADER_LEN..=60)
                .step_by(4)
                .chain((IPV6_HEADER_LEN..=IPV6_HEADER_LEN + 64).step_by(8))
                .map(|h| {
                    let fixed = h + udp + ESP_HEADER_LEN + s.iv_len() + s.icv_len();
                    esp_payload(wire, fixed, s.align()).map_or(0, |p| h + p)
                })
                .min()
                .unwrap_or(0),
            (Protocol::Ah, Mode::Tunnel) => {
                let ah = ah_length(
                    s.integrity.auth_data_len(),
                    self.outer_header_len() == IPV4_HEADER_LEN,
                );
                wire.saturating_sub(self.outer_header_len() + ah)
            }
            (Protocol::Ah, Mode::Transport) => {
                let ah = ah_length(s.integrity.auth_data_len(), true)
                    .max(ah_length(s.integrity.auth_data_len(), false));
                wire.saturating_sub(ah)
            }
        }
    }
}

/// The largest inner IP packet a bundle (`crate::bundle`: ESP in tunnel mode builds the
/// outer header, AH is inserted after it; IPComp sends a packet it cannot shrink
/// uncompressed, RFC 3173 §2.2, so it never adds) seals into at most `wire` bytes.
pub fn bundle_largest_inner(
    esp: &SaConfig,
    ah: Option<&SaConfig>,
    wire: usize,
    udp_encap: bool,
) -> usize {
    let ah_len = ah.map_or(0, |ah| {
        ah_length(
            ah.suite.integrity.auth_data_len(),
            esp.outer_header_len() == IPV4_HEADER_LEN,
        )
    });
    esp.largest_inner(wire.saturating_sub(ah_len), udp_encap)
}
