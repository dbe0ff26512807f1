//! The data path: the TUN device on the inside, raw IP sockets (and optionally UDP 4500,
//! RFC 3948) on the outside, the engine between.
//!
//! Two workers, one per direction, each owning its own [`Engine`] with that direction's
//! SAs and policies: the outbound worker (TUN → seal → socket) alone touches outbound
//! SAs, so sequence numbers stay unique and increasing without a lock; the inbound worker
//! (socket → open → TUN) alone touches inbound SAs and their replay windows. Each worker
//! handles packets in the order it reads them, so per-flow order is kept. With
//! `crypto_workers` above 1, each worker shares the cipher and ICV work of a batch with a
//! crew ([`crew`]) and keeps everything that changes an SA to itself, in order.
//!
//! Fails closed: traffic a protect policy matches whose SA is missing or expired is
//! dropped and counted by the engine (`no_sa`), never sent in clear.
//!
//! The rooms: [`sas`] (each direction's engine, SA lifetimes, sequence state, counters;
//! why one cannot be built, [`build_error`]),
//! [`outside`] (the outer sockets), [`outbound`] and [`inbound`] (each direction's path),
//! [`crypto`] (where a packet meets the cryptography, in both builds: the normal one and
//! the I/O ceiling's);
//! every system call that needs `unsafe` is in [`crate::sys`].

mod build_error;
mod codel;
mod crew;
mod crypto;
mod inbound;
mod outbound;
mod outside;
mod sas;
mod tun_queue;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tun_rs::SyncDevice;

use crate::config::Config;
use crate::stats::{Io, Shared};
use crate::sys;
use crew::Crew;
pub use crypto::CEILING_WARNING;
use inbound::InboundPath;
use outbound::OutboundPath;
pub use outside::Outside;
pub use sas::{BuildError, DirEngine};

const POLL_MS: i32 = 200;
/// Packets handled per wakeup before the worker looks at its stop flag and reloads.
const BATCH: usize = 64;
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

fn pollfds(fds: &[RawFd]) -> Vec<libc::pollfd> {
    fds.iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect()
}

/// Wait up to POLL_MS for any of `pfds` to be readable; `ready[i]` says which. `Err`:
/// a descriptor hung up, closed, or (the TUN device) reports an error — the device is
/// gone, and poll would return at once forever.
fn poll_readable(pfds: &mut [libc::pollfd], ready: &mut [bool]) -> io::Result<bool> {
    for p in pfds.iter_mut() {
        p.revents = 0;
    }
    let n = match sys::poll(pfds, POLL_MS) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(false),
        Err(e) => return Err(e),
    };
    for (r, p) in ready.iter_mut().zip(pfds.iter()) {
        *r = p.revents & libc::POLLIN != 0;
        if p.revents & (libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Err(io::Error::other(format!(
                "descriptor {} hung up or closed (revents 0x{:x})",
                p.fd, p.revents
            )));
        }
        // A socket's pending error (an ICMP error for a datagram sent earlier) is taken
        // and the socket goes on; the TUN device reports POLLERR only when it is gone.
        if p.revents & libc::POLLERR != 0 && sys::take_socket_error(p.fd).is_none() {
            return Err(io::Error::other(format!(
                "descriptor {} (the TUN device) reports an error: the device is gone",
                p.fd
            )));
        }
    }
    Ok(n > 0)
}

pub struct Worker {
    pub tun: Arc<SyncDevice>,
    pub mtu: u16,
    pub outside: Arc<Outside>,
    pub shared: Arc<Shared>,
    pub stop: Arc<AtomicBool>,
    pub reload: Receiver<Arc<Config>>,
    pub engine: DirEngine,
    /// Threads sealing or opening one batch together (`crew.rs`); 1: this worker alone.
    pub crypto_workers: usize,
    /// `tun_queue = "auto"`: the outbound worker sets the TUN device's queue
    /// (`tun_queue.rs`).
    pub auto_queue: bool,
}

