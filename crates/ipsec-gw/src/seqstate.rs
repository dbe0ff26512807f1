//! Sequence numbers and replay windows that outlive the process.
//!
//! RFC 4303 §3.3.3: a sender never sends two packets with one sequence number under one
//! SA's keys — and with AES-GCM, ChaCha20-Poly1305 and GMAC the sequence number *is* the
//! nonce (RFC 4106 §3.1, RFC 7634 §2): a repeat exposes the plaintexts' XOR and the
//! authentication key. With manual keys the keys survive a restart, so the numbers must
//! too. Linux's xfrm does not have this problem only because IKE makes fresh keys.
//!
//! One state file per direction (`[gateway] state`, `.out` / `.in` appended), a line per
//! SA the gateway has run, keyed by SPI and a fingerprint of its keys (a SHA-256 of them;
//! the keys themselves are never written):
//!
//! - outbound, the highest number the SA may have used: a **reservation** made ahead of
//!   use, `RESERVE` numbers at a time, written and fsync'd before a packet numbered above
//!   the previous reservation is sealed. A restart resumes above it: a crash skips at
//!   most one block of numbers and never reuses one.
//! - inbound, the highest number accepted, written at most every `PUBLISH_EVERY` (100 ms)
//!   without an fsync (it survives the process, not a power cut: the data path does not
//!   wait for the disk), and durably at a clean stop: a restarted receiver refuses
//!   everything up to it. (A process crash loses the last 100 ms.)
//! - `expired`: the SA reached its hard lifetime. Neither a reload nor a restart revives
//!   it under the same keys.
//!
//! Entries are never pruned: an SA taken out of the config and put back later with the
//! same keys must still resume above what it used.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ipsec::sa::Direction;

/// Sequence numbers reserved per write of the outbound state.
pub const RESERVE: u64 = 1 << 20;

/// Which SA an entry belongs to: its SPI and its keys' fingerprint.
pub type Key = (u32, String);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Outbound: the highest number reserved; inbound: the highest accepted.
    pub value: u64,
    pub expired: bool,
}

/// One direction's state file, in memory and on disk.
#[derive(Debug)]
pub struct SeqState {
    path: PathBuf,
    entries: BTreeMap<Key, Entry>,
}

/// The state file of a direction: `base` with `.out` or `.in` appended.
pub fn path_for(base: &Path, direction: Direction) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(match direction {
        Direction::Out => ".out",
        Direction::In => ".in",
    });
    PathBuf::from(s)
}

