//! Differential: the inbound path the gateway's crew runs (`inbound_start` on the worker,
//! the ICV check and decryption on other threads, `inbound_finish` back on the worker in
//! arrival order — `crates/ipsec-gw/src/dataplane/inbound.rs`) against the single-thread
//! path (`inbound`), on the same packets: every packet accepted by one is accepted by the
//! other with the same opened bytes, the SAs' packet and byte counts and their replay
//! windows are identical, and so is every drop reason — except which of `replay`,
//! `replay_too_old`, `icv_failure` and `zero_sequence` names a packet both drop: the
//! crew's first window check runs before the earlier packets of its batch are committed
//! (so an old twin may still be `replay` there where one thread says `replay_too_old`,
//! and with ESN the high half is inferred from that earlier window: a number one thread
//! places in the next 2^32 block, failing its ICV there, the crew may place in this one,
//! as a replay or as number 0). The total of drops must still agree.
//!
//! The input drives a sender: byte 0 picks the suite, ESN and the replay window; then
//! each 3-byte op seals a new packet (of a length the op gives), repeats an earlier one
//! (a replay, or a twin in the same batch), flips a byte of one (a forgery or a damaged
//! header), cuts one short, or ends the current batch (the crew's batches are cut where
//! the input says, at most 64 packets). The jobs of a batch run on up to 4 threads, in an
//! order the input shuffles. Nothing may panic; any difference aborts.

#![no_main]

use ipsec::crypto::SecretBytes;
use ipsec::engine::{Inbound, InboundStart};
use ipsec::spd::Prefix;
use ipsec::{
    Action, Direction, DropReason, Engine, Mode, PacketBuf, SaConfig, Selector, SpdRule, Suite,
    TunnelEndpoints, HEADROOM, TAILROOM,
};
use libfuzzer_sys::fuzz_target;

const SUITES: &[&str] = &[
    "aes128gcm16",
    "aes256gcm16",
    "chacha20poly1305",
    "aes128gmac",
    "aes128-sha1",
    "aes256-sha256",
    "null-sha256",
];
const WINDOWS: &[u32] = &[32, 64, 128, 1024];
const SLOT: usize = HEADROOM + 1600 + TAILROOM;

fn config(suite: &str, dir: Direction, esn: bool, window: u32) -> SaConfig {
    let s = Suite::parse(suite).unwrap();
    let mut c = SaConfig::new(
        0x1000,
        s,
        SecretBytes::new(
            (0..s.encryption.key_len())
                .map(|i| i as u8 ^ 0x5a)
                .collect(),
        ),
        SecretBytes::new(vec![9; s.integrity.key_len()]),
    );
    c.direction = dir;
    c.esn = esn;
    c.replay_window = Some(window);
    c.mode = Mode::Tunnel;
    c.tunnel = Some(TunnelEndpoints {
        src: "192.0.2.1".parse().unwrap(),
        dst: "192.0.2.2".parse().unwrap(),
    });
    c
}

fn engine(c: &SaConfig) -> Engine {
    let mut e = Engine::new();
    let id = e.add_sa(c).unwrap();
    let sel = Selector::between(
        Prefix::parse("10.1.0.0/16").unwrap(),
        Prefix::parse("10.2.0.0/16").unwrap(),
    );
    let rule = SpdRule {
        selector: sel,
        action: Action::Protect(id),
        also: Vec::new(),
    };
    e.spd_in.push(rule.clone());
    e.spd_out.push(rule);
    e
}

