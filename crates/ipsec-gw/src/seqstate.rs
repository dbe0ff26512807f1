//! Sequence numbers and replay windows that outlive the process.
//!
//! RFC 4303 §3.3.3: a sender never sends two packets with one sequence number under one
//! SA's keys — and with AES-GCM, ChaCha20-Poly1305 and GMAC the sequence number *is* the
//! nonce (RFC 4106 §3.1, RFC 4543 §3, RFC 7634 §2: salt ‖ IV, the SPI is not in it): a
//! repeat exposes the plaintexts' XOR and the authentication key. With manual keys the
//! keys survive a restart, so the numbers must too. Linux's xfrm does not have this
//! problem only because IKE makes fresh keys.
//!
//! **The state follows each key, not the SPI, the direction or the field holding it.**
//! An SA's numbers live under one entry per secret its keys hold ([`keys_of`]: a SHA-256
//! fingerprint of the key with its salt; the keys themselves are never written) — ESP's
//! AES-GCM `enc_key` and the same bytes as AH's AES-GMAC `integ_key` are one entry. A key
//! seen before — under another SPI, after a reload took its SA away and another brought
//! it back, in the other direction, or by another protocol — resumes above everything
//! ever sent or accepted under it (the gateway reads both directions' files:
//! [`highest`]). `config` refuses a key that serves two SAs in one config, and the
//! engine's build a key the other direction's file records (one sender per key).
//!
//! One state per direction (`[gateway] state`, `.out` / `.in` appended), a line per key
//! the gateway has run:
//!
//! - outbound, the highest number the SA may have used: a **reservation** made ahead of
//!   use, `RESERVE` numbers at a time, written and fsync'd before a packet numbered above
//!   the previous reservation is sealed. A restart resumes above it: a crash skips at
//!   most one block of numbers and never reuses one.
//! - inbound, a **reservation** too: before a packet numbered above it is handed on
//!   (after its ICV verified), the highest number accepted plus a block is written —
//!   the block following the SA's rate (1 at a few packets a second, doubling while
//!   writes come closer than 10 ms, up to `RESERVE_IN`) and, with many SAs, the state's
//!   (`IN_WRITES_PER_S`: up to 10 s of the SA's own traffic), without an fsync (the data path
//!   does not wait for the disk): it survives a crash of the process (`kill -9`), and a
//!   power cut once the kernel has written it back (its dirty-page expiry, 30 s by
//!   default: a power cut sooner may lose it). A restart refuses everything up to it:
//!   nothing accepted before the crash is accepted again, and about 10 ms of the
//!   traffic that came after (at most `RESERVE_IN` packets per SA, none at a few packets
//!   a second) is refused as replays (counted as `replay` or `too_old`). A clean stop
//!   writes the highest number accepted instead, durably: a clean restart refuses
//!   nothing new.
//! - `expired`: the SA reached its hard lifetime. Neither a reload nor a restart revives
//!   it under the same keys.
//!
//! **On disk: two slots, written in turn, in place.** A direction's state is two files,
//! `X.out` and `X.out.b`, opened (and the pair locked, `X.lock`, `flock`) once at start,
//! before the gateway gives up root: it then writes them through the descriptors it
//! holds, needing no right to the directory. Each write goes to the slot *not* holding
//! the newest generation, with a header naming the direction, a generation number, the
//! entry count and a SHA-256 of the entries. A load takes the valid slot of the highest
//! generation. When the other slot is not the generation just before it (missing,
//! damaged, cut short — a write torn by a power cut, or a file someone truncated), a newer
//! write may be lost: every reservation then goes up by one more block (`RESERVE` out,
//! `RESERVE_IN` in), which covers it (an outbound reservation never grows by more per
//! write; an inbound one can, when the peer's numbers jump, and the span past the block
//! is the power cut's loss the docs state), and the gateway says so. Both
//! slots missing: refused unless the operator says `--init-state` (keys never used
//! before); neither valid: refused.
//!
//! Entries are never pruned: an SA taken out of the config and put back later with the
//! same keys must still resume above what it used.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ipsec::sa::Direction;

use crate::claim::LockError;

/// Sequence numbers reserved per write of the outbound state.
pub const RESERVE: u64 = 1 << 20;

/// The most sequence numbers reserved per write of the inbound state: the most genuine
/// packets per SA a restart after an unclean stop refuses (as `replay` or `too_old`:
/// numbers the receiver may have accepted before the crash). The block per write
/// follows the SA's rate, from 1 up to this, so that writes come about every
/// [`IN_WRITE_GAP`]: at a few packets a second every accepted number is written and a
/// crash refuses none that came after.
pub const RESERVE_IN: u64 = 1 << 12;

/// Inbound writes closer than this double the block reserved per write; further apart
/// than four times it, they halve it.
pub const IN_WRITE_GAP: std::time::Duration = std::time::Duration::from_millis(10);

