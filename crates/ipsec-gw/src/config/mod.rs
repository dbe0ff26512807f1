//! The gateway's one TOML file: the gateway itself, its SAs and its policies — read and
//! checked thoroughly. Every error names the file and the key (`sa[1].enc_key`), or the
//! line for a syntax error, and says what is wrong; keys never appear in an error.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

use ipsec::crypto::{SecretBytes, Suite};
use ipsec::sa::{Direction, Mode, Protocol, SaConfig, TunnelEndpoints};
use ipsec::spd::{Prefix, Selector};

mod gateway;
mod policy;
mod raw;
mod sa;

pub use gateway::{auto_crypto_workers, MAX_CRYPTO_WORKERS};
use gateway::{crypto_workers, gateway, mtu, tun_queue};
pub use gateway::{TunQueue, LONG_TUN_QUEUE, MAX_TUN_QUEUE, SHORT_TUN_QUEUE};
use policy::{bundle, policy, unused_sas};
use raw::*;
pub use sa::{key_pairs, same_key};
use sa::{sa, shared_keys};

/// A config that cannot be used: `file: key: what is wrong`.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.file.display(), self.key, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Lifetime limits of an SA (RFC 4301 §4.4.2.1): soft warns, hard stops the SA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lifetime {
    pub soft_bytes: Option<u64>,
    pub hard_bytes: Option<u64>,
    pub soft_packets: Option<u64>,
    pub hard_packets: Option<u64>,
}

/// One SA as configured. `same_as` says whether a reload may keep the live SA.
#[derive(Clone, Debug)]
pub struct SaSpec {
    pub name: String,
    pub config: SaConfig,
    pub lifetime: Lifetime,
}

impl SaSpec {
    /// Everything that defines the SA's traffic and keys is unchanged (the name and the
    /// lifetimes may change without a new SA).
    pub fn same_as(&self, other: &SaSpec) -> bool {
        let (a, b) = (&self.config, &other.config);
        a.spi == b.spi
            && a.protocol == b.protocol
            && a.direction == b.direction
            && a.mode == b.mode
            && a.suite == b.suite
            && a.enc_key == b.enc_key
            && a.integ_key == b.integ_key
            && a.esn == b.esn
            && a.replay_window == b.replay_window
            && a.tunnel == b.tunnel
            && a.legacy == b.legacy
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyAction {
    Protect(String),
    ProtectBundle(String),
    Bypass,
    Discard,
}

/// An SA bundle (RFC 4301 §4.5): applied outbound IPComp -> ESP -> AH, undone inbound in
/// reverse, each layer its own SA.
#[derive(Clone, Debug)]
pub struct BundleSpec {
    pub name: String,
    pub direction: Direction,
    pub esp: String,
    pub ah: Option<String>,
    /// IPComp (RFC 3173, DEFLATE) inside ESP, with this CPI.
    pub ipcomp_cpi: Option<u16>,
}

#[derive(Clone, Debug)]
pub struct PolicySpec {
    pub direction: Direction,
    pub selector: Selector,
    pub action: PolicyAction,
    /// Inbound `protect` only: further SAs whose traffic the policy lets in besides its
    /// SA's — the old and the new SA of a make-before-break rekey (RFC 7296 §2.8: the
    /// old inbound SA is kept until the peer has switched to the new one). Empty
    /// otherwise.
    pub also: Vec<String>,
}

/// The smallest and largest TUN MTU: IPv4's minimum datagram every host must take
/// (RFC 791), and a jumbo frame (the data path's buffers are sized for it).
pub const MIN_MTU: u16 = 576;
pub const MAX_MTU: u16 = 9000;
const IPV6_MIN_MTU: usize = 1280;

/// The TUN device's MTU (RFC 4301 §8): a number, or `Auto` — the path MTU to the peer
/// less the largest overhead of the outbound SAs, so that no sealed packet is fragmented
/// (the kernel then answers a larger DF packet with ICMP "fragmentation needed" / ICMPv6
/// "packet too big", and fragments a larger non-DF IPv4 packet before it is sealed —
/// RFC 4301 §8.1's pre-fragmentation). Found at start and again at each reload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mtu {
    Auto,
    Fixed(u16),
}

#[derive(Clone, Debug)]
pub struct Config {
    pub file: PathBuf,
    pub tun: String,
    pub mtu: Mtu,
    /// 2: one worker thread per direction; 1: one thread for both.
    pub workers: u8,
    /// Threads that seal (outbound) or open (inbound) the packets of one batch together,
    /// per direction: 1, the worker alone; more, the worker and a crew (`crew.rs`).
    pub crypto_workers: usize,
    pub local: IpAddr,
    pub remote: IpAddr,
    pub routes: Vec<Prefix>,
    pub udp_encap: bool,
    pub stats: Option<PathBuf>,
    /// Where sequence numbers outlive the process (`.out` / `.in` appended): see
    /// `seqstate`. Default: the config's own path with `.state` appended.
    pub state: PathBuf,
    /// The user the gateway runs as once set up (`privilege`); "root" stays uid 0.
    pub user: String,
    pub stage_timing: bool,
    /// Routing table for `routes`, consulted by all traffic but the gateway's own
    /// (marked `fwmark`): so a route may cover the peer's own address (host-to-host).
    pub table: u32,
    pub fwmark: u32,
    /// TUN offloads (IFF_VNET_HDR: TSO/USO in, GRO out) when the kernel offers them.
    pub offload: bool,
    /// CoDel (RFC 8289) on the outer sockets' receive queues (`dataplane/codel.rs`).
    pub aqm: bool,
    /// The TUN device's queue (its txqueuelen): the outbound queue, between the kernel's
    /// forwarding and the gateway's reads, "auto" or a fixed number of packets.
    pub tun_queue: TunQueue,
    pub sas: Vec<SaSpec>,
    pub bundles: Vec<BundleSpec>,
    pub policies: Vec<PolicySpec>,
    /// Not errors, but worth a line in the log (overlapping policies).
    pub warnings: Vec<String>,
}

impl Config {
    pub fn udp_peer(&self) -> SocketAddr {
        SocketAddr::new(self.remote, ipsec::constants::NAT_T_PORT)
    }
}

impl Config {
    /// The largest inner packet every outbound SA and bundle seals into at most `wire`
    /// bytes (ESP in UDP if `udp_encap`), and the SA or bundle that sets it; `None`
    /// without outbound SAs (nothing is sealed: the path's own MTU).
    pub fn largest_inner(&self, wire: u16) -> Option<(usize, String)> {
        let out = |name: &str| {
            self.sas
                .iter()
                .find(|s| s.name == name && s.config.direction == Direction::Out)
        };
        let singles = self
            .sas
            .iter()
            .filter(|s| s.config.direction == Direction::Out)
            .map(|s| {
                (
                    s.config.largest_inner(wire.into(), self.udp_encap),
                    format!("sa {}", s.name),
                )
            });
        let bundles = self.bundles.iter().filter_map(|b| {
            let esp = out(&b.esp)?;
            let ah = b.ah.as_deref().and_then(out).map(|a| &a.config);
            let n =
                ipsec::sa::mtu::bundle_largest_inner(&esp.config, ah, wire.into(), self.udp_encap);
            Some((n, format!("bundle {}", b.name)))
        });
        singles.chain(bundles).min_by_key(|(n, _)| *n)
    }

