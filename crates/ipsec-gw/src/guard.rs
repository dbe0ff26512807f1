//! The boundary closed, running or down (RFC 4301 §5.1, §5.2): traffic that policy says
//! to protect never crosses in clear.
//!
//! - **Outbound, while down.** Every prefix routed into the TUN device also gets a
//!   `blackhole` route in the gateway's table, at the lowest preference
//!   ([`BLACKHOLE_METRIC`]): while the TUN device exists its own route wins; when the
//!   gateway stops or is killed the TUN device and its routes go, the blackhole stays,
//!   and the rule sending every unmarked packet to that table stays too — the host's
//!   other routes (a plain route to the far subnet) are never reached.
//! - **Clear packets from outside for protected traffic**, in either direction, running
//!   or down: an nftables table the gateway owns (`inet ipsec_gw_TABLE`, replaced in one
//!   transaction at start and on reload, never removed by a stop) drops, and counts,
//!   forwarded packets matching an inbound protect policy that did not come out of the
//!   TUN device, packets matching an outbound protect policy about to leave by another
//!   interface, and packets for the host itself matching an inbound protect policy that
//!   are not ESP, AH or (with UDP encapsulation) UDP 4500. Bypass policies before them
//!   are honoured in order, as the engine does.
//!
//! - **The host's own packets**, running or down: an `output` chain in the same table
//!   drops locally made packets matching an outbound protect policy that leave by another
//!   interface than the TUN device — all but the gateway's own tunnel packets (ESP, AH,
//!   UDP 4500, sent marked with `fwmark`).
//! - **One gateway's guard is its own.** A gateway claims its routing table in its
//!   network namespace for its life ([`crate::claim`]): a second
//!   gateway on the same table, whose start would replace the first one's nftables table
//!   and routes with its own, is refused; so is `--release` while a gateway runs.
//!
//! What a stop leaves is taken away only by `ipsec-gw --release CONFIG` ([`release`]).

use std::fmt::Write as _;
use std::process::{Command, Stdio};

use ipsec::sa::Direction;
use ipsec::spd::{Prefix, Selector};

use crate::config::{Config, PolicyAction};
use crate::prefixes::PrefixMap;

/// The blackhole routes' metric: the least preferred, below the TUN device's routes.
pub const BLACKHOLE_METRIC: u32 = 4_294_967_295;

/// iproute2's `ip`, by absolute path (not whatever `ip` comes first on $PATH).
fn binary(names: &[&'static str]) -> &'static str {
    names
        .iter()
        .copied()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or(names[0])
}

/// Run `ip ARGS` (iproute2: what a user would type); an error quotes its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    run(ip_binary(), args, None).map(|_| ())
}

fn ip_binary() -> &'static str {
    binary(&["/usr/sbin/ip", "/usr/bin/ip", "/sbin/ip", "/bin/ip"])
}

/// `ip` commands (each an argument list, as one would type after `ip`), one process per
/// address family (`ip -4 -batch -`, `ip -6 -batch -`): a route each is a process each
/// otherwise, and 4,096 tunnels' routes and blackholes took most of a start (8,192 runs
/// of `ip`). `force`: every command is tried, and what fails is no error (taking away
/// what may be gone already); else the first that fails stops its batch, and the error
/// quotes it and what `ip` said.
fn ip_batch(commands: &[(bool, Vec<String>)], force: bool) -> Result<(), String> {
    for v4 in [true, false] {
        let lines: Vec<String> = commands
            .iter()
            .filter(|(is_v4, _)| *is_v4 == v4)
            .map(|(_, c)| c.join(" "))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let fam = if v4 { "-4" } else { "-6" };
        let mut args = vec![fam, "-batch", "-"];
        if force {
            args.insert(0, "-force");
        }
        let text = lines.join("\n") + "\n";
        match run(ip_binary(), &args, Some(&text)) {
            Ok(_) => {}
            // some commands failed (what is gone already): the others were run; but an
            // `ip` that did not start, or that refused the batch itself, is an error
            Err(e) if force && e.contains("Command failed -:") => {}
            Err(e) => {
                // `ip` names the line it stopped at: "Command failed -:N"
                let failed = e
                    .rsplit_once("Command failed -:")
                    .and_then(|(_, n)| n.trim().parse::<usize>().ok())
                    .and_then(|n| lines.get(n.wrapping_sub(1)));
                return Err(match failed {
                    Some(line) => format!("ip {fam} {line} failed: {e}"),
                    None => e,
                });
            }
        }
    }
    Ok(())
}

