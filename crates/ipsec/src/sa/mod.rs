//! A security association: one direction of protected traffic (RFC 4301 §4.1), its
//! keys, sequence counter, anti-replay window and counters.

use core::fmt;
use core::net::IpAddr;

use crate::buf::PacketBuf;
use crate::crypto::job::{CryptoJob, Later, Now, When};
use crate::crypto::state::IvSource;
use crate::crypto::{CipherState, SecretBytes, Suite, SuiteError};
use crate::drop::{DropCounters, DropReason};
use esp::Recheck;

pub mod ah;
pub mod esp;
pub mod mtu;
use crate::ipcomp::IpcompConfigError;
use crate::replay::{BadWindowSize, ReplayWindow, DEFAULT_WINDOW};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// RFC 4303 §3.1.2: the whole IP packet is protected inside a new outer header.
    Tunnel,
    /// RFC 4303 §3.1.1: the IP header stays, its payload is protected.
    Transport,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Tunnel => "tunnel",
            Mode::Transport => "transport",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "tunnel" => Some(Mode::Tunnel),
            "transport" => Some(Mode::Transport),
            _ => None,
        }
    }
}

/// The IPsec protocol of an SA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// RFC 4303: confidentiality and/or integrity of the payload.
    Esp,
    /// RFC 4302: integrity of the payload and of the IP header's immutable fields.
    Ah,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Esp => "esp",
            Protocol::Ah => "ah",
        }
    }
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "esp" => Some(Protocol::Esp),
            "ah" => Some(Protocol::Ah),
            _ => None,
        }
    }
    /// The IP protocol number (IANA).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Esp => crate::constants::proto::ESP,
            Protocol::Ah => crate::constants::proto::AH,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Out,
    In,
}

/// Outer addresses of a tunnel-mode SA (source = the sealing gateway).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TunnelEndpoints {
    pub src: IpAddr,
    pub dst: IpAddr,
}

/// Everything needed to build an [`Sa`]. `Debug` redacts the keys.
#[derive(Clone, Debug)]
pub struct SaConfig {
    pub spi: u32,
    /// ESP (default) or AH.
    pub protocol: Protocol,
    pub direction: Direction,
    pub mode: Mode,
    pub suite: Suite,
    /// Encryption key material, salt included for the combined modes.
    pub enc_key: SecretBytes,
    pub integ_key: SecretBytes,
    /// Extended (64-bit) sequence numbers, RFC 4303 §2.2.1.
    pub esn: bool,
    /// Anti-replay window size; `None` disables replay checks (explicit choice only).
    pub replay_window: Option<u32>,
    /// Outer addresses: required for tunnel mode; for an inbound SA `dst` is also the
    /// SAD lookup address (RFC 4301 §4.4.2).
    pub tunnel: Option<TunnelEndpoints>,
    /// TTL / hop limit of outer headers built in tunnel mode.
    pub outer_ttl: u8,
    /// Accept broken or weak algorithms (DES, 3DES, MD5), for reproducing older studies.
    pub legacy: bool,
}

impl SaConfig {
    /// A config with the defaults: outbound, tunnel mode, no ESN, window 1024, TTL 64.
    pub fn new(spi: u32, suite: Suite, enc_key: SecretBytes, integ_key: SecretBytes) -> Self {
        SaConfig {
            spi,
            protocol: Protocol::Esp,
            direction: Direction::Out,
            mode: Mode::Tunnel,
            suite,
            enc_key,
            integ_key,
            esn: false,
            replay_window: Some(DEFAULT_WINDOW),
            tunnel: None,
            outer_ttl: 64,
            legacy: false,
        }
    }
}

