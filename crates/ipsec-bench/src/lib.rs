//! The engine benchmark behind `ipsec-lab bench`: for each suite, mode and IP packet
//! size, the time to seal and to open one packet through an [`ipsec::Sa`], and — in the
//! same run, on the same number of bytes — the raw aws-lc-rs cipher/AEAD + MAC cost
//! alone. The ratio raw / ours is what the ESP framing (headers, padding, sequence
//! numbers, replay window, copies) costs on top of the cryptography.
//!
//! Timing: each measurement runs `trials` trials of about `budget / trials` and keeps the
//! median ns per packet, so one noisy slice of a shared machine does not set the figure.
//! Single thread; this crate holds the clock so the core stays I/O-free.
#![forbid(unsafe_code)]

pub mod configs;

use std::hint::black_box;
use std::time::{Duration, Instant};

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, EncryptionContext, UnboundCipherKey,
};
use aws_lc_rs::hmac;
use aws_lc_rs::iv::FixedLength;
use ipsec::crypto::{MacPrimitive, Primitive, SecretBytes};
use ipsec::{Mode, PacketBuf, Sa, SaConfig, Suite, TunnelEndpoints, HEADROOM, TAILROOM};

/// The IP packet sizes of the seed studies (RFC 2544's plus 1420 and 1500).
pub const DEFAULT_SIZES: &[usize] = &[64, 128, 256, 512, 1024, 1280, 1420, 1500];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Seal,
    Open,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Seal => "seal",
            Op::Open => "open",
        }
    }

    pub fn from_name(name: &str) -> Result<Self, String> {
        match name {
            "seal" => Ok(Op::Seal),
            "open" => Ok(Op::Open),
            _ => Err(format!("op {name:?}: use seal or open")),
        }
    }
}

/// Refuse an IP packet size the benchmark cannot build or the studies never use.
pub fn check_size(size: usize) -> Result<(), String> {
    if (MIN_SIZE..=9000).contains(&size) {
        Ok(())
    } else {
        Err(format!(
            "size {size}: IP packet sizes must be {MIN_SIZE} to 9000 bytes"
        ))
    }
}

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub suites: Vec<Suite>,
    pub sizes: Vec<usize>,
    pub modes: Vec<Mode>,
    pub ops: Vec<Op>,
    /// Wall time for one measurement (ours or raw) of one case.
    pub budget: Duration,
    pub trials: usize,
    /// Lend the SA a clock for per-stage timing (and report the split).
    pub stage_timing: bool,
}

/// What per-stage timing costs when it is off: ns per timing point (a `start` and a
/// `stop` on a [`ipsec::StageTimes`] with no clock), against an empty loop measured in
/// the same run; the median of `trials`.
pub fn stage_off_cost_ns(trials: usize) -> f64 {
    const N: u64 = 2_000_000;
    let mut per: Vec<f64> = (0..trials.max(1))
        .map(|_| {
            let mut st = ipsec::StageTimes::off();
            let t = Instant::now();
            for _ in 0..N {
                let t0 = black_box(&st).start();
                black_box(&mut st).stop(ipsec::Stage::Header, black_box(t0));
            }
            let timed = t.elapsed();
            let t = Instant::now();
            for i in 0..N {
                black_box(i);
                black_box(&mut st);
            }
            let empty = t.elapsed();
            (timed.as_nanos() as f64 - empty.as_nanos() as f64).max(0.0) / N as f64
        })
        .collect();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    per[per.len() / 2]
}

