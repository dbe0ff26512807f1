//! The Security Policy Database: ordered rules, first match wins (RFC 4301 §4.4.1).
//! A packet no rule matches is discarded.

use core::net::IpAddr;
use core::ops::RangeInclusive;
use std::collections::HashMap;

use crate::sad::SaId;
use crate::wire::PacketInfo;

/// An address prefix such as 10.1.0.0/16 or 2001:db8::/32. Two prefixes are equal when
/// they are the same network (10.2.0.5/24 is 10.2.0.0/24): what a route, a guard's set
/// and an SPD index hold is the network, whatever host bits a config wrote.
#[derive(Clone, Copy, Debug)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    fn identity(&self) -> (bool, u128, u8) {
        (self.addr.is_ipv4(), masked(self.addr, self.len), self.len)
    }
}

impl PartialEq for Prefix {
    fn eq(&self, other: &Self) -> bool {
        self.identity() == other.identity()
    }
}

impl Eq for Prefix {}

impl core::hash::Hash for Prefix {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.identity().hash(state);
    }
}

impl Prefix {
    /// Fails if `len` exceeds the address width.
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, String> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(format!(
                "prefix length /{len} is longer than {max} bits for {addr}"
            ));
        }
        Ok(Prefix { addr, len })
    }

    /// Parse `a.b.c.d/n`, `x::y/n` or a bare address (a host prefix).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{a:?} is not an IP address"))?;
        let len = match l {
            Some(l) => l
                .trim()
                .parse()
                .map_err(|_| format!("{l:?} is not a prefix length"))?,
            None if addr.is_ipv4() => 32,
            None => 128,
        };
        Prefix::new(addr, len)
    }

    /// Same family, and the first `len` bits equal.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addr.is_ipv4() == ip.is_ipv4() && masked(self.addr, self.len) == masked(ip, self.len)
    }

    /// The network address: the prefix's address with its host bits zero (10.1.2.3/16
    /// is the network 10.1.0.0).
    pub fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(_) => {
                let bits = u32::try_from(masked(self.addr, self.len)).expect("32 bits");
                IpAddr::from(bits.to_be_bytes())
            }
            IpAddr::V6(_) => IpAddr::from(masked(self.addr, self.len).to_be_bytes()),
        }
    }
}

/// Written as its network: `10.1.0.0/16` for 10.1.2.3/16 (what `ip` and nftables take).
impl core::fmt::Display for Prefix {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.network(), self.len)
    }
}

/// The first `len` bits of `addr`, the rest zero, as an integer as wide as its family (an
/// IPv4 address in the low 32 bits); a `len` past the family's width keeps every bit.
pub fn masked(addr: IpAddr, len: u8) -> u128 {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX
                .checked_shl(32u32.saturating_sub(u32::from(len)))
                .unwrap_or(0);
            u128::from(u32::from(a) & mask)
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX
                .checked_shl(128u32.saturating_sub(u32::from(len)))
                .unwrap_or(0);
            u128::from(a) & mask
        }
    }
}

/// Traffic selectors (RFC 4301 §4.4.1.1); `None` / full ranges mean "any".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub src: Option<Prefix>,
    pub dst: Option<Prefix>,
    pub protocol: Option<u8>,
    pub src_ports: RangeInclusive<u16>,
    pub dst_ports: RangeInclusive<u16>,
}

const ANY_PORT: RangeInclusive<u16> = 0..=u16::MAX;

impl Default for Selector {
    fn default() -> Self {
        Selector {
            src: None,
            dst: None,
            protocol: None,
            src_ports: ANY_PORT,
            dst_ports: ANY_PORT,
        }
    }
}

impl Selector {
    /// All traffic from `src` to `dst`.
    pub fn between(src: Prefix, dst: Prefix) -> Self {
        Selector {
            src: Some(src),
            dst: Some(dst),
            ..Selector::default()
        }
    }