/// One secret an SA holds: a key field's cipher or MAC key, and the salt that follows
/// it in the combined modes and GMAC (RFC 4106 §8.1, RFC 4543 §6, RFC 7634 §4).
#[derive(Clone, Copy)]
pub struct Secret<'a> {
    /// Which config field holds it: `enc_key` or `integ_key`.
    pub field: &'static str,
    /// The key as the primitive takes it (the salt removed).
    pub key: &'a [u8],
    /// The whole field: the key and its salt.
    pub material: &'a [u8],
    /// Its nonce is salt ‖ sequence number (AES-GCM, ChaCha20-Poly1305, AES-GMAC in ESP
    /// or AH): two SAs numbering under one such key repeat nonces.
    pub nonce_is_sequence: bool,
}

impl SaConfig {
    /// The secrets this SA's keys hold, whichever field carries them (ESP's AEAD and
    /// GMAC in `enc_key`, AH's GMAC and every HMAC in `integ_key`); empty fields are none.
    pub fn secrets(&self) -> impl Iterator<Item = Secret<'_>> {
        let enc = self.suite.encryption;
        let integ = self.suite.integrity;
        [
            (
                "enc_key",
                self.enc_key.expose(),
                enc.salt_len(),
                enc.is_aead(),
            ),
            (
                "integ_key",
                self.integ_key.expose(),
                integ.salt_len(),
                integ.is_gmac(),
            ),
        ]
        .into_iter()
        .filter(|(_, m, _, _)| !m.is_empty())
        .map(|(field, material, salt, nonce_is_sequence)| Secret {
            field,
            key: &material[..material.len().saturating_sub(salt)],
            material,
            nonce_is_sequence,
        })
    }
}

/// Why an SA could not be built. Each names what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaError {
    Suite(SuiteError),
    /// SPI values 1–255 are reserved by IANA and 0 is never sent (RFC 4303 §2.1).
    ReservedSpi(u32),
    /// A replay window size outside what is accepted.
    ReplayWindow(BadWindowSize),
    /// Tunnel mode needs outer endpoints.
    TunnelEndpointsMissing,
    /// Tunnel source and destination must be of one IP version.
    TunnelFamilyMismatch,
    /// Another inbound SA already has this SPI (and destination).
    DuplicateSpi(u32),
    /// AH authenticates only: its SA takes an integrity algorithm and no encryption.
    AhWithEncryption(&'static str),
    /// AES-GMAC as an integrity algorithm is AH's (RFC 4543 §5.3); ESP has its own GMAC.
    GmacIntegrityWithEsp(&'static str),
    /// An IPComp association's parameters.
    Ipcomp(IpcompConfigError),
    /// SAs that do not form a bundle.
    Bundle(BundleError),
}

/// Why SAs (and an IPComp association) do not form a bundle (RFC 4301 §4.5, as
/// [`crate::bundle`] builds one: ESP in tunnel mode, AH of the same direction outside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BundleError {
    /// The SA with this SPI named as the bundle's ESP is not ESP.
    NotEsp(u32),
    /// The ESP SA is transport mode: a bundle's ESP builds the outer header.
    EspNotTunnel,
    /// The SA with this SPI named as the bundle's AH is not AH.
    NotAh(u32),
    /// The AH and ESP SAs protect different directions.
    DirectionsDiffer,
    /// No SA has the ESP id given.
    NoSuchEsp,
    /// No SA has the AH id given.
    NoSuchAh,
    /// No IPComp association has the id given.
    NoSuchIpcomp,
    /// One of the SAs is already in another bundle.
    SaInAnotherBundle,
}

impl fmt::Display for BundleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BundleError::NotEsp(spi) => write!(f, "bundle: SPI {spi:#x} is not an ESP SA"),
            BundleError::EspNotTunnel => {
                f.write_str("bundle: the ESP SA must be tunnel mode (it builds the outer header)")
            }
            BundleError::NotAh(spi) => write!(f, "bundle: SPI {spi:#x} is not an AH SA"),
            BundleError::DirectionsDiffer => {
                f.write_str("bundle: the AH and ESP SAs must have the same direction")
            }
            BundleError::NoSuchEsp => f.write_str("no such ESP SA"),
            BundleError::NoSuchAh => f.write_str("no such AH SA"),
            BundleError::NoSuchIpcomp => f.write_str("no such IPComp association"),
            BundleError::SaInAnotherBundle => f.write_str("an SA can be in one bundle only"),
        }
    }
}