/// Monotonic nanoseconds since the first call: the clock lent for per-stage timing.
pub fn mono_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            suites: Suite::bench_defaults(),
            sizes: DEFAULT_SIZES.to_vec(),
            modes: vec![Mode::Tunnel],
            ops: vec![Op::Seal, Op::Open],
            budget: Duration::from_millis(100),
            trials: 5,
            stage_timing: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct BenchResult {
    pub suite: String,
    pub mode: Mode,
    pub op: Op,
    /// Inner IP packet size, bytes.
    pub size: usize,
    pub ns_per_packet: f64,
    pub raw_ns_per_packet: f64,
    /// Bytes the raw measurement encrypted (the model's L_alg).
    pub l_alg: usize,
    /// With stage timing: ns per packet in each stage that ran (label, ns).
    pub stages: Vec<(&'static str, f64)>,
    /// With stage timing: timing points per packet (clock readings avoided when off).
    pub stage_points: f64,
}

/// Smallest packet the benchmark builds (IPv4 + UDP headers).
pub const MIN_SIZE: usize = 28;

/// Run every case of `cfg`, calling `progress(done, total)` after each.
pub fn run(cfg: &BenchConfig, mut progress: impl FnMut(usize, usize)) -> Vec<BenchResult> {
    let total = cfg.suites.len() * cfg.modes.len() * cfg.sizes.len() * cfg.ops.len();
    let mut out = Vec::with_capacity(total);
    for suite in &cfg.suites {
        for &mode in &cfg.modes {
            for &size in &cfg.sizes {
                for &op in &cfg.ops {
                    out.push(measure(
                        cfg.stage_timing,
                        *suite,
                        mode,
                        size,
                        op,
                        cfg.budget,
                        cfg.trials.max(1),
                    ));
                    progress(out.len(), total);
                }
            }
        }
    }
    out
}

fn key_bytes(n: usize, salt: u8) -> SecretBytes {
    SecretBytes::new((0..n).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect())
}

pub(crate) fn sa_config(suite: Suite, mode: Mode) -> SaConfig {
    let mut c = SaConfig::new(
        0x1000,
        suite,
        key_bytes(suite.encryption.key_len(), 0x11),
        key_bytes(suite.integrity.key_len(), 0x22),
    );
    c.mode = mode;
    // Naming a legacy suite for the benchmark is the explicit choice the SA asks for.
    c.legacy = suite.is_legacy();
    c.tunnel = Some(TunnelEndpoints {
        src: "192.0.2.1".parse().unwrap(),
        dst: "192.0.2.2".parse().unwrap(),
    });
    c
}

/// An IPv4/UDP packet of exactly `size` bytes.
pub fn ipv4_udp(size: usize) -> Vec<u8> {
    let size = size.max(MIN_SIZE);
    let mut p = vec![0u8; size];
    p[..20].copy_from_slice(&[
        0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 1, 0, 1, 10, 2, 0, 1,
    ]);
    p[2..4].copy_from_slice(&(size as u16).to_be_bytes());
    let c = ipsec::wire::checksum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p[20..22].copy_from_slice(&5001u16.to_be_bytes());
    p[22..24].copy_from_slice(&5001u16.to_be_bytes());
    p[24..26].copy_from_slice(&((size - 20) as u16).to_be_bytes());
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = i as u8;
    }
    p
}

/// Median of `trials` runs of `f`, each repeated until `slice` has passed; `f` returns
/// (packets done, time spent on them) so untimed set-up can be excluded.
fn median_ns(trials: usize, slice: Duration, mut f: impl FnMut() -> (u64, Duration)) -> f64 {
    let mut per: Vec<f64> = (0..trials)
        .map(|_| {
            let (mut n, mut t) = (0u64, Duration::ZERO);
            let start = Instant::now();
            while start.elapsed() < slice || n == 0 {
                let (dn, dt) = f();
                n += dn;
                t += dt;
            }
            t.as_nanos() as f64 / n as f64
        })
        .collect();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    per[per.len() / 2]
}

pub(crate) const BATCH: usize = 64;

