//! Numbers fixed by specifications, kept apart from tuning knobs (which live with
//! the code they tune, e.g. [`crate::replay::DEFAULT_WINDOW`]).

/// IP protocol numbers (IANA "Assigned Internet Protocol Numbers").
pub mod proto {
    pub const HOPOPT: u8 = 0;
    pub const ICMP: u8 = 1;
    pub const IPV4: u8 = 4; // IP-in-IP: ESP next header for an IPv4 inner packet (tunnel mode)
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const IPV6: u8 = 41; // ESP next header for an IPv6 inner packet (tunnel mode)
    pub const IPV6_ROUTE: u8 = 43;
    pub const IPV6_FRAG: u8 = 44;
    pub const ESP: u8 = 50;
    pub const AH: u8 = 51;
    pub const IPCOMP: u8 = 108;
    pub const ICMPV6: u8 = 58;
    /// RFC 4303 §2.6: "no next header" marks a TFC dummy packet, to be discarded.
    pub const NO_NEXT_HEADER: u8 = 59;
    pub const IPV6_OPTS: u8 = 60;
}

/// RFC 3948 §2 / RFC 7296 §2.23: UDP port for ESP in UDP (and IKE behind NAT).
pub const NAT_T_PORT: u16 = 4500;

pub const IPV4_HEADER_LEN: usize = 20;
pub const IPV6_HEADER_LEN: usize = 40;
/// RFC 4303 §2: SPI (4) + sequence number (4).
pub const ESP_HEADER_LEN: usize = 8;
/// RFC 3173 §2.2: next header, flags, CPI.
pub const IPCOMP_HEADER_LEN: usize = 4;
/// RFC 4302 §2: next header, payload length, reserved, SPI, sequence number.
pub const AH_FIXED_LEN: usize = 12;
/// RFC 4303 §2: pad length (1) + next header (1).
pub const ESP_TRAILER_LEN: usize = 2;
/// RFC 4303 §2.4: the ciphertext (padding included) ends on a 4-byte boundary.
pub const ESP_MIN_ALIGN: usize = 4;
/// Longest IV any supported suite carries (AES-CBC, RFC 3602 §3).
pub const MAX_IV_LEN: usize = 16;
/// Longest ICV any supported suite appends (HMAC-SHA-512-256, RFC 4868 §2.3).
pub const MAX_ICV_LEN: usize = 32;
/// Longest padding: block 16 minus one (RFC 4303 §2.4 allows up to 255, we emit the minimum).
pub const MAX_PAD_LEN: usize = 15;

/// Room a caller leaves in front of a packet: the largest outer header (IPv6, 40) +
/// ESP header (8) + IV (16), rounded up to leave space for the AH/IPComp layers that
/// bundles add later.
pub const HEADROOM: usize = 128;
/// Room a caller leaves behind a packet: padding (15) + trailer (2) + ICV (32), rounded up.
pub const TAILROOM: usize = 64;
/// Largest IP packet (IPv4 total length / IPv6 payload length are 16-bit).
pub const MAX_PACKET: usize = 65_535;