impl std::error::Error for BundleError {}

impl fmt::Display for SaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaError::Suite(e) => e.fmt(f),
            SaError::ReservedSpi(s) => {
                write!(f, "SPI {s} is reserved (RFC 4303 §2.1): use 256 or more")
            }
            SaError::ReplayWindow(e) => e.fmt(f),
            SaError::TunnelEndpointsMissing => {
                f.write_str("tunnel mode needs outer endpoints (tunnel source and destination)")
            }
            SaError::TunnelFamilyMismatch => {
                f.write_str("tunnel source and destination must both be IPv4 or both IPv6")
            }
            SaError::DuplicateSpi(s) => {
                write!(f, "SPI {s:#x} is already used by another inbound SA")
            }
            SaError::Ipcomp(e) => e.fmt(f),
            SaError::Bundle(e) => e.fmt(f),
            SaError::GmacIntegrityWithEsp(i) => write!(
                f,
                "integrity {i} (AUTH_AES_GMAC) is for AH only (RFC 4543 §5.3); for ESP use \
                 encryption {i} with integrity null (ENCR_NULL_AUTH_AES_GMAC)"
            ),
            SaError::AhWithEncryption(e) => write!(
                f,
                "AH authenticates only: give it an integrity algorithm and encryption null \
                 (got encryption {e})"
            ),
        }
    }
}

impl std::error::Error for SaError {}

impl From<SuiteError> for SaError {
    fn from(e: SuiteError) -> Self {
        SaError::Suite(e)
    }
}

/// Per-SA counters: successful packets and bytes (inner, as the model counts them),
/// and drops by reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaCounters {
    pub packets: u64,
    /// Bytes of protected payload (the inner packet in tunnel mode).
    pub bytes: u64,
    pub drops: DropCounters,
}

/// A live security association. See the module docs; sealing and opening are in `esp.rs`.
#[derive(Debug)]
pub struct Sa {
    pub(crate) spi: u32,
    pub(crate) protocol: Protocol,
    pub(crate) direction: Direction,
    pub(crate) mode: Mode,
    pub(crate) suite: Suite,
    pub(crate) esn: bool,
    pub(crate) tunnel: Option<TunnelEndpoints>,
    pub(crate) outer_ttl: u8,
    pub(crate) keys: CipherState,
    /// Last sequence number sent (0: none yet).
    pub(crate) last_seq: u64,
    pub(crate) replay: ReplayWindow,
    /// IPv4 identification for outer headers.
    pub(crate) ip_id: u16,
    pub counters: SaCounters,
    /// Per-stage time, when a clock is lent ([`crate::stage::StageTimes::set_clock`]).
    pub stages: crate::stage::StageTimes,
}

