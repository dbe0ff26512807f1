//! Sealing and opening in two halves (`Engine::outbound_deferred`,
//! `Engine::inbound_start` / `inbound_finish`), the cryptography run on several threads:
//! byte for byte what the one-step paths give (those are checked against RFC vectors
//! and the Linux kernel elsewhere), and the replay window kept exactly as RFC 4303
//! §3.4.3 asks when the packets of one batch are verified out of order.

mod common;
use common::*;

use ipsec::{
    CryptoJob, DropReason, Engine, InboundStart, Mode, Outbound, PacketBuf, HEADROOM, TAILROOM,
};

const THREADS: usize = 4;

/// One packet in flight: its buffer, where the packet lies in it, and its job.
struct Slot {
    buf: Vec<u8>,
    head: usize,
    len: usize,
    job: Option<(usize, CryptoJob)>,
    crypto: Result<(), DropReason>,
}

impl Slot {
    fn new(pkt: &[u8]) -> Slot {
        let mut buf = vec![0u8; HEADROOM + pkt.len() + TAILROOM];
        buf[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(pkt);
        Slot {
            buf,
            head: HEADROOM,
            len: pkt.len(),
            job: None,
            crypto: Ok(()),
        }
    }
    fn data(&self) -> &[u8] {
        &self.buf[self.head..self.head + self.len]
    }
}

/// Run every slot's job on THREADS threads at once, each thread taking every THREADS-th
/// slot from the back (so that later packets tend to finish first).
fn run_jobs(engine: &Engine, slots: &mut [Slot], seal: bool) {
    let mut lanes: Vec<Vec<&mut Slot>> = (0..THREADS).map(|_| Vec::new()).collect();
    for (i, s) in slots.iter_mut().rev().enumerate() {
        lanes[i % THREADS].push(s);
    }
    std::thread::scope(|scope| {
        for lane in lanes {
            scope.spawn(move || {
                for s in lane {
                    let Some((sa, job)) = s.job else { continue };
                    let keys = engine.sa(sa).expect("live SA").keys();
                    s.crypto = if seal {
                        job.seal(keys, &mut s.buf)
                    } else {
                        job.open(keys, &mut s.buf)
                    };
                }
            });
        }
    });
}

fn packets(inner: (&str, &str), n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| udp(inner.0, inner.1, 1 + i * 37 % 1400))
        .collect()
}

/// Seal `pkts` in two halves, the cryptography on several threads.
fn seal_deferred(a: &mut Engine, pkts: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut slots: Vec<Slot> = pkts.iter().map(|p| Slot::new(p)).collect();
    for s in &mut slots {
        let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
        let (out, job) = a.outbound_deferred(&mut p).unwrap();
        let Outbound::Sealed { sa } = out else {
            panic!("not sealed: {out:?}")
        };
        s.job = Some((
            sa,
            job.expect("a lone ESP SA's packet comes back with a job"),
        ));
        (s.head, s.len) = (p.head(), p.len());
    }
    run_jobs(a, &mut slots, true);
    slots
        .iter()
        .map(|s| {
            s.crypto.unwrap();
            s.data().to_vec()
        })
        .collect()
}

/// Open `wire` in batches of `batch` in two halves, the cryptography on several threads.
fn open_deferred(
    b: &mut Engine,
    wire: &[Vec<u8>],
    batch: usize,
) -> Vec<Result<Vec<u8>, DropReason>> {
    let mut out = Vec::new();
    for chunk in wire.chunks(batch) {
        let mut slots: Vec<Slot> = chunk.iter().map(|p| Slot::new(p)).collect();
        let mut early = Vec::new();
        for s in &mut slots {
            let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
            early.push(match b.inbound_start(&mut p) {
                Ok(InboundStart::Open { sa, job }) => {
                    s.job = Some((sa, job));
                    None
                }
                Ok(InboundStart::Done(r)) => panic!("handled whole: {r:?}"),
                Err(d) => Some(Err(d)),
            });
        }
        run_jobs(b, &mut slots, false);
        for (s, early) in slots.iter_mut().zip(early) {
            if let Some(r) = early {
                out.push(r);
                continue;
            }
            let (sa, job) = s.job.unwrap();
            let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
            out.push(
                b.inbound_finish(&mut p, sa, &job, s.crypto)
                    .map(|_| p.data().to_vec()),
            );
        }
    }
    out
}

