//! Benchmark of whole configurations: one ESP or AH SA, or a bundle (IPComp → ESP → AH),
//! on compressible text or random bytes — study 1's eight configurations among them.
//!
//! Each case seals (or opens) batches of packets prepared untimed beforehand, so the
//! figure is the transform's alone. There is no raw-crypto baseline for a configuration:
//! compare configurations with each other (study 1's effort ratios) or use `bench` for one
//! ESP suite against raw aws-lc-rs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ipsec::bundle::Layers;
use ipsec::crypto::state::IvSource;
use ipsec::{
    Clock, DropReason, Integrity, IpcompConfig, IpcompSa, Mode, PacketBuf, Protocol, Sa, Suite,
    HEADROOM,
};

use crate::{ipv4_udp, mono_ns, sa_config, Op, BATCH};

/// A configuration as `ipsec-lab` writes it: `esp:aes128-sha1`, `ah:sha1`,
/// `ah:sha1+esp:aes128`, `ipcomp+esp:aes128-sha1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigSpec {
    pub text: String,
    pub ipcomp: bool,
    pub esp: Option<Suite>,
    pub ah: Option<Integrity>,
}

impl ConfigSpec {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut spec = ConfigSpec {
            text: text.to_string(),
            ipcomp: false,
            esp: None,
            ah: None,
        };
        for part in text.split('+') {
            match part.split_once(':') {
                None if part == "ipcomp" && !spec.ipcomp => spec.ipcomp = true,
                Some(("esp", p)) if spec.esp.is_none() => {
                    spec.esp = Some(Suite::parse(p).map_err(|e| format!("{text:?}: {e}"))?)
                }
                Some(("ah", i)) if spec.ah.is_none() => {
                    let integ = Integrity::from_name(i)
                        .filter(|x| *x != Integrity::Null)
                        .ok_or_else(|| format!("{text:?}: AH integrity {i:?} is not known"))?;
                    spec.ah = Some(integ);
                }
                _ => {
                    return Err(format!(
                        "{text:?}: {part:?} is not a layer (ipcomp, esp:ENC[-INTEG], ah:INTEG), \
                         or is given twice"
                    ))
                }
            }
        }
        if spec.esp.is_none() && (spec.ipcomp || spec.ah.is_none()) {
            return Err(format!(
                "{text:?}: give ESP (alone or in a bundle with AH and/or IPComp) or AH alone"
            ));
        }
        Ok(spec)
    }

    fn legacy(&self) -> bool {
        self.esp.is_some_and(|s| s.is_legacy()) || self.ah.is_some_and(|i| i.is_legacy())
    }
}

/// What the packets carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// English prose: compresses about as well as study 1's "compressible" data.
    Text,
    /// Bytes from a fixed-seed generator: DEFLATE cannot shrink them.
    Random,
}

impl Payload {
    pub fn name(self) -> &'static str {
        match self {
            Payload::Text => "text",
            Payload::Random => "random",
        }
    }

    pub fn from_name(name: &str) -> Result<Self, String> {
        match name {
            "text" => Ok(Payload::Text),
            "random" => Ok(Payload::Random),
            _ => Err(format!("payload {name:?}: use text or random")),
        }
    }
}

const PROSE: &[u8] = b"Five classic IPsec performance studies measured by hand what a secure \
gateway costs on Pentium-era machines: how much throughput it keeps, how much CPU each \
configuration burns, when the link and when the processor is the bottleneck, and whether \
compression pays. A gateway between two networks encrypts and authenticates every packet \
that policy says to protect, and the time it spends on each packet splits into a part \
that does not depend on the size of the packet and a part that grows with it. ";

/// An IPv4/UDP packet of `size` bytes whose payload is `payload`.
pub fn packet(size: usize, payload: Payload) -> Vec<u8> {
    let mut p = ipv4_udp(size);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (i, b) in p[28..].iter_mut().enumerate() {
        *b = match payload {
            Payload::Text => PROSE[i % PROSE.len()],
            Payload::Random => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        };
    }
    p
}

/// One gateway's side of a configuration.
struct Side {
    esp: Option<Sa>,
    ah: Option<Sa>,
    ipcomp: Option<IpcompSa>,
}

impl Side {
    fn new(spec: &ConfigSpec, op_dir: ipsec::Direction) -> Self {
        let mk = |suite: Suite, protocol: Protocol, spi: u32| {
            let mut c = sa_config(suite, Mode::Tunnel);
            c.direction = op_dir;
            c.protocol = protocol;
            c.spi = spi;
            c.legacy = spec.legacy();
            Sa::new(&c).expect("bench SA")
        };
        Side {
            esp: spec.esp.map(|s| mk(s, Protocol::Esp, 0x1000)),
            ah: spec.ah.map(|i| {
                let s = Suite::new(ipsec::Encryption::Null, i).expect("AH suite");
                mk(s, Protocol::Ah, 0x2000)
            }),
            ipcomp: spec
                .ipcomp
                .then(|| IpcompSa::new(IpcompConfig::new(0x3000)).expect("IPComp")),
        }
    }