/// Every write holds every SA's line: with thousands of SAs each writing at its own few
/// packets a second, the state was written per packet and each write cost them all (at
/// 1,024 tunnels, 64-B packets: 0.2 x one tunnel's rate, most of the CPU in `render`).
/// Past this many inbound writes a second (of all SAs together) each write doubles its
/// SA's block whatever the SA's own rate — up to `IN_PRESSURE_SPAN` of the SA's own
/// traffic — so the writes fall back under it; a block halves again only below half of
/// it. A crash then refuses up to that block per SA: at most `IN_PRESSURE_SPAN` of that
/// SA's own traffic (and never more than `RESERVE_IN` packets), whatever the others do.
pub const IN_WRITES_PER_S: u32 = 200;

/// The most of an SA's own traffic its block grows to cover under the state's rate.
pub const IN_PRESSURE_SPAN: std::time::Duration = std::time::Duration::from_secs(10);

/// The next block of an inbound SA's reservation, from its block now, its own last
/// write (None: the first; else the time since and the numbers it accepted since) and
/// the state's writes in the last second.
pub fn next_in_block(
    block: u64,
    own: Option<(std::time::Duration, u64)>,
    writes_per_s: u32,
) -> u64 {
    let double = block.saturating_mul(2).clamp(1, RESERVE_IN);
    let Some((gap, accepted)) = own else {
        return block.max(1);
    };
    if gap < IN_WRITE_GAP {
        return double; // the SA's own rate, as with one SA
    }
    if writes_per_s > IN_WRITES_PER_S {
        // IN_PRESSURE_SPAN of its own traffic at the rate it had since its last write
        let span = u128::from(accepted) * IN_PRESSURE_SPAN.as_nanos() / gap.as_nanos().max(1);
        let cap = u64::try_from(span).unwrap_or(u64::MAX).clamp(1, RESERVE_IN);
        return if block < cap {
            double.min(cap)
        } else {
            (block / 2).max(cap)
        };
    }
    if gap > 4 * IN_WRITE_GAP && writes_per_s < IN_WRITES_PER_S / 2 {
        return (block / 2).max(1);
    }
    block.max(1)
}

/// The writes of one direction's state in the last second or so, for
/// [`next_in_block`]: this window's count and the last whole one's.
#[derive(Debug, Default)]
pub struct WriteRate {
    since: Option<std::time::Instant>,
    this: u32,
    last: u32,
}

impl WriteRate {
    /// A write at `now`.
    pub fn note(&mut self, now: std::time::Instant) {
        match self.since {
            Some(t) if now.duration_since(t) < std::time::Duration::from_secs(1) => {}
            Some(t) if now.duration_since(t) < std::time::Duration::from_secs(2) => {
                (self.since, self.last, self.this) = (Some(now), self.this, 0);
            }
            _ => (self.since, self.last, self.this) = (Some(now), 0, 0),
        }
        self.this = self.this.saturating_add(1);
    }

    /// Writes a second: the larger of this window's so far and the last whole one's.
    pub fn per_s(&self, now: std::time::Instant) -> u32 {
        match self.since {
            Some(t) if now.duration_since(t) < std::time::Duration::from_secs(2) => {
                self.this.max(self.last)
            }
            _ => 0,
        }
    }
}

/// What an entry is found by: the fingerprint of the SA's keys ([`fingerprint`]).
pub type Key = String;

const MAGIC: &str = "ipsec-gw-seqstate";
const VERSION: &str = "v2";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Outbound: the highest number reserved; inbound: the highest accepted.
    pub value: u64,
    pub expired: bool,
}

/// One direction's state, in memory and (when opened for writing) its two slot files.
#[derive(Debug)]
pub struct SeqState {
    /// The first slot's path (`X.out`): how messages name the state.
    path: PathBuf,
    direction: Direction,
    /// The two slots, open for writing; None: read only (the other direction's, a check).
    slots: Option<[File; 2]>,
    /// The newest generation on disk.
    generation: u64,
    entries: BTreeMap<Key, Entry>,
    /// Writes waited for the disk (`save`): what a test counts.
    synced: u64,
}

/// The state file of a direction: `base` with `.out` or `.in` appended (its first slot).
pub fn path_for(base: &Path, direction: Direction) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(match direction {
        Direction::Out => ".out",
        Direction::In => ".in",
    });
    PathBuf::from(s)
}

/// The second slot of the state whose first slot is `path`.
pub fn second_slot(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".b");
    PathBuf::from(s)
}

/// The lock that one gateway holds on a state (`base` + `.lock`) for its whole life.
pub fn lock_path(base: &Path) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

fn dir_word(d: Direction) -> &'static str {
    match d {
        Direction::Out => "out",
        Direction::In => "in",
    }
}

/// A fingerprint of an SA's key material: the first 16 bytes of a SHA-256, in hex.
/// Enough to tell one key from another, nothing to recover a key from. The SPI and the
/// direction are not in it — the nonce is not tied to them either. An SA with no keys at
/// all (ESP with null encryption and integrity) has no nonce to repeat: its entry is its
/// own (SPI and direction).
pub fn fingerprint(direction: Direction, spi: u32, enc_key: &[u8], integ_key: &[u8]) -> Key {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(b"ipsec-gw key material v2\0");
    ctx.update(&(enc_key.len() as u32).to_be_bytes());
    ctx.update(enc_key);
    ctx.update(&(integ_key.len() as u32).to_be_bytes());
    ctx.update(integ_key);
    if enc_key.is_empty() && integ_key.is_empty() {
        ctx.update(&[u8::from(direction == Direction::Out)]);
        ctx.update(&spi.to_be_bytes());
    }
    hex(&ctx.finish().as_ref()[..16])
}