impl Worker {
    /// Between wakeups, either direction: take a new config if one came, and publish the
    /// counters when due.
    fn tend(&mut self, io: &Io, last: &mut Instant) -> Result<(), String> {
        if let Ok(cfg) = self.reload.try_recv() {
            let dir = self.engine.direction;
            let old = std::mem::replace(&mut self.engine, DirEngine::empty(dir));
            // Checked by the main thread before it was sent (`DirEngine::check`): only
            // the state file can fail here. Fail closed: the worker stops, and the
            // gateway with it, rather than run on with no SAs.
            self.engine = DirEngine::build(&cfg, dir, Some(old), None)
                .map_err(|e| format!("reload failed: {e}"))?;
        }
        if last.elapsed() >= PUBLISH_EVERY {
            self.engine.publish(io, &self.shared);
            *last = Instant::now();
        }
        Ok(())
    }
}

/// The loop every worker runs until told to stop: tend (reload, publish), wait for one
/// of `fds` to be readable, handle what is ready. Returns why it stopped when not told
/// to: a failed `tend` (a reload that could not be applied), `step` (the TUN device
/// failed) or `poll` (a descriptor gone).
fn serve<S>(
    state: &mut S,
    stop: &AtomicBool,
    fds: &[RawFd],
    tend: impl Fn(&mut S) -> Result<(), String>,
    step: impl Fn(&mut S, &[bool]) -> Result<(), String>,
) -> Option<String> {
    let mut ready = vec![false; fds.len()];
    let mut pfds = pollfds(fds);
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = tend(state) {
            return Some(e);
        }
        match poll_readable(&mut pfds, &mut ready) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => return Some(format!("poll failed: {e}")),
        }
        if let Err(e) = step(state, &ready) {
            return Some(e);
        }
    }
    None
}

/// A worker stopped on its own: the gateway must not go on half alive (a supervisor —
/// systemd, the lab — sees it exit non-zero with the reason). Recorded for the main
/// thread, which a SIGTERM to this process wakes to tear down (TUN device, routing
/// rule) and exit 1.
pub fn worker_failed(shared: &Shared, stop: &AtomicBool, why: String) {
    eprintln!("ipsec-gw: a worker stopped: {why}");
    let mut f = shared.failed.lock().expect("failed lock");
    if f.is_none() {
        *f = Some(why);
    }
    drop(f);
    stop.store(true, Ordering::Relaxed);
    sys::terminate_self();
}

/// Run a worker's `body`; if it panics — a bug, or its crew's, which rayon raises again
/// in the worker — `failed` gets the panic's message (the default hook has printed where).
pub fn guarded(body: impl FnOnce(), failed: impl FnOnce(String)) {
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        failed(format!("it panicked: {msg}"));
    }
}

/// The TUN device non-blocking, as the outbound drain needs it (it reads until
/// `WouldBlock`); `false`, logged, when the kernel refuses.
fn nonblocking(tun: &SyncDevice) -> bool {
    let r = tun.set_nonblocking(true);
    if let Err(e) = &r {
        eprintln!("ipsec-gw: cannot make the TUN device non-blocking: {e}");
    }
    r.is_ok()
}

fn reading_tun(e: io::Error) -> String {
    format!("reading the TUN device failed: {e}")
}

/// The outbound worker: TUN → seal → outside, on its own thread.
pub fn run_outbound(w: Worker) {
    if !nonblocking(&w.tun) {
        worker_failed(
            &w.shared,
            &w.stop,
            "the TUN device cannot be made non-blocking".into(),
        );
        return;
    }
    let fds = [w.tun.as_raw_fd()];
    let crew = match Crew::new(w.crypto_workers, "seal") {
        Ok(c) => c,
        Err(e) => return worker_failed(&w.shared, &w.stop, e),
    };
    let path = OutboundPath::new(w.mtu, &w.outside, crew, w.auto_queue);
    serve_one(w, path, &fds, |w, path, _| {
        path.drain(&w.tun, &mut w.engine, &w.outside)
            .map_err(reading_tun)
    });
}

/// A direction's path: what it counted.
trait Counted {
    fn io(&self) -> &Io;
    /// Between wakeups: what the path itself tends (outbound: the TUN queue).
    fn tend(&mut self, _tun: &SyncDevice) {}
}

impl Counted for OutboundPath {
    fn io(&self) -> &Io {
        &self.io
    }
    fn tend(&mut self, tun: &SyncDevice) {
        self.set_queue(tun);
    }
}

impl Counted for InboundPath {
    fn io(&self) -> &Io {
        &self.io
    }
}