    fn set_clock(&mut self, clock: Option<Clock>) {
        for sa in [&mut self.esp, &mut self.ah].into_iter().flatten() {
            sa.stages.set_clock(clock);
        }
        if let Some(c) = &mut self.ipcomp {
            c.stages.set_clock(clock);
        }
    }

    fn seal(&mut self, p: &mut PacketBuf<'_>) -> Result<(), DropReason> {
        match (&mut self.esp, &mut self.ah, &mut self.ipcomp) {
            (Some(esp), None, None) => esp.seal(p),
            (None, Some(ah), None) => ah.seal(p),
            (Some(esp), ah, ipcomp) => Layers {
                ipcomp: ipcomp.as_mut(),
                esp,
                ah: ah.as_mut(),
            }
            .seal(p, IvSource::Generate),
            _ => Err(DropReason::NoSa),
        }
    }

    fn open(&mut self, p: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        match (&mut self.esp, &mut self.ah, &mut self.ipcomp) {
            (Some(esp), None, None) => esp.open(p),
            (None, Some(ah), None) => ah.open(p),
            (Some(esp), ah, ipcomp) => Layers {
                ipcomp: ipcomp.as_mut(),
                esp,
                ah: ah.as_mut(),
            }
            .open(p),
            _ => Err(DropReason::NoSa),
        }
    }