/// The entries an SA's sequence numbers live under: one per secret its keys hold,
/// whichever field, protocol or suite carries it — an AES-GCM `enc_key` of ESP and the
/// same bytes as AH's AES-GMAC `integ_key` are one entry, since their nonces are one
/// (salt ‖ sequence number) — plus, where it differs, the entry of both fields together
/// that earlier versions kept (so a state they wrote still counts). An SA resumes above
/// the highest of them ([`highest`]) and every write raises them all: a key seen before
/// in any SA, field or direction never numbers from below what went under it.
///
/// A secret's entry is [`fingerprint`] of its bytes (salt included) as the only field,
/// which is what earlier versions wrote for ESP's combined modes: their entries stand.
pub fn keys_of(c: &ipsec::sa::SaConfig) -> Vec<Key> {
    let (enc, integ) = (c.enc_key.expose(), c.integ_key.expose());
    let mut keys: Vec<Key> = c
        .secrets()
        .map(|s| fingerprint(c.direction, c.spi, s.material, &[]))
        .collect();
    let both = fingerprint(c.direction, c.spi, enc, integ);
    if !keys.contains(&both) {
        keys.push(both);
    }
    keys
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 * b.len());
    for b in b {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn sha256_hex(b: &[u8]) -> String {
    hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, b).as_ref())
}

/// The text of one slot: comment, header, entries. Every write renders every entry (an
/// inbound one can come per packet at a few packets a second per SA, thousands of SAs):
/// into one buffer sized up front, no allocation per line.
fn render(direction: Direction, generation: u64, entries: &BTreeMap<Key, Entry>) -> String {
    // a line: the fingerprint, a space, up to 20 digits, " expired", the newline
    let mut body = String::with_capacity(entries.len() * 64);
    for (fp, e) in entries {
        body.push_str(fp);
        let _ = write!(body, " {}", e.value);
        body.push_str(if e.expired { " expired\n" } else { "\n" });
    }
    let mut out = format!(
        "# ipsec-gw sequence state: KEY-FINGERPRINT VALUE [expired]; do not edit (the header's \
         checksum covers every line).\n\
         # Removing it lets manual keys reuse sequence numbers (GCM nonces): give every SA new \
         keys first, then start with --init-state.\n\
         {MAGIC} {VERSION} {} generation={generation} entries={} sha256={}\n",
        dir_word(direction),
        entries.len(),
        sha256_hex(body.as_bytes())
    );
    out.push_str(&body);
    out
}

/// Parse one slot's text: its generation and entries, or why it is not a valid slot.
fn parse(text: &str, direction: Direction) -> Result<(u64, BTreeMap<Key, Entry>), String> {
    let mut lines = text.split_inclusive('\n');
    let header = loop {
        match lines.next() {
            None => return Err("empty, or no header line".into()),
            Some(l) if l.starts_with('#') => continue,
            Some(l) => break l,
        }
    };
    let h: Vec<&str> = header.split_whitespace().collect();
    let field = |i: usize, name: &str| -> Result<String, String> {
        h.get(i)
            .and_then(|f| f.strip_prefix(name))
            .and_then(|f| f.strip_prefix('='))
            .map(str::to_string)
            .ok_or_else(|| format!("the header has no {name}= (not a {VERSION} state file)"))
    };
    if h.first() != Some(&MAGIC) || h.get(1) != Some(&VERSION) {
        return Err(format!(
            "no \"{MAGIC} {VERSION}\" header (damaged, or written by another version)"
        ));
    }
    if h.get(2) != Some(&dir_word(direction)) {
        return Err(format!(
            "it is the {} state, not the {} one",
            h.get(2).unwrap_or(&"?"),
            dir_word(direction)
        ));
    }
    let generation = field(3, "generation")?
        .parse::<u64>()
        .map_err(|_| "the generation is not a number".to_string())?;
    let count = field(4, "entries")?
        .parse::<usize>()
        .map_err(|_| "the entry count is not a number".to_string())?;
    let sum = field(5, "sha256")?;
    let body: String = lines.collect();
    if sha256_hex(body.as_bytes()) != sum {
        return Err("its entries do not match the header's checksum (cut short or edited)".into());
    }
    let mut entries = BTreeMap::new();
    for (i, line) in body.lines().enumerate() {
        let bad = || format!("entry {}: not KEY-FINGERPRINT VALUE [expired]", i + 1);
        let f: Vec<&str> = line.split_whitespace().collect();
        let (fp, value, expired) = match f.as_slice() {
            [fp, value] => (*fp, *value, false),
            [fp, value, "expired"] => (*fp, *value, true),
            _ => return Err(bad()),
        };
        if fp.len() != 32 || !fp.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let value = value.parse::<u64>().map_err(|_| bad())?;
        entries.insert(fp.to_string(), Entry { value, expired });
    }
    if entries.len() != count {
        return Err(format!(
            "the header counts {count} entries, the file holds {}",
            entries.len()
        ));
    }
    Ok((generation, entries))
}

