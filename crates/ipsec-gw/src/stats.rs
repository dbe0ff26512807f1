//! Counters the workers publish and the stats endpoint serves: per SA packets, bytes,
//! drops by reason and (when on) nanoseconds per stage; per direction the I/O counters.
//! Served on a Unix socket as JSON or Prometheus text; keys never appear here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(Clone, Debug, Default, Serialize)]
pub struct StageStat {
    pub ns: u64,
    pub calls: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SaStats {
    pub name: String,
    pub spi: String,
    pub protocol: &'static str,
    pub suite: String,
    pub packets: u64,
    pub bytes: u64,
    pub drops: BTreeMap<&'static str, u64>,
    pub stages: BTreeMap<&'static str, StageStat>,
    /// "active", or "expired" once its hard lifetime is reached (it then protects nothing).
    pub state: &'static str,
    pub soft_lifetime_reached: bool,
}

/// What crossed one direction's sockets (outside the engine's own counters).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Io {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub send_errors: u64,
    /// Packets sent or delivered in clear because a bypass policy said so.
    pub bypassed: u64,
    /// UDP-encapsulation datagrams that were not ESP (IKE's non-ESP marker, keepalives).
    pub not_esp: u64,
    /// UDP GSO: send calls that carried several ESP packets (segments) at once.
    pub gso_sends: u64,
    /// UDP GRO: datagrams the kernel handed up coalesced (several ESP packets in one).
    pub gro_receives: u64,
    /// Writes to the TUN device (inbound): fewer than packets out where GRO joined a
    /// flow's packets into one.
    pub tun_writes: u64,
    /// `aqm`: packets CoDel dropped from a standing queue in an outer socket (RFC 8289),
    /// never opened (counted in `rx_packets` too; each packet of a coalesced datagram).
    pub queue_delay_drops: u64,
    /// `tun_queue = "auto"` (outbound): times the TUN device's queue was changed.
    pub tun_queue_changes: u64,
}

/// An IPComp association's counters (RFC 3173), by the bundle it is in.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IpcompStats {
    pub bundle: String,
    pub cpi: u16,
    pub compressed: u64,
    pub incompressible: u64,
    pub too_small: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub decompressed: u64,
    pub drops: BTreeMap<&'static str, u64>,
}

/// The SAs reloads have taken away, their counters summed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RemovedStats {
    pub sas: u64,
    pub packets: u64,
    pub bytes: u64,
    pub drops: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DirStats {
    pub sas: Vec<SaStats>,
    pub ipcomp: Vec<IpcompStats>,
    /// Drops before an SA was known (no SA, unknown SPI, malformed, policy).
    pub drops: BTreeMap<&'static str, u64>,
    /// What the SAs a reload took away had counted (a rekey's old SAs): kept, so that a
    /// drop or a packet is not forgotten with its SA.
    pub removed_sas: RemovedStats,
    pub io: Io,
    /// How many times this direction's worker has published its counters (about every
    /// 100 ms, and once as it stops): a reader that sees it move twice knows the counters
    /// include everything handled before its first look.
    pub published: u64,
}

/// Shared between the workers (writers) and the stats endpoint (reader).
pub struct Shared {
    pub outbound: Mutex<DirStats>,
    pub inbound: Mutex<DirStats>,
    pub started: Instant,
    pub reloads: std::sync::atomic::AtomicU64,
    pub reloads_refused: std::sync::atomic::AtomicU64,
    /// Why a worker stopped on its own (the gateway then exits non-zero with it).
    pub failed: Mutex<Option<String>>,
    /// The nftables table of the clear-traffic guard (`guard`), whose counters the
    /// stats report: set once at start (the table follows `table`, which a reload may
    /// not change).
    pub guard: std::sync::OnceLock<String>,
    /// The TUN device's name, whose queue's drops the stats report (`tun_queue_drops`).
    pub tun: std::sync::OnceLock<String>,
}