/// A fingerprint of an SA's keys (and what they key): the first 16 bytes of a SHA-256,
/// in hex. Enough to tell one key from another, nothing to recover a key from.
pub fn fingerprint(direction: Direction, spi: u32, enc_key: &[u8], integ_key: &[u8]) -> String {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(b"ipsec-gw sequence state v1\0");
    ctx.update(&[u8::from(direction == Direction::Out)]);
    ctx.update(&spi.to_be_bytes());
    ctx.update(&(enc_key.len() as u32).to_be_bytes());
    ctx.update(enc_key);
    ctx.update(integ_key);
    ctx.finish().as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl SeqState {
    /// Read the state at `path` (none yet: empty). A file that does not parse is an
    /// error: guessing would risk reusing numbers.
    pub fn load(path: &Path) -> Result<SeqState, String> {
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(format!(
                    "cannot read the sequence state {}: {e}",
                    path.display()
                ))
            }
        };
        let mut entries = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || {
                format!(
                    "{}:{}: not a sequence state line (SPI FINGERPRINT VALUE [expired]); \
                     move the file away only if every SA in it gets new keys",
                    path.display(),
                    i + 1
                )
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            let (spi, fp, value) = match f.as_slice() {
                [spi, fp, value] | [spi, fp, value, "expired"] => (*spi, *fp, *value),
                _ => return Err(bad()),
            };
            let spi = u32::from_str_radix(spi.trim_start_matches("0x"), 16).map_err(|_| bad())?;
            let value = value.parse::<u64>().map_err(|_| bad())?;
            if fp.len() != 32 || !fp.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            entries.insert(
                (spi, fp.to_string()),
                Entry {
                    value,
                    expired: f.len() == 4,
                },
            );
        }
        Ok(SeqState {
            path: path.to_path_buf(),
            entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &Key) -> Option<Entry> {
        self.entries.get(key).copied()
    }

    pub fn set(&mut self, key: Key, entry: Entry) {
        self.entries.insert(key, entry);
    }

    /// Merge into an SA's entry: its value only ever rises, and once expired it stays
    /// expired (what every write but a clean stop's release does).
    pub fn raise(&mut self, key: &Key, value: u64, expired: bool) {
        let e = self.entries.entry(key.clone()).or_default();
        e.value = e.value.max(value);
        e.expired |= expired;
    }

    /// Write the whole state durably: a temporary file, fsync'd, renamed over the old
    /// one, and the directory fsync'd (so the rename itself survives a power cut).
    pub fn save(&self) -> io::Result<()> {
        self.write(true)
    }

    /// Write the whole state, renamed over the old one, without waiting for the disk: it
    /// survives the process (a crash, `kill -9`), not the machine. For the inbound
    /// highest-accepted numbers written every 100 ms from the data path, where an fsync
    /// (milliseconds, more on a busy disk) would stall the packets behind it.
    pub fn save_quick(&self) -> io::Result<()> {
        self.write(false)
    }

    fn write(&self, durable: bool) -> io::Result<()> {
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir {
            fs::create_dir_all(d)?;
        }
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut text = String::from(
            "# ipsec-gw sequence state: SPI KEY-FINGERPRINT VALUE [expired]; do not edit.\n\
             # Removing it lets manual keys reuse sequence numbers (GCM nonces): give every \
             SA new keys first.\n",
        );
        for ((spi, fp), e) in &self.entries {
            text.push_str(&format!(
                "{spi:08x} {fp} {}{}\n",
                e.value,
                if e.expired { " expired" } else { "" }
            ));
        }
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(text.as_bytes())?;
            if durable {
                f.sync_all()?;
            }
        }
        fs::rename(&tmp, &self.path)?;
        if durable {
            fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ipsec-gw-seq-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d.join("gw.state")
    }

    #[test]
    fn round_trips_and_never_writes_a_key() {
        let p = tmp("rt");
        let key = [0x5au8; 20];
        let fp = fingerprint(Direction::Out, 0x1001, &key, &[]);
        assert_eq!(fp.len(), 32);
        let mut s = SeqState::load(&p).unwrap();
        assert_eq!(s.get(&(0x1001, fp.clone())), None);
        s.set(
            (0x1001, fp.clone()),
            Entry {
                value: 3 * RESERVE,
                expired: false,
            },
        );
        s.set(
            (0x2002, "0".repeat(32)),
            Entry {
                value: 7,
                expired: true,
            },
        );
        s.save().unwrap();
        let text = fs::read_to_string(&p).unwrap();
        assert!(
            !text.contains(&"5a".repeat(4)),
            "a key byte pattern was written"
        );
        let back = SeqState::load(&p).unwrap();
        assert_eq!(back.get(&(0x1001, fp)).unwrap().value, 3 * RESERVE);
        assert!(back.get(&(0x2002, "0".repeat(32))).unwrap().expired);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn a_fingerprint_tells_keys_spis_and_directions_apart() {
        let a = fingerprint(Direction::Out, 0x1001, &[1; 16], &[2; 20]);
        assert_ne!(a, fingerprint(Direction::Out, 0x1001, &[1; 16], &[3; 20]));
        assert_ne!(a, fingerprint(Direction::Out, 0x1002, &[1; 16], &[2; 20]));
        assert_ne!(a, fingerprint(Direction::In, 0x1001, &[1; 16], &[2; 20]));
        assert_eq!(a, fingerprint(Direction::Out, 0x1001, &[1; 16], &[2; 20]));
    }

    #[test]
    fn a_damaged_file_is_refused_not_guessed() {
        let p = tmp("bad");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, "00001001 abc 12\n").unwrap();
        let e = SeqState::load(&p).unwrap_err();
        assert!(
            e.contains("gw.state:1") && e.contains("not a sequence state line"),
            "{e}"
        );
    }

    #[test]
    fn an_unwritable_place_is_an_error() {
        let s = SeqState {
            path: PathBuf::from("/proc/ipsec-gw-cannot-write-here/gw.state.out"),
            entries: BTreeMap::new(),
        };
        assert!(s.save().is_err());
    }
}