/// A slot as found on disk.
enum Slot {
    Missing,
    Bad(String),
    Good(u64, BTreeMap<Key, Entry>),
}

/// One slot as its open file holds it (None: the file does not exist). Read with pread
/// ([`crate::config::read_whole`]): the descriptors a [`Reader`] shares with the writer
/// share an offset, which this never moves.
fn read_slot(f: Option<&File>, direction: Direction) -> Slot {
    let Some(f) = f else {
        return Slot::Missing;
    };
    let text = crate::config::read_whole(f)
        .and_then(|b| String::from_utf8(b.to_vec()).map_err(|_| io::Error::other("not UTF-8")));
    match text {
        Err(e) => Slot::Bad(format!("cannot read it: {e}")),
        Ok(t) if t.is_empty() => Slot::Bad("empty".into()),
        Ok(t) => match parse(&t, direction) {
            Ok((g, e)) => Slot::Good(g, e),
            Err(why) => Slot::Bad(why),
        },
    }
}

/// Open (`O_NOFOLLOW`: never through a symlink) one slot for reading and writing;
/// `create`: make it (0600) when missing. Ok(None): missing and not made.
fn open_slot(path: &Path, create: bool) -> Result<Option<File>, String> {
    let mut o = fs::OpenOptions::new();
    o.read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600);
    match o.open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound && create => o
            .create_new(true)
            .open(path)
            .map(Some)
            .map_err(|e| format!("cannot create the sequence state {}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!(
            "cannot open the sequence state {}: {e}{}",
            path.display(),
            if e.raw_os_error() == Some(libc::ELOOP) {
                " (a symlink: refused)"
            } else {
                ""
            }
        )),
    }
}

impl SeqState {
    /// Open a direction's state for the gateway's life: both slots opened (made, when
    /// `init` and none exists yet), the newest valid one read. Refused, with what to do:
    /// both slots missing without `init`, or neither valid. One slot missing or damaged
    /// is survived safely (see the module's text) and said on stderr.
    pub fn open(path: &Path, direction: Direction, init: bool) -> Result<SeqState, String> {
        let b = second_slot(path);
        let (fa, fb) = (open_slot(path, false)?, open_slot(&b, false)?);
        if fa.is_none() && fb.is_none() && !init {
            return Err(format!(
                "no sequence state at {} (nor {}): without it, manual keys used before \
                 would repeat sequence numbers (GCM nonces). Restore the file, or — only if \
                 every SA's keys are new, never used before — start once with --init-state",
                path.display(),
                b.display()
            ));
        }
        let mut st = SeqState::from_slots(path, direction, [fa.as_ref(), fb.as_ref()])?;
        let fa = match fa {
            Some(f) => f,
            None => open_slot(path, true)?.expect("created"),
        };
        let fb = match fb {
            Some(f) => f,
            None => open_slot(&b, true)?.expect("created"),
        };
        st.slots = Some([fa, fb]);
        if st.generation == 0 {
            // nothing written yet: generation 0 in the first slot, so that the first
            // write (generation 1, the second slot) has its predecessor beside it
            let text = render(direction, 0, &st.entries);
            let f = &st.slots.as_ref().expect("just set")[0];
            f.write_all_at(text.as_bytes(), 0)
                .and_then(|()| f.set_len(text.len() as u64))
                .and_then(|()| f.sync_data())
                .map_err(|e| format!("cannot write the sequence state {}: {e}", path.display()))?;
        }
        Ok(st)
    }

    /// A reader of this state through descriptors of its own (for the other direction's
    /// engine, which reads it on every reload, after the gateway gave up root).
    pub fn reader(&self) -> Result<Reader, String> {
        let slots = self
            .slots
            .as_ref()
            .ok_or_else(|| "the sequence state is not open".to_string())?;
        let dup = |f: &File| {
            f.try_clone()
                .map_err(|e| format!("cannot share {}: {e}", self.path.display()))
        };
        Ok(Reader {
            path: self.path.clone(),
            direction: self.direction,
            slots: [dup(&slots[0])?, dup(&slots[1])?],
        })
    }