/// Clear packets for protected traffic the guard dropped before they crossed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClearDropped {
    /// From outside, matching an inbound protect policy, not out of the TUN device.
    pub inbound: u64,
    /// Matching an outbound protect policy, about to leave by another interface.
    pub outbound: u64,
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

impl Shared {
    pub fn new() -> Self {
        Shared {
            outbound: Mutex::new(DirStats::default()),
            inbound: Mutex::new(DirStats::default()),
            started: Instant::now(),
            reloads: Default::default(),
            reloads_refused: Default::default(),
            failed: Mutex::new(None),
            guard: std::sync::OnceLock::new(),
            tun: std::sync::OnceLock::new(),
        }
    }

    pub fn json(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        #[derive(Serialize)]
        struct All {
            uptime_s: f64,
            reloads: u64,
            reloads_refused: u64,
            outbound: DirStats,
            inbound: DirStats,
            clear_dropped: ClearDropped,
            tun_queue_drops: Option<u64>,
        }
        let all = All {
            tun_queue_drops: self.tun_queue_drops(),
            clear_dropped: self.clear_dropped(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            reloads: self.reloads.load(Relaxed),
            reloads_refused: self.reloads_refused.load(Relaxed),
            outbound: self.outbound.lock().expect("stats lock").clone(),
            inbound: self.inbound.lock().expect("stats lock").clone(),
        };
        serde_json::to_string_pretty(&all).expect("stats serialise")
    }

    /// Packets the kernel dropped because the TUN device's queue (`tun_queue`) was full:
    /// its transmit drops, as `ip -s link` shows them, read from this thread's network
    /// namespace's /proc/thread-self/net/dev (None, `null`, when it cannot be read). Not
    /// counted there: what a shrink of the queue (`tun_queue = "auto"`) let go.
    pub fn tun_queue_drops(&self) -> Option<u64> {
        let tun = self.tun.get()?;
        std::fs::read_to_string("/proc/thread-self/net/dev")
            .ok()
            .and_then(|t| tx_dropped(&t, tun))
    }

    /// The guard's counters (zero when it has none or nftables cannot be asked).
    pub fn clear_dropped(&self) -> ClearDropped {
        match self.guard.get().and_then(|t| crate::guard::dropped(t)) {
            Some((inbound, outbound)) => ClearDropped { inbound, outbound },
            None => ClearDropped::default(),
        }
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        let clear = self.clear_dropped();
        let _ = writeln!(
            s,
            "# HELP ipsec_gw_clear_dropped_total Clear packets for protected traffic dropped \
             at the boundary.\n# TYPE ipsec_gw_clear_dropped_total counter\n\
             ipsec_gw_clear_dropped_total{{direction=\"in\"}} {}\n\
             ipsec_gw_clear_dropped_total{{direction=\"out\"}} {}",
            clear.inbound, clear.outbound
        );
        if let Some(n) = self.tun_queue_drops() {
            let _ = writeln!(
                s,
                "# HELP ipsec_gw_tun_queue_drops_total Packets the kernel dropped: the TUN \
                 device's queue (tun_queue) was full.\n\
                 # TYPE ipsec_gw_tun_queue_drops_total counter\n\
                 ipsec_gw_tun_queue_drops_total {n}"
            );
        }
        let mut family = |name: &str, help: &str, kind: &str| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            "ipsec_gw_sa_packets_total",
            "Packets sealed or opened by the SA.",
            "counter",
        );
        family(
            "ipsec_gw_sa_bytes_total",
            "Protected payload bytes of the SA.",
            "counter",
        );
        family(
            "ipsec_gw_sa_drops_total",
            "Packets the SA refused, by reason.",
            "counter",
        );
        family(
            "ipsec_gw_sa_stage_ns_total",
            "Nanoseconds spent per stage.",
            "counter",
        );
        family(
            "ipsec_gw_drops_total",
            "Packets refused before an SA was known.",
            "counter",
        );
        family(
            "ipsec_gw_io_packets_total",
            "Packets read or written on a side.",
            "counter",
        );
        family(
            "ipsec_gw_send_errors_total",
            "Packets the kernel refused to send.",
            "counter",
        );
        family(
            "ipsec_gw_udp_gso_sends_total",
            "UDP GSO sends carrying several ESP packets.",
            "counter",
        );
        family(
            "ipsec_gw_udp_gro_receives_total",
            "UDP datagrams received coalesced (GRO).",
            "counter",
        );
        family(
            "ipsec_gw_tun_writes_total",
            "Writes to the TUN device (GRO joins packets into fewer).",
            "counter",
        );
        family(
            "ipsec_gw_queue_delay_drops_total",
            "Packets CoDel dropped from a standing receive queue (aqm), unopened.",
            "counter",
        );
        family(
            "ipsec_gw_tun_queue_changes_total",
            "Changes of the TUN device's queue (tun_queue = \"auto\", outbound).",
            "counter",
        );
        for (dir, st) in [
            ("out", self.outbound.lock().expect("stats lock").clone()),
            ("in", self.inbound.lock().expect("stats lock").clone()),
        ] {
            for sa in &st.sas {
                let l = format!("sa=\"{}\",spi=\"{}\",direction=\"{dir}\"", sa.name, sa.spi);
                let _ = writeln!(s, "ipsec_gw_sa_packets_total{{{l}}} {}", sa.packets);
                let _ = writeln!(s, "ipsec_gw_sa_bytes_total{{{l}}} {}", sa.bytes);
                for (r, n) in &sa.drops {
                    let _ = writeln!(s, "ipsec_gw_sa_drops_total{{{l},reason=\"{r}\"}} {n}");
                }
                for (stage, v) in &sa.stages {
                    let _ = writeln!(
                        s,
                        "ipsec_gw_sa_stage_ns_total{{{l},stage=\"{stage}\"}} {}",
                        v.ns
                    );
                }
            }
            for (r, n) in &st.drops {
                let _ = writeln!(
                    s,
                    "ipsec_gw_drops_total{{direction=\"{dir}\",reason=\"{r}\"}} {n}"
                );
            }
            let _ = writeln!(
                s,
                "ipsec_gw_io_packets_total{{direction=\"{dir}\",io=\"rx\"}} {}\n\
                 ipsec_gw_io_packets_total{{direction=\"{dir}\",io=\"tx\"}} {}\n\
                 ipsec_gw_send_errors_total{{direction=\"{dir}\"}} {}\n\
                 ipsec_gw_udp_gso_sends_total{{direction=\"{dir}\"}} {}\n\
                 ipsec_gw_udp_gro_receives_total{{direction=\"{dir}\"}} {}\n\
                 ipsec_gw_tun_writes_total{{direction=\"{dir}\"}} {}\n\
                 ipsec_gw_queue_delay_drops_total{{direction=\"{dir}\"}} {}\n\
                 ipsec_gw_tun_queue_changes_total{{direction=\"{dir}\"}} {}",
                st.io.rx_packets,
                st.io.tx_packets,
                st.io.send_errors,
                st.io.gso_sends,
                st.io.gro_receives,
                st.io.tun_writes,
                st.io.queue_delay_drops,
                st.io.tun_queue_changes
            );
        }
        s
    }
}

