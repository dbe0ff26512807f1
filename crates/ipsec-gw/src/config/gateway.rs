//! `[gateway]`: addresses, protected prefixes and the worker counts.

use super::*;

/// The priority of Linux's rule `lookup main` (`ip rule`): the gateway's rule must come
/// before it.
pub const MAIN_RULE_PRIORITY: u32 = 32766;

/// Most crypto workers per direction: beyond 8, one batch (at most 64 packets) gives
/// each too little to do.
pub const MAX_CRYPTO_WORKERS: usize = 8;

/// `crypto_workers = "auto"`: 1 below 8 cores — today's single thread per direction,
/// since with fewer a crew only takes CPU from the traffic's own ends (measured on 2
/// cores: docs/gateway.md) — and a quarter of the cores from 8 up (the two directions, and on a
/// lab host the other gateway and the traffic's ends, share the machine), at most
/// [`MAX_CRYPTO_WORKERS`]. Not yet measured on a many-core machine: set it from
/// `benchmarks/gateway_scaling.py` there.
pub fn auto_crypto_workers() -> usize {
    crypto_workers_for(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

pub(super) fn crypto_workers_for(cores: usize) -> usize {
    if cores < 8 {
        1
    } else {
        (cores / 4).min(MAX_CRYPTO_WORKERS)
    }
}

/// `[gateway] crypto_workers`: "auto" (the default) or 1..=MAX_CRYPTO_WORKERS.
pub(super) fn crypto_workers(cx: &Ctx<'_>, g: &RawGateway) -> Result<usize, ConfigError> {
    Ok(match &g.crypto_workers {
        None => auto_crypto_workers(),
        Some(RawCount::Word(w)) if w == "auto" => auto_crypto_workers(),
        Some(RawCount::Number(n)) if (1..=MAX_CRYPTO_WORKERS as i64).contains(n) => *n as usize,
        Some(other) => {
            let got = other.shown();
            return Err(cx.err(
                "gateway.crypto_workers",
                format!(
                    "{got} is not \"auto\" or a number of threads from 1 to {MAX_CRYPTO_WORKERS}"
                ),
            ));
        }
    })
}

/// `tun_queue`: the TUN device's queue, in packets (its txqueuelen). A count, not a time:
/// with offloads a packet there may be a 64 KB GSO buffer, so Linux's 500 stand at tens of
/// milliseconds under TCP (RRUL RTT p50 17-21 ms through `ours` here, 0.4 ms at 16, the
/// same throughput), while 16 drop the bursts of small packets a generator sends (64-B
/// NDR 14-25 Mbit/s at 500, 0 at 16): docs/gateway.md "The TUN device's queue". What does
/// not fit the kernel drops and counts in the device's transmit drops (the stats'
/// `tun_queue_drops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunQueue {
    /// SHORT_TUN_QUEUE while most of the bytes read in a window came in TCP super-packets
    /// (TCP's bulk, which a short queue slows without costing throughput), LONG_TUN_QUEUE
    /// after LONG_AFTER windows without (`dataplane/tun_queue.rs`).
    Auto,
    Fixed(u32),
}

/// The default queue, and `auto`'s for traffic of whole packets: Linux's own for a TUN
/// device.
pub const LONG_TUN_QUEUE: u32 = 500;
/// `auto`'s queue while TCP super-packets bring most of the bytes.
pub const SHORT_TUN_QUEUE: u32 = 16;
/// The most `tun_queue` accepts (Linux's own default for Ethernet devices is 1,000).
pub const MAX_TUN_QUEUE: u32 = 10_000;

impl TunQueue {
    /// The queue the device starts with.
    pub fn start(self) -> u32 {
        match self {
            TunQueue::Auto => LONG_TUN_QUEUE,
            TunQueue::Fixed(n) => n,
        }
    }
}

/// `tun_queue`: LONG_TUN_QUEUE packets by default, "auto", or 1..=MAX_TUN_QUEUE packets.
pub(super) fn tun_queue(cx: &Ctx<'_>, g: &RawGateway) -> Result<TunQueue, ConfigError> {
    Ok(match &g.tun_queue {
        // 500 by default: "auto" kept a burst of UDP right after TCP's bulk in its short
        // queue (CI lost 4 % of 50 Mbit/s there): a choice until it bounds time
        None => TunQueue::Fixed(LONG_TUN_QUEUE),
        Some(RawCount::Word(w)) if w == "auto" => TunQueue::Auto,
        Some(RawCount::Number(n)) if (1..=i64::from(MAX_TUN_QUEUE)).contains(n) => {
            TunQueue::Fixed(*n as u32)
        }
        Some(other) => {
            let got = other.shown();
            return Err(cx.err(
                "gateway.tun_queue",
                format!("{got} is not \"auto\" or a number of packets from 1 to {MAX_TUN_QUEUE}"),
            ));
        }
    })
}

/// `mtu`: "auto" (the default: the path's less the SAs' overhead) or 576..9000 bytes.
pub(super) fn mtu(cx: &Ctx<'_>, g: &RawGateway) -> Result<Mtu, ConfigError> {
    Ok(match &g.mtu {
        None => Mtu::Auto,
        Some(RawCount::Word(w)) if w == "auto" => Mtu::Auto,
        Some(RawCount::Number(n)) if (MIN_MTU as i64..=MAX_MTU as i64).contains(n) => {
            Mtu::Fixed(*n as u16)
        }
        Some(other) => {
            let got = other.shown();
            return Err(cx.err(
                "gateway.mtu",
                format!("{got} is not \"auto\" or a number of bytes from {MIN_MTU} to {MAX_MTU}"),
            ));
        }
    })
}

/// `[gateway]`: its own checks; the outer addresses and the routes into the TUN device.
pub(super) fn gateway(
    cx: &Ctx<'_>,
    g: &RawGateway,
) -> Result<(IpAddr, IpAddr, Vec<Prefix>), ConfigError> {
    // The name goes into the guard's nftables rules (`iifname "NAME"`): letters, digits
    // and `_.-` only, never a quote or a space that would change what the rule says.
    if g.tun.is_empty()
        || g.tun.len() > 15
        || !g
            .tun
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c))
        || g.tun == "."
        || g.tun == ".."
    {
        return Err(cx.err(
            "gateway.tun",
            format!(
                "{:?} is not an interface name of 1-15 letters, digits, '_', '.' or '-'",
                g.tun
            ),
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
    // The rule into the table takes the table's number as its priority (`guard`): from
    // 32766, the priority of `lookup main`, the host's main table would be asked first
    // and protected traffic would leave by its routes instead of the TUN device.
    if g.table >= MAIN_RULE_PRIORITY {
        return Err(cx.err(
            "gateway.table",
            format!(
                "{} is too high: the rule into it takes its number as priority, and from \
                 {MAIN_RULE_PRIORITY} (the main table's rule) the host's own routes would \
                 come first; use 1-252 or 256-{}",
                g.table,
                MAIN_RULE_PRIORITY - 1
            ),
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
