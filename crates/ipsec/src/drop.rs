//! Every reason the engine refuses a packet, as one enum.
//!
//! Each carries whose fault it is ([`Fault`], as rustls sorts its errors): the peer (or
//! the network) sent something malformed, unauthenticated or replayed, a policy refused
//! it, the caller misused the API, or something that cannot fail did (internal).
//! A refusal is never a panic: each is a named drop, counted per SA where there is
//! one ([`DropCounters`]) and per engine otherwise.

use core::fmt;

/// Whose doing a drop is: what an operator (or the lab) does about it differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The peer or the network: malformed, unauthenticated, replayed or unknown input.
    Peer,
    /// What the SPD and the SAs' state say: discard, no usable SA, a mismatch, a
    /// sequence space used up.
    Policy,
    /// The engine's caller: a buffer without room, a packet too big, a wrong fixed IV.
    Caller,
    /// What should not fail did (the crypto library refused an operation): a bug.
    Internal,
}

impl Fault {
    /// The stable snake_case name (`"peer"`, `"policy"`, `"caller"`, `"internal"`).
    pub fn label(self) -> &'static str {
        match self {
            Fault::Peer => "peer",
            Fault::Policy => "policy",
            Fault::Caller => "caller",
            Fault::Internal => "internal",
        }
    }
}

macro_rules! drops {
    ($( $(#[$m:meta])* $name:ident = $label:literal => $fault:ident ),* $(,)?) => {
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
            /// Whose fault the drop is.
            pub fn class(self) -> Fault {
                match self { $( DropReason::$name => Fault::$fault ),* }
            }
        }
    };
}

drops! {
    // --- malformed input (the peer's or the network's fault) ---
    /// Shorter than its headers, or a length field points past the end.
    Truncated = "truncated" => Peer,
    /// Not IPv4 or IPv6, bad IHL, or a length field that contradicts the buffer.
    MalformedIp = "malformed_ip" => Peer,
    /// ESP ciphertext not a whole number of cipher blocks / 4-byte words.
    BadCiphertextLength = "bad_ciphertext_length" => Peer,
    /// The padding bytes are not 1, 2, 3, … or the pad length exceeds the payload (RFC 4303 §2.4).
    BadPadding = "bad_padding" => Peer,
    /// Decrypted next header is not allowed for this SA's mode.
    BadNextHeader = "bad_next_header" => Peer,
    /// Tunnel mode: the decrypted inner packet is not a valid IP packet.
    MalformedInner = "malformed_inner" => Peer,
    /// An IP fragment where a whole packet is needed (reassembly is not supported).
    Fragment = "fragment" => Peer,
    /// AH header length is shorter than its fixed part or not the length this SA's
    /// integrity algorithm gives (RFC 4302 §2.2).
    MalformedAh = "malformed_ah" => Peer,
    /// Headers AH cannot cover here: an IPv6 routing header with segments left, or
    /// IP + extension headers longer than 512 bytes before AH.
    UnsupportedHeader = "unsupported_header" => Peer,
    /// IPComp: the DEFLATE data is not a valid stream.
    BadCompressedData = "bad_compressed_data" => Peer,
    /// IPComp: the decompressed payload would exceed 65,535 bytes (a decompression bomb).
    DecompressedTooBig = "decompressed_too_big" => Peer,
    // --- authentication and replay ---
    /// No SA for this SPI / destination / protocol.
    UnknownSpi = "unknown_spi" => Peer,
    /// ICV or AEAD tag did not verify.
    IcvFailure = "icv_failure" => Peer,
    /// Sequence number already received (RFC 4303 §3.4.3).
    Replay = "replay" => Peer,
    /// Sequence number left of the anti-replay window (RFC 4303 §3.4.3).
    ReplayTooOld = "replay_too_old" => Peer,
    /// Sequence number 0 is never sent (RFC 4303 §3.3.3: the first packet is 1).
    ZeroSequence = "zero_sequence" => Peer,
    /// TFC dummy packet (next header 59, RFC 4303 §2.6): discarded by design.
    DummyPacket = "dummy_packet" => Peer,
    // --- policy ---
    /// The SPD says discard.
    PolicyDiscard = "policy_discard" => Policy,
    /// A protect policy matched but its SA is missing or unusable: fail closed.
    NoSa = "no_sa" => Policy,
    /// Inbound: the packet (clear or decrypted) does not match the policy for this SA.
    PolicyMismatch = "policy_mismatch" => Policy,
    /// Inbound: the layers a packet came through are not its SA bundle's (one missing,
    /// one extra, or in the wrong order).
    BundleMismatch = "bundle_mismatch" => Policy,
    /// Outbound: the SA's sequence number space is used up; it must be rekeyed (RFC 4303 §3.3.3).
    SequenceExhausted = "sequence_exhausted" => Policy,
    // --- caller misuse, and what should not fail ---
    /// Not enough headroom or tailroom in the caller's buffer.
    NoRoom = "no_room" => Caller,
    /// The sealed packet would exceed 65,535 bytes.
    TooBig = "too_big" => Caller,
    /// A fixed IV of the wrong length was supplied (known-answer tests only).
    BadIv = "bad_iv" => Caller,
    /// The crypto library refused an operation that should not fail.
    CryptoError = "crypto_error" => Internal,
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

    /// `other`'s counts added to these, reason by reason.
    pub fn add(&mut self, other: &DropCounters) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_label_and_whose_fault_it_is() {
        let labels: std::collections::HashSet<_> =
            DropReason::ALL.iter().map(|d| d.label()).collect();
        assert_eq!(labels.len(), DropReason::COUNT);
        // "should not fail" is nobody's input: a bug, not the caller's misuse
        assert_eq!(DropReason::CryptoError.class(), Fault::Internal);
        assert_eq!(DropReason::NoRoom.class(), Fault::Caller);
        assert_eq!(DropReason::Replay.class(), Fault::Peer);
        assert_eq!(DropReason::NoSa.class(), Fault::Policy);
        let internal: Vec<_> = DropReason::ALL
            .iter()
            .filter(|d| d.class() == Fault::Internal)
            .collect();
        assert_eq!(internal, [&DropReason::CryptoError]);
    }
}
