//! `[[sa]]`: each SA checked key by key, its keys read (hex or `@FILE`), and no key
//! shared between two SAs.

use super::*;
use std::collections::HashSet;

/// `sa[i]`: one SA, checked key by key and against those before it (`seen`: their names,
/// and the SPIs each direction has used).
pub(super) fn sa<'r>(
    cx: &Ctx<'_>,
    (i, s): (usize, &'r RawSa),
    g: &RawGateway,
    (local, remote): (IpAddr, IpAddr),
    seen: &mut Seen<'r>,
    warnings: &mut Vec<String>,
) -> Result<SaSpec, ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    let direction = identity(cx, (i, s), seen)?;
    let (protocol, mode, suite) = algorithms(cx, (i, s))?;
    let (enc_key, integ_key) = keys(cx, (i, s), &suite, warnings)?;
    let lifetime = lifetime(cx, (i, s))?;
    let tunnel = match direction {
        Direction::Out => TunnelEndpoints {
            src: local,
            dst: remote,
        },
        Direction::In => TunnelEndpoints {
            src: remote,
            dst: local,
        },
    };
    if !suite.has_integrity() && s.replay_window != 0 && direction == Direction::In {
        warnings.push(format!(
            "{}: {}: {} has no integrity, so its sequence numbers are not \
             authenticated: it gets no anti-replay window (RFC 4303 §3.4.3) — one forged \
             packet would otherwise block it; use an AEAD or add integrity",
            cx.file.display(),
            k("replay_window"),
            suite.name()
        ));
    }
    let mut c = SaConfig::new(s.spi, suite, enc_key, integ_key);
    c.protocol = protocol;
    c.direction = direction;
    c.mode = mode;
    c.esn = s.esn;
    c.replay_window = (s.replay_window != 0).then_some(s.replay_window);
    // Transport mode keeps the packet's own addresses (RFC 4303 §3.1.1): host-to-host.
    c.tunnel = (mode == Mode::Tunnel).then_some(tunnel);
    c.legacy = s.legacy;
    if protocol == Protocol::Ah && g.udp_encap {
        return Err(cx.err(
            k("protocol"),
            "AH cannot cross UDP encapsulation (RFC 3948 carries ESP only)",
        ));
    }
    Ok(SaSpec {
        name: s.name.clone(),
        config: c,
        lifetime,
    })
}

/// The earlier SAs' names and (SPI, direction)s, as `sa` parses each: a lookup each, so
/// a file of thousands of SAs is checked in linear time.
#[derive(Default)]
pub(super) struct Seen<'r> {
    names: HashSet<&'r str>,
    spis: HashMap<(u32, &'r str), usize>,
}

/// `sa[i]`'s name, direction and SPI: named once, in or out, an SPI outside the reserved
/// range and unique in its direction.
fn identity<'r>(
    cx: &Ctx<'_>,
    (i, s): (usize, &'r RawSa),
    seen: &mut Seen<'r>,
) -> Result<Direction, ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    if s.name.is_empty() {
        return Err(cx.err(k("name"), "must not be empty"));
    }
    if !seen.names.insert(s.name.as_str()) {
        return Err(cx.err(k("name"), format!("a second SA named {:?}", s.name)));
    }
    let seen_spi = &mut seen.spis;
    let direction = match s.direction.as_str() {
        "out" => Direction::Out,
        "in" => Direction::In,
        d => return Err(cx.err(k("direction"), format!("{d:?}: must be in or out"))),
    };
    if s.spi < 256 {
        return Err(cx.err(
            k("spi"),
            format!("{} is reserved (SPIs 0-255, RFC 4303 §2.1)", s.spi),
        ));
    }
    if let Some(j) = seen_spi.insert((s.spi, s.direction.as_str()), i) {
        return Err(cx.err(
            k("spi"),
            format!(
                "0x{:x} is already the SPI of sa[{j}] in the same direction",
                s.spi
            ),
        ));
    }
    Ok(direction)
}

/// `sa[i]`'s protocol, mode and suite, and the pairs that may not go together.
fn algorithms(
    cx: &Ctx<'_>,
    (i, s): (usize, &RawSa),
) -> Result<(Protocol, Mode, Suite), ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    let protocol = Protocol::from_name(&s.protocol).ok_or_else(|| {
        cx.err(
            k("protocol"),
            format!("{:?}: must be esp or ah", s.protocol),
        )
    })?;
    let mode = Mode::from_name(&s.mode).ok_or_else(|| {
        cx.err(
            k("mode"),
            format!("{:?}: must be tunnel or transport", s.mode),
        )
    })?;
    let suite = Suite::from_names(&s.encryption, &s.integrity).map_err(|e| {
        let key = if matches!(e, ipsec::crypto::SuiteError::UnknownIntegrity(_)) {
            k("integrity")
        } else {
            k("encryption")
        };
        cx.err(key, e.to_string())
    })?;
    if protocol == Protocol::Ah && s.encryption != "null" {
        return Err(cx.err(k("encryption"), "AH does no encryption: set it to null"));
    }
    if protocol == Protocol::Esp && suite.integrity.is_gmac() {
        return Err(cx.err(
            k("integrity"),
            format!(
                "{}: AES-GMAC as integrity is AH's (RFC 4543 §5.3); for ESP set \
                 encryption = \"{}\" and integrity = \"null\"",
                s.integrity, s.integrity
            ),
        ));
    }
    suite
        .check_legacy(s.legacy)
        .map_err(|e| cx.err(k("legacy"), format!("{e}; set legacy = true to allow it")))?;
    Ok((protocol, mode, suite))
}