fn measure(
    stage_timing: bool,
    suite: Suite,
    mode: Mode,
    size: usize,
    op: Op,
    budget: Duration,
    trials: usize,
) -> BenchResult {
    let pkt = ipv4_udp(size);
    let slice = budget / trials as u32;
    let cfg = sa_config(suite, mode);
    let mut tx = Sa::new(&cfg).expect("bench SA");
    let clock = stage_timing.then_some(mono_ns as ipsec::Clock);
    let stages: (Vec<(&'static str, f64)>, f64);
    let cap = HEADROOM + pkt.len() + TAILROOM;
    let payload_len = match mode {
        Mode::Tunnel => pkt.len(),
        Mode::Transport => pkt.len() - 20,
    };
    let l_alg = payload_len + suite.pad_len(payload_len) + 2;
    let raw = RawCrypto::new(suite);

    let ours = match op {
        Op::Seal => {
            let mut buf = vec![0u8; cap];
            buf[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(&pkt);
            // Warm up untimed: the first calls pay one-time costs (the random generator's
            // seeding, page faults) that would swamp a per-stage mean.
            for _ in 0..BATCH {
                buf[HEADROOM..HEADROOM + 20].copy_from_slice(&pkt[..20]);
                let mut p = PacketBuf::new(&mut buf, HEADROOM, pkt.len()).unwrap();
                tx.seal(&mut p).expect("bench seal");
            }
            let warm = tx.counters.packets;
            tx.stages.set_clock(clock);
            let ns = median_ns(trials, slice, || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    // Seal encrypts in place: restore only the header it reads, as a
                    // gateway's fresh packet would have it.
                    buf[HEADROOM..HEADROOM + 20].copy_from_slice(&pkt[..20]);
                    let mut p = PacketBuf::new(&mut buf, HEADROOM, pkt.len()).unwrap();
                    black_box(tx.seal(&mut p)).expect("bench seal");
                }
                (BATCH as u64, t.elapsed())
            });
            stages = per_packet(&tx, warm);
            ns
        }
        Op::Open => {
            let mut rx = Sa::new(&cfg).expect("bench SA");
            let mut bufs: Vec<(Vec<u8>, usize, usize)> =
                (0..BATCH).map(|_| (vec![0u8; cap], 0, 0)).collect();
            let mut clock_lent = false;
            let mut warm = 0;
            let ns = median_ns(trials, slice, || {
                for (b, h, l) in bufs.iter_mut() {
                    b[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(&pkt);
                    let mut p = PacketBuf::new(b, HEADROOM, pkt.len()).unwrap();
                    tx.seal(&mut p).expect("bench seal");
                    (*h, *l) = (p.head(), p.len());
                }
                if !clock_lent {
                    // The first batch opens untimed (warm-up; see the seal case).
                    clock_lent = true;
                    warm = rx.counters.packets + BATCH as u64;
                } else {
                    rx.stages.set_clock(clock);
                }
                let t = Instant::now();
                for (b, h, l) in bufs.iter_mut() {
                    let mut p = PacketBuf::new(b, *h, *l).unwrap();
                    black_box(rx.open(&mut p)).expect("bench open");
                }
                (BATCH as u64, t.elapsed())
            });
            stages = per_packet(&rx, warm);
            ns
        }
    };

    let iv_len = suite.iv_len();
    let covered = 8 + iv_len + l_alg;
    let raw_ns = match op {
        Op::Seal => {
            let mut buf = vec![0x5au8; covered + 32];
            let mut ctr = 0u64;
            median_ns(trials, slice, || {
                let t = Instant::now();
                for _ in 0..BATCH {
                    ctr += 1;
                    raw.seal(&mut buf, iv_len, covered, ctr);
                    black_box(&buf);
                }
                (BATCH as u64, t.elapsed())
            })
        }
        Op::Open => {
            let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0x5au8; covered + 32]).collect();
            let mut ctr = 0u64;
            median_ns(trials, slice, || {
                let first = ctr;
                for b in bufs.iter_mut() {
                    ctr += 1;
                    b.fill(0x5a);
                    raw.seal(b, iv_len, covered, ctr);
                }
                let t = Instant::now();
                for (i, b) in bufs.iter_mut().enumerate() {
                    assert!(
                        raw.open(b, iv_len, covered, first + 1 + i as u64),
                        "raw open"
                    );
                }
                (BATCH as u64, t.elapsed())
            })
        }
    };

    BenchResult {
        suite: suite.name(),
        mode,
        op,
        size: pkt.len(),
        ns_per_packet: ours,
        raw_ns_per_packet: raw_ns,
        l_alg,
        stage_points: stages.1,
        stages: stages.0,
    }
}

