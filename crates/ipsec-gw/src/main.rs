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
use ipsec_gw::reload::{key_of_other_direction, needs_restart, reload_problem, KeysTaken};
use ipsec_gw::tun_mtu::{fixed_mtu_warning, mtu_report, path_note, set_tun_mtu, tun_mtu};
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
            Err(claim::LockError::Held(e)) => {
                eprintln!("ipsec-gw: --release refused: {e}; stop that gateway first");
                return ExitCode::from(1);
            }
            // not another gateway's: nothing to stop, what the system said instead
            Err(claim::LockError::Os(e)) => {
                eprintln!("ipsec-gw: --release refused: {e}");
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
        let (mtu, warning) = match mtu_report(&cfg) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ipsec-gw: {e}");
                return ExitCode::from(2);
            }
        };
        if let Some(w) = warning {
            eprintln!("ipsec-gw: warning: {w}");
        }
        eprintln!(
            "ipsec-gw: {}: usable ({} SAs, {} policies; sequence state in {}.out/.in; {mtu})",
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
        let writes = match io["queue_delay_drops"].as_u64() {
            Some(n) if n > 0 => format!("{writes}, {n} dropped by CoDel (aqm)"),
            _ => writes,
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

/// The gateway's life: set up (as root, then as its user), start the workers, serve
/// signals until told to stop, then stop the workers and say why if one failed.
fn run(cfg: config::Config, init_state: bool, signals: Signals) -> Result<(), String> {
    let (up, engines) = set_up(&cfg, init_state)?;
    let (stop, senders, threads) = spawn_workers(&cfg, &up, engines)?;
    announce(&cfg, &up);
    let mut up = up;
    Reloader {
        running_mtu: up.start_mtu,
        current: cfg,
        up: &mut up,
        senders,
    }
    .serve(signals);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    if let Some(bound) = &up.stats_socket {
        bound.remove();
    }
    let failed = up.shared.failed.lock().expect("failed lock").take();
    match failed {
        Some(why) => Err(format!("stopped because a worker failed: {why}")),
        None => Ok(()),
    }
}

/// What start-up made and the running gateway keeps: the devices, sockets and locks,
/// and what a reload is checked against.
struct Up {
    tun: Arc<tun_rs::SyncDevice>,
    outside: Arc<dataplane::Outside>,
    shared: Arc<stats::Shared>,
    stats_socket: Option<stats::BoundSocket>,
    /// The TUN device's MTU at start, and the path MTU it came from (`auto`).
    start_mtu: u16,
    path: Option<u16>,
    /// The config file, opened while root: the gateway's user re-reads it on SIGHUP.
    source: config::Source,
    /// What each direction's state records, for a reload to check the other direction's
    /// SAs against (the workers' readers are theirs); and every key each direction's SAs
    /// held in a config this gateway took, which a worker records only once it builds
    /// that config, later than it is sent (a burst of reloads).
    states: [seqstate::Reader; 2],
    taken: KeysTaken,
    /// One gateway per routing table (its guard), and per state, for its whole life
    /// (let go last, the table first).
    _table: std::fs::File,
    _lock: std::fs::File,
}

/// One direction's engine each (out, in).
type Engines = (dataplane::DirEngine, dataplane::DirEngine);

/// Everything the gateway needs made, in the order that leaves nothing half made: the
/// engines (state read, reservations written) before the TUN device, the guard before
/// the TUN device, root given up before any other thread starts. Returns the two
/// directions' engines (out, in) beside it.
fn set_up(cfg: &config::Config, init_state: bool) -> Result<(Up, Engines), String> {
    // Least privilege before anything is made: every step below proves it needs no more.
    privilege::limit_for_setup()?;
    let ids = privilege::lookup(&cfg.user)?;
    let source = config::Source::open(&cfg.file).map_err(|e| e.to_string())?;
    let lock = seqstate::lock(&cfg.state)?;
    let table = claim::table(cfg)?;
    // The engines first, sequence state read and reservations written: nothing is
    // created (TUN device, routes) for a gateway that cannot keep its numbers.
    let (engines, states) = engines(cfg, init_state)?;
    let mut taken = KeysTaken::default();
    taken.add(cfg);
    // The TUN device's MTU, before anything is made: a path that leaves too little room
    // is refused with nothing to undo.
    let (start_mtu, path) = tun_mtu(cfg)?;
    if let config::Mtu::Fixed(n) = cfg.mtu {
        let path = sys::path_mtu(cfg.local, cfg.remote, cfg.fwmark).ok();
        if let Some(w) = path.and_then(|p| fixed_mtu_warning(cfg, n, p)) {
            eprintln!("ipsec-gw: warning: {w}");
        }
    }
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
    guard::install(cfg)?;
    let tun = tun_rs::DeviceBuilder::new()
        .name(&cfg.tun)
        .mtu(start_mtu)
        .offload(cfg.offload)
        .tx_queue_len(cfg.tun_queue.start())
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
    guard::tun_routes(cfg)?;
    let outside = Arc::new(
        dataplane::Outside::open(cfg).map_err(|e| format!("cannot open the outer sockets: {e}"))?,
    );
    let shared = Arc::new(stats::Shared::new());
    let _ = shared.guard.set(guard::table_name(cfg));
    let _ = shared.tun.set(cfg.tun.clone());
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
    let up = Up {
        tun,
        outside,
        shared,
        stats_socket,
        start_mtu,
        path,
        source,
        states,
        taken,
        _table: table,
        _lock: lock,
    };
    Ok((up, engines))
}

/// Both directions' engines (out, in), built on their sequence state (each reads the
/// other's), and a reader of each state (out, in) for the reload checks.
fn engines(
    cfg: &config::Config,
    init_state: bool,
) -> Result<(Engines, [seqstate::Reader; 2]), String> {
    let open = |dir: Direction| {
        seqstate::SeqState::open(&seqstate::path_for(&cfg.state, dir), dir, init_state)
    };
    let (st_out, st_in) = (open(Direction::Out)?, open(Direction::In)?);
    let (read_out, read_in) = (st_out.reader()?, st_in.reader()?);
    let states = [st_out.reader()?, st_in.reader()?];
    let engine = |dir: Direction, both| -> Result<dataplane::DirEngine, String> {
        dataplane::DirEngine::build(cfg, dir, None, Some(both)).map_err(|e| e.to_string())
    };
    let eng_out = engine(Direction::Out, (st_out, read_in))?;
    let eng_in = engine(Direction::In, (st_in, read_out))?;
    Ok(((eng_out, eng_in), states))
}

/// Where a reload goes to each direction's worker (out, in).
type Senders = (
    mpsc::Sender<Arc<config::Config>>,
    mpsc::Sender<Arc<config::Config>>,
);

type Threads = Vec<std::thread::JoinHandle<()>>;

/// The workers on their threads — one for both directions (`workers = 1`) or one each —
/// with their engines (out, in); the flag that stops them and where reloads go to them.
fn spawn_workers(
    cfg: &config::Config,
    up: &Up,
    (eng_out, eng_in): Engines,
) -> Result<(Arc<AtomicBool>, Senders, Threads), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (out_tx, out_rx) = mpsc::channel();
    let (in_tx, in_rx) = mpsc::channel();
    let worker = |engine, rx| dataplane::Worker {
        tun: up.tun.clone(),
        // the buffers' size: what `auto` may grow to at a reload, or the fixed MTU
        mtu: match cfg.mtu {
            config::Mtu::Auto => config::MAX_MTU,
            config::Mtu::Fixed(n) => n,
        },
        outside: up.outside.clone(),
        shared: up.shared.clone(),
        stop: stop.clone(),
        reload: rx,
        engine,
        crypto_workers: cfg.crypto_workers,
        auto_queue: cfg.tun_queue == config::TunQueue::Auto,
    };
    let wo = worker(eng_out, out_rx);
    let wi = worker(eng_in, in_rx);
    // A worker that panics (or whose crew does: rayon hands the panic back to it) stops
    // the gateway like any other worker failure, never leaving it half alive.
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        let (shared, stop) = (up.shared.clone(), stop.clone());
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
    Ok((stop, (out_tx, in_tx), threads))
}

/// The gateway is up: say what it runs.
fn announce(cfg: &config::Config, up: &Up) {
    if let Some(w) = dataplane::CEILING_WARNING {
        eprintln!("ipsec-gw: WARNING: {w}");
    }
    let on = |b: bool| if b { "on" } else { "off" };
    eprintln!(
        "ipsec-gw: up: TUN {} (MTU {}{}, offloads: TCP {}, UDP {}), {} -> {}{}, {} SAs, {} policies, {}",
        cfg.tun,
        up.start_mtu,
        path_note(up.path),
        on(up.tun.tcp_gso()),
        on(up.tun.udp_gso()),
        cfg.local,
        cfg.remote,
        if cfg.udp_encap {
            format!(
                " (ESP in UDP 4500, GSO {}, GRO {})",
                on(up.outside.udp_gso),
                on(up.outside.udp_gro)
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
}

/// Why a reload was refused; the running config stays either way.
enum Refused {
    /// It changes what only a restart can change.
    NeedsRestart,
    /// It does not load, the engines or the key checks refuse it, or what it needs (an
    /// MTU, the guard) cannot be had now.
    Because(String),
}

/// The main thread once the workers run: SIGHUP reloads the config, SIGTERM or SIGINT
/// stop the gateway.
struct Reloader<'u> {
    current: config::Config,
    running_mtu: u16,
    up: &'u mut Up,
    senders: Senders,
}

impl Reloader<'_> {
    /// Serve signals until one says stop; each reload refused is counted and said why.
    fn serve(mut self, mut signals: Signals) {
        for sig in signals.forever() {
            if sig != SIGHUP {
                eprintln!("ipsec-gw: stopping");
                break;
            }
            let Err(refused) = self.reload() else {
                continue;
            };
            self.up
                .shared
                .reloads_refused
                .fetch_add(1, Ordering::Relaxed);
            match refused {
                Refused::NeedsRestart => eprintln!(
                    "ipsec-gw: reload refused: the TUN device (name, MTU, offloads), outer \
                     addresses, UDP encapsulation, table, fwmark, workers, crypto_workers, \
                     state, stats and user change only with a restart; the running config stays"
                ),
                Refused::Because(e) => {
                    eprintln!("ipsec-gw: reload refused, the running config stays: {e}")
                }
            }
        }
    }

    /// The config file read again and checked: a config that loads but that the engines
    /// refuse, or that changes an SA but not its keys, is refused like one that does not
    /// load (each checked once).
    fn load(&mut self) -> Result<config::Config, Refused> {
        let (new, through_fd) = self
            .up
            .source
            .reload()
            .map_err(|e| Refused::Because(e.to_string()))?;
        if through_fd {
            eprintln!(
                "ipsec-gw: note: user {} may not open {}: read through the descriptor opened \
                 at start (edits in place are seen; a file put in its place is not, until a \
                 restart)",
                self.current.user,
                self.current.file.display()
            );
        }
        match reload_problem(&self.current, &new)
            .or_else(|| key_of_other_direction(&new, &self.up.states, &self.up.taken))
        {
            Some(why) => Err(Refused::Because(why)),
            None => Ok(new),
        }
    }

    /// Take the config as it is now on disk, or refuse it with the running one kept.
    fn reload(&mut self) -> Result<(), Refused> {
        let new = self.load()?;
        if needs_restart(&self.current, &new) {
            return Err(Refused::NeedsRestart);
        }
        for w in &new.warnings {
            eprintln!("ipsec-gw: warning: {w}");
        }
        // `auto` follows the path: the MTU the path and the new SAs give now. One that
        // cannot be worked out refuses the reload (the new SAs might not fit the running
        // MTU); a smaller one is set before the new engines take over, a larger one after
        // — never a moment with packets too big.
        let mtu = match new.mtu {
            config::Mtu::Auto => Some(tun_mtu(&new).map_err(Refused::Because)?),
            config::Mtu::Fixed(_) => None,
        };
        if let Some((n, path)) = mtu.filter(|(n, _)| *n < self.running_mtu) {
            set_tun_mtu(&new, &mut self.running_mtu, n, path).map_err(Refused::Because)?;
        }
        // The new guard before the new engines: a guard that cannot be installed refuses
        // the reload, the running config and its guard stay (as a start that cannot
        // install it is refused).
        guard::reinstall(&self.current, &new).map_err(Refused::Because)?;
        self.up.taken.add(&new);
        let new = Arc::new(new);
        let _ = self.senders.0.send(new.clone());
        let _ = self.senders.1.send(new.clone());
        if let Some((n, path)) = mtu.filter(|(n, _)| *n > self.running_mtu) {
            if let Err(e) = set_tun_mtu(&new, &mut self.running_mtu, n, path) {
                eprintln!("ipsec-gw: warning: {e} (the smaller MTU is safe)");
            }
        }
        self.up.shared.reloads.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "ipsec-gw: reloaded {} ({} SAs, {} policies)",
            new.file.display(),
            new.sas.len(),
            new.policies.len()
        );
        self.current = (*new).clone();
        Ok(())
    }
}