    pub fn matches(&self, p: &PacketInfo) -> bool {
        let port_ok = |range: &RangeInclusive<u16>, port: Option<u16>| {
            *range == ANY_PORT || port.is_some_and(|x| range.contains(&x))
        };
        self.src.is_none_or(|s| s.contains(p.src))
            && self.dst.is_none_or(|d| d.contains(p.dst))
            && self.protocol.is_none_or(|x| x == p.protocol)
            && port_ok(&self.src_ports, p.src_port)
            && port_ok(&self.dst_ports, p.dst_port)
    }

    /// True if some packet could match both selectors (used to warn of shadowed rules).
    pub fn overlaps(&self, other: &Selector) -> bool {
        let pfx = |a: Option<Prefix>, b: Option<Prefix>| match (a, b) {
            (Some(a), Some(b)) => {
                let l = a.len.min(b.len);
                a.addr.is_ipv4() == b.addr.is_ipv4()
                    && Prefix {
                        addr: a.addr,
                        len: l,
                    }
                    .contains(b.addr)
            }
            _ => true,
        };
        let rng = |a: &RangeInclusive<u16>, b: &RangeInclusive<u16>| {
            a.start() <= b.end() && b.start() <= a.end()
        };
        pfx(self.src, other.src)
            && pfx(self.dst, other.dst)
            && (self.protocol.is_none()
                || other.protocol.is_none()
                || self.protocol == other.protocol)
            && rng(&self.src_ports, &other.src_ports)
            && rng(&self.dst_ports, &other.dst_ports)
    }
}

/// What a policy does with matching traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Protect with this SA (outbound: seal with it; inbound: must have arrived through it).
    Protect(SaId),
    /// Protect with this SA bundle (`Engine::add_bundle`): IPComp → ESP → AH.
    ProtectBundle(usize),
    /// Pass in clear.
    Bypass,
    Discard,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpdRule {
    pub selector: Selector,
    pub action: Action,
    /// Inbound `Protect` rules only: further SAs the rule lets traffic in through besides
    /// its action's — a rekey's old and new SA side by side (RFC 7296 §2.8: the old
    /// inbound SA lives until the peer has moved to the new one). Empty otherwise; the
    /// outbound path ignores it (a packet is sealed with the action's SA).
    pub also: Vec<SaId>,
}

impl SpdRule {
    /// A rule with nothing besides its action.
    pub fn new(selector: Selector, action: Action) -> Self {
        SpdRule {
            selector,
            action,
            also: Vec::new(),
        }
    }

    /// Inbound: whether traffic that came through `via` (an SA, or a bundle) is what
    /// this rule lets in — its action, or one of the SAs beside it.
    pub fn admits(&self, via: Action) -> bool {
        self.action == via
            || match (self.action, via) {
                (Action::Protect(_), Action::Protect(sa)) => self.also.contains(&sa),
                _ => false,
            }
    }
}

/// Up to this many rules a lookup scans them in order; past it, the index decides which
/// few to try (one tunnel per gateway pair, a handful of bypass rules: the scan is the
/// cheaper, and it is the reference the index is tested against).
pub const LINEAR_UP_TO: usize = 16;

/// Ordered rules for one direction, first match wins (RFC 4301 §4.4.1) — and a lookup
/// whose cost does not grow with the number of rules in the common case of many
/// tunnels, each to its own destination prefix. The rules are indexed by destination:
/// for each prefix length in use (per address family), the masked destination maps to
/// the positions of the rules with that destination prefix; rules with any destination
/// are a list of their own. A rule can match a packet only if its destination prefix
/// contains the packet's destination, so only those lists hold candidates; each is in
/// rule order, and the lowest position that fully matches is the first match of the
/// ordered list — the same answer as the scan, for every rule set (§4.4.1.2 leaves how
/// the SPD is searched to the implementation, the ordered result is what it must keep).
/// Lookups cost one hash probe per prefix length in use plus the candidates tried.
#[derive(Clone, Debug, Default)]
pub struct Spd {
    rules: Vec<SpdRule>,
    index: DstIndex,
}