fn open_at_once(b: &mut Engine, wire: &[Vec<u8>]) -> Vec<Result<Vec<u8>, DropReason>> {
    wire.iter()
        .map(|w| {
            let mut s = Slot::new(w);
            let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
            b.inbound(&mut p).map(|_| p.data().to_vec())
        })
        .collect()
}

const SUITES: &[&str] = &[
    "aes128gcm16",
    "chacha20poly1305",
    "aes128gmac",
    "aes256-sha256",
    "aes128-sha1",
    "3des-sha1",
    "null-sha256",
];

/// Every packet sealed in two halves on four threads is byte for byte the packet the
/// one-step seal makes (same keys, same numbers; CBC SAs given the same IV key), in
/// tunnel and transport mode, IPv4 and IPv6; and the one-step open takes them all back.
#[test]
fn sealing_in_two_halves_on_several_threads_gives_the_same_bytes() {
    let v4 = (("192.0.2.1", "192.0.2.2"), ("10.1.0.1", "10.2.0.1"));
    let v6 = (("2001:db8::1", "2001:db8::2"), ("fd00:1::1", "fd00:2::1"));
    for suite in SUITES {
        for mode in [Mode::Tunnel, Mode::Transport] {
            for (outer, inner) in [v4, v6] {
                // transport mode protects the endpoints' own packets
                let inner = if mode == Mode::Transport {
                    outer
                } else {
                    inner
                };
                let (mut a1, mut b) = pair(suite, mode, outer, inner);
                let (mut a2, _) = pair(suite, mode, outer, inner);
                for a in [&mut a1, &mut a2] {
                    a.sa_mut(0).unwrap().set_cbc_iv_key_for_tests([7; 16]);
                }
                let pkts = packets(inner, 70);
                let at_once: Vec<Vec<u8>> = pkts
                    .iter()
                    .map(|p| {
                        let mut s = Slot::new(p);
                        let mut pb = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
                        a1.outbound(&mut pb).unwrap();
                        pb.data().to_vec()
                    })
                    .collect();
                let halves = seal_deferred(&mut a2, &pkts);
                assert_eq!(at_once, halves, "{suite} {mode:?} {outer:?}");
                let opened = open_at_once(&mut b, &halves);
                for (o, p) in opened.iter().zip(&pkts) {
                    assert_eq!(o.as_ref().unwrap(), p, "{suite} {mode:?}");
                }
                let (s1, s2) = (a1.sa(0).unwrap(), a2.sa(0).unwrap());
                assert_eq!(s1.next_seq(), 71);
                assert_eq!(s1.counters, s2.counters);
            }
        }
    }
}

/// What arrives, in batches of 16 opened on four threads, meets exactly the fate it
/// meets opened one at a time: a duplicate in the same batch as its original is a
/// `replay` (both pass the check before the ICV; the second fails it again at the
/// commit), a forged packet an `icv_failure` that commits nothing (its genuine twin
/// later is accepted), an old packet's replay in a later batch a `replay`; reordering
/// inside the window is accepted.
#[test]
fn opening_in_two_halves_keeps_the_replay_window_exact() {
    let outer = ("192.0.2.1", "192.0.2.2");
    let inner = ("10.1.0.1", "10.2.0.1");
    for suite in SUITES {
        let (mut a, mut b1) = pair(suite, Mode::Tunnel, outer, inner);
        let (_, mut b2) = pair(suite, Mode::Tunnel, outer, inner);
        let pkts = packets(inner, 48);
        let sealed: Vec<Vec<u8>> = pkts
            .iter()
            .map(|p| {
                let mut s = Slot::new(p);
                let mut pb = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
                a.outbound(&mut pb).unwrap();
                pb.data().to_vec()
            })
            .collect();
        let mut forged = sealed[20].clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        // batch 1: 0..=9 with 5 twice and 8/9 swapped, the forged 20, then 10..=13
        let mut wire: Vec<Vec<u8>> = (0..8).map(|i| sealed[i].clone()).collect();
        wire.insert(6, sealed[5].clone());
        wire.extend([sealed[9].clone(), sealed[8].clone(), forged]);
        wire.extend((10..14).map(|i| sealed[i].clone()));
        assert_eq!(wire.len(), 16);
        // batch 2: the genuine 20, a replay of 3, then 14..=19 and 21..=27
        wire.extend([sealed[20].clone(), sealed[3].clone()]);
        wire.extend((14..20).chain(21..28).map(|i| sealed[i].clone()));
        let at_once = open_at_once(&mut b1, &wire);
        let halves = open_deferred(&mut b2, &wire, 16);
        let fates = |v: &[Result<Vec<u8>, DropReason>]| -> Vec<Result<usize, DropReason>> {
            v.iter()
                .map(|r| r.as_ref().map(Vec::len).map_err(|d| *d))
                .collect()
        };
        assert_eq!(fates(&at_once), fates(&halves), "{suite}");
        assert!(at_once == halves, "{suite}: the same bytes");
        let verdict = |i: usize| halves[i].as_ref().err().copied();
        assert_eq!(
            verdict(6),
            Some(DropReason::Replay),
            "{suite}: twin in one batch"
        );
        assert_eq!(verdict(11), Some(DropReason::IcvFailure), "{suite}: forged");
        assert_eq!(
            halves[16].as_ref().unwrap(),
            &pkts[20],
            "{suite}: genuine twin"
        );
        assert_eq!(verdict(17), Some(DropReason::Replay), "{suite}: old replay");
        let accepted = halves.iter().filter(|r| r.is_ok()).count();
        assert_eq!(accepted, 28, "{suite}: every genuine packet once");
        let (s1, s2) = (b1.sa(0).unwrap(), b2.sa(0).unwrap());
        assert_eq!(s1.counters, s2.counters, "{suite}");
        assert_eq!(s2.replay_window().top(), 28, "packet 27 carries number 28");
    }
}