/// An inner UDP packet 10.1.0.5 -> 10.2.0.9 of `n` payload bytes, numbered `k`.
fn inner(n: usize, k: u32) -> Vec<u8> {
    let len = 28 + n;
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[10, 1, 0, 5]);
    p[16..20].copy_from_slice(&[10, 2, 0, 9]);
    let mut sum = 0u32;
    for i in (0..20).step_by(2) {
        sum += u32::from(u16::from_be_bytes([p[i], p[i + 1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p[20..22].copy_from_slice(&4444u16.to_be_bytes());
    p[22..24].copy_from_slice(&9u16.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + n) as u16).to_be_bytes());
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = (i as u32 ^ k) as u8;
    }
    p
}

type Outcome = Result<Vec<u8>, DropReason>;

fn single(rx: &mut Engine, wire: &[u8]) -> Outcome {
    let mut buf = vec![0u8; SLOT.max(HEADROOM + wire.len() + TAILROOM)];
    buf[HEADROOM..HEADROOM + wire.len()].copy_from_slice(wire);
    let mut p = PacketBuf::new(&mut buf, HEADROOM, wire.len()).unwrap();
    match rx.inbound(&mut p)? {
        Inbound::Opened { .. } => Ok(p.data().to_vec()),
        Inbound::Bypass => Ok(b"bypass".to_vec()),
    }
}

/// One batch as the crew runs it: start each in order, the jobs on threads in `order`,
/// finish each in order.
fn crew(rx: &mut Engine, batch: &[Vec<u8>], order: &[u8], threads: usize) -> Vec<Outcome> {
    let mut bufs: Vec<Vec<u8>> = batch
        .iter()
        .map(|w| {
            let mut b = vec![0u8; SLOT.max(HEADROOM + w.len() + TAILROOM)];
            b[HEADROOM..HEADROOM + w.len()].copy_from_slice(w);
            b
        })
        .collect();
    enum Fate {
        Done(Outcome),
        Job {
            sa: usize,
            job: ipsec::CryptoJob,
            head: usize,
            len: usize,
        },
    }
    let mut fates = Vec::new();
    for (b, w) in bufs.iter_mut().zip(batch) {
        let mut p = PacketBuf::new(b, HEADROOM, w.len()).unwrap();
        fates.push(match rx.inbound_start(&mut p) {
            Ok(InboundStart::Open { sa, job }) => Fate::Job {
                sa,
                job,
                head: p.head(),
                len: p.len(),
            },
            Ok(InboundStart::Done(Inbound::Opened { .. })) => Fate::Done(Ok(p.data().to_vec())),
            Ok(InboundStart::Done(Inbound::Bypass)) => Fate::Done(Ok(b"bypass".to_vec())),
            Err(d) => Fate::Done(Err(d)),
        });
    }
    // the jobs: on `threads` threads, each taking the jobs of its share in the input's order
    let mut crypto: Vec<Option<Result<(), DropReason>>> = vec![None; fates.len()];
    {
        let mut work: Vec<(usize, &mut Vec<u8>)> = bufs.iter_mut().enumerate().collect();
        work.sort_by_key(|(i, _)| order.get(*i).copied().unwrap_or(0));
        let mut shares: Vec<Vec<(usize, &mut Vec<u8>)>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (k, w) in work.into_iter().enumerate() {
            shares[k % threads].push(w);
        }
        let fates = &fates;
        let rx = &*rx;
        let results: Vec<Vec<(usize, Result<(), DropReason>)>> = std::thread::scope(|s| {
            let hs: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    s.spawn(move || {
                        let mut out = Vec::new();
                        for (i, buf) in share {
                            if let Fate::Job { sa, job, .. } = &fates[i] {
                                let keys = rx.sa(*sa).expect("live SA").keys();
                                out.push((i, job.open(keys, buf)));
                            }
                        }
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, r) in results.into_iter().flatten() {
            crypto[i] = Some(r);
        }
    }
    let mut out = Vec::new();
    for (i, (fate, buf)) in fates.into_iter().zip(bufs.iter_mut()).enumerate() {
        out.push(match fate {
            Fate::Done(o) => o,
            Fate::Job { sa, job, head, len } => {
                let mut p = PacketBuf::new(buf, head, len).unwrap();
                let r = crypto[i].take().expect("every job ran");
                match rx.inbound_finish(&mut p, sa, &job, r) {
                    Ok(Inbound::Opened { .. }) => Ok(p.data().to_vec()),
                    Ok(Inbound::Bypass) => Ok(b"bypass".to_vec()),
                    Err(d) => Err(d),
                }
            }
        });
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 || data.len() > 3 * 400 {
        return;
    }
    let sel = data[0];
    let suite = SUITES[usize::from(sel) % SUITES.len()];
    let esn = sel & 0x08 != 0;
    let window = WINDOWS[usize::from(sel >> 4) % WINDOWS.len()];
    let threads = 1 + usize::from(sel >> 6);
    let mut tx = engine(&config(suite, Direction::Out, esn, window));
    let mut single_rx = engine(&config(suite, Direction::In, esn, window));
    let mut crew_rx = engine(&config(suite, Direction::In, esn, window));
    let mut sent: Vec<Vec<u8>> = Vec::new();
    let mut batch: Vec<Vec<u8>> = Vec::new();
    let mut order: Vec<u8> = Vec::new();
    let mut single_out: Vec<Outcome> = Vec::new();
    let mut crew_out: Vec<Outcome> = Vec::new();
    let mut flush = |batch: &mut Vec<Vec<u8>>, order: &mut Vec<u8>, crew_rx: &mut Engine| {
        crew_out.extend(crew(crew_rx, batch, order, threads));
        batch.clear();
        order.clear();
    };
    for (k, op) in data[1..].chunks_exact(3).enumerate() {
        let pick = |v: &[Vec<u8>]| v.get(usize::from(op[1]) % v.len().max(1)).cloned();
        let wire = match op[0] % 8 {
            0..=3 => {
                let n = usize::from(op[1]) * 5 + usize::from(op[2] & 7);
                let pkt = inner(n, k as u32);
                let mut buf = vec![0u8; SLOT];
                buf[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(&pkt);
                let mut p = PacketBuf::new(&mut buf, HEADROOM, pkt.len()).unwrap();
                if tx.outbound(&mut p).is_err() {
                    continue;
                }
                let w = p.data().to_vec();
                sent.push(w.clone());
                Some(w)
            }
            4 => pick(&sent), // a replay, or a twin
            5 => pick(&sent).map(|mut w| {
                let at = usize::from(op[2]) % w.len();
                w[at] ^= 1 | (op[2] >> 3);
                w
            }),
            6 => pick(&sent).map(|mut w| {
                w.truncate(w.len().saturating_sub(usize::from(op[2] % 32)));
                w
            }),
            _ => {
                flush(&mut batch, &mut order, &mut crew_rx);
                None
            }
        };
        if let Some(w) = wire {
            single_out.push(single(&mut single_rx, &w));
            batch.push(w);
            order.push(op[2]);
            if batch.len() == 64 {
                flush(&mut batch, &mut order, &mut crew_rx);
            }
        }
    }
    flush(&mut batch, &mut order, &mut crew_rx);
    assert_eq!(single_out.len(), crew_out.len());
    let replay_family = |r: &Outcome| {
        matches!(
            r,
            Err(DropReason::Replay
                | DropReason::ReplayTooOld
                | DropReason::IcvFailure
                | DropReason::ZeroSequence)
        )
    };
    for (i, (a, b)) in single_out.iter().zip(&crew_out).enumerate() {
        let same = a == b || (replay_family(a) && replay_family(b));
        assert!(same, "packet {i}: single {a:?}, crew {b:?}");
    }
    let (_, a) = single_rx.sas().next().unwrap();
    let (_, b) = crew_rx.sas().next().unwrap();
    assert_eq!(
        (a.counters.packets, a.counters.bytes),
        (b.counters.packets, b.counters.bytes),
        "the SA's counts differ"
    );
    let total = |c: &ipsec::DropCounters| c.nonzero().map(|(_, n)| n).sum::<u64>();
    assert_eq!(
        total(&a.counters.drops),
        total(&b.counters.drops),
        "the drops differ"
    );
    for (label, n) in a.counters.drops.nonzero() {
        if !["replay", "replay_too_old", "icv_failure", "zero_sequence"].contains(&label) {
            assert_eq!(
                b.counters
                    .drops
                    .nonzero()
                    .find(|(l, _)| *l == label)
                    .map(|x| x.1),
                Some(n)
            );
        }
    }
    assert_eq!(
        single_rx.counters, crew_rx.counters,
        "the engine's counters differ"
    );
    let (wa, wb) = (a.replay_window(), b.replay_window());
    assert_eq!(wa.top(), wb.top(), "the replay windows' tops differ");
    let lo = wa.top().saturating_sub(u64::from(window) + 2);
    for seq in lo..=wa.top() + 2 {
        assert_eq!(wa.check(seq), wb.check(seq), "the windows differ at {seq}");
    }
});
