//! Why a direction's engine could not be built from a config, named for the user.

use std::fmt;
use std::io;
use std::path::PathBuf;

use ipsec::sa::Direction;
use ipsec::SaError;

/// Why a direction's engine could not be built from a config — at start, on a reload,
/// or for `--check` — typed as the engine's own `DropReason` is, and named for the user.
#[derive(Debug)]
pub enum BuildError {
    /// The engine refused an SA.
    Sa {
        name: String,
        spi: u32,
        source: SaError,
    },
    /// The sequence state says an outbound SA has used every number it may send.
    SequenceSpent { name: String, spi: u32, used: u64 },
    /// The engine refused a bundle (or its IPComp association).
    Bundle { name: String, source: SaError },
    /// A policy or bundle names an SA or bundle this direction does not have.
    Unknown { what: &'static str, name: String },
    /// The sequence state could not be written: without it a restart would reuse
    /// sequence numbers under the same keys.
    State { path: PathBuf, source: io::Error },
    /// The other direction's sequence state could not be read (a key seen there must
    /// resume above it).
    OtherState(String),
    /// An SA's key numbered packets in the other direction before. Outbound: the peer
    /// sent under it, up to a number this gateway cannot know (what never reached it),
    /// so sealing under it could repeat a (key, sequence number) the peer used. Inbound:
    /// this gateway sealed under it, and a peer sending under it would repeat ours.
    KeyOfOtherDirection {
        name: String,
        spi: u32,
        direction: Direction,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Sa { name, spi, source } => {
                write!(f, "sa {name} (spi 0x{spi:x}): {source}")
            }
            BuildError::SequenceSpent { name, spi, used } => write!(
                f,
                "sa {name} (spi 0x{spi:x}): the sequence state records number {used} used: \
                 none is left to send under these keys (give the SA new keys)"
            ),
            BuildError::Bundle { name, source } => write!(f, "bundle {name}: {source}"),
            BuildError::Unknown { what, name } => {
                write!(f, "no {what} named {name:?} in this direction")
            }
            BuildError::OtherState(why) => write!(f, "{why}"),
            BuildError::KeyOfOtherDirection {
                name,
                spi,
                direction,
            } => {
                let (this, other, why) = match direction {
                    Direction::Out => (
                        "outbound",
                        "inbound",
                        "the peer sent under it, numbers this gateway may never have seen, \
                         and sealing under it could repeat one of them (a nonce used twice)",
                    ),
                    Direction::In => (
                        "inbound",
                        "outbound",
                        "this gateway sealed under it, and a peer sending under it would \
                         repeat the numbers (nonces) it used",
                    ),
                };
                write!(
                    f,
                    "sa {name} (spi 0x{spi:x}): the {other} sequence state records a key of \
                     this {this} SA: {why}; give the SA new keys"
                )
            }
            BuildError::State { path, source } => write!(
                f,
                "cannot write the sequence state {}: {source} (without it a restart would \
                 reuse sequence numbers under the same keys; refusing to run)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for BuildError {}
