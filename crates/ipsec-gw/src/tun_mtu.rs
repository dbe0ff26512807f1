//! The TUN device's MTU: with `mtu = "auto"` the path MTU to the peer less the largest
//! overhead of the outbound SAs and bundles (RFC 4301 §8: the gateway's own PMTU), so
//! nothing sealed is fragmented; what `--check` says of it on this host; a warning for a
//! fixed MTU the path cannot carry sealed; the change at a reload.

use crate::config::{Config, Mtu};
use crate::{guard, sys};

/// The TUN device's MTU (at start, and at a reload with `auto`), and the path MTU it came
/// from (`auto`).
pub fn tun_mtu(cfg: &Config) -> Result<(u16, Option<u16>), String> {
    match cfg.mtu {
        Mtu::Fixed(n) => Ok((n, None)),
        Mtu::Auto => {
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

/// What `--check` says of the TUN device's MTU on this host, and a warning for a fixed
/// MTU the path cannot carry sealed. `Err`: with `auto`, the path leaves too little room
/// (the gateway would refuse to start: so does the check). A path this host cannot ask
/// about (the config checked away from its gateway, or without CAP_NET_ADMIN for the
/// mark) is said, not refused: the start works it out.
pub fn mtu_report(cfg: &Config) -> Result<(String, Option<String>), String> {
    let path = sys::path_mtu(cfg.local, cfg.remote, cfg.fwmark);
    match (cfg.mtu, path) {
        (Mtu::Auto, Err(e)) => Ok((
            format!(
                "TUN MTU \"auto\": the path MTU from {} to {} cannot be learned here ({e}); \
                 the gateway works it out at start",
                cfg.local, cfg.remote
            ),
            None,
        )),
        (Mtu::Auto, Ok(p)) => {
            let n = cfg.auto_mtu(p)?;
            Ok((format!("TUN MTU {n}{}", path_note(Some(p))), None))
        }
        (Mtu::Fixed(n), Ok(p)) => Ok((format!("TUN MTU {n}"), fixed_mtu_warning(cfg, n, p))),
        (Mtu::Fixed(n), Err(_)) => Ok((format!("TUN MTU {n}"), None)),
    }
}

/// A fixed TUN MTU larger than a path of `path` bytes carries once sealed: such inner
/// packets are fragmented after sealing (ESP in UDP) or refused by the raw socket (plain
/// ESP: lost, and no ICMP tells the sender) — RFC 4301 §8 asks for neither.
pub fn fixed_mtu_warning(cfg: &Config, n: u16, path: u16) -> Option<String> {
    let fits = cfg.auto_mtu(path).ok()?;
    (n > fits).then(|| {
        format!(
            "{}: gateway.mtu = {n} is more than the path MTU to {} ({path} bytes) carries \
             sealed ({fits}): larger inner packets are {} after sealing; \"auto\" gives {fits}",
            cfg.file.display(),
            cfg.remote,
            if cfg.udp_encap {
                "fragmented"
            } else {
                "refused by the raw socket (lost, no ICMP back)"
            }
        )
    })
}

pub fn path_note(path: Option<u16>) -> String {
    path.map_or(String::new(), |p| {
        format!(" = path MTU {p} less the SAs' overhead")
    })
}

/// Give the TUN device `n` bytes of MTU (the gateway keeps CAP_NET_ADMIN, ambient, for
/// this and the guard); `running` follows it.
pub fn set_tun_mtu(
    cfg: &Config,
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