    fn from_slots(
        path: &Path,
        direction: Direction,
        files: [Option<&File>; 2],
    ) -> Result<SeqState, String> {
        let paths = [path.to_path_buf(), second_slot(path)];
        let slots: Vec<Slot> = files.iter().map(|f| read_slot(*f, direction)).collect();
        let mut st = SeqState {
            path: path.to_path_buf(),
            direction,
            slots: None,
            generation: 0,
            entries: BTreeMap::new(),
            synced: 0,
        };
        let best = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Good(g, _) => Some((*g, i)),
                _ => None,
            })
            .max();
        let Some((generation, i)) = best else {
            if slots.iter().all(|s| matches!(s, Slot::Missing)) {
                return Ok(st);
            }
            let why: Vec<String> = slots
                .iter()
                .zip(&paths)
                .map(|(s, p)| match s {
                    Slot::Bad(w) => format!("{}: {w}", p.display()),
                    _ => format!("{}: missing", p.display()),
                })
                .collect();
            return Err(format!(
                "the sequence state is not usable ({}); refusing to guess, which could repeat \
                 sequence numbers (GCM nonces). Restore it, or give every SA new keys and \
                 start with --init-state after moving these files away",
                why.join("; ")
            ));
        };
        let Slot::Good(_, entries) = &slots[i] else {
            unreachable!("best is a good slot")
        };
        st.generation = generation;
        st.entries = entries.clone();
        let other_ok = matches!(&slots[1 - i], Slot::Good(g, _) if *g + 1 == generation);
        if !other_ok && generation > 0 {
            let why = match &slots[1 - i] {
                Slot::Missing => "missing".to_string(),
                Slot::Bad(w) => w.clone(),
                Slot::Good(g, _) => format!("generation {g}, not {}", generation - 1),
            };
            let block = match direction {
                Direction::Out => RESERVE,
                Direction::In => RESERVE_IN,
            };
            for e in st.entries.values_mut() {
                e.value = e.value.saturating_add(block);
            }
            eprintln!(
                "ipsec-gw: warning: sequence state {} ({why}): a newer write may be lost; \
                 using {} (generation {generation}), every reservation one block higher to \
                 cover it",
                paths[1 - i].display(),
                paths[i].display(),
            );
        }
        Ok(st)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        self.entries.get(key).copied()
    }

    pub fn set(&mut self, key: Key, entry: Entry) {
        self.entries.insert(key, entry);
    }

    /// Merge into an entry: its value only ever rises, and once expired it stays expired
    /// (what every write but a clean stop's release does).
    pub fn raise(&mut self, key: &str, value: u64, expired: bool) {
        let e = self.entries.entry(key.to_string()).or_default();
        e.value = e.value.max(value);
        e.expired |= expired;
    }

    /// Write the whole state durably: the next generation into the older slot, and
    /// fsync'd before this returns.
    pub fn save(&mut self) -> io::Result<()> {
        self.write(true)
    }

    /// Write the whole state without waiting for the disk: it survives the process (a
    /// crash, `kill -9`), not the machine. For the inbound highest-accepted numbers
    /// written every 100 ms from the data path, where an fsync (milliseconds, more on a
    /// busy disk) would stall the packets behind it.
    pub fn save_quick(&mut self) -> io::Result<()> {
        self.write(false)
    }

    /// How many writes waited for the disk so far.
    pub fn synced(&self) -> u64 {
        self.synced
    }

    /// Whether any of `keys` has an entry here, whatever its value: a key this
    /// direction numbered under (one sender per key: the other direction refuses it).
    pub fn records_any(&self, keys: &[Key]) -> bool {
        keys.iter().any(|k| self.entries.contains_key(k))
    }

    /// Every later write fails, as on a full or failing disk (tests).
    #[cfg(test)]
    pub fn fail_writes(&mut self) {
        self.slots = None;
    }

    fn write(&mut self, durable: bool) -> io::Result<()> {
        let Some(slots) = self.slots.as_ref() else {
            return Err(io::Error::other("the sequence state is open read-only"));
        };
        let generation = self.generation + 1;
        let f = &slots[(generation % 2) as usize];
        let text = render(self.direction, generation, &self.entries);
        f.write_all_at(text.as_bytes(), 0)?;
        f.set_len(text.len() as u64)?;
        if durable {
            f.sync_data()?;
            self.synced += 1;
        }
        self.generation = generation;
        Ok(())
    }
}

/// One direction's state as the other direction reads it: its newest valid slot, now.
#[derive(Debug)]
pub struct Reader {
    path: PathBuf,
    direction: Direction,
    slots: [File; 2],
}

impl Reader {
    pub fn read(&self) -> Result<SeqState, String> {
        let [a, b] = &self.slots;
        SeqState::from_slots(&self.path, self.direction, [Some(a), Some(b)])
    }
}

/// The highest value any state records under any of `keys` ([`keys_of`]): this
/// direction's and the other's (a key seen in either direction, in any SA, never
/// numbers from below what went under it); expired when any of them is.
pub fn highest(mine: Option<&SeqState>, other: Option<&SeqState>, keys: &[Key]) -> Entry {
    let mut out = Entry::default();
    for e in keys
        .iter()
        .flat_map(|k| [mine, other].map(|s| s.and_then(|s| s.get(k))))
        .flatten()
    {
        out.value = out.value.max(e.value);
        out.expired |= e.expired;
    }
    out
}