/// The replay window's numbered edge-case table (`replay.rs`, in the manner of
/// WireGuard's selftest), as real packets through the two-half path: one packet a batch,
/// every row's verdict exactly the table's; eight a batch with the cryptography on four
/// threads, every row accepted or refused as in the table. (Refusals may then name the
/// other replay reason: a row checked before its batch's earlier rows were committed sees
/// the older window — number 1 is "seen" there, "too old" one commit later.)
#[test]
fn the_replay_edge_case_table_holds_with_the_crypto_on_several_threads() {
    const W: u64 = 64;
    let ok = None;
    let (replay, too_old) = (Some(DropReason::Replay), Some(DropReason::ReplayTooOld));
    let table: &[(u32, u64, Option<DropReason>)] = &[
        (1, 0, Some(DropReason::ZeroSequence)),
        (2, 1, ok),
        (3, 1, replay),
        (4, 2, ok),
        (5, 4, ok),
        (6, 3, ok),
        (7, 3, replay),
        (8, W, ok),
        (9, 1, replay),
        (10, W + 1, ok),
        (11, 1, too_old),
        (12, 2, replay),
        (13, 5, ok),
        (14, 5, replay),
        (15, 3 * W, ok),
        (16, 2 * W + 1, ok),
        (17, 2 * W, too_old),
        (18, 3 * W, replay),
        (19, 3 * W - 1, ok),
        (20, 1_000_000, ok),
        (21, 1_000_000 - W + 1, ok),
        (22, 1_000_000 - W, too_old),
        (23, 3 * W - 1, too_old),
        (24, u64::from(u32::MAX), ok),
    ];
    let outer = ("192.0.2.1", "192.0.2.2");
    let inner = ("10.1.0.1", "10.2.0.1");
    // the packet numbered `seq` (0: number 1's, its number field zeroed: refused before
    // its ICV, which then does not matter)
    let (mut a, _) = pair("aes128gcm16", Mode::Tunnel, outer, inner);
    let wire: Vec<Vec<u8>> = table
        .iter()
        .map(|&(_, seq, _)| {
            a.sa_mut(0).unwrap().set_next_seq(seq.max(1)).unwrap();
            let mut s = Slot::new(&udp(inner.0, inner.1, 100));
            let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
            a.outbound(&mut p).unwrap();
            let mut w = p.data().to_vec();
            if seq == 0 {
                w[24..28].fill(0); // after the 20-byte outer header and the SPI
            }
            w
        })
        .collect();
    for batch in [1, 8] {
        let mut b = Engine::new();
        let mut c = cfg("aes128gcm16", Mode::Tunnel, ipsec::Direction::In, outer);
        c.replay_window = Some(W as u32);
        let id = b.add_sa(&c).unwrap();
        b.spd_in.push(ipsec::SpdRule {
            selector: ipsec::Selector::between(
                ipsec::spd::Prefix::parse(inner.0).unwrap(),
                ipsec::spd::Prefix::parse(inner.1).unwrap(),
            ),
            action: ipsec::Action::Protect(id),
            also: Vec::new(),
        });
        let got = open_deferred(&mut b, &wire, batch);
        for (&(step, seq, want), r) in table.iter().zip(&got) {
            let verdict = r.as_ref().err().copied();
            if batch == 1 {
                assert_eq!(verdict, want, "step {step}: seq {seq}");
            } else {
                assert_eq!(verdict.is_none(), want.is_none(), "step {step}: seq {seq}");
                let named = [replay, too_old, Some(DropReason::ZeroSequence)];
                assert!(
                    verdict.is_none() || named.contains(&verdict),
                    "step {step}: {verdict:?}"
                );
            }
        }
    }
}

