//! The gateway's one TOML file: the gateway itself, its SAs and its policies — read and
//! checked thoroughly. Every error names the file and the key (`sa[1].enc_key`), or the
//! line for a syntax error, and says what is wrong; keys never appear in an error.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use zeroize::{Zeroize, Zeroizing};

use ipsec::crypto::{SecretBytes, Suite};
use ipsec::sa::{Direction, Mode, Protocol, SaConfig, TunnelEndpoints};
use ipsec::spd::{Prefix, Selector};
use serde::Deserialize;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    gateway: RawGateway,
    #[serde(default)]
    sa: Vec<RawSa>,
    #[serde(default)]
    bundle: Vec<RawBundle>,
    #[serde(default)]
    policy: Vec<RawPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBundle {
    name: String,
    direction: String,
    esp: String,
    #[serde(default)]
    ah: Option<String>,
    #[serde(default)]
    ipcomp_cpi: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGateway {
    tun: String,
    #[serde(default = "default_mtu")]
    mtu: u16,
    local: String,
    remote: String,
    #[serde(default)]
    routes: Vec<String>,
    #[serde(default)]
    udp_encap: bool,
    #[serde(default)]
    stats: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default = "default_user")]
    user: String,
    #[serde(default)]
    stage_timing: bool,
    #[serde(default = "default_true")]
    offload: bool,
    #[serde(default = "default_table")]
    table: u32,
    #[serde(default = "default_fwmark")]
    fwmark: u32,
    #[serde(default = "default_workers")]
    workers: u8,
    /// "auto" or a count: threads that seal (or open) one batch together, per direction.
    #[serde(default)]
    crypto_workers: Option<RawCount>,
}

/// A count that may also be a word ("auto").
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RawCount {
    Number(i64),
    Word(String),
}

/// Most crypto workers per direction: beyond 8, one batch (at most 64 packets) gives
/// each too little to do.
pub const MAX_CRYPTO_WORKERS: usize = 8;