/// Each timed stage's ns per packet the SA processed after the first `warm` (untimed),
/// and the timing points per packet.
fn per_packet(sa: &Sa, warm: u64) -> (Vec<(&'static str, f64)>, f64) {
    let n = sa.counters.packets.saturating_sub(warm).max(1) as f64;
    let split = sa
        .stages
        .nonzero()
        .map(|(label, ns, _)| (label, ns as f64 / n))
        .collect();
    let points = sa.stages.nonzero().map(|(_, _, calls)| calls).sum::<u64>() as f64 / n;
    (split, points)
}

/// aws-lc-rs used directly, with none of our code: the cost floor of each suite
/// (RustCrypto for the legacy algorithms aws-lc-rs lacks).
#[allow(clippy::large_enum_variant)] // one per benchmark case
enum RawCipher {
    None,
    Cbc(EncryptingKey, DecryptingKey),
    Aead(LessSafeKey),
    Gmac(LessSafeKey),
    Des(des::Des),
    Tdes(des::TdesEde3),
}

#[allow(clippy::large_enum_variant)] // one per benchmark case
enum RawMac {
    AwsLc(hmac::Key),
    Md5(::hmac::Hmac<md5::Md5>),
}

impl RawMac {
    fn sign(&self, data: &[u8], out: &mut [u8]) {
        match self {
            RawMac::AwsLc(k) => {
                let tag = hmac::sign(k, data);
                out.copy_from_slice(&tag.as_ref()[..out.len()]);
            }
            RawMac::Md5(k) => {
                let mut m = k.clone();
                ::hmac::Mac::update(&mut m, data);
                let tag = ::hmac::Mac::finalize(m).into_bytes();
                out.copy_from_slice(&tag[..out.len()]);
            }
        }
    }
}

fn legacy_cbc<C>(key: &C, iv: &[u8], data: &mut [u8], encrypt: bool) -> bool
where
    C: Clone
        + cbc::cipher::BlockCipher
        + cbc::cipher::BlockEncryptMut
        + cbc::cipher::BlockDecryptMut,
{
    use cbc::cipher::block_padding::NoPadding;
    use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit};
    let n = data.len();
    if encrypt {
        cbc::Encryptor::<C>::inner_iv_slice_init(key.clone(), iv)
            .map(|e| e.encrypt_padded_mut::<NoPadding>(data, n).is_ok())
            .unwrap_or(false)
    } else {
        cbc::Decryptor::<C>::inner_iv_slice_init(key.clone(), iv)
            .map(|d| d.decrypt_padded_mut::<NoPadding>(data).is_ok())
            .unwrap_or(false)
    }
}

struct RawCrypto {
    cipher: RawCipher,
    mac: Option<(RawMac, usize)>,
    icv: usize,
}

impl RawCrypto {
    fn new(suite: Suite) -> Self {
        let ek = key_bytes(suite.encryption.key_len(), 0x33);
        let k = ek.expose();
        let cipher = match suite.encryption.spec().primitive {
            Primitive::Null => RawCipher::None,
            Primitive::DesCbc => {
                RawCipher::Des(cbc::cipher::KeyInit::new_from_slice(k).expect("DES key"))
            }
            Primitive::TripleDesCbc => {
                RawCipher::Tdes(cbc::cipher::KeyInit::new_from_slice(k).expect("3DES key"))
            }
            Primitive::AesCbc(alg) => RawCipher::Cbc(
                EncryptingKey::cbc(UnboundCipherKey::new(alg, k).unwrap()).unwrap(),
                DecryptingKey::cbc(UnboundCipherKey::new(alg, k).unwrap()).unwrap(),
            ),
            Primitive::Aead(alg) => RawCipher::Aead(LessSafeKey::new(
                UnboundKey::new(alg, &k[..k.len() - 4]).unwrap(),
            )),
            Primitive::Gmac(alg) => RawCipher::Gmac(LessSafeKey::new(
                UnboundKey::new(alg, &k[..k.len() - 4]).unwrap(),
            )),
        };
        let ik = key_bytes(suite.integrity.key_len(), 0x44);
        let mac = match suite.integrity.spec().primitive {
            MacPrimitive::Null => None,
            MacPrimitive::HmacMd5 => Some(RawMac::Md5(
                ::hmac::Mac::new_from_slice(ik.expose()).expect("HMAC takes any key"),
            )),
            MacPrimitive::Hmac(alg) => Some(RawMac::AwsLc(hmac::Key::new(*alg, ik.expose()))),
            // AH's GMAC is no ESP suite (`Sa::new` refuses it), so it has no raw baseline.
            MacPrimitive::Gmac(_) => None,
        }
        .map(|m| (m, suite.integrity.icv_len()));
        RawCrypto {
            cipher,
            mac,
            icv: suite.icv_len(),
        }
    }