/// The transmit drops of interface `name` in /proc/net/dev's text: after "name:", eight
/// receive columns (bytes, packets, errs, drop, fifo, frame, compressed, multicast),
/// then transmit's bytes, packets, errs, drop.
fn tx_dropped(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (ifname, cols) = l.split_once(':')?;
        if ifname.trim() != name {
            return None;
        }
        cols.split_whitespace().nth(11)?.parse().ok()
    })
}

/// Refused when a running gateway answers on `path`: a second gateway must not take the
/// first one's stats socket (checked before anything is made, and again at [`bind`]).
pub fn in_use(path: &Path) -> std::io::Result<()> {
    if UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::other(
            "a running gateway answers on it: give each gateway its own `stats` path",
        ));
    }
    Ok(())
}

/// Bind the stats socket (0600: call it under `sys::with_umask(0o177, …)`), before the
/// gateway gives up root; [`serve`] answers on
/// it: a client writes one line, `json` (the default) or `prometheus`, and reads the
/// answer until the socket closes.
pub fn bind(path: &Path) -> std::io::Result<(UnixListener, BoundSocket)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    // Only a socket a previous gateway left is replaced: a typo that names a config or a
    // key file must not delete it, as root; nor may a second gateway take the socket of
    // one that still answers on it.
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            in_use(path)?;
            std::fs::remove_file(path)?
        }
        Ok(_) => {
            return Err(std::io::Error::other(
                "it exists and is not a socket: refusing to replace it",
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Counters only, but still this gateway's business: owner only, from the first
    // instant — the caller binds under a umask of 0177 (`sys::with_umask`), not a chmod
    // by path after `bind`, which whoever may write the directory could race (a symlink
    // in its place: root would chmod the file it names). Refused if made wider.
    let listener = UnixListener::bind(path)?;
    let m = std::fs::symlink_metadata(path)?;
    if m.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "it was made with mode {:o}, not 0600",
            m.permissions().mode() & 0o777
        )));
    }
    let bound = BoundSocket {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    };
    Ok((listener, bound))
}

