//! Helpers the engine's integration tests share: keys, SA configs, packets, engine pairs.
#![allow(dead_code)] // each test file uses its own part

use core::net::IpAddr;

use ipsec::crypto::SecretBytes;
use ipsec::spd::Prefix;
use ipsec::{
    Action, Direction, Engine, Mode, Protocol, SaConfig, Selector, SpdRule, Suite, TunnelEndpoints,
    HEADROOM, TAILROOM,
};

pub fn keys(suite: &Suite) -> (SecretBytes, SecretBytes) {
    let e = (0..suite.encryption.key_len())
        .map(|i| i as u8 ^ 0x5a)
        .collect();
    let i = (0..suite.integrity.key_len())
        .map(|i| i as u8 ^ 0xa5)
        .collect();
    (SecretBytes::new(e), SecretBytes::new(i))
}

pub fn cfg(suite: &str, mode: Mode, dir: Direction, outer: (&str, &str)) -> SaConfig {
    let s = Suite::parse(suite).unwrap();
    let (e, i) = keys(&s);
    let mut c = SaConfig::new(0x1000, s, e, i);
    c.mode = mode;
    c.direction = dir;
    // The tests name their suites: a legacy one is the explicit choice an SA asks for.
    c.legacy = s.is_legacy();
    c.tunnel = Some(TunnelEndpoints {
        src: outer.0.parse().unwrap(),
        dst: outer.1.parse().unwrap(),
    });
    c
}

/// A UDP packet from `src` to `dst` with `n` payload bytes.
pub fn udp(src: &str, dst: &str, n: usize) -> Vec<u8> {
    let (s, d): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
    let mut udp = vec![0x30, 0x39, 0x00, 0x35, 0, 0, 0, 0];
    udp[4..6].copy_from_slice(&((8 + n) as u16).to_be_bytes());
    udp.extend((0..n).map(|i| i as u8));
    match (s, d) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0];
            h[2..4].copy_from_slice(&((20 + udp.len()) as u16).to_be_bytes());
            h.extend(s.octets());
            h.extend(d.octets());
            let c = ipsec::wire::checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            [h, udp].concat()
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let mut h = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
            h[4..6].copy_from_slice(&(udp.len() as u16).to_be_bytes());
            h.extend(s.octets());
            h.extend(d.octets());
            [h, udp].concat()
        }
        _ => unreachable!(),
    }
}

pub fn framed(pkt: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; HEADROOM + pkt.len() + TAILROOM];
    v[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(pkt);
    v
}

/// Two engines (gateway A seals, gateway B opens) with ESP policies for `inner` traffic.
pub fn pair(suite: &str, mode: Mode, outer: (&str, &str), inner: (&str, &str)) -> (Engine, Engine) {
    pair_of(Protocol::Esp, suite, mode, outer, inner)
}

/// As [`pair`], with AH SAs of `suite` (an integrity-only proposal).
pub fn ah_pair(
    suite: &str,
    mode: Mode,
    outer: (&str, &str),
    inner: (&str, &str),
) -> (Engine, Engine) {
    pair_of(Protocol::Ah, suite, mode, outer, inner)
}

pub fn pair_of(
    protocol: Protocol,
    suite: &str,
    mode: Mode,
    outer: (&str, &str),
    inner: (&str, &str),
) -> (Engine, Engine) {
    let mut a = Engine::new();
    let mut b = Engine::new();
    let mut c_out = cfg(suite, mode, Direction::Out, outer);
    c_out.protocol = protocol;
    let mut c_in = cfg(suite, mode, Direction::In, outer);
    c_in.protocol = protocol;
    let out = a.add_sa(&c_out).unwrap();
    let inb = b.add_sa(&c_in).unwrap();
    let sel = Selector::between(
        Prefix::parse(inner.0).unwrap(),
        Prefix::parse(inner.1).unwrap(),
    );
    a.spd_out.push(SpdRule {
        selector: sel.clone(),
        action: Action::Protect(out),
        also: Vec::new(),
    });
    b.spd_in.push(SpdRule {
        selector: sel,
        action: Action::Protect(inb),
        also: Vec::new(),
    });
    (a, b)
}
