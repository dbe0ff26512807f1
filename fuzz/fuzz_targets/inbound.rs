//! Fuzz the inbound path (outer parse, SAD lookup, replay, ICV/AEAD, padding, inner
//! checks, transport header restore; ESP and AH, whose mutable-field zeroing parses IPv4
//! options and IPv6 extension headers; IPComp → ESP → AH bundles) and the outbound
//! parsers.
//!
//! Input byte 0 picks a shape: even → the rest is an outer packet as received;
//! odd → the rest is an inner payload that a matching SA seals first, after which
//! bytes chosen by the input are flipped, so mutations reach past the ICV check only
//! rarely but reach the framing code always. Nothing may panic.

#![no_main]

use std::sync::LazyLock;

use ipsec::crypto::SecretBytes;
use ipsec::spd::Prefix;
use ipsec::{
    Action, Bundle, Direction, Encryption, Engine, Integrity, IpcompConfig, Mode, PacketBuf,
    Protocol, SaConfig, Selector, SpdRule, Suite, TunnelEndpoints, HEADROOM, TAILROOM,
};
use libfuzzer_sys::fuzz_target;

/// (suite, AH?): every ESP encryption of the engine's table (with HMAC-SHA-256, or
/// alone when combined mode; `null` with HMAC-SHA1), then AH with every integrity
/// algorithm AH takes, AES-GMAC (RFC 4543 §4) included: a new row is fuzzed unasked.
static SUITES: LazyLock<Vec<(Suite, bool)>> = LazyLock::new(|| {
    let mut out = Vec::new();
    for e in ipsec::crypto::table::ENCRYPTIONS {
        let i = match (e.is_aead(), e.id) {
            (true, _) => Integrity::Null,
            (false, Encryption::Null) => Integrity::HmacSha1_96,
            (false, _) => Integrity::HmacSha256_128,
        };
        out.push((Suite::new(e.id, i).unwrap(), false));
    }
    for i in ipsec::crypto::table::INTEGRITIES.iter().filter(|i| i.ah) {
        out.push((Suite::new(Encryption::Null, i.id).unwrap(), true));
    }
    out
});

fn config(suite: (Suite, bool), mode: Mode, dir: Direction, esn: bool, v6: bool) -> SaConfig {
    let s = suite.0;
    let mut c = SaConfig::new(
        0x1000,
        s,
        // Distinct bytes: a 3DES key of equal thirds would be refused as single DES.
        SecretBytes::new(
            (0..s.encryption.key_len())
                .map(|i| i as u8 ^ 0x5a)
                .collect(),
        ),
        SecretBytes::new(vec![9; s.integrity.key_len()]),
    );
    c.legacy = s.is_legacy();
    c.protocol = if suite.1 { Protocol::Ah } else { Protocol::Esp };
    c.mode = mode;
    c.direction = dir;
    c.esn = esn;
    c.replay_window = Some(64);
    let (a, b) = if v6 {
        ("2001:db8::1", "2001:db8::2")
    } else {
        ("192.0.2.1", "192.0.2.2")
    };
    c.tunnel = Some(TunnelEndpoints {
        src: a.parse().unwrap(),
        dst: b.parse().unwrap(),
    });
    c
}

/// An engine whose one policy protects with an IPComp → ESP → AH bundle.
fn bundle_engine(dir: Direction, v6: bool) -> Engine {
    let mut e = Engine::new();
    let esp = e
        .add_sa(&config(
            (Suite::parse("aes128-sha1").unwrap(), false),
            Mode::Tunnel,
            dir,
            false,
            v6,
        ))
        .unwrap();
    let mut ah = config(
        (Suite::parse("null-sha1").unwrap(), true),
        Mode::Tunnel,
        dir,
        false,
        v6,
    );
    ah.spi = 0x2000;
    let ah = e.add_sa(&ah).unwrap();
    let ipcomp = e
        .add_ipcomp(IpcompConfig {
            min_size: 0,
            ..IpcompConfig::new(0x3000)
        })
        .unwrap();
    let b = e
        .add_bundle(Bundle {
            ipcomp: Some(ipcomp),
            esp,
            ah: Some(ah),
        })
        .unwrap();
    let any = |v6: bool| Prefix::parse(if v6 { "::/0" } else { "0.0.0.0/0" }).unwrap();
    for inner6 in [false, true] {
        let sel = Selector::between(any(inner6), any(inner6));
        e.spd_in.push(SpdRule {
            selector: sel.clone(),
            action: Action::ProtectBundle(b),
            also: Vec::new(),
        });
        e.spd_out.push(SpdRule {
            selector: sel,
            action: Action::ProtectBundle(b),
            also: Vec::new(),
        });
    }
    e
}

fn engine(c: &SaConfig) -> Engine {
    let mut e = Engine::new();
    let id = e.add_sa(c).unwrap();
    let any = |v6: bool| Prefix::parse(if v6 { "::/0" } else { "0.0.0.0/0" }).unwrap();
    for v6 in [false, true] {
        let sel = Selector::between(any(v6), any(v6));
        e.spd_in.push(SpdRule {
            selector: sel.clone(),
            action: Action::Protect(id),
            also: Vec::new(),
        });
        e.spd_out.push(SpdRule {
            selector: sel,
            action: Action::Protect(id),
            also: Vec::new(),
        });
    }
    e
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 || data.len() > 4096 {
        return;
    }
    let sel = data[0];
    let suite = SUITES[usize::from(sel >> 1) % SUITES.len()];
    let mode = if sel & 0x10 != 0 {
        Mode::Transport
    } else {
        Mode::Tunnel
    };
    let esn = sel & 0x20 != 0;
    let v6 = sel & 0x40 != 0;
    let body = &data[1..];
    // Bit 7 with an even suite index: a bundle instead of one SA.
    let bundle = sel & 0x80 != 0 && (sel >> 1) % 2 == 0;
    let mut rx = if bundle {
        bundle_engine(Direction::In, v6)
    } else {
        engine(&config(suite, mode, Direction::In, esn, v6))
    };
    let mut buf = vec![0u8; HEADROOM + body.len() + 4096 + TAILROOM];

    if sel & 1 == 0 {
        buf[HEADROOM..HEADROOM + body.len()].copy_from_slice(body);
        let mut p = PacketBuf::new(&mut buf, HEADROOM, body.len()).unwrap();
        let _ = rx.inbound(&mut p);
        return;
    }
    // Seal `body` (as an IP packet if it parses) with the matching outbound SA, then mutate.
    let mut tx = if bundle {
        bundle_engine(Direction::Out, v6)
    } else {
        engine(&config(suite, mode, Direction::Out, esn, v6))
    };
    buf[HEADROOM..HEADROOM + body.len()].copy_from_slice(body);
    let mut p = PacketBuf::new(&mut buf, HEADROOM, body.len()).unwrap();
    if tx.outbound(&mut p).is_err() {
        return;
    }
    let (head, len) = (p.head(), p.len());
    let flips = body.len().min(4);
    for k in 0..flips {
        let at = usize::from(body[body.len() - 1 - k]) % len;
        if body[k] & 1 == 1 {
            buf[head + at] ^= body[k] | 1;
        }
    }
    let cut = if body[0] & 0x80 != 0 {
        len - usize::from(body[0] & 0x0f).min(len)
    } else {
        len
    };
    let mut p = PacketBuf::new(&mut buf, head, cut).unwrap();
    let _ = rx.inbound(&mut p);
});