    /// The TUN MTU for a path MTU of `wire` bytes (`mtu = "auto"`), or why there is none.
    pub fn auto_mtu(&self, wire: u16) -> Result<u16, String> {
        let Some((n, who)) = self.largest_inner(wire) else {
            return Ok(wire.clamp(MIN_MTU, MAX_MTU));
        };
        if n < usize::from(MIN_MTU) {
            return Err(format!(
                "{}: gateway.mtu: \"auto\": the path MTU to {} is {wire} bytes, which leaves \
                 {n} for inner packets ({who}), under the {MIN_MTU} every IPv4 host must take; \
                 raise the outer link's MTU or set `mtu` to a number",
                self.file.display(),
                self.remote
            ));
        }
        // IPv6 needs 1280 on every link (RFC 8200 §5): under it Linux takes IPv6 off the
        // device, and the IPv6 routes into it with it
        if n < IPV6_MIN_MTU && has_ipv6_route(&self.routes) {
            return Err(format!(
                "{}: gateway.mtu: \"auto\": the path MTU to {} is {wire} bytes, which leaves \
                 {n} for inner packets ({who}), under the {IPV6_MIN_MTU} IPv6 needs for the \
                 IPv6 routes; raise the outer link's MTU",
                self.file.display(),
                self.remote
            ));
        }
        Ok(n.min(usize::from(MAX_MTU)) as u16)
    }
}

fn has_ipv6_route(routes: &[Prefix]) -> bool {
    routes.iter().any(|r| r.addr.is_ipv6())
}

/// A fixed MTU under IPv6's 1280 (RFC 8200 §5) cannot carry IPv6 routes: Linux takes
/// IPv6 off such a device, and the routes into it would fail at start.
fn fixed_mtu_fits_ipv6(cx: &Ctx<'_>, m: Mtu, routes: &[Prefix]) -> Result<Mtu, ConfigError> {
    match m {
        Mtu::Fixed(n) if usize::from(n) < IPV6_MIN_MTU && has_ipv6_route(routes) => {
            Err(cx.err(
                "gateway.mtu",
                format!("{n} is under the {IPV6_MIN_MTU} bytes IPv6 needs (RFC 8200 §5), and `routes` has an IPv6 prefix"),
            ))
        }
        _ => Ok(m),
    }
}

struct Ctx<'a> {
    file: &'a Path,
}

impl Ctx<'_> {
    fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Read and check a config file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    // The text holds the keys (hex): wiped once parsed.
    let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        key: "(file)".into(),
        message: e.to_string(),
    })?);
    parse(&text, path)
}

/// The config file as a running gateway re-reads it on SIGHUP, after it gave up root
/// (`privilege`): through the descriptor opened at start (an edit in place is seen even
/// where the gateway's user may not open the path), or by its path when that user may
/// open it and it names another file now (an editor that writes a new file and renames
/// it over the old one).
pub struct Source {
    path: PathBuf,
    file: std::fs::File,
}