/// The exclusive lock one gateway holds on its state for its whole life: a second
/// gateway on the same state (two processes writing one file) is refused.
pub fn lock(base: &Path) -> Result<File, LockError> {
    let path = lock_path(base);
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(d)
            .map_err(|e| LockError::Os(format!("cannot create {}: {e}", d.display())))?;
    }
    crate::sys::try_lock_file(&path).map_err(|e| match e {
        Some(why) => LockError::Os(why),
        None => LockError::Held(format!(
            "another ipsec-gw holds the sequence state {} (its lock {}): two gateways \
             must not share one state",
            base.display(),
            path.display()
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state file's path in a directory of its own, removed when the test ends.
    fn tmp() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gw.state.out");
        (d, p)
    }

    fn entry(value: u64) -> Entry {
        Entry {
            value,
            expired: false,
        }
    }

    /// An inbound SA's block: its own rate alone while the state is written less than
    /// IN_WRITES_PER_S times a second (what one SA always had); past that, doubling
    /// whatever its own rate (many SAs) up to IN_PRESSURE_SPAN of its own traffic — a
    /// quiet SA beside busy ones keeps a small block — halving only once the writes are
    /// under half.
    #[test]
    fn the_inbound_block_follows_the_sas_rate_and_the_states() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        let (quiet, busy, calm) = (10, IN_WRITES_PER_S + 1, IN_WRITES_PER_S / 2 - 1);
        // one SA: doubling while its writes come closer than 10 ms, halving past 40
        assert_eq!(next_in_block(1, Some((ms(5), 1)), quiet), 2);
        assert_eq!(next_in_block(8, Some((ms(20), 8)), quiet), 8);
        assert_eq!(next_in_block(8, Some((ms(50), 8)), quiet), 4);
        assert_eq!(next_in_block(1, Some((ms(50), 1)), quiet), 1);
        assert_eq!(
            next_in_block(RESERVE_IN, Some((ms(1), 99)), quiet),
            RESERVE_IN
        );
        assert_eq!(next_in_block(1, None, quiet), 1);
        // many SAs, each a few packets a second: the state's rate doubles them, up to
        // 10 s of the SA's own traffic (here 2 accepted in 500 ms: 40)
        assert_eq!(next_in_block(1, Some((ms(500), 2)), busy), 2);
        assert_eq!(next_in_block(32, Some((ms(500), 2)), busy), 40);
        assert_eq!(next_in_block(40, Some((ms(500), 2)), busy), 40);
        assert_eq!(next_in_block(1, None, busy), 1); // no rate known yet
                                                     // a quiet SA beside busy ones: a packet a second keeps its block at 10
        assert_eq!(next_in_block(10, Some((ms(1000), 1)), busy), 10);
        assert_eq!(next_in_block(64, Some((ms(1000), 1)), busy), 32); // slowed: back down
        assert_eq!(next_in_block(16, Some((ms(1000), 1)), busy), 10);
        assert_eq!(
            next_in_block(RESERVE_IN, Some((ms(50), 1 << 20)), busy),
            RESERVE_IN
        );
        assert_eq!(next_in_block(1, Some((ms(60_000), 0)), busy), 1);
        // between half and the whole rate: held (no halving back into the writes)
        assert_eq!(next_in_block(64, Some((ms(500), 2)), IN_WRITES_PER_S), 64);
        assert_eq!(next_in_block(64, Some((ms(500), 2)), calm), 32);
        assert_eq!(next_in_block(u64::MAX, Some((ms(1), 1)), quiet), RESERVE_IN);
        // the rate: this second's count, or the last whole second's, gone after two
        let t0 = std::time::Instant::now();
        let mut r = WriteRate::default();
        assert_eq!(r.per_s(t0), 0);
        for i in 0..300 {
            r.note(t0 + ms(i));
        }
        assert_eq!(r.per_s(t0 + ms(300)), 300);
        r.note(t0 + ms(1100)); // a new window: the last one's 300 still counts
        assert_eq!(r.per_s(t0 + ms(1200)), 300);
        assert_eq!(r.per_s(t0 + ms(3200)), 0);
        r.note(t0 + ms(5000)); // long quiet: nothing carried over
        assert_eq!(r.per_s(t0 + ms(5001)), 1);
    }

    /// The text a slot holds, byte for byte: the format earlier builds wrote and read
    /// (the header's SHA-256 checked here by `sha256sum`'s answer for the two lines).
    #[test]
    fn a_slot_is_written_as_it_always_was() {
        let mut m = BTreeMap::new();
        m.insert("0".repeat(32), entry(u64::MAX));
        m.insert(
            "a".repeat(32),
            Entry {
                value: 7,
                expired: true,
            },
        );
        let text = render(Direction::In, 3, &m);
        let body = format!(
            "{} {}\n{} 7 expired\n",
            "0".repeat(32),
            u64::MAX,
            "a".repeat(32)
        );
        let (head, rest) = text.rsplit_once("\n0000").unwrap();
        assert_eq!(format!("0000{rest}"), body);
        // printf '%s 18446744073709551615\n%s 7 expired\n' $(printf '0%.0s' {1..32}) \
        //   $(printf 'a%.0s' {1..32}) | sha256sum
        assert!(head.ends_with(
            "ipsec-gw-seqstate v2 in generation=3 entries=2 \
             sha256=70ff22e0e57bd11bea3f21461ab7bcb4ee5f47041e4036b5cec7983c4e062666"
        ));
        assert_eq!(parse(&text, Direction::In).unwrap(), (3, m));
    }

    #[test]
    fn round_trips_and_never_writes_a_key() {
        let (_dir, p) = tmp();
        let key = [0x5au8; 20];
        let fp = fingerprint(Direction::Out, 0x1001, &key, &[]);
        assert_eq!(fp.len(), 32);
        let mut s = SeqState::open(&p, Direction::Out, true).unwrap();
        assert_eq!(s.get(&fp), None);
        s.set(fp.clone(), entry(3 * RESERVE));
        s.set(
            "0".repeat(32),
            Entry {
                value: 7,
                expired: true,
            },
        );
        s.save().unwrap();
        s.save().unwrap(); // both slots written
        drop(s);
        for slot in [p.clone(), second_slot(&p)] {
            let text = fs::read_to_string(&slot).unwrap();
            assert!(!text.contains(&"5a".repeat(4)), "a key byte was written");
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&slot).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let back = SeqState::open(&p, Direction::Out, false).unwrap();
        assert_eq!(back.get(&fp).unwrap().value, 3 * RESERVE);
        assert!(back.get(&"0".repeat(32)).unwrap().expired);
        assert_eq!(back.generation, 2);
    }

    #[test]
    fn the_fingerprint_is_the_keys_not_the_spi_or_direction() {
        let a = fingerprint(Direction::Out, 0x1001, &[1; 20], &[]);
        assert_eq!(a, fingerprint(Direction::Out, 0x3003, &[1; 20], &[]));
        assert_eq!(a, fingerprint(Direction::In, 0x1001, &[1; 20], &[]));
        assert_ne!(a, fingerprint(Direction::Out, 0x1001, &[2; 20], &[]));
        let b = fingerprint(Direction::Out, 0x1001, &[1; 16], &[2; 20]);
        assert_ne!(b, fingerprint(Direction::Out, 0x1001, &[1; 16], &[3; 20]));
        // where the key bytes end and the integrity key's begin is part of it
        assert_ne!(
            fingerprint(Direction::Out, 1, &[1, 2], &[3]),
            fingerprint(Direction::Out, 1, &[1], &[2, 3])
        );
        // no keys at all: nothing to repeat, told apart by SPI and direction
        let n = fingerprint(Direction::Out, 0x1001, &[], &[]);
        assert_ne!(n, fingerprint(Direction::Out, 0x1002, &[], &[]));
        assert_ne!(n, fingerprint(Direction::In, 0x1001, &[], &[]));
    }

    /// The state follows each key, whichever field, protocol or suite holds it: for
    /// every pair of suites and key fields whose material has one length, the same bytes
    /// give the two SAs a common entry (ESP AES-GCM's `enc_key` and AH AES-GMAC's
    /// `integ_key` among them), in either direction and under any SPI; and the entries
    /// earlier versions wrote (both fields together) are among an SA's, so their
    /// numbers still count.
    #[test]
    fn every_sa_holding_a_key_shares_its_entry() {
        use ipsec::crypto::{Encryption, Integrity, SecretBytes, Suite};
        use ipsec::sa::{Protocol, SaConfig};
        let mut suites = Vec::new();
        for e in Encryption::all_names() {
            for i in Integrity::all_names() {
                if let Ok(s) = Suite::from_names(e, i) {
                    let proto = if s.integrity.is_gmac() {
                        Protocol::Ah
                    } else {
                        Protocol::Esp
                    };
                    suites.push((proto, s));
                }
            }
        }
        let material = |n: usize, seed: u8| -> Vec<u8> { (0..n as u8).map(|i| i ^ seed).collect() };
        let sa = |(proto, s): (Protocol, Suite), field: usize, k: &[u8], dir, spi| {
            let (el, il) = (s.encryption.key_len(), s.integrity.key_len());
            let (enc, integ) = if field == 0 {
                (k.to_vec(), material(il, 0x55))
            } else {
                (material(el, 0x66), k.to_vec())
            };
            let mut c = SaConfig::new(spi, s, SecretBytes::new(enc), SecretBytes::new(integ));
            c.protocol = proto;
            c.direction = dir;
            c
        };
        let mut shared = 0;
        for &a in &suites {
            for &b in &suites {
                for fa in 0..2 {
                    for fb in 0..2 {
                        let len = |(_, s): (Protocol, Suite), f| {
                            if f == 0 {
                                s.encryption.key_len()
                            } else {
                                s.integrity.key_len()
                            }
                        };
                        let n = len(a, fa);
                        if n == 0 || n != len(b, fb) {
                            continue;
                        }
                        let k = material(n, 0x11);
                        let ka = keys_of(&sa(a, fa, &k, Direction::Out, 0x1001));
                        let kb = keys_of(&sa(b, fb, &k, Direction::In, 0x2002));
                        assert!(
                            ka.iter().any(|x| kb.contains(x)),
                            "{:?} field {fa} and {:?} field {fb} share no entry",
                            a.1.name(),
                            b.1.name()
                        );
                        shared += 1;
                    }
                }
            }
        }
        assert!(shared > 100, "{shared}");
        // what earlier versions wrote: both fields together
        for &(p, s) in &suites {
            let c = sa(
                (p, s),
                0,
                &material(s.encryption.key_len(), 0x11),
                Direction::Out,
                7,
            );
            let old = fingerprint(c.direction, c.spi, c.enc_key.expose(), c.integ_key.expose());
            assert!(keys_of(&c).contains(&old), "{}", s.name());
        }
        // the pair, by name
        let gcm = Suite::from_names("aes128gcm16", "null").unwrap();
        let gmac = Suite::from_names("null", "aes128gmac").unwrap();
        let k = material(20, 0x42);
        let a = keys_of(&sa((Protocol::Esp, gcm), 0, &k, Direction::Out, 0x1001));
        let b = keys_of(&sa((Protocol::Ah, gmac), 1, &k, Direction::Out, 0x3003));
        assert_eq!(a[0], b[0]);
    }

    #[test]
    fn both_slots_missing_is_refused_without_init() {
        let (_dir, p) = tmp();
        let e = SeqState::open(&p, Direction::Out, false).unwrap_err();
        assert!(
            e.contains("no sequence state") && e.contains("--init-state"),
            "{e}"
        );
        assert!(!p.exists(), "a refused open must not create the file");
        let s = SeqState::open(&p, Direction::Out, true).unwrap();
        assert!(s.entries.is_empty() && p.exists() && second_slot(&p).exists());
    }

    /// Every way one slot can be damaged: cut at a line boundary, emptied, edited, the
    /// other direction's, an old format. With the other slot good too, the state loads
    /// with every reservation one block higher; with both damaged, it is refused.
    #[test]
    fn a_damaged_state_is_refused_or_survived_one_block_higher() {
        let (_dir, p) = tmp();
        let mut s = SeqState::open(&p, Direction::Out, true).unwrap();
        s.set("a".repeat(32), entry(10));
        s.set("b".repeat(32), entry(20));
        s.save().unwrap(); // generation 1 in slot b
        s.raise(&"a".repeat(32), 11, false);
        s.save().unwrap(); // generation 2 in slot a
        drop(s);
        let good = fs::read_to_string(&p).unwrap();
        let cut = good
            .lines()
            .take(good.lines().count() - 1)
            .collect::<Vec<_>>();
        let damages = [
            cut.join("\n") + "\n",
            String::new(),
            good.replace(" 11\n", " 12\n"),
            good.replace(" out ", " in "),
            format!("00001001 {} 11\n", "a".repeat(32)),
        ];
        for bad in &damages {
            fs::write(&p, bad).unwrap();
            let s = SeqState::open(&p, Direction::Out, false).unwrap();
            // generation 1 (10, 20), every value one block up
            assert_eq!(s.get(&"a".repeat(32)), Some(entry(10 + RESERVE)), "{bad:?}");
            assert_eq!(s.get(&"b".repeat(32)), Some(entry(20 + RESERVE)));
            drop(s);
            let other = fs::read_to_string(second_slot(&p)).unwrap();
            fs::write(second_slot(&p), bad).unwrap();
            let e = SeqState::open(&p, Direction::Out, false).unwrap_err();
            assert!(e.contains("not usable"), "{e}");
            fs::write(second_slot(&p), other).unwrap();
        }
        // one slot deleted: survived, one block up
        fs::write(&p, &good).unwrap();
        fs::remove_file(second_slot(&p)).unwrap();
        let s = SeqState::open(&p, Direction::Out, false).unwrap();
        assert_eq!(s.get(&"a".repeat(32)), Some(entry(11 + RESERVE)));
    }

    #[test]
    fn a_symlinked_slot_is_refused() {
        let (_dir, p) = tmp();
        let target = p.with_file_name("elsewhere");
        fs::write(&target, "precious\n").unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let e = SeqState::open(&p, Direction::Out, true).unwrap_err();
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious\n");
    }

    #[test]
    fn a_second_lock_on_one_state_is_refused() {
        let (_dir, p) = tmp();
        let base = p.with_file_name("gw.state");
        let held = lock(&base).unwrap();
        let e = lock(&base).unwrap_err();
        assert!(matches!(e, LockError::Held(_)), "{e}");
        assert!(e.to_string().contains("another ipsec-gw holds"), "{e}");
        drop(held);
        assert!(lock(&base).is_ok());
    }

    #[test]
    fn the_highest_of_both_directions_wins() {
        let (_dir, p) = tmp();
        let q = p.with_file_name("gw.state.in");
        let mut out = SeqState::open(&p, Direction::Out, true).unwrap();
        let mut inb = SeqState::open(&q, Direction::In, true).unwrap();
        out.set("a".repeat(32), entry(5));
        inb.set(
            "a".repeat(32),
            Entry {
                value: 9,
                expired: true,
            },
        );
        inb.save().unwrap();
        let read = inb.reader().unwrap().read().unwrap();
        let h = highest(Some(&out), Some(&read), &["a".repeat(32)]);
        assert_eq!((h.value, h.expired), (9, true));
        assert_eq!(
            highest(Some(&out), None, &["c".repeat(32)]),
            Entry::default()
        );
        // the highest of several keys' entries, and expired if any is
        out.set("d".repeat(32), entry(40));
        let h = highest(Some(&out), Some(&read), &["d".repeat(32), "a".repeat(32)]);
        assert_eq!((h.value, h.expired), (40, true));
    }

    #[test]
    fn a_state_read_through_a_reader_cannot_be_written() {
        let (_dir, p) = tmp();
        let s = SeqState::open(&p, Direction::Out, true).unwrap();
        let mut copy = s.reader().unwrap().read().unwrap();
        assert!(copy.save().is_err());
    }
}