/// `crypto_workers = "auto"`: 1 below 8 cores — today's single thread per direction,
/// since with fewer a crew only takes CPU from the traffic's own ends (measured on 2
/// cores: README) — and a quarter of the cores from 8 up (the two directions, and on a
/// lab host the other gateway and the traffic's ends, share the machine), at most
/// [`MAX_CRYPTO_WORKERS`]. Not yet measured on a many-core machine: set it from
/// `benchmarks/gateway_scaling.py` there.
pub fn auto_crypto_workers() -> usize {
    crypto_workers_for(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn crypto_workers_for(cores: usize) -> usize {
    if cores < 8 {
        1
    } else {
        (cores / 4).min(MAX_CRYPTO_WORKERS)
    }
}

/// One worker per direction.
fn default_workers() -> u8 {
    2
}

fn default_true() -> bool {
    true
}

fn default_table() -> u32 {
    220
}
/// "LAB" in ASCII: the mark on the gateway's own outer packets.
fn default_fwmark() -> u32 {
    0x004c_4142
}

fn default_mtu() -> u16 {
    1400
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSa {
    name: String,
    direction: String,
    spi: u32,
    #[serde(default = "default_esp")]
    protocol: String,
    #[serde(default = "default_tunnel")]
    mode: String,
    encryption: String,
    #[serde(default = "default_null")]
    integrity: String,
    #[serde(default)]
    enc_key: String,
    #[serde(default)]
    integ_key: String,
    #[serde(default = "default_window")]
    replay_window: u32,
    #[serde(default)]
    esn: bool,
    #[serde(default)]
    legacy: bool,
    soft_bytes: Option<u64>,
    hard_bytes: Option<u64>,
    soft_packets: Option<u64>,
    hard_packets: Option<u64>,
}

/// The hex (or `@file` names) of the keys, as read: wiped when the raw config goes.
impl Drop for RawSa {
    fn drop(&mut self) {
        self.enc_key.zeroize();
        self.integ_key.zeroize();
    }
}

fn default_esp() -> String {
    "esp".into()
}
fn default_tunnel() -> String {
    "tunnel".into()
}
fn default_null() -> String {
    "null".into()
}
fn default_window() -> u32 {
    1024
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    direction: String,
    #[serde(default)]
    src: Option<String>,
    #[serde(default)]
    dst: Option<String>,
    #[serde(default)]
    protocol: Option<u8>,
    action: String,
    #[serde(default)]
    sa: Option<String>,
    #[serde(default)]
    bundle: Option<String>,
}

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
}

#[derive(Clone, Debug)]
pub struct Config {
    pub file: PathBuf,
    pub tun: String,
    pub mtu: u16,
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
    let mut seen_spi = HashMap::new();
    for (i, s) in raw.sa.iter().enumerate() {
        let spec = sa(
            &cx,
            (i, s),
            g,
            (local, remote),
            &sas,
            &mut seen_spi,
            &mut warnings,
        )?;
        sas.push(spec);
    }
    shared_keys(&cx, &sas)?;
    let mut bundles: Vec<BundleSpec> = Vec::new();
    for (i, b) in raw.bundle.iter().enumerate() {
        bundles.push(bundle(&cx, (i, b), &sas, &bundles)?);
    }
    let mut policies: Vec<PolicySpec> = Vec::new();
    for (i, p) in raw.policy.iter().enumerate() {
        let spec = policy(&cx, (i, p), &sas, &bundles, &policies, &mut warnings)?;
        policies.push(spec);
    }
    unused_sas(&cx, &sas, &bundles, &policies, &mut warnings);
    Ok(Config {
        file: path.to_path_buf(),
        tun: g.tun.clone(),
        mtu: g.mtu,
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
        sas,
        bundles,
        policies,
        warnings,
    })
}

/// No two SAs share a key, in either direction: with AES-GCM, ChaCha20-Poly1305 and GMAC
/// the nonce is salt ‖ sequence number (RFC 4106 §3.1, RFC 7634 §2, RFC 4543 §3), with
/// no SPI or direction in it, so two SAs under one key number the same nonces; an
/// integrity key shared lets one SA's packets be replayed into the other (RFC 4301
/// §4.4.2: each SA its own keys). The sequence state follows the key material
/// (`seqstate`), which is what makes a key one SA's.
fn shared_keys(cx: &Ctx<'_>, sas: &[SaSpec]) -> Result<(), ConfigError> {
    for (j, b) in sas.iter().enumerate() {
        for (i, a) in sas[..j].iter().enumerate() {
            let (ka, kb) = (&a.config, &b.config);
            for (field, x, y) in [
                ("enc_key", ka.enc_key.expose(), kb.enc_key.expose()),
                ("integ_key", ka.integ_key.expose(), kb.integ_key.expose()),
            ] {
                if !y.is_empty() && x == y {
                    return Err(cx.err(
                        format!("sa[{j}].{field}"),
                        format!(
                            "the same key as sa[{i}] ({:?}): two SAs never share a key,                              not even one in and one out (with AES-GCM both would number the                              same nonces, RFC 4106 §3.1); give each SA its own",
                            a.name
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

fn default_user() -> String {
    "ipsec-gw".into()
}

/// `[gateway] crypto_workers`: "auto" (the default) or 1..=MAX_CRYPTO_WORKERS.
fn crypto_workers(cx: &Ctx<'_>, g: &RawGateway) -> Result<usize, ConfigError> {
    Ok(match &g.crypto_workers {
        None => auto_crypto_workers(),
        Some(RawCount::Word(w)) if w == "auto" => auto_crypto_workers(),
        Some(RawCount::Number(n)) if (1..=MAX_CRYPTO_WORKERS as i64).contains(n) => *n as usize,
        Some(other) => {
            let got = match other {
                RawCount::Number(n) => n.to_string(),
                RawCount::Word(w) => format!("{w:?}"),
            };
            return Err(cx.err(
                "gateway.crypto_workers",
                format!(
                    "{got} is not \"auto\" or a number of threads from 1 to {MAX_CRYPTO_WORKERS}"
                ),
            ));
        }
    })
}

/// `[gateway]`: its own checks; the outer addresses and the routes into the TUN device.
fn gateway(cx: &Ctx<'_>, g: &RawGateway) -> Result<(IpAddr, IpAddr, Vec<Prefix>), ConfigError> {
    if g.tun.is_empty() || g.tun.len() > 15 || g.tun.contains('/') {
        return Err(cx.err(
            "gateway.tun",
            "must be an interface name of 1-15 characters",
        ));
    }
    if !(1..=2).contains(&g.workers) {
        return Err(cx.err(
            "gateway.workers",
            format!(
                "{} is not 1 (one thread for both directions) or 2 (one per direction); \
                 more than one worker per direction is not supported yet",
                g.workers
            ),
        ));
    }
    if !(576..=9000).contains(&g.mtu) {
        return Err(cx.err("gateway.mtu", format!("{} is outside 576..9000", g.mtu)));
    }
    let addr = |key: &str, s: &str| -> Result<IpAddr, ConfigError> {
        s.parse()
            .map_err(|_| cx.err(key, format!("{s:?} is not an IP address")))
    };
    let local = addr("gateway.local", &g.local)?;
    let remote = addr("gateway.remote", &g.remote)?;
    if local.is_ipv4() != remote.is_ipv4() {
        return Err(cx.err(
            "gateway.remote",
            "local and remote must both be IPv4 or both IPv6",
        ));
    }
    let mut routes = Vec::new();
    for (i, r) in g.routes.iter().enumerate() {
        routes.push(Prefix::parse(r).map_err(|e| cx.err(format!("gateway.routes[{i}]"), e))?);
    }
    if g.table == 0 || g.table >= 253 && g.table <= 255 {
        return Err(cx.err(
            "gateway.table",
            format!("{} is a reserved routing table (0, 253-255)", g.table),
        ));
    }
    if g.user.is_empty() || g.user.contains(['\0', '/', ':']) {
        return Err(cx.err("gateway.user", format!("{:?} is not a user name", g.user)));
    }
    if g.fwmark == 0 {
        return Err(cx.err("gateway.fwmark", "must not be 0 (unmarked)"));
    }
    Ok((local, remote, routes))
}

/// `sa[i]`: one SA, checked key by key and against those before it (`sas`, and the SPIs
/// each direction has used, `seen_spi`).
fn sa<'r>(
    cx: &Ctx<'_>,
    (i, s): (usize, &'r RawSa),
    g: &RawGateway,
    (local, remote): (IpAddr, IpAddr),
    sas: &[SaSpec],
    seen_spi: &mut HashMap<(u32, &'r str), usize>,
    warnings: &mut Vec<String>,
) -> Result<SaSpec, ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    if s.name.is_empty() {
        return Err(cx.err(k("name"), "must not be empty"));
    }
    if sas.iter().any(|x| x.name == s.name) {
        return Err(cx.err(k("name"), format!("a second SA named {:?}", s.name)));
    }
    let direction = match s.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    if s.spi < 256 {
        return Err(cx.err(
            k("spi"),
            format!("{} is reserved (SPIs 0-255, RFC 4303 §2.1)", s.spi),
        ));
    }
    if let Some(j) = seen_spi.insert((s.spi, s.direction.as_str()), i) {
        return Err(cx.err(
            k("spi"),
            format!(
                "0x{:x} is already the SPI of sa[{j}] in the same direction",
                s.spi
            ),
        ));
    }
    let protocol = Protocol::from_name(&s.protocol).ok_or_else(|| {
        cx.err(
            k("protocol"),
            format!("{:?}: must be esp or ah", s.protocol),
        )
    })?;
    let mode = Mode::from_name(&s.mode).ok_or_else(|| {
        cx.err(
            k("mode"),
            format!("{:?}: must be tunnel or transport", s.mode),
        )
    })?;
    let suite = Suite::from_names(&s.encryption, &s.integrity).map_err(|e| {
        let key = if matches!(e, ipsec::crypto::SuiteError::UnknownIntegrity(_)) {
            k("integrity")
        } else {
            k("encryption")
        };
        cx.err(key, e.to_string())
    })?;
    if protocol == Protocol::Ah && s.encryption != "null" {
        return Err(cx.err(k("encryption"), "AH does no encryption: set it to null"));
    }
    if protocol == Protocol::Esp && suite.integrity.is_gmac() {
        return Err(cx.err(
            k("integrity"),
            format!(
                "{}: AES-GMAC as integrity is AH's (RFC 4543 §5.3); for ESP set \
                 encryption = \"{}\" and integrity = \"null\"",
                s.integrity, s.integrity
            ),
        ));
    }
    suite
        .check_legacy(s.legacy)
        .map_err(|e| cx.err(k("legacy"), format!("{e}; set legacy = true to allow it")))?;
    let enc_key = key(cx, cx.file, &k("enc_key"), &s.enc_key, warnings)?;
    let integ_key = key(cx, cx.file, &k("integ_key"), &s.integ_key, warnings)?;
    let want = suite.encryption.key_len();
    if enc_key.expose().len() != want {
        return Err(cx.err(
            k("enc_key"),
            format!(
                "{} needs {want} key bytes{} ({} hex digits), got {}",
                s.encryption,
                if suite.encryption.is_aead() {
                    ", the 4-byte salt included"
                } else {
                    ""
                },
                want * 2,
                enc_key.expose().len()
            ),
        ));
    }
    let want = suite.integrity.key_len();
    if integ_key.expose().len() != want {
        return Err(cx.err(
            k("integ_key"),
            format!(
                "{} needs {want} key bytes ({} hex digits), got {}",
                s.integrity,
                want * 2,
                integ_key.expose().len()
            ),
        ));
    }
    if s.replay_window != 0
        && (!(32..=65536).contains(&s.replay_window) || s.replay_window % 32 != 0)
    {
        return Err(cx.err(
            k("replay_window"),
            "must be 0 (no anti-replay) or a multiple of 32 from 32 to 65536",
        ));
    }
    let lifetime = Lifetime {
        soft_bytes: s.soft_bytes,
        hard_bytes: s.hard_bytes,
        soft_packets: s.soft_packets,
        hard_packets: s.hard_packets,
    };
    for (soft, hard, what) in [
        (lifetime.soft_bytes, lifetime.hard_bytes, "bytes"),
        (lifetime.soft_packets, lifetime.hard_packets, "packets"),
    ] {
        if let (Some(sv), Some(hv)) = (soft, hard) {
            if sv >= hv {
                return Err(cx.err(
                    k(&format!("soft_{what}")),
                    format!("must be below hard_{what} ({hv})"),
                ));
            }
        }
    }
    let tunnel = match direction {
        Direction::Out => TunnelEndpoints {
            src: local,
            dst: remote,
        },
        Direction::In => TunnelEndpoints {
            src: remote,
            dst: local,
        },
    };
    if !suite.has_integrity() && s.replay_window != 0 && direction == Direction::In {
        warnings.push(format!(
            "{}: {}: {} has no integrity, so its sequence numbers are not \
             authenticated: it gets no anti-replay window (RFC 4303 §3.4.3) — one forged \
             packet would otherwise block it; use an AEAD or add integrity",
            cx.file.display(),
            k("replay_window"),
            suite.name()
        ));
    }
    let mut c = SaConfig::new(s.spi, suite, enc_key, integ_key);
    c.protocol = protocol;
    c.direction = direction;
    c.mode = mode;
    c.esn = s.esn;
    c.replay_window = (s.replay_window != 0).then_some(s.replay_window);
    // Transport mode keeps the packet's own addresses (RFC 4303 §3.1.1): host-to-host.
    c.tunnel = (mode == Mode::Tunnel).then_some(tunnel);
    c.legacy = s.legacy;
    if protocol == Protocol::Ah && g.udp_encap {
        return Err(cx.err(
            k("protocol"),
            "AH cannot cross UDP encapsulation (RFC 3948 carries ESP only)",
        ));
    }
    Ok(SaSpec {
        name: s.name.clone(),
        config: c,
        lifetime,
    })
}

/// `bundle[i]`: its SAs exist, are of its direction and protocol, and in no other bundle.
fn bundle(
    cx: &Ctx<'_>,
    (i, b): (usize, &RawBundle),
    sas: &[SaSpec],
    bundles: &[BundleSpec],
) -> Result<BundleSpec, ConfigError> {
    let k = |f: &str| format!("bundle[{i}].{f}");
    if bundles.iter().any(|x| x.name == b.name) || b.name.is_empty() {
        return Err(cx.err(k("name"), format!("{:?}: empty or used twice", b.name)));
    }
    let direction = match b.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    let layer = |f: &str, name: &str, want: Protocol| -> Result<(), ConfigError> {
        let sa = sas
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| cx.err(k(f), format!("no SA named {name:?} in this file")))?;
        if sa.config.protocol != want {
            return Err(cx.err(k(f), format!("SA {name:?} is not {}", want.name())));
        }
        if sa.config.direction != direction {
            return Err(cx.err(k(f), format!("SA {name:?} is of the other direction")));
        }
        if want == Protocol::Esp && sa.config.mode != Mode::Tunnel {
            return Err(cx.err(
                k(f),
                "a bundle's ESP SA is tunnel mode (it builds the outer header)",
            ));
        }
        let taken = bundles
            .iter()
            .any(|x| x.esp == name || x.ah.as_deref() == Some(name));
        if taken {
            return Err(cx.err(k(f), format!("SA {name:?} is already in a bundle")));
        }
        Ok(())
    };
    layer("esp", &b.esp, Protocol::Esp)?;
    if let Some(ah) = &b.ah {
        layer("ah", ah, Protocol::Ah)?;
    }
    if let Some(cpi) = b.ipcomp_cpi {
        ipsec::IpcompConfig::new(cpi)
            .check()
            .map_err(|e| cx.err(k("ipcomp_cpi"), e))?;
    }
    Ok(BundleSpec {
        name: b.name.clone(),
        direction,
        esp: b.esp.clone(),
        ah: b.ah.clone(),
        ipcomp_cpi: b.ipcomp_cpi,
    })
}

/// `policy[i]`: its selector and action, checked against the SAs and bundles; an overlap
/// with an earlier policy of its direction is a warning (the first match wins).
fn policy(
    cx: &Ctx<'_>,
    (i, p): (usize, &RawPolicy),
    sas: &[SaSpec],
    bundles: &[BundleSpec],
    policies: &[PolicySpec],
    warnings: &mut Vec<String>,
) -> Result<PolicySpec, ConfigError> {
    let k = |f: &str| format!("policy[{i}].{f}");
    let direction = match p.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    let pfx = |f: &str, v: &Option<String>| -> Result<Option<Prefix>, ConfigError> {
        v.as_deref()
            .map(Prefix::parse)
            .transpose()
            .map_err(|e| cx.err(k(f), e))
    };
    let selector = Selector {
        src: pfx("src", &p.src)?,
        dst: pfx("dst", &p.dst)?,
        protocol: p.protocol,
        ..Selector::default()
    };
    let in_bundle = |name: &str| {
        bundles
            .iter()
            .any(|b| b.esp == name || b.ah.as_deref() == Some(name))
    };
    let action = match (p.action.as_str(), &p.sa) {
        ("protect", None) if p.bundle.is_some() => {
            let name = p.bundle.as_deref().unwrap_or_default();
            let b = bundles.iter().find(|b| b.name == name).ok_or_else(|| {
                cx.err(
                    k("bundle"),
                    format!("no bundle named {name:?} in this file"),
                )
            })?;
            if b.direction != direction {
                return Err(cx.err(
                    k("bundle"),
                    format!("bundle {name:?} is of the other direction"),
                ));
            }
            PolicyAction::ProtectBundle(name.to_string())
        }
        (_, Some(_)) if p.bundle.is_some() => {
            return Err(cx.err(k("bundle"), "a policy names an SA or a bundle, not both"))
        }
        ("protect", Some(name)) if in_bundle(name) => {
            return Err(cx.err(
                k("sa"),
                format!("SA {name:?} is in a bundle: protect with the bundle"),
            ))
        }
        ("protect", Some(name)) => {
            let sa = sas
                .iter()
                .find(|s| &s.name == name)
                .ok_or_else(|| cx.err(k("sa"), format!("no SA named {name:?} in this file")))?;
            if sa.config.direction != direction {
                return Err(cx.err(
                    k("sa"),
                    format!(
                        "SA {name:?} is {}bound, this policy is {}",
                        if sa.config.direction == Direction::Out {
                            "out"
                        } else {
                            "in"
                        },
                        p.direction
                    ),
                ));
            }
            PolicyAction::Protect(name.clone())
        }
        ("protect", None) => {
            return Err(cx.err(
                k("sa"),
                "a protect policy names the SA (or `bundle`) to protect with",
            ))
        }
        ("bypass", None) => PolicyAction::Bypass,
        ("discard", None) => PolicyAction::Discard,
        ("bypass" | "discard", Some(_)) => {
            return Err(cx.err(k("sa"), format!("a {} policy takes no SA", p.action)))
        }
        (a, _) => {
            return Err(cx.err(
                k("action"),
                format!("{a:?}: must be protect, bypass or discard"),
            ))
        }
    };
    for (j, q) in policies.iter().enumerate() {
        if q.direction == direction && q.selector.overlaps(&selector) {
            warnings.push(format!(
                "{}: policy[{i}] overlaps policy[{j}]: the first one that matches wins \
                 (RFC 4301 §4.4.1)",
                cx.file.display()
            ));
        }
    }
    Ok(PolicySpec {
        direction,
        selector,
        action,
    })
}

/// A warning for each SA no policy uses (directly or through its bundle).
fn unused_sas(
    cx: &Ctx<'_>,
    sas: &[SaSpec],
    bundles: &[BundleSpec],
    policies: &[PolicySpec],
    warnings: &mut Vec<String>,
) {
    for (i, s) in sas.iter().enumerate() {
        let in_used_bundle = bundles.iter().any(|b| {
            (b.esp == s.name || b.ah.as_deref() == Some(&s.name))
                && policies
                    .iter()
                    .any(|p| p.action == PolicyAction::ProtectBundle(b.name.clone()))
        });
        let used = in_used_bundle
            || policies
                .iter()
                .any(|p| p.action == PolicyAction::Protect(s.name.clone()));
        if !used {
            warnings.push(format!(
                "{}: sa[{i}] ({}) is used by no policy",
                cx.file.display(),
                s.name
            ));
        }
    }
}

/// A key given as hex, or `@FILE` holding hex (relative to the config's directory). A
/// key file others may read is a warning.
fn key(
    cx: &Ctx<'_>,
    cfg: &Path,
    name: &str,
    v: &str,
    warnings: &mut Vec<String>,
) -> Result<SecretBytes, ConfigError> {
    if let Some(f) = v.strip_prefix('@') {
        let p = cfg.parent().unwrap_or(Path::new(".")).join(f);
        if let Ok(m) = std::fs::metadata(&p) {
            use std::os::unix::fs::PermissionsExt;
            if m.permissions().mode() & 0o077 != 0 {
                warnings.push(format!(
                    "{}: {name}: the key file {} may be read by others (mode {:o}): chmod 600 it",
                    cfg.display(),
                    p.display(),
                    m.permissions().mode() & 0o777
                ));
            }
        }
        let text = Zeroizing::new(
            std::fs::read_to_string(&p)
                .map_err(|e| cx.err(name, format!("cannot read {}: {e}", p.display())))?,
        );
        return SecretBytes::from_hex(&text)
            .map_err(|e| cx.err(name, format!("in {}: {e}", p.display())));
    }
    SecretBytes::from_hex(v).map_err(|e| cx.err(name, e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A usable two-SA config (out: aes128gcm16 0x1001, in: aes256-sha256 0x2002); other
    /// modules' tests build engines from it.
    pub(crate) const GOOD: &str = r#"
[gateway]
tun = "ipsec0"
local = "192.0.2.1"
remote = "192.0.2.2"
routes = ["10.2.0.0/24"]

[[sa]]
name = "out"
direction = "out"
spi = 0x1001
encryption = "aes128gcm16"
enc_key = "000102030405060708090a0b0c0d0e0f10111213"

[[sa]]
name = "in"
direction = "in"
spi = 0x2002
encryption = "aes256"
integrity = "sha256"
enc_key = "000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f"
integ_key = "000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f"

[[policy]]
direction = "out"
src = "10.1.0.0/24"
dst = "10.2.0.0/24"
action = "protect"
sa = "out"

[[policy]]
direction = "in"
src = "10.2.0.0/24"
dst = "10.1.0.0/24"
action = "protect"
sa = "in"
"#;

    fn err(text: &str) -> ConfigError {
        parse(text, Path::new("gw.toml")).expect_err("should be refused")
    }

    /// GOOD with the first occurrence of `from` replaced by `to`.
    fn with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "{from:?} not in GOOD");
        GOOD.replacen(from, to, 1)
    }

    /// Every window the config accepts is one the engine builds (the config's rule and
    /// the engine's agree), and an SA with encryption but no integrity is warned about.
    #[test]
    fn accepted_replay_windows_build_and_enc_only_is_warned() {
        for w in [0u32, 32, 64, 96, 1024, 65536] {
            let text = with(
                "spi = 0x1001",
                &format!("spi = 0x1001\nreplay_window = {w}"),
            );
            let c = parse(&text, Path::new("gw.toml")).unwrap();
            ipsec::Sa::new(&c.sas[0].config).unwrap();
        }
        for w in [1u32, 31, 33, 100, 65537] {
            let text = with(
                "spi = 0x1001",
                &format!("spi = 0x1001\nreplay_window = {w}"),
            );
            assert_eq!(err(&text).key, "sa[0].replay_window", "window {w}");
        }
        let text = with("integrity = \"sha256\"\n", "");
        let text = text.replacen(
            "integ_key = \"000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f\"\n",
            "",
            1,
        );
        let c = parse(&text, Path::new("gw.toml")).unwrap();
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("no anti-replay window")),
            "{:?}",
            c.warnings
        );
        assert!(!ipsec::Sa::new(&c.sas[1].config)
            .unwrap()
            .replay_window()
            .is_enabled());
    }

    /// "auto": today's single thread per direction below 8 cores, a quarter of the
    /// cores from 8 up, never more than 8.
    #[test]
    fn auto_crypto_workers_follow_the_cores() {
        let got: Vec<usize> = [1, 2, 4, 7, 8, 16, 32, 64].map(crypto_workers_for).to_vec();
        assert_eq!(got, [1, 1, 1, 1, 2, 4, 8, 8]);
    }

    #[test]
    fn a_good_config_reads() {
        let c = parse(GOOD, Path::new("gw.toml")).unwrap();
        assert_eq!(c.sas.len(), 2);
        assert_eq!(c.policies.len(), 2);
        assert_eq!(c.mtu, 1400);
        assert_eq!(c.workers, 2);
        assert_eq!(c.crypto_workers, auto_crypto_workers());
        for (line, want) in [
            ("crypto_workers = 3", 3),
            ("crypto_workers = \"auto\"", auto_crypto_workers()),
        ] {
            let text = GOOD.replace("tun = \"ipsec0\"", &format!("tun = \"ipsec0\"\n{line}"));
            assert_eq!(
                parse(&text, Path::new("gw.toml")).unwrap().crypto_workers,
                want,
                "{line}"
            );
        }
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let out = &c.sas[0].config;
        assert_eq!(
            out.tunnel.unwrap().dst,
            "192.0.2.2".parse::<IpAddr>().unwrap()
        );
        let inb = &c.sas[1].config;
        assert_eq!(
            inb.tunnel.unwrap().dst,
            "192.0.2.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn each_error_names_the_file_and_key() {
        let cases: &[(String, &str, &str)] = &[
            (with("aes128gcm16", "aes999"), "sa[0].encryption", "aes999"),
            (
                with("integrity = \"sha256\"", "integrity = \"sha3\""),
                "sa[1].integrity",
                "sha3",
            ),
            (
                with("0a0b0c0d0e0f10111213", "0a0b0c0d0e0f"),
                "sa[0].enc_key",
                "needs 20 key bytes",
            ),
            (with("spi = 0x2002", "spi = 0x10"), "sa[1].spi", "reserved"),
            (
                with("name = \"in\"", "name = \"out\""),
                "sa[1].name",
                "second SA",
            ),
            (
                with("sa = \"in\"", "sa = \"nowhere\""),
                "policy[1].sa",
                "no SA named",
            ),
            (
                with("sa = \"in\"", "sa = \"out\""),
                "policy[1].sa",
                "outbound",
            ),
            (
                with("action = \"protect\"", "action = \"encrypt\""),
                "policy[0].action",
                "encrypt",
            ),
            (
                with("tun = \"ipsec0\"", "tun = \"ipsec0\"\nworkers = 4"),
                "gateway.workers",
                "more than one worker per direction",
            ),
            (
                with("tun = \"ipsec0\"", "tun = \"ipsec0\"\ncrypto_workers = 0"),
                "gateway.crypto_workers",
                "0 is not \"auto\" or a number of threads from 1 to 8",
            ),
            (
                with(
                    "tun = \"ipsec0\"",
                    "tun = \"ipsec0\"\ncrypto_workers = \"all\"",
                ),
                "gateway.crypto_workers",
                "\"all\" is not",
            ),
            (
                with("local = \"192.0.2.1\"", "local = \"gw-a\""),
                "gateway.local",
                "not an IP",
            ),
            (
                with("routes = [\"10.2.0.0/24\"]", "routes = [\"10.2.0.0/33\"]"),
                "gateway.routes[0]",
                "/33",
            ),
            (
                with("direction = \"in\"", "direction = \"both\""),
                "sa[1].direction",
                "in or out",
            ),
            (
                with("encryption = \"aes256\"", "encryption = \"3des\""),
                "sa[1].legacy",
                "legacy = true",
            ),
            (
                with("tun = \"ipsec0\"", "tun = \"a-very-long-interface-name\""),
                "gateway.tun",
                "1-15",
            ),
            (
                // the engine's windows are whole 32-bit words: 100 passed --check and
                // then panicked at start
                with("spi = 0x2002", "spi = 0x2002\nreplay_window = 100"),
                "sa[1].replay_window",
                "multiple of 32",
            ),
            (
                // AH's AES-GMAC (RFC 4543 §4) as an ESP integrity algorithm
                with(
                    "encryption = \"aes256\"\nintegrity = \"sha256\"",
                    "encryption = \"null\"\nintegrity = \"aes256gmac\"",
                ),
                "sa[1].integrity",
                "AH's (RFC 4543 §5.3)",
            ),
        ];
        for (text, key, words) in cases {
            let e = err(text);
            assert_eq!(e.key, *key, "{e}");
            assert!(
                e.to_string().starts_with(&format!("gw.toml: {key}: ")),
                "{e}"
            );
            assert!(e.to_string().contains(words), "{e} lacks {words:?}");
        }
    }

    #[test]
    fn duplicate_spi_in_one_direction_and_unknown_keys() {
        let text = GOOD.replacen("spi = 0x2002", "spi = 0x1001", 1);
        // the same SPI in the other direction is fine (they are the peer's choice)
        assert!(parse(&text, Path::new("gw.toml")).is_ok());
        let dup = format!(
            "{GOOD}\n[[sa]]\nname = \"x\"\ndirection = \"out\"\nspi = 0x1001\n\
             encryption = \"null\"\nintegrity = \"sha1\"\n\
             integ_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n"
        );
        let e = err(&dup);
        assert_eq!(e.key, "sa[2].spi");
        assert!(e.message.contains("already the SPI of sa[0]"), "{e}");
        let e = err(&with("[gateway]", "[gateway]\ncolour = \"blue\""));
        assert!(e.key.starts_with("line "), "{e}");
        assert!(e.message.contains("unknown field `colour`"), "{e}");
    }

    #[test]
    fn keys_never_appear_in_errors() {
        let secret = "deadbeefdeadbeefdeadbeefdeadbeefdeadbeez"; // one bad digit
        let e = err(&with("000102030405060708090a0b0c0d0e0f10111213", secret));
        assert_eq!(e.key, "sa[0].enc_key");
        assert!(!e.to_string().contains("deadbeef"), "{e}");
        let s = format!("{:?}", parse(GOOD, Path::new("gw.toml")).unwrap());
        assert!(!s.contains("0a0b0c0d"), "a key leaked into Debug output");
    }

    #[test]
    fn overlapping_policies_and_unused_sas_are_warnings() {
        let text = format!(
            "{GOOD}\n[[policy]]\ndirection = \"out\"\nsrc = \"10.1.0.0/16\"\naction = \"bypass\"\n"
        );
        let c = parse(&text, Path::new("gw.toml")).unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("policy[2] overlaps policy[0]"),
            "{:?}",
            c.warnings
        );
        let unused = format!(
            "{GOOD}\n[[sa]]\nname = \"spare\"\ndirection = \"out\"\nspi = 0x3003\n\
             encryption = \"null\"\nintegrity = \"sha1\"\n\
             integ_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n"
        );
        let c = parse(&unused, Path::new("gw.toml")).unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("sa[2] (spare) is used by no policy"),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn keys_from_files_and_lifetimes() {
        let dir = std::env::temp_dir().join(format!("ipsec-gw-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("k.hex"),
            "000102030405060708090a0b0c0d0e0f10111213\n",
        )
        .unwrap();
        let text = with(
            "enc_key = \"000102030405060708090a0b0c0d0e0f10111213\"",
            "enc_key = \"@k.hex\"\nsoft_packets = 10\nhard_packets = 20",
        );
        let c = parse(&text, &dir.join("gw.toml")).unwrap();
        assert_eq!(c.sas[0].lifetime.hard_packets, Some(20));
        let e = parse(&text.replace("@k.hex", "@nope.hex"), &dir.join("gw.toml")).unwrap_err();
        assert_eq!(e.key, "sa[0].enc_key");
        let bad = text.replace("soft_packets = 10", "soft_packets = 30");
        let e = parse(&bad, &dir.join("gw.toml")).unwrap_err();
        assert_eq!(e.key, "sa[0].soft_packets");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_reload_keeps_sas_whose_definition_is_unchanged() {
        let a = parse(GOOD, Path::new("gw.toml")).unwrap();
        let renamed = GOOD
            .replace("name = \"out\"", "name = \"a-to-b\"")
            .replace("sa = \"out\"", "sa = \"a-to-b\"");
        let renamed = parse(&renamed, Path::new("gw.toml")).unwrap();
        assert!(a.sas[0].same_as(&renamed.sas[0]));
        let rekeyed = parse(
            &with("0a0b0c0d0e0f10111213", "0a0b0c0d0e0f10111214"),
            Path::new("gw.toml"),
        )
        .unwrap();
        assert!(!a.sas[0].same_as(&rekeyed.sas[0]));
        assert!(a.sas[1].same_as(&rekeyed.sas[1]));
    }

    #[test]
    fn bundles_are_checked() {
        let ah =
            "\n[[sa]]\nname = \"ah-out\"\ndirection = \"out\"\nspi = 0x1101\nprotocol = \"ah\"\n\
                  encryption = \"null\"\nintegrity = \"sha1\"\n\
                  integ_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n";
        let bundle = |esp: &str, ahn: &str| {
            format!(
                "{GOOD}{ah}\n[[bundle]]\nname = \"b\"\ndirection = \"out\"\nesp = \"{esp}\"\n\
                 ah = \"{ahn}\"\nipcomp_cpi = 2\n"
            )
        };
        // a good bundle, used by a policy in place of the ESP SA
        let good = bundle("out", "ah-out").replacen("sa = \"out\"", "bundle = \"b\"", 1);
        let c = parse(&good, Path::new("gw.toml")).unwrap();
        assert_eq!(c.bundles.len(), 1);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // an SA in a bundle cannot also protect alone
        let e = err(&bundle("out", "ah-out"));
        assert_eq!(e.key, "policy[0].sa");
        assert!(e.message.contains("is in a bundle"), "{e}");
        // layers of the wrong protocol or direction, or missing
        let e = err(&bundle("ah-out", "out"));
        assert_eq!(e.key, "bundle[0].esp");
        let e = err(&bundle("in", "ah-out"));
        assert!(e.message.contains("other direction"), "{e}");
        let e = err(&bundle("out", "nope"));
        assert_eq!(e.key, "bundle[0].ah");
        let e = err(&good.replace("ipcomp_cpi = 2", "ipcomp_cpi = 100"));
        assert_eq!(e.key, "bundle[0].ipcomp_cpi");
        let e = err(&good.replacen("bundle = \"b\"", "bundle = \"b\"\nsa = \"in\"", 1));
        assert_eq!(e.key, "policy[0].bundle");
    }

    /// Two SAs never share a key, in or out: the nonce (salt ‖ sequence number) has no
    /// SPI or direction in it. Refused naming the second SA's key and the first SA.
    #[test]
    fn two_sas_sharing_a_key_are_refused() {
        let gcm_in = "name = \"in\"\ndirection = \"in\"\nspi = 0x2002\n\
                      encryption = \"aes128gcm16\"\n\
                      enc_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n";
        let text = GOOD.replacen(
            &GOOD[GOOD.find("name = \"in\"").unwrap()..GOOD.find("\n\n[[policy]]").unwrap()],
            gcm_in.trim_end(),
            1,
        );
        let e = err(&text);
        assert_eq!(e.key, "sa[1].enc_key");
        assert!(e.message.contains("the same key as sa[0] (\"out\")"), "{e}");
        assert!(
            !e.to_string().contains("0001020304"),
            "the key was printed: {e}"
        );
        // an integrity key shared is refused too
        let text = with(
            "encryption = \"aes128gcm16\"\nenc_key = \"000102030405060708090a0b0c0d0e0f10111213\"",
            "encryption = \"null\"\nintegrity = \"sha256\"\n\
             integ_key = \"000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f\"",
        );
        assert_eq!(err(&text).key, "sa[1].integ_key");
    }
}
