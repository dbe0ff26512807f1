//! Every reason the engine refuses a packet, as one enum.
//!
//! Grouped by whose fault it is (as rustls groups its errors): the peer sent
//! something malformed, a policy refused it, or the caller misused the API.
//! A refusal is never a panic: each is a named drop, counted per SA where there is
//! one ([`DropCounters`]) and per engine otherwise.

use core::fmt;

macro_rules! drops {
    ($( $(#[$m:meta])* $name:ident = $label:literal ),* $(,)?) => {
        /// Why a packet was refused. See the module docs.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[repr(u8)]
        pub enum DropReason { $( $(#[$m])* $name ),* }

        impl DropReason {
            /// Every reason, in counter order.
            pub const ALL: &'static [DropReason] = &[ $( DropReason::$name ),* ];
            /// Number of reasons (the length of a counter array).
            pub const COUNT: usize = DropReason::ALL.len();
            /// The stable snake_case name used in counters, JSON and logs.
            pub fn label(self) -> &'static str {
                match self { $( DropReason::$name => $label ),* }
            }
        }
    };
}

drops! {
    // --- malformed input (the peer's or the network's fault) ---
    /// Shorter than its headers, or a length field points past the end.
    Truncated = "truncated",
    /// Not IPv4 or IPv6, bad IHL, or a length field that contradicts the buffer.
    MalformedIp = "malformed_ip",
    /// ESP ciphertext not a whole number of cipher blocks / 4-byte words.
    BadCiphertextLength = "bad_ciphertext_length",
    /// The padding bytes are not 1, 2, 3, … or the pad length exceeds the payload (RFC 4303 §2.4).
    BadPadding = "bad_padding",
    /// Decrypted next header is not allowed for this SA's mode.
    BadNextHeader = "bad_next_header",
    /// Tunnel mode: the decrypted inner packet is not a valid IP packet.
    MalformedInner = "malformed_inner",
    /// An IP fragment where a whole packet is needed (reassembly is not supported).
    Fragment = "fragment",
    /// AH header length is shorter than its fixed part or not the length this SA's
    /// integrity algorithm gives (RFC 4302 §2.2).
    MalformedAh = "malformed_ah",
    /// Headers AH cannot cover here: an IPv6 routing header with segments left, or
    /// IP + extension headers longer than 512 bytes before AH.
    UnsupportedHeader = "unsupported_header",
    /// IPComp: the DEFLATE data is not a valid stream.
    BadCompressedData = "bad_compressed_data",
    /// IPComp: the decompressed payload would exceed 65,535 bytes (a decompression bomb).
    DecompressedTooBig = "decompressed_too_big",
    // --- authentication and replay ---
    /// No SA for this SPI / destination / protocol.
    UnknownSpi = "unknown_spi",
    /// ICV or AEAD tag did not verify.
    IcvFailure = "icv_failure",
    /// Sequence number already received (RFC 4303 §3.4.3).
    Replay = "replay",
    /// Sequence number left of the anti-replay window (RFC 4303 §3.4.3).
    ReplayTooOld = "replay_too_old",
    /// Sequence number 0 is never sent (RFC 4303 §3.3.3: the first packet is 1).
    ZeroSequence = "zero_sequence",
    /// TFC dummy packet (next header 59, RFC 4303 §2.6): discarded by design.
    DummyPacket = "dummy_packet",
    // --- policy ---
    /// The SPD says discard.
    PolicyDiscard = "policy_discard",
    /// A protect policy matched but its SA is missing or unusable: fail closed.
    NoSa = "no_sa",
    /// Inbound: the packet (clear or decrypted) does not match the policy for this SA.
    PolicyMismatch = "policy_mismatch",
    /// Inbound: the layers a packet came through are not its SA bundle's (one missing,
    /// one extra, or in the wrong order).
    BundleMismatch = "bundle_mismatch",
    /// Outbound: the SA's sequence number space is used up; it must be rekeyed (RFC 4303 §3.3.3).
    SequenceExhausted = "sequence_exhausted",
    // --- caller misuse ---
    /// Not enough headroom or tailroom in the caller's buffer.
    NoRoom = "no_room",
    /// The sealed packet would exceed 65,535 bytes.
    TooBig = "too_big",
    /// A fixed IV of the wrong length was supplied (known-answer tests only).
    BadIv = "bad_iv",
    /// The crypto library refused an operation that should not fail.
    CryptoError = "crypto_error",
}

impl DropReason {
    /// Whose fault a drop is: `"malformed"`, `"auth"`, `"policy"` or `"caller"`.
    pub fn class(self) -> &'static str {
        use DropReason as D;
        match self {
            D::Truncated
            | D::MalformedIp
            | D::BadCiphertextLength
            | D::BadPadding
            | D::BadNextHeader
            | D::MalformedInner
            | D::Fragment
            | D::MalformedAh
            | D::UnsupportedHeader
            | D::BadCompressedData
            | D::DecompressedTooBig => "malformed",
            D::UnknownSpi
            | D::IcvFailure
            | D::Replay
            | D::ReplayTooOld
            | D::ZeroSequence
            | D::DummyPacket => "auth",
            D::PolicyDiscard
            | D::NoSa
            | D::PolicyMismatch
            | D::BundleMismatch
            | D::SequenceExhausted => "policy",
            D::NoRoom | D::TooBig | D::BadIv | D::CryptoError => "caller",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl std::error::Error for DropReason {}

/// One counter per [`DropReason`] reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DropCounters([u64; DropReason::COUNT]);

impl DropCounters {
    pub fn count(&mut self, d: DropReason) {
        self.0[d as usize] += 1;
    }
    pub fn get(&self, d: DropReason) -> u64 {
        self.0[d as usize]
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// Non-zero counters as (label, count).
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|d| (d.label(), self.get(*d)))
            .filter(|(_, n)| *n > 0)
    }
}