    /// Stage totals over the side's associations: (label, ns, calls).
    fn stages(&self) -> Vec<(&'static str, u64, u64)> {
        let mut out: Vec<(&'static str, u64, u64)> = Vec::new();
        let mut add = |l: &'static str, ns: u64, calls: u64| match out.iter_mut().find(|e| e.0 == l)
        {
            Some(e) => {
                e.1 += ns;
                e.2 += calls;
            }
            None => out.push((l, ns, calls)),
        };
        for sa in [&self.esp, &self.ah].into_iter().flatten() {
            sa.stages.nonzero().for_each(|(l, n, c)| add(l, n, c));
        }
        if let Some(c) = &self.ipcomp {
            c.stages.nonzero().for_each(|(l, n, c)| add(l, n, c));
        }
        out
    }
}

#[derive(Clone, Debug)]
pub struct ConfigResult {
    pub config: String,
    pub payload: Payload,
    pub op: Op,
    pub size: usize,
    pub ns_per_packet: f64,
    /// Bytes of the protected packet on the wire (the last one sealed).
    pub wire_len: usize,
    /// With stage timing: ns per packet by stage, and timing points per packet.
    pub stages: Vec<(&'static str, f64)>,
    pub stage_points: f64,
}

/// Lay a fresh copy of `pkt` into each buffer, sealed by `tx` if `sealed` (untimed set-up).
/// Returns the sealed length (0 if not sealed).
fn fill(bufs: &mut [(Vec<u8>, usize, usize)], pkt: &[u8], tx: &mut Side, sealed: bool) -> usize {
    let mut wire_len = 0;
    for (b, h, l) in bufs.iter_mut() {
        b[HEADROOM..HEADROOM + pkt.len()].copy_from_slice(pkt);
        (*h, *l) = (HEADROOM, pkt.len());
        if sealed {
            let mut p = PacketBuf::new(b, HEADROOM, pkt.len()).unwrap();
            tx.seal(&mut p).expect("bench seal");
            (*h, *l) = (p.head(), p.len());
            wire_len = p.len();
        }
    }
    wire_len
}

/// Time sealing or opening `size`-byte packets of `payload` through `spec`.
pub fn measure_config(
    spec: &ConfigSpec,
    size: usize,
    op: Op,
    payload: Payload,
    budget: Duration,
    trials: usize,
    stage_timing: bool,
) -> ConfigResult {
    let pkt = packet(size, payload);
    let cap = HEADROOM + 65_536;
    let mut tx = Side::new(spec, ipsec::Direction::Out);
    let mut rx = Side::new(spec, ipsec::Direction::In);
    let mut bufs: Vec<(Vec<u8>, usize, usize)> =
        (0..BATCH).map(|_| (vec![0u8; cap], 0, 0)).collect();
    // One untimed round warms up both sides (seeding, page faults, zlib state).
    let mut wire_len = fill(&mut bufs, &pkt, &mut tx, true);
    for (b, h, l) in bufs.iter_mut() {
        let mut p = PacketBuf::new(b, *h, *l).unwrap();
        rx.open(&mut p).expect("bench open");
    }
    let clock = stage_timing.then_some(mono_ns as Clock);
    let timed = match op {
        Op::Seal => &mut tx,
        Op::Open => &mut rx,
    };
    timed.set_clock(clock);
    let slice = budget / trials.max(1) as u32;
    let mut timed_packets = 0u64;
    let mut per: Vec<f64> = (0..trials.max(1))
        .map(|_| {
            let (mut n, mut t) = (0u64, Duration::ZERO);
            let start = Instant::now();
            while start.elapsed() < slice || n == 0 {
                let sealing = op == Op::Seal;
                let w = fill(&mut bufs, &pkt, &mut tx, !sealing);
                if !sealing {
                    wire_len = w;
                }
                let side = if sealing { &mut tx } else { &mut rx };
                let t0 = Instant::now();
                for (b, h, l) in bufs.iter_mut() {
                    let mut p = PacketBuf::new(b, *h, *l).unwrap();
                    if sealing {
                        black_box(side.seal(&mut p)).expect("bench seal");
                    } else {
                        black_box(side.open(&mut p)).expect("bench open");
                    }
                }
                t += t0.elapsed();
                n += BATCH as u64;
            }
            timed_packets += n;
            t.as_nanos() as f64 / n as f64
        })
        .collect();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let side = match op {
        Op::Seal => &tx,
        Op::Open => &rx,
    };
    let n = timed_packets.max(1) as f64;
    let raw = side.stages();
    ConfigResult {
        config: spec.text.clone(),
        payload,
        op,
        size: pkt.len(),
        ns_per_packet: per[per.len() / 2],
        wire_len,
        stages: raw.iter().map(|(l, ns, _)| (*l, *ns as f64 / n)).collect(),
        stage_points: raw.iter().map(|(_, _, c)| *c).sum::<u64>() as f64 / n,
    }
}

/// Every (configuration, payload, size, op) of a sweep, in that order, each measured
/// with [`measure_config`]; `progress(done, total)` after each.
#[allow(clippy::too_many_arguments)]
pub fn run_configs(
    specs: &[ConfigSpec],
    payloads: &[Payload],
    sizes: &[usize],
    ops: &[Op],
    budget: Duration,
    trials: usize,
    stage_timing: bool,
    mut progress: impl FnMut(usize, usize),
) -> Vec<ConfigResult> {
    let total = specs.len() * sizes.len() * ops.len() * payloads.len();
    let mut out = Vec::with_capacity(total);
    for spec in specs {
        for &payload in payloads {
            for &size in sizes {
                for &op in ops {
                    out.push(measure_config(
                        spec,
                        size,
                        op,
                        payload,
                        budget,
                        trials,
                        stage_timing,
                    ));
                    progress(out.len(), total);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_parse_and_refuse_what_they_should() {
        let s = ConfigSpec::parse("ah:sha1+esp:aes128").unwrap();
        assert!(s.esp.is_some() && s.ah == Some(Integrity::HmacSha1_96) && !s.ipcomp);
        assert!(ConfigSpec::parse("ipcomp+esp:aes128-sha1").unwrap().ipcomp);
        assert!(ConfigSpec::parse("ah:sha256").unwrap().esp.is_none());
        for bad in [
            "ipcomp",
            "ipcomp+ah:sha1",
            "esp:aes999",
            "ah:null",
            "gre:x",
            "esp:aes128+esp:aes128",
        ] {
            assert!(ConfigSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_study1_configuration_runs_both_ways() {
        let configs = [
            ("esp:null-sha1", Payload::Text),
            ("esp:aes128", Payload::Text),
            ("esp:aes128-sha1", Payload::Text),
            ("esp:aes128-sha256", Payload::Text),
            ("ah:sha1+esp:aes128", Payload::Text),
            ("ipcomp+esp:aes128-sha1", Payload::Text),
            ("ipcomp+esp:aes128-sha1", Payload::Random),
            ("ah:sha1", Payload::Random),
        ];
        for (c, payload) in configs {
            let spec = ConfigSpec::parse(c).unwrap();
            for op in [Op::Seal, Op::Open] {
                let r = measure_config(&spec, 1420, op, payload, Duration::from_millis(2), 1, true);
                assert!(r.ns_per_packet > 0.0 && r.stage_points > 0.0, "{c} {op:?}");
                if spec.ipcomp && payload == Payload::Text {
                    assert!(r.wire_len < 1420, "{c}: text compresses ({})", r.wire_len);
                    let want = if op == Op::Seal {
                        "compress"
                    } else {
                        "decompress"
                    };
                    assert!(r.stages.iter().any(|(l, _)| *l == want), "{c} {op:?}");
                } else {
                    assert!(r.wire_len > 1420, "{c}: {}", r.wire_len);
                }
            }
        }
    }
}