/// Answer on `listener` (from [`bind`]) on a thread of its own, for the process's life.
pub fn serve(listener: UnixListener, shared: std::sync::Arc<Shared>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stats".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        let _ = answer(s, &shared);
                    }
                    // EMFILE and the like: wait instead of spinning on accept
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })?;
    Ok(())
}

/// The stats socket this gateway bound: its path and (device, inode).
#[derive(Debug)]
pub struct BoundSocket {
    pub path: std::path::PathBuf,
    id: (u64, u64),
}

impl BoundSocket {
    /// Remove the socket at a clean stop — only if the path still names the very socket
    /// this gateway bound (same device and inode): never a file put there since, nor
    /// another gateway's socket.
    pub fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.id => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    eprintln!(
                        "ipsec-gw: cannot remove the stats socket {}: {e}",
                        self.path.display()
                    );
                }
            }
            Ok(_) => eprintln!(
                "ipsec-gw: {} is no longer the stats socket this gateway bound: left alone",
                self.path.display()
            ),
            Err(_) => {}
        }
    }
}

/// The longest request line taken ("json" or "prometheus").
const MAX_REQUEST: u64 = 64;

fn answer(stream: UnixStream, shared: &Shared) -> std::io::Result<()> {
    use std::io::Read;
    // A client that sends nothing, or reads nothing, holds the (one) stats thread for at
    // most these: it cannot wedge it.
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let body = if line.trim() == "prometheus" {
        shared.prometheus()
    } else {
        shared.json()
    };
    (&stream).write_all(body.as_bytes())
}

/// The client side (`ipsec-gw stats`).
pub fn fetch(path: &Path, format: &str) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format.as_bytes())?;
    s.write_all(b"\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::tx_dropped;

    /// A /proc/net/dev as Linux 6.1 writes it (`ip -s link` showed "TX: ... dropped 37"
    /// for ipsec0): the transmit drop column, for the named interface only.
    #[test]
    fn the_tun_queue_drops_are_the_devices_transmit_drops() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
            lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n\
            ipsec0: 1234      10    0    5    0     0          0         0   987654     321    2   37    0     0       0          0\n  \
            ipsec01: 1 2 3 4 5 6 7 8 9 10 11 99 13 14 15 16\n";
        assert_eq!(tx_dropped(text, "ipsec0"), Some(37));
        assert_eq!(tx_dropped(text, "ipsec01"), Some(99));
        assert_eq!(tx_dropped(text, "lo"), Some(0));
        assert_eq!(tx_dropped(text, "ipsec"), None);
        assert_eq!(tx_dropped("ipsec0: 1 2 3\n", "ipsec0"), None);
    }
}