impl Sa {
    pub fn new(cfg: &SaConfig) -> Result<Self, SaError> {
        if cfg.spi < 256 {
            return Err(SaError::ReservedSpi(cfg.spi));
        }
        cfg.suite.check_legacy(cfg.legacy)?;
        if cfg.protocol == Protocol::Ah && cfg.suite.encryption != crate::Encryption::Null {
            return Err(SaError::AhWithEncryption(cfg.suite.encryption.name()));
        }
        if cfg.protocol == Protocol::Esp && !cfg.suite.integrity.spec().esp {
            return Err(SaError::GmacIntegrityWithEsp(cfg.suite.integrity.name()));
        }
        // RFC 4303 §3.4.3: anti-replay needs integrity — without it the sequence number
        // is not authenticated, and one forged packet numbered 2^32 - 1 would close the
        // window to every genuine one. Such an SA keeps no window.
        let replay = match cfg.replay_window {
            Some(w) if cfg.suite.has_integrity() => {
                ReplayWindow::new(w).map_err(SaError::ReplayWindow)?
            }
            _ => ReplayWindow::disabled(),
        };
        match (cfg.mode, cfg.tunnel) {
            (Mode::Tunnel, None) => return Err(SaError::TunnelEndpointsMissing),
            (_, Some(t)) if t.src.is_ipv4() != t.dst.is_ipv4() => {
                return Err(SaError::TunnelFamilyMismatch)
            }
            _ => {}
        }
        Ok(Sa {
            spi: cfg.spi,
            protocol: cfg.protocol,
            direction: cfg.direction,
            mode: cfg.mode,
            suite: cfg.suite,
            esn: cfg.esn,
            tunnel: cfg.tunnel,
            outer_ttl: cfg.outer_ttl,
            keys: CipherState::new(cfg.suite, &cfg.enc_key, &cfg.integ_key)?,
            last_seq: 0,
            replay,
            ip_id: 0,
            counters: SaCounters::default(),
            stages: crate::stage::StageTimes::off(),
        })
    }

    pub fn spi(&self) -> u32 {
        self.spi
    }
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }
    pub fn direction(&self) -> Direction {
        self.direction
    }
    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn suite(&self) -> Suite {
        self.suite
    }
    pub fn esn(&self) -> bool {
        self.esn
    }
    pub fn tunnel(&self) -> Option<TunnelEndpoints> {
        self.tunnel
    }
    pub fn replay_window(&self) -> &ReplayWindow {
        &self.replay
    }

    /// The sequence number the next sealed packet will carry.
    pub fn next_seq(&self) -> u64 {
        self.last_seq.wrapping_add(1)
    }

    /// Replace a CBC SA's secret IV key: for known-answer tests of the IV derivation
    /// only (see `crypto::state::CbcIvs`). False for a suite without CBC.
    #[doc(hidden)]
    pub fn set_cbc_iv_key_for_tests(&mut self, key: [u8; 16]) -> bool {
        self.keys.set_cbc_iv_key_for_tests(key)
    }

    /// Set the sequence number of the next sealed packet (known-answer tests, and
    /// resuming an SA). `0` is refused: sequence numbers start at 1; so is a number past
    /// the last usable one (RFC 4303 §3.3.3): an SA resumed there has nothing to send.
    pub fn set_next_seq(&mut self, seq: u64) -> Result<(), crate::DropReason> {
        if seq == 0 {
            return Err(crate::DropReason::ZeroSequence);
        }
        if seq > self.last_usable_seq() {
            return Err(crate::DropReason::SequenceExhausted);
        }
        self.last_seq = seq - 1;
        Ok(())
    }

    /// The last sequence number the SA may send: 2^32 - 1 without ESN, 2^64 - 1 with.
    fn last_usable_seq(&self) -> u64 {
        if self.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        }
    }

    /// Resume an inbound SA whose highest received sequence number was `top` (known-answer
    /// tests with large ESN values, and SAs carried over a reload).
    pub fn set_replay_top(&mut self, top: u64) {
        if top > self.replay.top() {
            self.replay.commit(top);
        }
    }

    /// Resume an inbound SA after a restart whose highest accepted sequence number was
    /// `top`: every number up to it counts as received (see [`ReplayWindow::resume`]).
    pub fn resume_inbound(&mut self, top: u64) {
        self.replay.resume(top);
    }

    /// The next IPv4 identification of a header this SA writes (or, AH in transport mode,
    /// of one it must fill in): never 0. Linux sends a raw IPv4 packet whose
    /// identification is 0 and DF clear with an identification of its own choosing
    /// (`raw_send_hdrinc`: `if (!iph->id) ip_select_ident(...)`), after AH's ICV was
    /// computed over the 0: identification is immutable (RFC 4302 §3.3.3.1.1.1), so the
    /// receiver refused one packet in every 65,536 of a tunnel's DF-less traffic.
    pub(crate) fn next_ip_id(&mut self) -> u16 {
        self.ip_id = match self.ip_id.wrapping_add(1) {
            0 => 1,
            id => id,
        };
        self.ip_id
    }

    /// Take the next sequence number, refusing to cycle (RFC 4303 §3.3.3): without ESN
    /// the last usable number is 2^32 - 1, with ESN 2^64 - 1.
    pub(crate) fn take_seq(&mut self) -> Result<u64, crate::DropReason> {
        if self.last_seq >= self.last_usable_seq() {
            return Err(crate::DropReason::SequenceExhausted);
        }
        self.last_seq += 1;
        Ok(self.last_seq)
    }
}

