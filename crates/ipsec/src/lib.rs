//! The ipsec-lab IPsec core: ESP (RFC 4303), AH (RFC 4302) and IPComp (RFC 3173) with
//! today's algorithms (and, on SAs marked legacy, yesterday's), anti-replay, the SPD and
//! the SAD — I/O-free.
//!
//! Nothing here opens a socket, starts a thread, reads a clock or talks to Python:
//! the caller owns buffers and I/O, and every transform returns what happened
//! (sealed, opened, bypassed) or a [`DropReason`] reason. That is what lets the same
//! engine serve the gateway daemon, the Python bindings, the benchmark and the
//! fuzzer.
//!
//! Buffers: a packet lives in a caller-owned `&mut [u8]` with [`HEADROOM`] bytes free
//! in front and [`TAILROOM`] bytes free behind it ([`PacketBuf`]). Sealing grows the
//! packet into that room and opening shrinks it; nothing is allocated per packet.

#![forbid(unsafe_code)]

pub mod buf;
pub mod bundle;
pub mod constants;
pub mod crypto;
pub mod drop;
pub mod engine;
pub mod ipcomp;
pub mod locate;
pub mod replay;
pub mod sa;
pub mod sad;
pub mod spd;
pub mod stage;
pub mod wire;

pub use buf::PacketBuf;
pub use constants::{HEADROOM, MAX_PACKET, TAILROOM};
pub use crypto::job::CryptoJob;
pub use crypto::{Encryption, Integrity, Suite, SuiteError};
pub use drop::{DropCounters, DropReason, Fault};
pub use engine::{Bundle, Engine, Inbound, InboundStart, Outbound};
pub use ipcomp::{Compressed, IpcompConfig, IpcompConfigError, IpcompCounters, IpcompSa};
pub use replay::{BadWindowSize, ReplayWindow};
pub use sa::{ah, esp};
pub use sa::{
    BundleError, Direction, Mode, Protocol, Sa, SaConfig, SaCounters, SaError, TunnelEndpoints,
};
pub use sad::{Sad, SadKey};
pub use spd::{Action, Selector, Spd, SpdRule};
pub use stage::{Clock, Stage, StageTimes};