/// One direction on its own thread: `serve` with that worker's tending (reload, publish),
/// `step` on each wakeup, and its counters published a last time when it stops.
fn serve_one<P: Counted>(
    w: Worker,
    path: P,
    fds: &[RawFd],
    step: impl Fn(&mut Worker, &mut P, &[bool]) -> Result<(), String>,
) {
    let stop = w.stop.clone();
    let mut st = (w, path, Instant::now());
    let why = serve(
        &mut st,
        &stop,
        fds,
        |(w, path, last)| {
            path.tend(&w.tun);
            w.tend(path.io(), last)
        },
        |(w, path, _), ready| step(w, path, ready),
    );
    let (mut w, path, _) = st;
    w.engine.release();
    if let Some(why) = why {
        worker_failed(&w.shared, &stop, why);
    }
    w.engine.publish(path.io(), &w.shared);
}

/// The inbound worker: outside → open → TUN, on its own thread.
pub fn run_inbound(w: Worker) {
    let crew = match Crew::new(w.crypto_workers, "open") {
        Ok(c) => c,
        Err(e) => return worker_failed(&w.shared, &w.stop, e),
    };
    let path = InboundPath::new(&w.outside, &w.tun, crew);
    let fds = path.fds.clone();
    serve_one(w, path, &fds, |w, path, ready| {
        path.drain(ready, &mut w.engine, &w.outside);
        Ok(())
    });
}

/// One worker for both directions (`workers = 1`): one thread polls the TUN device and
/// the outer sockets together and drains whichever is ready — the same steps as the two
/// workers, with no hand-over between threads.
pub fn run_both(out: Worker, inb: Worker) {
    if !nonblocking(&out.tun) {
        worker_failed(
            &out.shared,
            &out.stop,
            "the TUN device cannot be made non-blocking".into(),
        );
        return;
    }
    let stop = out.stop.clone();
    let mut fds = vec![out.tun.as_raw_fd()];
    let icrew = match Crew::new(inb.crypto_workers, "open") {
        Ok(c) => c,
        Err(e) => return worker_failed(&inb.shared, &stop, e),
    };
    let ipath = InboundPath::new(&inb.outside, &inb.tun, icrew);
    fds.extend(&ipath.fds);
    let crew = match Crew::new(out.crypto_workers, "seal") {
        Ok(c) => c,
        Err(e) => return worker_failed(&out.shared, &stop, e),
    };
    let opath = OutboundPath::new(out.mtu, &out.outside, crew, out.auto_queue);
    let now = Instant::now();
    let mut st = (out, opath, now, inb, ipath, now);
    let why = serve(
        &mut st,
        &stop,
        &fds,
        |(out, opath, last_out, inb, ipath, last_in)| {
            opath.set_queue(&out.tun);
            out.tend(&opath.io, last_out)?;
            inb.tend(&ipath.io, last_in)
        },
        |(out, opath, _, inb, ipath, _), ready| {
            if ready[0] {
                opath
                    .drain(&out.tun, &mut out.engine, &out.outside)
                    .map_err(reading_tun)?;
            }
            if ready[1..].iter().any(|&r| r) {
                ipath.drain(&ready[1..], &mut inb.engine, &inb.outside);
            }
            Ok(())
        },
    );
    let (mut out, opath, _, mut inb, ipath, _) = st;
    out.engine.release();
    inb.engine.release();
    out.engine.publish(&opath.io, &out.shared);
    inb.engine.publish(&ipath.io, &inb.shared);
    if let Some(why) = why {
        worker_failed(&out.shared, &stop, why);
    }
}

#[cfg(test)]
mod tests {
    use super::guarded;

    /// A panicking worker — or a panic in its crew, which comes back to the worker — is
    /// reported with its message, so the gateway stops (`worker_failed`) instead of going
    /// on with one direction dead; a worker that returns reports nothing.
    #[test]
    fn a_panicking_worker_is_reported_not_lost() {
        let mut why = None;
        guarded(|| panic!("slot {} out of range", 65), |w| why = Some(w));
        assert_eq!(why.as_deref(), Some("it panicked: slot 65 out of range"));
        let mut why = None;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        guarded(
            || pool.in_place_scope(|s| s.spawn(|_| panic!("in the crew"))),
            |w| why = Some(w),
        );
        assert_eq!(why.as_deref(), Some("it panicked: in the crew"));
        let mut why = None;
        guarded(|| {}, |w| why = Some(w));
        assert_eq!(why, None);
    }
}