/// Seal and open by protocol and mode: ESP ([`esp`]) or AH ([`ah`]).
impl Sa {
    /// Seal the IP packet in `pkt` according to this SA's mode; on success `pkt` holds
    /// the ESP packet with its (outer or moved) IP header. Drops are counted on the SA.
    pub fn seal(&mut self, pkt: &mut PacketBuf<'_>) -> Result<(), DropReason> {
        self.seal_with(pkt, IvSource::Generate)
    }

    /// As [`Sa::seal`], with the IV chosen by the caller (known-answer tests only).
    pub fn seal_with(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        iv: IvSource<'_>,
    ) -> Result<(), DropReason> {
        self.seal_when::<Now>(pkt, iv)
    }

    /// As [`Sa::seal`], but an ESP SA leaves the encryption and ICV to the caller: the
    /// returned job, to run with [`Sa::keys`] (on any thread) before the packet is sent.
    /// Everything that changes the SA — the sequence number, the CBC IV, the counters
    /// — happens here. AH seals at once (`None`).
    pub fn seal_deferred(
        &mut self,
        pkt: &mut PacketBuf<'_>,
    ) -> Result<Option<CryptoJob>, DropReason> {
        self.seal_when::<Later>(pkt, IvSource::Generate)
    }

    /// Seal by protocol and mode, an ESP SA's cryptography now or handed back (`W`;
    /// AH always now). Drops are counted on the SA.
    pub(crate) fn seal_when<W: When>(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        iv: IvSource<'_>,
    ) -> Result<W::Job, DropReason> {
        let r = match (self.protocol, self.mode) {
            (Protocol::Ah, _) => self.seal_ah(pkt).map(|_| W::none()),
            (Protocol::Esp, Mode::Tunnel) => self.seal_tunnel::<W>(pkt, iv),
            (Protocol::Esp, Mode::Transport) => self.seal_transport::<W>(pkt, iv),
        };
        self.count(r)
    }

    /// Opening an ESP packet in two halves: this one, before the ICV — the SPI, the
    /// full sequence number and the replay check (RFC 4303 §3.4.3) — changes nothing;
    /// the job it returns verifies and decrypts with [`Sa::keys`] on any thread; then
    /// [`Sa::open_finish`]. `Err(UnknownSpi)` for an AH SA (open it with [`Sa::open`]).
    pub fn open_start(&mut self, pkt: &mut PacketBuf<'_>) -> Result<CryptoJob, DropReason> {
        if self.protocol != Protocol::Esp {
            return Err(DropReason::UnknownSpi);
        }
        let r = self.open_check(pkt);
        self.count(r)
    }