/// The rules' positions by destination prefix (`Spd`).
#[derive(Clone, Debug, Default)]
struct DstIndex {
    /// (IPv6, prefix length) → masked destination → positions, ascending.
    by_len: Vec<(bool, u8, HashMap<u128, Vec<u32>>)>,
    /// Rules with any destination: positions, ascending.
    any_dst: Vec<u32>,
}

/// An address as a number of its family's width, masked to `len` bits.
impl DstIndex {
    fn add(&mut self, position: usize, dst: Option<Prefix>) {
        let at = u32::try_from(position).expect("an SPD of fewer than 2^32 rules");
        let Some(d) = dst else {
            self.any_dst.push(at);
            return;
        };
        let v6 = d.addr.is_ipv6();
        let i = match self
            .by_len
            .iter()
            .position(|(f, l, _)| *f == v6 && *l == d.len)
        {
            Some(i) => i,
            None => {
                self.by_len.push((v6, d.len, HashMap::new()));
                self.by_len.len() - 1
            }
        };
        let key = masked(d.addr, d.len);
        self.by_len[i].2.entry(key).or_default().push(at);
    }
}

impl Spd {
    pub fn push(&mut self, rule: SpdRule) {
        self.index.add(self.rules.len(), rule.selector.dst);
        self.rules.push(rule);
    }
    pub fn rules(&self) -> &[SpdRule] {
        &self.rules
    }
    pub fn clear(&mut self) {
        self.rules.clear();
        self.index = DstIndex::default();
    }
    /// The first matching rule's action; `Discard` when none matches (RFC 4301 §4.4.1).
    pub fn lookup(&self, p: &PacketInfo) -> Action {
        self.rule(p).map_or(Action::Discard, |r| r.action)
    }

    /// The first matching rule, if any.
    pub fn rule(&self, p: &PacketInfo) -> Option<&SpdRule> {
        if self.rules.len() <= LINEAR_UP_TO {
            return self.scan(p);
        }
        let v6 = p.dst.is_ipv6();
        let mut best = self.first_in(&self.index.any_dst, p, usize::MAX);
        for (family, len, map) in &self.index.by_len {
            if *family == v6 {
                if let Some(list) = map.get(&masked(p.dst, *len)) {
                    best = self.first_in(list, p, best);
                }
            }
        }
        self.rules.get(best)
    }

    /// The first matching rule by scanning them in order (what `rule` answers; kept for
    /// small SPDs and as the reference of the tests).
    pub fn scan(&self, p: &PacketInfo) -> Option<&SpdRule> {
        self.rules.iter().find(|r| r.selector.matches(p))
    }

