//! The Security Policy Database: ordered rules, first match wins (RFC 4301 §4.4.1).
//! A packet no rule matches is discarded.

use core::net::IpAddr;
use core::ops::RangeInclusive;

use crate::sad::SaId;
use crate::wire::PacketInfo;

/// An address prefix such as 10.1.0.0/16 or 2001:db8::/32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
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

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
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
}

/// Ordered rules for one direction.
#[derive(Clone, Debug, Default)]
pub struct Spd {
    rules: Vec<SpdRule>,
}

impl Spd {
    pub fn push(&mut self, rule: SpdRule) {
        self.rules.push(rule);
    }
    pub fn rules(&self) -> &[SpdRule] {
        &self.rules
    }
    pub fn clear(&mut self) {
        self.rules.clear();
    }
    /// The first matching rule's action; `Discard` when none matches (RFC 4301 §4.4.1).
    pub fn lookup(&self, p: &PacketInfo) -> Action {
        self.rule(p).map_or(Action::Discard, |r| r.action)
    }

    /// The first matching rule, if any.
    pub fn rule(&self, p: &PacketInfo) -> Option<&SpdRule> {
        self.rules.iter().find(|r| r.selector.matches(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        });
        spd.push(SpdRule {
            selector: Selector::between(
                Prefix::parse("10.1.0.0/16").unwrap(),
                Prefix::parse("10.2.0.0/16").unwrap(),
            ),
            action: Action::Protect(7),
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
}
