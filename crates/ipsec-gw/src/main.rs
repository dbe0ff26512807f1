//! `ipsec-gw`: the ipsec-lab gateway. The engine (`crates/ipsec`) between a TUN device
//! (the inside: routes to the remote subnets point into it) and raw IP sockets for ESP
//! and AH (the outside), optionally ESP in UDP on port 4500 (RFC 3948). Foreground; logs
//! to stderr; SIGHUP reloads the config, SIGTERM/SIGINT stop it (the TUN device goes).

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use ipsec::sa::Direction;
use ipsec_gw::guard::ip;
use ipsec_gw::{claim, config, dataplane, guard, privilege, seqstate, stats, sys};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

#[derive(Parser)]
#[command(
    name = "ipsec-gw",
    version,
    about = "The ipsec-lab gateway: ESP/AH tunnels in user space, between a TUN device and raw IP sockets",
    long_about = "Runs in the foreground; logs to stderr; needs CAP_NET_ADMIN and CAP_NET_RAW \
                  (root). SIGHUP reloads the config (unchanged SAs keep their sequence numbers \
                  and replay windows; a config that fails its checks is refused and the \
                  running one stays); SIGTERM or SIGINT stop it and remove the TUN device."
)]
struct Cli {
    /// The gateway's config file (TOML; docs/gateway.md gives the format).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Check the config and exit: 0 if it is usable (warnings on stderr), 2 if not.
    #[arg(long)]
    check: bool,
    /// Start with no sequence state (none exists yet): ONLY for keys never used before.
    /// Without it a gateway whose state files are missing refuses to start, since manual
    /// keys used before would repeat sequence numbers (with AES-GCM: nonces).
    #[arg(long, conflicts_with = "check")]
    init_state: bool,
    /// Take away what keeps the protected subnets closed while the gateway is down (its
    /// blackhole routes, routing rule and nftables table), then exit: traffic for them
    /// then follows the host's other routes, in clear. For decommissioning.
    #[arg(long, conflicts_with_all = ["check", "init_state"])]
    release: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a running gateway's counters (from its stats socket).
    Stats {
        /// The stats socket (`gateway.stats` in its config).
        #[arg(long)]
        socket: PathBuf,
        /// Print JSON (for scripts).
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Print Prometheus text.
        #[arg(long)]
        prometheus: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Signals first, before the config is read: a SIGHUP or SIGTERM that comes while the
    // gateway is being set up waits for the loop in `run`, instead of killing it half
    // made (their default action). Registering opens a self-pipe; it spawns no thread.
    let signals = match Signals::new([SIGHUP, SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ipsec-gw: cannot handle signals: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(Cmd::Stats {
        socket,
        json,
        prometheus,
    }) = cli.command
    {
        return print_stats(&socket, json, prometheus);
    }
    let Some(path) = cli.config else {
        eprintln!("ipsec-gw: --config FILE is needed (see --help)");
        return ExitCode::from(2);
    };
    let cfg = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ipsec-gw: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &cfg.warnings {
        eprintln!("ipsec-gw: warning: {w}");
    }
    // The engines themselves, built as the gateway will build them: a config --check
    // calls usable is one that starts (every rule of the engine's, not a copy of them).
    if let Err(e) = dataplane::DirEngine::check(&cfg) {
        eprintln!("ipsec-gw: {}: {e}", path.display());
        return ExitCode::from(2);
    }
    if cli.release {
        // Never under a running gateway: its guard is what keeps its traffic from
        // leaving in clear. Both its locks are tried (held: refused).
        let held = claim::table(&cfg).and_then(|t| seqstate::lock(&cfg.state).map(|s| (t, s)));
        let _locks = match held {
            Ok(locks) => locks,
            Err(e) => {
                eprintln!("ipsec-gw: --release refused: {e}; stop that gateway first");
                return ExitCode::from(1);
            }
        };
        return match guard::release(&cfg) {
            Ok(()) => {
                eprintln!(
                    "ipsec-gw: {}: released: traffic for its protected subnets now follows \
                     the host's other routes",
                    path.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ipsec-gw: {e}");
                ExitCode::from(1)
            }
        };
    }
    if cli.check {
        eprintln!(
            "ipsec-gw: {}: usable ({} SAs, {} policies; sequence state in {}.out/.in)",
            path.display(),
            cfg.sas.len(),
            cfg.policies.len(),
            cfg.state.display()
        );
        return ExitCode::SUCCESS;
    }
    match run(cfg, cli.init_state, signals) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipsec-gw: {e}");
            ExitCode::from(1)
        }
    }
}

fn print_stats(socket: &std::path::Path, json: bool, prometheus: bool) -> ExitCode {
    let format = if prometheus { "prometheus" } else { "json" };
    let text = match stats::fetch(socket, format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ipsec-gw stats: cannot read {}: {e}", socket.display());
            return ExitCode::from(1);
        }
    };
    if json || prometheus {
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("ipsec-gw stats: not the gateway's JSON: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "up {:.0} s, {} reloads ({} refused)",
        v["uptime_s"].as_f64().unwrap_or(0.0),
        v["reloads"],
        v["reloads_refused"]
    );
    for dir in ["outbound", "inbound"] {
        let d = &v[dir];
        let io = &d["io"];
        let offload = match (io["gso_sends"].as_u64(), io["gro_receives"].as_u64()) {
            (Some(0) | None, Some(0) | None) => String::new(),
            (gso, gro) => format!(
                " ({} UDP GSO sends, {} GRO receives)",
                gso.unwrap_or(0),
                gro.unwrap_or(0)
            ),
        };
        let writes = match io["tun_writes"].as_u64() {
            Some(n) if n > 0 => format!(" in {n} TUN writes"),
            _ => String::new(),
        };
        println!(
            "{dir}: {} packets in, {} out{writes}{offload}, {} send errors, drops {}",
            io["rx_packets"], io["tx_packets"], io["send_errors"], d["drops"]
        );
        for sa in d["sas"].as_array().into_iter().flatten() {
            println!(
                "  SA {} spi {} {} {}: {} packets, {} bytes, {}, drops {}",
                sa["name"].as_str().unwrap_or("?"),
                sa["spi"].as_str().unwrap_or("?"),
                sa["protocol"].as_str().unwrap_or("?"),
                sa["suite"].as_str().unwrap_or("?"),
                sa["packets"],
                sa["bytes"],
                sa["state"].as_str().unwrap_or("?"),
                sa["drops"]
            );
        }
    }
    ExitCode::SUCCESS
}

fn run(cfg: config::Config, init_state: bool, mut signals: Signals) -> Result<(), String> {
    // Least privilege before anything is made: every step below proves it needs no more.
    privilege::limit_for_setup()?;
    let ids = privilege::lookup(&cfg.user)?;
    // Opened while root: the gateway's user re-reads it on SIGHUP through this.
    let mut source = config::Source::open(&cfg.file).map_err(|e| e.to_string())?;
    // One gateway per state, and per routing table (its guard), for its whole life.
    let _lock = seqstate::lock(&cfg.state)?;
    let _table = claim::table(&cfg)?;
    // The engines first, sequence state read and reservations written: nothing is
    // created (TUN device, routes) for a gateway that cannot keep its numbers.
    let open = |dir: Direction| {
        seqstate::SeqState::open(&seqstate::path_for(&cfg.state, dir), dir, init_state)
    };
    let (st_out, st_in) = (open(Direction::Out)?, open(Direction::In)?);
    let (read_out, read_in) = (st_out.reader()?, st_in.reader()?);
    // What each direction's state records, for a reload to check the other direction's
    // SAs against (the workers' readers are theirs); and every key each direction's SAs
    // held in a config this gateway took, which a worker records only once it builds
    // that config, later than it is sent (a burst of reloads).
    let states = [st_out.reader()?, st_in.reader()?];
    let mut taken = KeysTaken::default();
    taken.add(&cfg);
    let engine = |dir: Direction, both| -> Result<dataplane::DirEngine, String> {
        dataplane::DirEngine::build(&cfg, dir, None, Some(both)).map_err(|e| e.to_string())
    };
    let eng_out = engine(Direction::Out, (st_out, read_in))?;
    let eng_in = engine(Direction::In, (st_in, read_out))?;
    // The TUN device's MTU, before anything is made: a path that leaves too little room
    // is refused with nothing to undo.
    let (start_mtu, path) = tun_mtu(&cfg)?;
    // A TUN device of this name is another gateway's (a gateway's goes with it): refused
    // before this one's guard goes in beside that one's.
    if std::path::Path::new("/sys/class/net")
        .join(&cfg.tun)
        .exists()
    {
        return Err(format!(
            "an interface named {} exists already (another gateway's?): give this gateway \
             its own `tun`",
            cfg.tun
        ));
    }
    if let Some(p) = &cfg.stats {
        stats::in_use(p).map_err(|e| format!("cannot serve stats on {}: {e}", p.display()))?;
    }
    // The boundary closed before the TUN device exists, and kept closed after it goes.
    guard::install(&cfg)?;
    let tun = tun_rs::DeviceBuilder::new()
        .name(&cfg.tun)
        .mtu(start_mtu)
        .offload(cfg.offload)
        .build_sync()
        .map_err(|e| format!("cannot create TUN device {}: {e}", cfg.tun))?;
    let tun = Arc::new(tun);
    ip(&["link", "set", "dev", &cfg.tun, "up"])?;
    // Loose reverse-path filtering on the TUN device: a host-to-host peer's packets come
    // out of it with a source whose route is the outer interface.
    let rp = format!("/proc/sys/net/ipv4/conf/{}/rp_filter", cfg.tun);
    if let Err(e) = std::fs::write(&rp, "2") {
        eprintln!("ipsec-gw: warning: cannot set loose reverse-path filtering ({rp}): {e}");
    }
    guard::tun_routes(&cfg)?;
    let outside = Arc::new(
        dataplane::Outside::open(&cfg)
            .map_err(|e| format!("cannot open the outer sockets: {e}"))?,
    );
    let shared = Arc::new(stats::Shared::new());
    let _ = shared.guard.set(guard::table_name(&cfg));
    let stats_socket = match &cfg.stats {
        Some(p) => Some(
            sys::with_umask(0o177, || stats::bind(p))
                .map_err(|e| format!("cannot serve stats on {}: {e}", p.display()))?,
        ),
        None => None,
    };
    // Everything that needs root exists: give it up before any other thread starts.
    privilege::become_user(ids)?;
    let stats_socket = match stats_socket {
        Some((listener, bound)) => {
            stats::serve(listener, shared.clone())
                .map_err(|e| format!("cannot serve stats: {e}"))?;
            Some(bound)
        }
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (out_tx, out_rx) = mpsc::channel();
    let (in_tx, in_rx) = mpsc::channel();
    let worker = |engine, rx| dataplane::Worker {
        tun: tun.clone(),
        // the buffers' size: what `auto` may grow to at a reload, or the fixed MTU
        mtu: match cfg.mtu {
            config::Mtu::Auto => config::MAX_MTU,
            config::Mtu::Fixed(n) => n,
        },
        outside: outside.clone(),
        shared: shared.clone(),
        stop: stop.clone(),
        reload: rx,
        engine,
        crypto_workers: cfg.crypto_workers,
    };
    let wo = worker(eng_out, out_rx);
    let wi = worker(eng_in, in_rx);
    // A worker that panics (or whose crew does: rayon hands the panic back to it) stops
    // the gateway like any other worker failure, never leaving it half alive.
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                dataplane::guarded(f, |why| dataplane::worker_failed(&shared, &stop, why))
            })
            .map_err(|e| e.to_string())
    };
    let threads = if cfg.workers == 1 {
        vec![spawn(
            "worker",
            Box::new(move || dataplane::run_both(wo, wi)),
        )?]
    } else {
        vec![
            spawn("outbound", Box::new(move || dataplane::run_outbound(wo)))?,
            spawn("inbound", Box::new(move || dataplane::run_inbound(wi)))?,
        ]
    };
    if let Some(w) = dataplane::CEILING_WARNING {
        eprintln!("ipsec-gw: WARNING: {w}");
    }
    eprintln!(
        "ipsec-gw: up: TUN {} (MTU {}{}, offloads: TCP {}, UDP {}), {} -> {}{}, {} SAs, {} policies, {}",
        cfg.tun,
        start_mtu,
        path_note(path),
        if tun.tcp_gso() { "on" } else { "off" },
        if tun.udp_gso() { "on" } else { "off" },
        cfg.local,
        cfg.remote,
        if cfg.udp_encap {
            let on = |b: bool| if b { "on" } else { "off" };
            format!(
                " (ESP in UDP 4500, GSO {}, GRO {})",
                on(outside.udp_gso),
                on(outside.udp_gro)
            )
        } else {
            String::new()
        },
        cfg.sas.len(),
        cfg.policies.len(),
        match (cfg.workers, cfg.crypto_workers) {
            (1, 1) => "one worker".to_string(),
            (_, 1) => "a worker per direction".to_string(),
            (1, n) => format!("one worker, {n} crypto workers per direction"),
            (_, n) => format!("a worker per direction, {n} crypto workers each"),
        }
    );
    let mut current = cfg;
    let mut running_mtu = start_mtu;
    for sig in signals.forever() {
        if sig != SIGHUP {
            eprintln!("ipsec-gw: stopping");
            break;
        }
        // A config that loads but that the engines refuse, or that changes an SA but
        // not its keys, is refused like one that does not load (each checked once).
        let loaded = source
            .reload()
            .map(|(new, through_fd)| {
                if through_fd {
                    eprintln!(
                        "ipsec-gw: note: user {} may not open {}: read through the \
                         descriptor opened at start (edits in place are seen; a file put \
                         in its place is not, until a restart)",
                        current.user,
                        current.file.display()
                    );
                }
                new
            })
            .map_err(|e| e.to_string())
            .and_then(|new| {
                match reload_problem(&current, &new)
                    .or_else(|| key_of_other_direction(&new, &states, &taken))
                {
                    Some(why) => Err(why),
                    None => Ok(new),
                }
            });
        match loaded {
            Ok(new)
                if (
                    &new.tun,
                    new.mtu,
                    new.offload,
                    new.workers,
                    new.crypto_workers,
                ) != (
                    &current.tun,
                    current.mtu,
                    current.offload,
                    current.workers,
                    current.crypto_workers,
                ) || (new.local, new.remote, new.udp_encap)
                    != (current.local, current.remote, current.udp_encap)
                    || (new.table, new.fwmark) != (current.table, current.fwmark)
                    || (&new.state, &new.stats, &new.user)
                        != (&current.state, &current.stats, &current.user) =>
            {
                shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "ipsec-gw: reload refused: the TUN device (name, MTU, offloads), outer \
                     addresses, UDP encapsulation, table, fwmark, workers, crypto_workers, \
                     state, stats and user change only with a restart; the running config stays"
                );
            }
            Ok(new) => {
                for w in &new.warnings {
                    eprintln!("ipsec-gw: warning: {w}");
                }
                // `auto` follows the path: the MTU the path and the new SAs give now. One
                // that cannot be worked out refuses the reload (the new SAs might not fit
                // the running MTU); a smaller one is set before the new engines take
                // over, a larger one after — never a moment with packets too big.
                let mtu = match new.mtu {
                    config::Mtu::Auto => match tun_mtu(&new) {
                        Ok((n, path)) => Some((n, path)),
                        Err(e) => {
                            shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                            eprintln!("ipsec-gw: reload refused, the running config stays: {e}");
                            continue;
                        }
                    },
                    config::Mtu::Fixed(_) => None,
                };
                if let Some((n, path)) = mtu.filter(|(n, _)| *n < running_mtu) {
                    if let Err(e) = set_tun_mtu(&new, &mut running_mtu, n, path) {
                        shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                        eprintln!("ipsec-gw: reload refused, the running config stays: {e}");
                        continue;
                    }
                }
                // The new guard before the new engines: a guard that cannot be
                // installed refuses the reload, the running config and its guard stay
                // (as a start that cannot install it is refused).
                if let Err(e) = guard::reinstall(&current, &new) {
                    shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                    eprintln!("ipsec-gw: reload refused, the running config stays: {e}");
                    continue;
                }
                taken.add(&new);
                let new = Arc::new(new);
                let _ = out_tx.send(new.clone());
                let _ = in_tx.send(new.clone());
                if let Some((n, path)) = mtu.filter(|(n, _)| *n > running_mtu) {
                    if let Err(e) = set_tun_mtu(&new, &mut running_mtu, n, path) {
                        eprintln!("ipsec-gw: warning: {e} (the smaller MTU is safe)");
                    }
                }
                shared.reloads.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "ipsec-gw: reloaded {} ({} SAs, {} policies)",
                    new.file.display(),
                    new.sas.len(),
                    new.policies.len()
                );
                current = (*new).clone();
            }
            Err(e) => {
                shared.reloads_refused.fetch_add(1, Ordering::Relaxed);
                eprintln!("ipsec-gw: reload refused, the running config stays: {e}");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    if let Some(bound) = &stats_socket {
        bound.remove();
    }
    let failed = shared.failed.lock().expect("failed lock").take();
    match failed {
        Some(why) => Err(format!("stopped because a worker failed: {why}")),
        None => Ok(()),
    }
}

/// The keys (`seqstate::keys_of`) each direction's SAs held in any config this gateway
/// took: at start and every reload sent to the workers.
#[derive(Default)]
struct KeysTaken {
    out: std::collections::HashSet<seqstate::Key>,
    inb: std::collections::HashSet<seqstate::Key>,
}

impl KeysTaken {
    fn add(&mut self, cfg: &config::Config) {
        for s in &cfg.sas {
            let set = match s.config.direction {
                Direction::Out => &mut self.out,
                Direction::In => &mut self.inb,
            };
            set.extend(seqstate::keys_of(&s.config));
        }
    }
}

/// An SA of `new` under a key the other direction numbered under — recorded in that
/// direction's state (`states`: out, in) or held by one of its SAs in a config taken
/// before: the worker would refuse to build it
/// ([`dataplane::BuildError::KeyOfOtherDirection`]) and stop the gateway, or build it
/// before the other worker recorded the key. The reload is refused instead; the running
/// config stays.
fn key_of_other_direction(
    new: &config::Config,
    states: &[seqstate::Reader; 2],
    taken: &KeysTaken,
) -> Option<String> {
    let [out, inb] = states;
    let (out, inb) = match (out.read(), inb.read()) {
        (Ok(o), Ok(i)) => (o, i),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    new.sas
        .iter()
        .find(|s| {
            let (state, held) = match s.config.direction {
                Direction::Out => (&inb, &taken.inb),
                Direction::In => (&out, &taken.out),
            };
            let keys = seqstate::keys_of(&s.config);
            state.records_any(&keys) || keys.iter().any(|k| held.contains(k))
        })
        .map(|s| {
            dataplane::BuildError::KeyOfOtherDirection {
                name: s.name.clone(),
                spi: s.config.spi,
                direction: s.config.direction,
            }
            .to_string()
        })
}

/// The TUN device's MTU (at start, and at a reload with `auto`), and the path MTU it came
/// from (`auto`).
fn tun_mtu(cfg: &config::Config) -> Result<(u16, Option<u16>), String> {
    match cfg.mtu {
        config::Mtu::Fixed(n) => Ok((n, None)),
        config::Mtu::Auto => {
            let path = sys::path_mtu(cfg.local, cfg.remote, cfg.fwmark).map_err(|e| {
                format!(
                    "{}: gateway.mtu: \"auto\": cannot learn the path MTU from {} to {}: {e}",
                    cfg.file.display(),
                    cfg.local,
                    cfg.remote
                )
            })?;
            Ok((cfg.auto_mtu(path)?, Some(path)))
        }
    }
}

fn path_note(path: Option<u16>) -> String {
    path.map_or(String::new(), |p| {
        format!(" = path MTU {p} less the SAs' overhead")
    })
}

/// Give the TUN device `n` bytes of MTU (the gateway keeps CAP_NET_ADMIN, ambient, for
/// this and the guard); `running` follows it.
fn set_tun_mtu(
    cfg: &config::Config,
    running: &mut u16,
    n: u16,
    path: Option<u16>,
) -> Result<(), String> {
    guard::ip(&["link", "set", "dev", &cfg.tun, "mtu", &n.to_string()])
        .map_err(|e| format!("cannot set TUN {} MTU {n}: {e}", cfg.tun))?;
    eprintln!(
        "ipsec-gw: TUN {} MTU {} -> {n}{}",
        cfg.tun,
        *running,
        path_note(path)
    );
    *running = n;
    Ok(())
}

/// Why a reload of `new` over `current` must be refused, if it must: the engines it
/// would build fail (every rule the engine enforces), or an SA changes what it does
/// while keeping its keys — the same keys under new parameters would restart or
/// reinterpret its sequence numbers (RFC 4301 §4.4.2: a changed SA is a new SA, which
/// needs new keys).
fn reload_problem(current: &config::Config, new: &config::Config) -> Option<String> {
    if let Err(e) = dataplane::DirEngine::check(new) {
        return Some(e.to_string());
    }
    for n in &new.sas {
        // any key of one in the other, whatever field, suite or direction holds it
        let shares_a_key = |c: &config::SaSpec| {
            c.config
                .secrets()
                .any(|a| n.config.secrets().any(|b| config::same_key(a.key, b.key)))
        };
        if let Some(c) = current
            .sas
            .iter()
            .find(|c| shares_a_key(c) && !c.same_as(n))
        {
            return Some(format!(
                "sa {} changes its parameters (SPI, protocol, direction, suite, mode, ESN, \
                 window or endpoints) but keeps a key of sa {}: give it new keys",
                n.name, c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two SAs, out and in, aes256-sha256, with these (enc_key, integ_key).
    fn cfg(out: (&str, &str), inb: (&str, &str)) -> config::Config {
        let text = format!(
            r#"
[gateway]
tun = "ipsec0"
local = "192.0.2.1"
remote = "192.0.2.2"
routes = ["10.2.0.0/24"]

[[sa]]
name = "out"
direction = "out"
spi = 0x1001
encryption = "aes256"
integrity = "sha256"
enc_key = "{}"
integ_key = "{}"

[[sa]]
name = "in"
direction = "in"
spi = 0x2002
encryption = "aes256"
integrity = "sha256"
enc_key = "{}"
integ_key = "{}"

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
"#,
            out.0, out.1, inb.0, inb.1
        );
        config::parse(&text, std::path::Path::new("gw.toml")).unwrap()
    }

    fn key(seed: u8, n: usize) -> String {
        (0..n)
            .map(|i| format!("{:02x}", seed.wrapping_add(i as u8)))
            .collect()
    }

    /// A burst of reloads: R1 put key K on the inbound SA, R2 took it away, R3 puts it
    /// on the outbound SA — before the inbound worker built R1, no state records K, yet
    /// R3 is refused (the worker would otherwise stop the gateway on it, or seal under
    /// K while the peer still sends under it). Likewise a key the outbound side took,
    /// for an inbound SA; and a key a state records. Keys of neither: accepted.
    #[test]
    fn a_key_the_other_direction_took_is_refused_before_any_state_records_it() {
        let d = std::env::temp_dir().join(format!("ipsec-gw-main-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mut st_out = seqstate::SeqState::open(&d.join("s.out"), Direction::Out, true).unwrap();
        let st_in = seqstate::SeqState::open(&d.join("s.in"), Direction::In, true).unwrap();
        let states = [st_out.reader().unwrap(), st_in.reader().unwrap()];
        let (a, b, c, e) = (key(0x10, 32), key(0x30, 32), key(0x80, 32), key(0xa0, 32));
        let k = key(0x40, 32);
        let start = cfg((&a, &b), (&c, &e));
        let mut taken = KeysTaken::default();
        taken.add(&start);
        assert_eq!(key_of_other_direction(&start, &states, &taken), None);
        // R1: K as the inbound SA's enc_key (sent to the workers, built by neither yet)
        let r1 = cfg((&a, &b), (&k, &e));
        assert_eq!(key_of_other_direction(&r1, &states, &taken), None);
        taken.add(&r1);
        // R3 (R2 took K away again): K as the outbound SA's enc_key
        let why = key_of_other_direction(&cfg((&k, &b), (&c, &e)), &states, &taken);
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("records a key of this outbound SA")),
            "{why:?}"
        );
        // the mirror: an inbound SA under a key the outbound side took, either field
        let (g, h) = (key(0x60, 32), key(0x70, 32));
        for inb in [(a.as_str(), e.as_str()), (c.as_str(), b.as_str())] {
            let why =
                key_of_other_direction(&cfg((&g, &h), inb), &states, &taken).expect("refused");
            assert!(why.contains("records a key of this inbound SA"), "{why}");
            assert!(!why.contains(&a) && !why.contains(&b), "a key in a message");
        }
        // one a state records (a key no config of this process took)
        let fresh = KeysTaken::default();
        let z = key(0xc0, 32);
        assert_eq!(
            key_of_other_direction(&cfg((&a, &b), (&z, &e)), &states, &fresh),
            None
        );
        for fp in seqstate::keys_of(&cfg((&z, &b), (&c, &e)).sas[0].config) {
            st_out.set(fp, seqstate::Entry::default());
        }
        st_out.save().unwrap();
        let why = key_of_other_direction(&cfg((&a, &b), (&z, &e)), &states, &fresh).unwrap();
        assert!(why.contains("the outbound sequence state records"), "{why}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