    /// The position of the first rule of `list` (ascending) before `best` that matches
    /// `p`, else `best`.
    fn first_in(&self, list: &[u32], p: &PacketInfo, best: usize) -> usize {
        for &at in list {
            let at = at as usize;
            if at >= best {
                break;
            }
            if self.rules[at].selector.matches(p) {
                return at;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_is_written_as_its_network_and_contains_only_its_own_family() {
        let cases = [
            ("10.1.2.3/16", "10.1.0.0/16"),
            ("10.1.2.3/32", "10.1.2.3/32"),
            ("10.1.2.3/0", "0.0.0.0/0"),
            ("192.168.255.255/23", "192.168.254.0/23"),
            ("2001:db8:1:2::9/32", "2001:db8::/32"),
            ("2001:db8::ff/128", "2001:db8::ff/128"),
            ("2001:db8::1/0", "::/0"),
            ("2001:db8::1/65", "2001:db8::/65"),
        ];
        for (given, written) in cases {
            let p = Prefix::parse(given).unwrap();
            assert_eq!(p.to_string(), written, "{given}");
            assert!(p.contains(p.addr) && p.contains(p.network()), "{given}");
        }
        let any4 = Prefix::parse("0.0.0.0/0").unwrap();
        let any6 = Prefix::parse("::/0").unwrap();
        assert!(any4.contains("255.1.2.3".parse().unwrap()));
        assert!(!any4.contains("::".parse().unwrap()));
        assert!(!any6.contains("0.0.0.0".parse().unwrap()));
        let p = Prefix::parse("10.1.0.0/16").unwrap();
        assert!(p.contains("10.1.255.255".parse().unwrap()));
        assert!(!p.contains("10.2.0.0".parse().unwrap()));
        // equal (and hashed alike) as networks, whatever host bits were written
        let set: std::collections::HashSet<Prefix> = ["10.2.0.5/24", "10.2.0.0/24"]
            .iter()
            .map(|t| Prefix::parse(t).unwrap())
            .collect();
        assert_eq!(set.len(), 1);
        for (a, b) in [
            ("10.2.0.5/24", "10.2.0.0/25"),
            ("10.2.0.0/24", "10.3.0.0/24"),
            ("0.0.0.0/0", "::/0"),
            ("2001:db8::1/32", "2001:db9::/32"),
        ] {
            assert_ne!(
                Prefix::parse(a).unwrap(),
                Prefix::parse(b).unwrap(),
                "{a} {b}"
            );
        }
        assert_eq!(
            Prefix::parse("2001:db8::1/32").unwrap(),
            Prefix::parse("2001:db8:ffff::/32").unwrap()
        );
        // a length past the width keeps every bit (as /32 and /128 do)
        assert_eq!(masked("10.1.2.3".parse().unwrap(), 40), 0x0a01_0203);
        assert_eq!(masked("::1".parse().unwrap(), 200), 1);
    }

    fn info(src: &str, dst: &str, protocol: u8, ports: Option<(u16, u16)>) -> PacketInfo {
        PacketInfo {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol,
            src_port: ports.map(|p| p.0),
            dst_port: ports.map(|p| p.1),
        }
    }

    #[test]
    fn prefixes() {
        let p = Prefix::parse("10.1.0.0/16").unwrap();
        assert!(p.contains("10.1.255.3".parse().unwrap()));
        assert!(!p.contains("10.2.0.1".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        assert!(Prefix::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert!(Prefix::parse("2001:db8::/32")
            .unwrap()
            .contains("2001:db8:1::5".parse().unwrap()));
        assert!(Prefix::parse("10.0.0.0/33").is_err());
        assert!(Prefix::parse("10.0.0/8").is_err());
    }

    #[test]
    fn first_match_wins_and_default_is_discard() {
        let mut spd = Spd::default();
        spd.push(SpdRule {
            selector: Selector {
                protocol: Some(17),
                dst_ports: 53..=53,
                ..Selector::between(
                    Prefix::parse("10.1.0.0/16").unwrap(),
                    Prefix::parse("10.2.0.0/16").unwrap(),
                )
            },
            action: Action::Bypass,
            also: Vec::new(),
        });
        spd.push(SpdRule {
            selector: Selector::between(
                Prefix::parse("10.1.0.0/16").unwrap(),
                Prefix::parse("10.2.0.0/16").unwrap(),
            ),
            action: Action::Protect(7),
            also: Vec::new(),
        });
        assert_eq!(
            spd.lookup(&info("10.1.0.1", "10.2.0.1", 17, Some((999, 53)))),
            Action::Bypass
        );
        assert_eq!(
            spd.lookup(&info("10.1.0.1", "10.2.0.1", 17, Some((999, 54)))),
            Action::Protect(7)
        );
        // ICMP has no ports: a port selector does not match it.
        assert_eq!(
            spd.lookup(&info("10.1.0.1", "10.2.0.1", 1, None)),
            Action::Protect(7)
        );
        assert_eq!(
            spd.lookup(&info("10.9.0.1", "10.2.0.1", 1, None)),
            Action::Discard
        );
    }

    #[test]
    fn overlap_detection() {
        let a = Selector::between(
            Prefix::parse("10.0.0.0/8").unwrap(),
            Prefix::parse("10.2.0.0/16").unwrap(),
        );
        let b = Selector::between(
            Prefix::parse("10.1.0.0/16").unwrap(),
            Prefix::parse("10.2.3.0/24").unwrap(),
        );
        let c = Selector::between(
            Prefix::parse("192.0.2.0/24").unwrap(),
            Prefix::parse("10.2.0.0/16").unwrap(),
        );
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
    }

    /// A small xorshift generator: the property test's cases, the same every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// An address near the others (so prefixes overlap and packets hit them): IPv4 in
    /// 10.0.0.0/14, IPv6 in 2001:db8::/110, the family one in four times IPv6.
    fn address(r: &mut Rng, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6((0x2001_0db8_u128 << 96 | u128::from(r.below(1 << 18))).into())
        } else {
            IpAddr::V4((0x0a00_0000_u32 | r.below(1 << 18) as u32).into())
        }
    }

    fn prefix(r: &mut Rng, v6: bool) -> Option<Prefix> {
        if r.below(6) == 0 {
            return None; // any
        }
        let width = if v6 { 128 } else { 32 };
        // lengths from wide to a host, a few of them in common use
        let len = [0, 8, 14, 16, 20, 24, 24, 24, 28, width][r.below(10) as usize];
        Some(Prefix::new(address(r, v6), len).unwrap())
    }

    fn ports(r: &mut Rng) -> RangeInclusive<u16> {
        match r.below(4) {
            0 => {
                let a = r.below(8) as u16;
                a..=a + r.below(4) as u16
            }
            _ => ANY_PORT,
        }
    }

    fn rule(r: &mut Rng, position: usize) -> SpdRule {
        let v6 = r.below(4) == 0;
        SpdRule {
            selector: Selector {
                src: prefix(r, v6),
                dst: prefix(r, v6),
                protocol: [None, None, Some(6), Some(17), Some(1)][r.below(5) as usize],
                src_ports: ports(r),
                dst_ports: ports(r),
            },
            action: match r.below(4) {
                0 => Action::Bypass,
                1 => Action::Discard,
                _ => Action::Protect(position),
            },
            also: Vec::new(),
        }
    }

    fn packet(r: &mut Rng) -> PacketInfo {
        let v6 = r.below(4) == 0;
        let protocol = [6, 17, 1, 50][r.below(4) as usize];
        let ported = protocol == 6 || protocol == 17;
        PacketInfo {
            src: address(r, v6),
            dst: address(r, v6),
            protocol,
            src_port: ported.then(|| r.below(12) as u16),
            dst_port: ported.then(|| r.below(12) as u16),
        }
    }

    /// The index answers what the ordered scan answers — the same rule, by position — for
    /// random rule sets of every size across the threshold (both families, every prefix
    /// length class, any-destination rules, overlaps, ports and protocols), packets drawn
    /// near the rules' addresses so that many match several rules, and after a clear.
    #[test]
    fn the_index_finds_the_first_match_of_the_ordered_list() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let mut matched = 0;
        for case in 0..300 {
            let n = [0, 1, 5, 16, 17, 40, 200, 1000][case % 8];
            let mut spd = Spd::default();
            for i in 0..n {
                spd.push(rule(&mut r, i));
            }
            // a tunnel per destination too: many rules, each its own /24
            if case % 3 == 0 {
                for k in 0..n as u32 {
                    let dst = Prefix::new(IpAddr::V4((0x0a00_0000 | (k << 8)).into()), 24);
                    spd.push(SpdRule {
                        selector: Selector {
                            dst: Some(dst.unwrap()),
                            ..Selector::default()
                        },
                        action: Action::Protect(n + k as usize),
                        also: Vec::new(),
                    });
                }
            }
            for _ in 0..200 {
                let p = packet(&mut r);
                let want = spd.scan(&p).map(|x| x as *const SpdRule);
                let got = spd.rule(&p).map(|x| x as *const SpdRule);
                assert_eq!(got, want, "case {case}: {} rules, {p:?}", spd.rules().len());
                matched += usize::from(want.is_some());
            }
            spd.clear();
            assert!(spd.rules().is_empty() && spd.rule(&packet(&mut r)).is_none());
        }
        // the cases exercised matches, not only misses
        assert!(matched > 10_000, "{matched}");
    }
}