/// With stage timing on, `inbound_start` opens a packet whole — and times its SA lookup
/// once, as `inbound` does, not once more for a second lookup of the same packet.
#[test]
fn opening_whole_from_the_start_times_one_sa_lookup() {
    fn clock() -> u64 {
        static NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        NOW.fetch_add(10, std::sync::atomic::Ordering::Relaxed)
    }
    let outer = ("192.0.2.1", "192.0.2.2");
    let inner = ("10.1.0.1", "10.2.0.1");
    let (mut a, mut b) = pair("aes128gcm16", Mode::Tunnel, outer, inner);
    b.set_clock(Some(clock));
    let mut s = Slot::new(&udp(inner.0, inner.1, 100));
    let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
    a.outbound(&mut p).unwrap();
    let wire = p.data().to_vec();
    let mut s = Slot::new(&wire);
    let mut p = PacketBuf::new(&mut s.buf, s.head, s.len).unwrap();
    let r = b.inbound_start(&mut p).unwrap();
    assert!(
        matches!(r, InboundStart::Done(ipsec::Inbound::Opened { .. })),
        "{r:?}"
    );
    assert_eq!(p.data(), &udp(inner.0, inner.1, 100)[..]);
    assert_eq!(b.sa(0).unwrap().stages.calls(ipsec::Stage::SaLookup), 1);
}

/// A forged copy of a packet, opened in the same batch behind the packet itself: its ICV
/// fails, but its number was committed by then — a `replay`, as the single-thread path
/// (window before ICV, RFC 4303 §3.4.3) calls it, not an `icv_failure`. Found by the
/// crew differential fuzz target (fuzz/fuzz_targets/crew.rs).
#[test]
fn a_forged_twin_behind_its_packet_is_a_replay_as_on_one_thread() {
    let v4 = ("192.0.2.1", "192.0.2.2");
    let (mut a, mut b) = pair(
        "aes128gcm16",
        Mode::Tunnel,
        v4,
        ("10.1.0.0/16", "10.2.0.0/16"),
    );
    let pkt = udp("10.1.0.5", "10.2.0.9", 100);
    let mut buf = framed(&pkt);
    let mut p = PacketBuf::new(&mut buf, HEADROOM, pkt.len()).unwrap();
    a.outbound(&mut p).unwrap();
    let wire = p.data().to_vec();
    let mut forged = wire.clone();
    *forged.last_mut().unwrap() ^= 1;
    let mut bufs = [framed(&wire), framed(&forged)];
    let mut started = Vec::new();
    for (buf, w) in bufs.iter_mut().zip([&wire, &forged]) {
        let mut p = PacketBuf::new(buf, HEADROOM, w.len()).unwrap();
        let InboundStart::Open { sa, job } = b.inbound_start(&mut p).unwrap() else {
            panic!("a lone ESP SA's packet is a job");
        };
        started.push((sa, job, p.head(), p.len()));
    }
    let mut reasons = Vec::new();
    for ((sa, job, head, len), buf) in started.into_iter().zip(bufs.iter_mut()) {
        let crypto = job.open(b.sa(sa).unwrap().keys(), buf);
        let mut p = PacketBuf::new(buf, head, len).unwrap();
        reasons.push(b.inbound_finish(&mut p, sa, &job, crypto).err());
    }
    assert_eq!(reasons, [None, Some(DropReason::Replay)]);
}