/// Run `nft ARGS`, `input` on its stdin; its stdout.
fn nft(args: &[&str], input: Option<&str>) -> Result<String, String> {
    run(
        binary(&["/usr/sbin/nft", "/usr/bin/nft", "/sbin/nft"]),
        args,
        input,
    )
}

fn run(bin: &str, args: &[&str], input: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    // a clean environment: nothing of the gateway's own (its caller's locale, an
    // NFT_* or IPROUTE_* variable, a PATH) reaches the tools it runs as root
    let mut child = Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {bin}: {e}"))?;
    // Its input is written from a thread of its own while its output is read: a tool
    // that answers as it reads (`ip -force -batch`, a line of stderr per command that
    // fails) would otherwise fill its output pipe and wait for us, as we wait for it to
    // read. A tool that refuses before reading all of its input closes the pipe: its
    // own status and words then say why, not the broken pipe.
    let stdin = child.stdin.take();
    let (fed, out) = std::thread::scope(|s| {
        let writer = s.spawn(move || match (input, stdin) {
            (Some(text), Some(mut stdin)) => stdin.write_all(text.as_bytes()),
            _ => Ok(()),
        });
        let out = child.wait_with_output();
        let fed = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")));
        (fed, out)
    });
    let out = out.map_err(|e| format!("{bin}: {e}"))?;
    if out.status.success() {
        fed.map_err(|e| format!("{bin}: {e}"))?;
    } else {
        return Err(format!(
            "{bin} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The gateway's nftables table (inet family): one per routing table, as the rule is.
pub fn table_name(cfg: &Config) -> String {
    format!("ipsec_gw_{}", cfg.table)
}

fn family(p: &Prefix) -> &'static str {
    if p.addr.is_ipv4() {
        "ip"
    } else {
        "ip6"
    }
}

/// A selector as an nftables match (addresses, protocol, ports), or None when it can
/// match no packet of one family (source IPv4, destination IPv6).
fn matcher(sel: &Selector) -> Option<String> {
    let mut m = String::new();
    if let (Some(s), Some(d)) = (sel.src, sel.dst) {
        if s.addr.is_ipv4() != d.addr.is_ipv4() {
            return None;
        }
    }
    for (p, dir) in [(sel.src, "saddr"), (sel.dst, "daddr")] {
        if let Some(p) = p {
            let _ = write!(m, "{} {dir} {p} ", family(&p));
        }
    }
    if let Some(proto) = sel.protocol {
        let _ = write!(m, "meta l4proto {proto} ");
    }
    for (r, word) in [(&sel.src_ports, "sport"), (&sel.dst_ports, "dport")] {
        if *r != (0..=u16::MAX) {
            let _ = write!(m, "th {word} {}-{} ", r.start(), r.end());
        }
    }
    Some(m)
}

/// The rules of one direction's policies, in order: a bypass accepts what it matches
/// (later rules do not see it), a protect or discard drops it unless `exempt` lets it
/// through; each drop counted, with a comment naming the direction.
///
/// Consecutive policies of one verdict that match on addresses alone (a source and a
/// destination prefix of one family: a tunnel's) become one rule over a set of (source
/// . destination) pairs — their order among themselves decides nothing, as each gives
/// the same verdict — so the kernel looks a packet up in the set instead of walking a
/// rule per tunnel, and nftables loads 4,096 tunnels' guard in 0.22 s instead of 0.57
/// (one run here). A set holds no two pairs that share a packet (nftables refuses
/// them): a pair that would starts a new rule.
fn policy_rules(cfg: &Config, direction: Direction, exempt: &str, label: &str) -> String {
    let mut out = String::new();
    let mut group = Group::default();
    for p in cfg.policies.iter().filter(|p| p.direction == direction) {
        let Some(m) = matcher(&p.selector) else {
            continue;
        };
        let verdict = match p.action {
            PolicyAction::Bypass => "accept".to_string(),
            PolicyAction::Discard | PolicyAction::Protect(_) | PolicyAction::ProtectBundle(_) => {
                format!("counter drop comment \"{label}\"")
            }
        };
        let prefix = if matches!(p.action, PolicyAction::Bypass) {
            ""
        } else {
            exempt
        };
        match (p.selector.src, p.selector.dst) {
            (Some(s), Some(d))
                if p.selector.protocol.is_none()
                    && p.selector.src_ports == (0..=u16::MAX)
                    && p.selector.dst_ports == (0..=u16::MAX) =>
            {
                if !group.takes(&s, &d, prefix, &verdict) {
                    group.flush(&mut out);
                }
                group.add(s, d, prefix, verdict);
            }
            _ => {
                group.flush(&mut out);
                let _ = writeln!(out, "    {prefix}{m}{verdict}");
            }
        }
    }
    group.flush(&mut out);
    out
}

/// Consecutive address-only policies of one family and verdict, no two of whose
/// (source, destination) pairs share a packet: one rule.
#[derive(Default)]
struct Group {
    pairs: Vec<(Prefix, Prefix)>,
    /// the rule's head (`exempt`) and verdict, and whether its family is IPv6
    kind: Option<(String, String, bool)>,
    srcs: PrefixMap<()>,
    dsts: PrefixMap<()>,
    seen: std::collections::HashSet<(Prefix, Prefix)>,
}

impl Group {
    /// Whether (s, d) may join: the same kind, and its source meets no source of the
    /// group or its destination no destination (so it shares a packet with no pair).
    fn takes(&self, s: &Prefix, d: &Prefix, head: &str, verdict: &str) -> bool {
        let Some((h, v, v6)) = &self.kind else {
            return true;
        };
        h == head
            && v == verdict
            && *v6 == s.addr.is_ipv6()
            && (self.seen.contains(&(*s, *d)) || !self.srcs.meets(s) || !self.dsts.meets(d))
    }

    fn add(&mut self, s: Prefix, d: Prefix, head: &str, verdict: String) {
        self.kind = Some((head.to_string(), verdict, s.addr.is_ipv6()));
        if self.seen.insert((s, d)) {
            self.pairs.push((s, d));
            self.srcs.insert(&s, ());
            self.dsts.insert(&d, ());
        }
    }

    fn flush(&mut self, out: &mut String) {
        let Some((head, verdict, _)) = self.kind.take() else {
            return;
        };
        if let [(s, d)] = self.pairs[..] {
            // one pair: the rule a lone policy of it gets
            let m = matcher(&Selector::between(s, d)).expect("a group's pairs are of one family");
            let _ = writeln!(out, "    {head}{m}{verdict}");
        } else {
            let fam = family(&self.pairs[0].0);
            let set: Vec<String> = self
                .pairs
                .iter()
                .map(|(s, d)| format!("{s} . {d}"))
                .collect();
            let _ = writeln!(
                out,
                "    {head}{fam} saddr . {fam} daddr {{ {} }} {verdict}",
                set.join(", ")
            );
        }
        *self = Group::default();
    }
}

/// IPv6 neighbour discovery (RFC 4861) is the link's own business, never IPsec's: a
/// host-to-host policy covers the peer's address, and its neighbour solicitations and
/// advertisements must still pass in clear (as strongSwan and Linux xfrm let them by).
const ND: &str = "    icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, \
                  nd-neighbor-advert, nd-redirect } accept\n";

/// The whole table, as one `nft -f` transaction that replaces any earlier copy.
pub fn ruleset(cfg: &Config) -> String {
    let t = table_name(cfg);
    let tun = &cfg.tun;
    // (nftables comments hold at most 128 characters: no path in it)
    let mut s = format!(
        "table inet {t} {{}}\ndelete table inet {t}\ntable inet {t} {{\n\
         \x20 comment \"ipsec-gw: no clear traffic for protected subnets; ipsec-gw --release \
         removes it\"\n"
    );
    // forwarded, from outside into a protected subnet: only out of the TUN device
    let _ = write!(
        s,
        "  chain inbound {{\n    type filter hook forward priority filter - 1; policy accept;\n\
         \x20   iifname \"{tun}\" accept\n{ND}{}  }}\n",
        policy_rules(cfg, Direction::In, "", "clear_inbound")
    );
    // forwarded, from a protected subnet out: only into the TUN device
    let _ = write!(
        s,
        "  chain outbound {{\n    type filter hook forward priority filter - 1; policy accept;\n\
         \x20   oifname \"{tun}\" accept\n{}  }}\n",
        policy_rules(cfg, Direction::Out, "", "clear_outbound")
    );
    // to the host itself (host-to-host): the tunnel's own packets, and nothing else, in
    // clear
    let encap = if cfg.udp_encap {
        "    udp dport 4500 accept\n"
    } else {
        ""
    };
    let _ = write!(
        s,
        "  chain local {{\n    type filter hook input priority filter - 1; policy accept;\n\
         \x20   iifname \"{tun}\" accept\n    meta l4proto {{ esp, ah }} accept\n{ND}{encap}{}  }}\n",
        policy_rules(cfg, Direction::In, "", "clear_inbound")
    );
    // made by the host itself, for a protected destination: only into the TUN device,
    // but for the gateway's own tunnel packets (marked, `outside.rs`)
    let mark = format!("0x{:x}", cfg.fwmark);
    let encap = if cfg.udp_encap {
        format!("    meta mark {mark} udp sport 4500 accept\n")
    } else {
        String::new()
    };
    let _ = write!(
        s,
        "  chain local_out {{\n    type filter hook output priority filter - 1; policy accept;\n\
         \x20   oifname \"{tun}\" accept\n    meta mark {mark} meta l4proto {{ esp, ah }} accept\n\
         {ND}{encap}{}  }}\n}}\n",
        policy_rules(cfg, Direction::Out, "", "clear_outbound")
    );
    s
}

/// Install (or replace) the guard: the blackhole routes, the rule into the gateway's
/// table, and the nftables table. Nothing is taken away first: the boundary is never
/// open while it is replaced.
pub fn install(cfg: &Config) -> Result<(), String> {
    blackholes(cfg, &cfg.routes, "replace", false)?;
    rule(cfg, true)?;
    nft(&["-f", "-"], Some(&ruleset(cfg)))
        .map(|_| ())
        .map_err(|e| format!("cannot install the clear-traffic guard (nftables): {e}"))
}

/// A reload's guard, in place of `current`'s: the nftables table first, in one
/// transaction (refused: nothing changed, `current`'s stands), then the blackhole routes
/// and the routes into the TUN device of `new`, and those of `current`'s routes that `new`
/// does not have taken away. When `new`'s fail, `current`'s guard is put
/// back — its table, and what `new` added that it does not have taken away — and the
/// error says so: the caller then refuses the reload.
pub fn reinstall(current: &Config, new: &Config) -> Result<(), String> {
    nft(&["-f", "-"], Some(&ruleset(new)))
        .map_err(|e| format!("cannot install the clear-traffic guard (nftables): {e}"))?;
    let Err(e) = blackholes(new, &new.routes, "replace", false).and_then(|()| tun_routes(new))
    else {
        // What the running config routed and the new one does not: its route into the
        // TUN device and its blackhole go (the new guard, already in place, decides
        // what of that traffic may pass in clear). Left behind, they stayed until the
        // host rebooted: `--release` knows only the config's routes.
        let gone = only_in(&current.routes, &new.routes);
        let mut removal = tun_route_commands(current, &gone, "del");
        removal.extend(blackhole_commands(current, &gone, "del"));
        if let Err(e) = ip_batch(&removal, true) {
            eprintln!("ipsec-gw: warning: cannot remove the routes the reload took away: {e}");
        }
        return Ok(());
    };
    let extra = only_in(&new.routes, &current.routes);
    let mut gone = tun_route_commands(current, &extra, "del");
    gone.extend(blackhole_commands(current, &extra, "del"));
    let _ = ip_batch(&gone, true);
    let back = nft(&["-f", "-"], Some(&ruleset(current)))
        .and_then(|_| blackholes(current, &current.routes, "replace", false))
        .and_then(|()| tun_routes(current));
    Err(match back {
        Ok(()) => format!("{e} (the running guard and routes are put back)"),
        Err(b) => format!("{e}; putting the running guard back failed too: {b}"),
    })
}

/// The prefixes of `these` not among `those`, in order.
fn only_in(these: &[Prefix], those: &[Prefix]) -> Vec<Prefix> {
    let those: std::collections::HashSet<&Prefix> = those.iter().collect();
    these
        .iter()
        .filter(|r| !those.contains(r))
        .copied()
        .collect()
}

/// The routes into the TUN device, in the gateway's own table (the rule that sends
/// traffic there, and the blackholes under these routes, stay when it stops).
pub fn tun_routes(cfg: &Config) -> Result<(), String> {
    ip_batch(&tun_route_commands(cfg, &cfg.routes, "replace"), false)
}

/// `route VERB PREFIX dev TUN table T` for each of `routes`, with its family.
fn tun_route_commands(cfg: &Config, routes: &[Prefix], verb: &str) -> Vec<(bool, Vec<String>)> {
    let table = cfg.table.to_string();
    routes
        .iter()
        .map(|r| {
            let dst = r.to_string();
            let c = ["route", verb, &dst, "dev", &cfg.tun, "table", &table];
            (r.addr.is_ipv4(), c.map(String::from).to_vec())
        })
        .collect()
}

/// `ip route VERB blackhole PREFIX table T metric M` for each of `routes` (prefixes
/// routed into the TUN device): `replace` to install, `del` to release (`force`: what
/// is gone already is no error).
fn blackholes(cfg: &Config, routes: &[Prefix], verb: &str, force: bool) -> Result<(), String> {
    ip_batch(&blackhole_commands(cfg, routes, verb), force)
}

fn blackhole_commands(cfg: &Config, routes: &[Prefix], verb: &str) -> Vec<(bool, Vec<String>)> {
    let table = cfg.table.to_string();
    let metric = BLACKHOLE_METRIC.to_string();
    routes
        .iter()
        .map(|r| {
            let dst = r.to_string();
            let c = [
                "route",
                verb,
                "blackhole",
                &dst,
                "table",
                &table,
                "metric",
                &metric,
            ];
            (r.addr.is_ipv4(), c.map(String::from).to_vec())
        })
        .collect()
}

/// The rule that sends every packet but the gateway's own (marked) to its table — policy
/// routing, as strongSwan's table 220: a route there may cover the peer's outer address,
/// as a host-to-host tunnel needs.
fn rule_args(cfg: &Config) -> Vec<String> {
    [
        "not".to_string(),
        "fwmark".into(),
        format!("0x{:x}", cfg.fwmark),
        "lookup".into(),
        cfg.table.to_string(),
        "priority".into(),
        cfg.table.to_string(),
    ]
    .into()
}

/// Every copy of the rule removed (in both families), then, when `add`, exactly one
/// added: one a killed gateway left is replaced, never doubled.
fn rule(cfg: &Config, add: bool) -> Result<(), String> {
    let r = rule_args(cfg);
    let r: Vec<&str> = r.iter().map(String::as_str).collect();
    for fam in ["-4", "-6"] {
        let mut del = vec![fam, "rule", "del"];
        del.extend(&r);
        let mut n = 0;
        while n < 16 && ip(&del).is_ok() {
            n += 1;
        }
        if add {
            let mut args = vec![fam, "rule", "add"];
            args.extend(&r);
            ip(&args)?;
        }
    }
    Ok(())
}

/// Take the guard away (`ipsec-gw --release`): the rule, the blackhole routes and the
/// nftables table. What is already gone is no error.
pub fn release(cfg: &Config) -> Result<(), String> {
    rule(cfg, false)?;
    // one already gone is no error: take away the others
    blackholes(cfg, &cfg.routes, "del", true)?;
    let t = table_name(cfg);
    nft(
        &["-f", "-"],
        Some(&format!("table inet {t} {{}}\ndelete table inet {t}\n")),
    )
    .map(|_| ())
    .map_err(|e| format!("cannot remove the nftables table {t}: {e}"))
}

/// Packets the guard dropped so far, (inbound, outbound), from its table's counters.
pub fn dropped(table: &str) -> Option<(u64, u64)> {
    let text = nft(&["-j", "list", "table", "inet", table], None).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let (mut inb, mut out) = (0, 0);
    for item in v["nftables"].as_array()? {
        let rule = &item["rule"];
        let Some(comment) = rule["comment"].as_str() else {
            continue;
        };
        let packets: u64 = rule["expr"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["counter"]["packets"].as_u64())
            .sum();
        match comment {
            "clear_inbound" => inb += packets,
            "clear_outbound" => out += packets,
            _ => {}
        }
    }
    Some((inb, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        let keys = "enc_key = \"000102030405060708090a0b0c0d0e0f10111213\"\n";
        let base = format!(
            "[gateway]\ntun = \"ipsec0\"\nlocal = \"192.0.2.1\"\nremote = \"192.0.2.2\"\n\
             routes = [\"10.2.0.0/24\"]\n[[sa]]\nname = \"out\"\ndirection = \"out\"\n\
             spi = 4097\nencryption = \"aes128gcm16\"\n{keys}\
             [[sa]]\nname = \"in\"\ndirection = \"in\"\nspi = 4098\n\
             encryption = \"aes128gcm16\"\nenc_key = \"100102030405060708090a0b0c0d0e0f10111213\"\n{text}"
        );
        crate::config::parse(&base, std::path::Path::new("/etc/gw.toml")).unwrap()
    }

    #[test]
    fn the_ruleset_drops_clear_protected_traffic_and_honours_bypass_first() {
        let c = cfg(
            "[[policy]]\ndirection = \"in\"\nsrc = \"10.2.0.7/32\"\ndst = \"10.1.0.0/24\"\n\
             protocol = 17\naction = \"bypass\"\n\
             [[policy]]\ndirection = \"in\"\nsrc = \"10.2.0.9/24\"\ndst = \"10.1.0.0/24\"\n\
             action = \"protect\"\nsa = \"in\"\n\
             [[policy]]\ndirection = \"out\"\nsrc = \"10.1.0.0/24\"\ndst = \"10.2.0.0/24\"\n\
             action = \"protect\"\nsa = \"out\"\n",
        );
        let r = ruleset(&c);
        assert!(r.starts_with("table inet ipsec_gw_220 {}\ndelete table inet ipsec_gw_220\n"));
        let inbound = r.split("chain inbound").nth(1).unwrap();
        let inbound = inbound.split("chain outbound").next().unwrap();
        let bypass = inbound
            .find("ip saddr 10.2.0.7/32 ip daddr 10.1.0.0/24 meta l4proto 17 accept")
            .expect(&r);
        // the host bits of 10.2.0.9/24 cleared: nftables refuses them
        let drop = inbound
            .find(
                "ip saddr 10.2.0.0/24 ip daddr 10.1.0.0/24 counter drop comment \"clear_inbound\"",
            )
            .expect(&r);
        assert!(bypass < drop);
        assert!(inbound.contains("iifname \"ipsec0\" accept"));
        let outbound = r.split("chain outbound").nth(1).unwrap();
        assert!(outbound.contains("oifname \"ipsec0\" accept"));
        assert!(outbound.contains(
            "ip saddr 10.1.0.0/24 ip daddr 10.2.0.0/24 counter drop comment \"clear_outbound\""
        ));
        let local = r.split("chain local").nth(1).unwrap();
        assert!(local.contains("meta l4proto { esp, ah } accept"));
        for chain in [inbound, local] {
            assert!(chain.contains("icmpv6 type { nd-router-solicit"), "{chain}");
        }
        assert!(!local.contains("4500"), "no UDP encapsulation configured");
    }

    fn pol(dir: &str, src: &str, dst: &str, action: &str) -> String {
        let sa = match action {
            "protect" => format!("sa = \"{dir}\"\n"),
            _ => String::new(),
        };
        format!(
            "[[policy]]\ndirection = \"{dir}\"\nsrc = \"{src}\"\ndst = \"{dst}\"\n\
             action = \"{action}\"\n{sa}"
        )
    }

    /// Tunnels' policies become one rule over a set of (source . destination) pairs; a
    /// bypass between them, a policy with a protocol, another family or a pair that
    /// shares packets with one already in the set begins a new rule, so the order of
    /// the verdicts stays the policies' order.
    #[test]
    fn consecutive_tunnels_are_one_set_and_the_order_of_verdicts_stays() {
        let c = cfg(&[
            pol("in", "10.2.0.0/24", "10.1.0.0/24", "protect"),
            pol("in", "10.2.1.0/24", "10.1.1.0/24", "protect"),
            pol("in", "10.2.2.0/24", "10.1.0.0/24", "protect"), // same dst, other src: joins
            pol("in", "10.2.0.0/24", "10.1.0.0/24", "protect"), // a repeat: joins, once
            pol("in", "10.2.0.0/16", "10.1.0.0/16", "protect"), // shares packets: a new set
            pol("in", "10.3.0.0/24", "10.1.9.0/24", "protect"),
            pol("in", "10.4.0.0/24", "10.1.0.0/24", "bypass"),
            pol("in", "10.5.0.0/24", "10.1.0.0/24", "protect"), // after the bypass: its own
            pol("in", "2001:db8:2::/48", "2001:db8:1::/48", "protect"),
            pol("in", "2001:db8:3::/48", "2001:db8:1::/48", "protect"),
        ]
        .concat());
        let r = policy_rules(&c, Direction::In, "", "clear_inbound");
        let d = "counter drop comment \"clear_inbound\"";
        let want = [
            format!(
                "    ip saddr . ip daddr {{ 10.2.0.0/24 . 10.1.0.0/24, 10.2.1.0/24 . 10.1.1.0/24, \
                 10.2.2.0/24 . 10.1.0.0/24 }} {d}"
            ),
            format!(
                "    ip saddr . ip daddr {{ 10.2.0.0/16 . 10.1.0.0/16, 10.3.0.0/24 . 10.1.9.0/24 }} {d}"
            ),
            "    ip saddr 10.4.0.0/24 ip daddr 10.1.0.0/24 accept".to_string(),
            format!("    ip saddr 10.5.0.0/24 ip daddr 10.1.0.0/24 {d}"),
            format!(
                "    ip6 saddr . ip6 daddr {{ 2001:db8:2::/48 . 2001:db8:1::/48, \
                 2001:db8:3::/48 . 2001:db8:1::/48 }} {d}"
            ),
        ];
        assert_eq!(r.lines().collect::<Vec<_>>(), want, "{r}");
    }
}