/// `sa[i]`'s keys (`enc_key`, `integ_key`), read and of the lengths its suite needs.
fn keys(
    cx: &Ctx<'_>,
    (i, s): (usize, &RawSa),
    suite: &Suite,
    warnings: &mut Vec<String>,
) -> Result<(SecretBytes, SecretBytes), ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    let enc_key = key(cx, cx.file, &k("enc_key"), &s.enc_key, warnings)?;
    let integ_key = key(cx, cx.file, &k("integ_key"), &s.integ_key, warnings)?;
    let want = suite.encryption.key_len();
    if enc_key.expose().len() != want {
        return Err(cx.err(
            k("enc_key"),
            format!(
                "{} needs {want} key bytes{} ({} hex digits), got {}",
                s.encryption,
                if suite.encryption.is_aead() {
                    ", the 4-byte salt included"
                } else {
                    ""
                },
                want * 2,
                enc_key.expose().len()
            ),
        ));
    }
    let want = suite.integrity.key_len();
    if integ_key.expose().len() != want {
        return Err(cx.err(
            k("integ_key"),
            format!(
                "{} needs {want} key bytes ({} hex digits), got {}",
                s.integrity,
                want * 2,
                integ_key.expose().len()
            ),
        ));
    }
    Ok((enc_key, integ_key))
}

/// `sa[i]`'s replay window (RFC 4303 §3.4.3) and lifetimes (RFC 4301 §4.4.2.1: soft
/// below hard).
fn lifetime(cx: &Ctx<'_>, (i, s): (usize, &RawSa)) -> Result<Lifetime, ConfigError> {
    let k = |f: &str| format!("sa[{i}].{f}");
    if s.replay_window != 0
        && (!(32..=65536).contains(&s.replay_window) || s.replay_window % 32 != 0)
    {
        return Err(cx.err(
            k("replay_window"),
            "must be 0 (no anti-replay) or a multiple of 32 from 32 to 65536",
        ));
    }
    let lifetime = Lifetime {
        soft_bytes: s.soft_bytes,
        hard_bytes: s.hard_bytes,
        soft_packets: s.soft_packets,
        hard_packets: s.hard_packets,
    };
    for (soft, hard, what) in [
        (lifetime.soft_bytes, lifetime.hard_bytes, "bytes"),
        (lifetime.soft_packets, lifetime.hard_packets, "packets"),
    ] {
        if let (Some(sv), Some(hv)) = (soft, hard) {
            if sv >= hv {
                return Err(cx.err(
                    k(&format!("soft_{what}")),
                    format!("must be below hard_{what} ({hv})"),
                ));
            }
        }
    }
    Ok(lifetime)
}

/// A key given as hex, or `@FILE` holding hex (relative to the config's directory). A
/// key file others may read is a warning.
fn key(
    cx: &Ctx<'_>,
    cfg: &Path,
    name: &str,
    v: &str,
    warnings: &mut Vec<String>,
) -> Result<SecretBytes, ConfigError> {
    if let Some(f) = v.strip_prefix('@') {
        let p = cfg.parent().unwrap_or(Path::new(".")).join(f);
        if let Ok(m) = std::fs::metadata(&p) {
            use std::os::unix::fs::PermissionsExt;
            if m.permissions().mode() & 0o077 != 0 {
                warnings.push(format!(
                    "{}: {name}: the key file {} may be read by others (mode {:o}): chmod 600 it",
                    cfg.display(),
                    p.display(),
                    m.permissions().mode() & 0o777
                ));
            }
        }
        let text = Zeroizing::new(
            std::fs::read_to_string(&p)
                .map_err(|e| cx.err(name, format!("cannot read {}: {e}", p.display())))?,
        );
        return SecretBytes::from_hex(&text)
            .map_err(|e| cx.err(name, format!("in {}: {e}", p.display())));
    }
    SecretBytes::from_hex(v).map_err(|e| cx.err(name, e))
}