    /// The last half of opening a packet [`Sa::open_start`] began, given how its job
    /// went: the replay window checked again and committed, the trailer read, the inner
    /// packet (tunnel) or IP header (transport) restored. Drops are counted on the SA.
    pub fn open_finish(
        &mut self,
        pkt: &mut PacketBuf<'_>,
        job: &CryptoJob,
        crypto: Result<(), DropReason>,
    ) -> Result<u8, DropReason> {
        // A packet that failed its ICV is named as the single-thread path names it, which
        // checks the window before the ICV (RFC 4303 §3.4.3) with every earlier packet
        // committed — as they are now: a replay when the window now refuses its number
        // (an earlier packet of the batch, opened beside it, took it). With ESN, only when
        // the number inferred now is the one the job used (else that path would have
        // tried the ICV under the other high half: an ICV failure). Found by the crew's
        // differential fuzz target.
        let crypto = crypto.map_err(|e| {
            let now = if self.esn {
                self.replay.infer_esn(job.seq as u32)
            } else {
                Some(job.seq)
            };
            match now {
                Some(seq) if seq == job.seq => self.replay.check(seq).err().unwrap_or(e),
                _ => e,
            }
        });
        let r = crypto.and_then(|()| match self.mode {
            Mode::Tunnel => self.open_tunnel_finish(pkt, job, false, Recheck::Yes),
            Mode::Transport => self.open_transport_finish(pkt, job, Recheck::Yes),
        });
        self.count(r)
    }

    /// Open the ESP (or AH) packet in `pkt` (an IP packet whose payload is ESP or AH). On
    /// success `pkt` holds the inner packet (tunnel) or the restored IP packet (transport),
    /// and the result is the ESP or AH next header. Drops are counted on the SA.
    pub fn open(&mut self, pkt: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        let r = match (self.protocol, self.mode) {
            (Protocol::Ah, _) => self.open_ah(pkt),
            (Protocol::Esp, Mode::Tunnel) => self.open_tunnel(pkt, false),
            (Protocol::Esp, Mode::Transport) => self.open_transport(pkt),
        };
        self.count(r)
    }

    pub(crate) fn count<T>(&mut self, r: Result<T, DropReason>) -> Result<T, DropReason> {
        if let Err(d) = r {
            self.counters.drops.count(d);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed errors say what the `String`s they replaced said, word for word.
    #[test]
    fn typed_errors_keep_their_messages() {
        for (e, message) in [
            (
                BundleError::NotEsp(0x1234),
                "bundle: SPI 0x1234 is not an ESP SA",
            ),
            (
                BundleError::EspNotTunnel,
                "bundle: the ESP SA must be tunnel mode (it builds the outer header)",
            ),
            (
                BundleError::NotAh(0x300),
                "bundle: SPI 0x300 is not an AH SA",
            ),
            (
                BundleError::DirectionsDiffer,
                "bundle: the AH and ESP SAs must have the same direction",
            ),
            (BundleError::NoSuchEsp, "no such ESP SA"),
            (BundleError::NoSuchAh, "no such AH SA"),
            (BundleError::NoSuchIpcomp, "no such IPComp association"),
            (
                BundleError::SaInAnotherBundle,
                "an SA can be in one bundle only",
            ),
        ] {
            assert_eq!(e.to_string(), message);
            assert_eq!(SaError::Bundle(e).to_string(), message);
        }
        assert_eq!(
            SaError::Ipcomp(IpcompConfigError::Level(0)).to_string(),
            "DEFLATE level 0: 1 to 9"
        );
        assert_eq!(
            SaError::ReplayWindow(BadWindowSize(48)).to_string(),
            "replay window 48 must be a multiple of 32 from 32 to 65536 (or disabled explicitly)"
        );
    }

    #[test]
    fn a_bad_replay_window_is_refused_by_its_size() {
        let mut cfg = SaConfig::new(
            0x1000,
            Suite::parse("aes128gcm16").unwrap(),
            SecretBytes::from_slice(&[7; 20]),
            SecretBytes::from_slice(&[]),
        );
        cfg.mode = Mode::Transport;
        cfg.direction = Direction::In;
        cfg.replay_window = Some(100);
        assert_eq!(
            Sa::new(&cfg).err(),
            Some(SaError::ReplayWindow(BadWindowSize(100)))
        );
    }
}