    fn nonce(ctr: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&ctr.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// `buf[0..8]` header, `[8..8+iv]` IV, `[8+iv..covered]` plaintext; ICV after.
    fn seal(&self, buf: &mut [u8], iv: usize, covered: usize, ctr: u64) {
        let ct = 8 + iv;
        match &self.cipher {
            RawCipher::None => {}
            RawCipher::Cbc(enc, _) => {
                let ctx = EncryptionContext::Iv128(FixedLength::from([ctr as u8; 16]));
                enc.less_safe_encrypt(&mut buf[ct..covered], ctx).unwrap();
            }
            RawCipher::Aead(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                let tag = k
                    .seal_in_place_separate_tag(
                        Self::nonce(ctr),
                        Aad::from(&head[..8]),
                        &mut rest[..covered - ct],
                    )
                    .unwrap();
                buf[covered..covered + 16].copy_from_slice(tag.as_ref());
            }
            RawCipher::Gmac(k) => {
                let tag = k
                    .seal_in_place_separate_tag(
                        Self::nonce(ctr),
                        Aad::from(&buf[..covered]),
                        &mut [],
                    )
                    .unwrap();
                buf[covered..covered + 16].copy_from_slice(tag.as_ref());
            }
            RawCipher::Des(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                legacy_cbc(k, &head[8..], &mut rest[..covered - ct], true);
            }
            RawCipher::Tdes(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                legacy_cbc(k, &head[8..], &mut rest[..covered - ct], true);
            }
        }
        if let Some((k, n)) = &self.mac {
            let (data, tag) = buf.split_at_mut(covered);
            k.sign(data, &mut tag[..*n]);
        }
    }

    fn open(&self, buf: &mut [u8], iv: usize, covered: usize, ctr: u64) -> bool {
        let ct = 8 + iv;
        if let Some((k, n)) = &self.mac {
            let mut tag = [0u8; 64];
            k.sign(&buf[..covered], &mut tag[..*n]);
            if aws_lc_rs::constant_time::verify_slices_are_equal(
                &tag[..*n],
                &buf[covered..covered + n],
            )
            .is_err()
            {
                return false;
            }
        }
        match &self.cipher {
            RawCipher::None => true,
            RawCipher::Cbc(_, dec) => {
                let ctx = DecryptionContext::Iv128(FixedLength::from([ctr as u8; 16]));
                dec.decrypt(&mut buf[ct..covered], ctx).is_ok()
            }
            RawCipher::Aead(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                k.open_in_place(
                    Self::nonce(ctr),
                    Aad::from(&head[..8]),
                    &mut rest[..covered - ct + self.icv],
                )
                .is_ok()
            }
            RawCipher::Gmac(k) => {
                let mut tag: [u8; 16] = buf[covered..covered + 16].try_into().unwrap();
                k.open_in_place(Self::nonce(ctr), Aad::from(&buf[..covered]), &mut tag)
                    .is_ok()
            }
            RawCipher::Des(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                legacy_cbc(k, &head[8..], &mut rest[..covered - ct], false)
            }
            RawCipher::Tdes(k) => {
                let (head, rest) = buf.split_at_mut(ct);
                legacy_cbc(k, &head[8..], &mut rest[..covered - ct], false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_measures_every_case() {
        let cfg = BenchConfig {
            stage_timing: false,
            suites: vec![
                Suite::parse("aes128gcm16").unwrap(),
                Suite::parse("aes128-sha1").unwrap(),
                Suite::parse("3des-md5").unwrap(),
            ],
            sizes: vec![64, 1500],
            modes: vec![Mode::Tunnel, Mode::Transport],
            ops: vec![Op::Seal, Op::Open],
            budget: Duration::from_millis(2),
            trials: 1,
        };
        let mut calls = 0;
        let r = run(&cfg, |_, _| calls += 1);
        assert_eq!(r.len(), 24);
        assert_eq!(calls, 24);
        for x in &r {
            assert!(x.ns_per_packet > 0.0 && x.raw_ns_per_packet > 0.0, "{x:?}");
            assert!(x.l_alg >= x.size - 20);
        }
    }
}

#[cfg(test)]
mod stage_tests {
    use super::*;

    #[test]
    fn stage_timing_reports_a_split_per_packet() {
        let cfg = BenchConfig {
            suites: vec![Suite::parse("aes128-sha1").unwrap()],
            sizes: vec![1400],
            modes: vec![Mode::Tunnel],
            ops: vec![Op::Seal, Op::Open],
            budget: Duration::from_millis(20),
            trials: 3,
            stage_timing: true,
        };
        for r in run(&cfg, |_, _| {}) {
            let labels: Vec<_> = r.stages.iter().map(|(l, _)| *l).collect();
            // No timing comparisons (the machine is shared): which stages ran, per op.
            let want: &[&str] = match r.op {
                Op::Seal => &["header", "padding", "iv", "cipher", "mac"],
                Op::Open => &["replay_check", "mac", "cipher", "replay_update", "padding"],
            };
            assert_eq!(labels.len(), want.len(), "{labels:?}");
            assert!(want.iter().all(|w| labels.contains(w)), "{labels:?}");
            assert!(r.stages.iter().all(|(_, ns)| *ns >= 0.0));
        }
        let off = BenchConfig {
            stage_timing: false,
            ..cfg
        };
        assert!(run(&off, |_, _| {}).iter().all(|r| r.stages.is_empty()));
    }
}