impl Source {
    pub fn open(path: &Path) -> Result<Source, ConfigError> {
        let file = std::fs::File::open(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            key: "(file)".into(),
            message: e.to_string(),
        })?;
        Ok(Source {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Read and check the config again; the second value says when it was read through
    /// the descriptor because its path could not be opened (a replaced file is then not
    /// seen).
    pub fn reload(&mut self) -> Result<(Config, bool), ConfigError> {
        use std::os::unix::fs::MetadataExt;
        let err = |message: String| ConfigError {
            file: self.path.clone(),
            key: "(file)".into(),
            message,
        };
        let mut through_fd = false;
        match std::fs::File::open(&self.path) {
            Ok(f) => {
                let (a, b) = (f.metadata(), self.file.metadata());
                if let (Ok(a), Ok(b)) = (a, b) {
                    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
                        self.file = f;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => through_fd = true,
            Err(e) => return Err(err(e.to_string())),
        }
        let mut bytes = read_whole(&self.file).map_err(|e| err(e.to_string()))?;
        let text = Zeroizing::new(
            String::from_utf8(std::mem::take(&mut *bytes))
                .map_err(|_| err("not UTF-8 text".into()))?,
        );
        Ok((parse(&text, &self.path)?, through_fd))
    }
}

/// All of an open file, read from offset 0 with pread (the descriptor's offset is never
/// moved, so descriptors that share it may read too), wiped when dropped: a config holds
/// keys. For files a gateway reads through what it opened before giving up root (its
/// config, its sequence state).
pub(crate) fn read_whole(f: &std::fs::File) -> std::io::Result<Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    // sized up front: a buffer that grows leaves unwiped copies behind
    let size = f.metadata().map_or(0, |m| m.len() as usize);
    let mut bytes = Zeroizing::new(Vec::with_capacity(size + 1));
    let mut chunk = Zeroizing::new([0u8; 8192]);
    loop {
        let n = f.read_at(&mut chunk[..], bytes.len() as u64)?;
        if n == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}

/// Check a config given as text (`path` names it in errors and anchors `@file` keys).
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let cx = Ctx { file: path };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
        let key = line.map_or("(syntax)".to_string(), |l| format!("line {l}"));
        cx.err(key, e.message().to_string())
    })?;
    let g = &raw.gateway;
    let (local, remote, routes) = gateway(&cx, g)?;
    let crypto_workers = crypto_workers(&cx, g)?;
    let mut warnings = Vec::new();
    let mut sas: Vec<SaSpec> = Vec::new();
    let mut seen = sa::Seen::default();
    for (i, s) in raw.sa.iter().enumerate() {
        let spec = sa(&cx, (i, s), g, (local, remote), &mut seen, &mut warnings)?;
        sas.push(spec);
    }
    shared_keys(&cx, &sas)?;
    // (names are unique: `sa` refused a second)
    let sa_named: HashMap<&str, usize> = sas
        .iter()
        .enumerate()
        .map(|(at, s)| (s.name.as_str(), at))
        .collect();
    let mut bundles: Vec<BundleSpec> = Vec::new();
    let mut bundle_names = policy::Bundles::default();
    for (i, b) in raw.bundle.iter().enumerate() {
        let spec = bundle(&cx, (i, b), &sas, &sa_named, &bundle_names)?;
        bundle_names.add(bundles.len(), &spec);
        bundles.push(spec);
    }
    let mut policies: Vec<PolicySpec> = Vec::new();
    for (i, p) in raw.policy.iter().enumerate() {
        policies.push(policy(
            &cx,
            (i, p),
            &sas,
            &sa_named,
            (&bundles, &bundle_names),
        )?);
    }
    policy::overlap_warnings(&cx, &policies, &mut warnings);
    unused_sas(&cx, &sas, &bundles, &policies, &mut warnings);
    Ok(Config {
        file: path.to_path_buf(),
        tun: g.tun.clone(),
        mtu: fixed_mtu_fits_ipv6(&cx, mtu(&cx, g)?, &routes)?,
        workers: g.workers,
        crypto_workers,
        local,
        remote,
        routes,
        udp_encap: g.udp_encap,
        stats: g.stats.as_ref().map(PathBuf::from),
        state: match &g.state {
            Some(p) => path.parent().unwrap_or(Path::new(".")).join(p),
            // beside the config: one per gateway, also for several gateways on one host
            // (namespaces may reuse a TUN device's name)
            None => {
                let mut s = path.as_os_str().to_owned();
                s.push(".state");
                PathBuf::from(s)
            }
        },
        user: g.user.clone(),
        stage_timing: g.stage_timing,
        table: g.table,
        fwmark: g.fwmark,
        offload: g.offload,
        aqm: g.aqm,
        tun_queue: tun_queue(&cx, g)?,
        sas,
        bundles,
        policies,
        warnings,
    })
}

#[cfg(test)]
pub(crate) mod tests;