/// No key serves two SAs, whatever field, protocol, suite or direction holds it: with
/// AES-GCM, ChaCha20-Poly1305 and GMAC (in ESP's `enc_key` or AH's `integ_key`) the nonce
/// is salt ‖ sequence number (RFC 4106 §3.1, RFC 7634 §2, RFC 4543 §3), with no SPI,
/// protocol or direction in it, so two SAs under one key number the same nonces — and an
/// ESP-GCM SA and an AH-GMAC SA under one AES key give away its GHASH key; an integrity
/// key shared lets one SA's packets be replayed into the other (RFC 4301 §4.4.2: each SA
/// its own keys). Keys are compared without their salts, and a key that begins with
/// another (the same bytes cut to AES-128's length) counts as the same. One SA's
/// encryption and integrity keys are told apart too. The sequence state follows each
/// key (`seqstate::keys_of`), which is what makes a key one SA's across restarts and
/// reloads.
pub(super) fn shared_keys(cx: &Ctx<'_>, sas: &[SaSpec]) -> Result<(), ConfigError> {
    let all: Vec<(usize, ipsec::sa::Secret<'_>)> = sas
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.config.secrets().map(move |k| (i, k)))
        .collect();
    // Sorted, a key and every key it begins are neighbours (each key between them begins
    // with it too): no neighbours alike, no two keys alike — found in n log n. Only
    // where some are, the pairs in order below name the first of them, as always.
    if !any_same(all.iter().map(|(_, k)| k.key).collect()) {
        return Ok(());
    }
    for (n, (j, b)) in all.iter().enumerate() {
        for (i, a) in &all[..n] {
            if !same_key(a.key, b.key) {
                continue;
            }
            let whose = if i == j {
                format!("its own {}", a.field)
            } else {
                format!("sa[{i}].{} ({:?})", a.field, sas[*i].name)
            };
            return Err(cx.err(
                format!("sa[{j}].{}", b.field),
                format!(
                    "the same key as {whose}: a key serves one SA and one purpose, whatever \
                     the protocols, suites and directions (AES-GCM and GMAC under one key \
                     number the same nonces, RFC 4106 §3.1, RFC 4543 §3); give each its own"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether any two of `keys` are one (`same_key`), in n log n: sorted, a key and every key
/// that begins with it are neighbours (each key between them begins with it too).
pub fn any_same(mut keys: Vec<&[u8]>) -> bool {
    keys.sort_unstable();
    keys.windows(2).any(|w| same_key(w[0], w[1]))
}

/// Every pair of `keys` that are one (`same_key`), each once, the one that begins the
/// other first: sorted, the keys that begin with a key follow it at once, so each key
/// is compared only with those — n log n and the pairs found, not every pair.
pub fn key_pairs<T: Copy>(mut keys: Vec<(&[u8], T)>) -> Vec<(T, T)> {
    keys.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    for (p, (a, ta)) in keys.iter().enumerate() {
        if a.is_empty() {
            continue;
        }
        for (b, tb) in keys[p + 1..].iter().take_while(|(b, _)| b.starts_with(a)) {
            debug_assert!(same_key(a, b));
            out.push((*ta, *tb));
        }
    }
    out
}

/// Two keys that are one: equal, or one the start of the other (salts already removed).
pub fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().min(b.len());
    n > 0 && a[..n] == b[..n]
}

#[cfg(test)]
mod any_same_tests {
    use super::{any_same, key_pairs, same_key};

    /// `any_same` answers what comparing every pair answers, and `key_pairs` finds the
    /// pairs it finds, over random key sets whose
    /// keys often begin one another (AES-128's 16 bytes of a 32-byte key, 20 of 36 with a
    /// salt), equal ones, and none alike.
    #[test]
    fn sorting_finds_what_every_pair_finds() {
        let mut x: u64 = 0x853c_49e6_748f_ea9b;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut alike, mut apart) = (0, 0);
        for case in 0..3000 {
            let n = 2 + (next() % 40) as usize;
            let mut keys: Vec<Vec<u8>> = Vec::new();
            for _ in 0..n {
                let len = [16, 20, 32, 36][(next() % 4) as usize];
                let mut k: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                // in half the sets, now and then an earlier key cut short, made longer
                // or repeated
                if case % 2 == 0 && !keys.is_empty() && next() % 8 == 0 {
                    let from = &keys[(next() as usize) % keys.len()];
                    k = from[..from.len().min(len)].to_vec();
                    k.extend((k.len()..len).map(|_| next() as u8));
                }
                keys.push(k);
            }
            let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let pairwise = (0..refs.len()).any(|j| (0..j).any(|i| same_key(refs[i], refs[j])));
            assert_eq!(any_same(refs.clone()), pairwise, "case {case}: {keys:?}");
            // and every pair, as comparing each with each finds them
            let mut every: Vec<(usize, usize)> = (0..refs.len())
                .flat_map(|j| (0..j).map(move |i| (i, j)))
                .filter(|&(i, j)| same_key(refs[i], refs[j]))
                .collect();
            let mut found: Vec<(usize, usize)> = key_pairs(refs.iter().copied().zip(0..).collect())
                .into_iter()
                .map(|(a, b)| (a.min(b), a.max(b)))
                .collect();
            every.sort_unstable();
            found.sort_unstable();
            assert_eq!(found, every, "case {case}: {keys:?}");
            if pairwise {
                alike += 1
            } else {
                apart += 1
            }
        }
        assert!(alike > 300 && apart > 300, "{alike} {apart}");
    }
}
