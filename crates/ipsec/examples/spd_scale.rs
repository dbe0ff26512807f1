//! The SPD's lookup against the number of tunnels (issue 44's axis): for N tunnels, each
//! its own pair of /24s between the gateways' networks, behind two bypass rules (as a
//! gateway's config puts them first), the ns per lookup of the indexed SPD (`Spd::rule`)
//! and of the ordered scan it replaces (`Spd::scan`), same rules, same packets, one to a
//! random tunnel each, medians of `ROUNDS` alternating rounds. Prints one JSON object.
//! Not a test: nothing asserts a time (benchmarks/spd_scale.py runs it).
//!
//!     cargo run --release -p ipsec --example spd_scale [N ...]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use ipsec::spd::{Action, Prefix, Selector, Spd, SpdRule};
use ipsec::wire::ip::PacketInfo;

const ROUNDS: usize = 7;
const LOOKUPS: usize = 200_000;

fn net(side: u32, k: u32) -> Ipv4Addr {
    // tunnel k's /24 on side 1 (10.1.x.0 ...) or 2, up to 65,536 of them per side
    Ipv4Addr::from((10 << 24) | (side << 22) | (k << 8))
}

fn spd(n: u32) -> Spd {
    let mut s = Spd::default();
    for port in [500u16, 4500] {
        // IKE in clear (a gateway's first rules)
        s.push(SpdRule {
            selector: Selector {
                protocol: Some(17),
                dst_ports: port..=port,
                ..Selector::default()
            },
            action: Action::Bypass,
            also: Vec::new(),
        });
    }
    for k in 0..n {
        let src = Prefix::new(IpAddr::V4(net(1, k)), 24).unwrap();
        let dst = Prefix::new(IpAddr::V4(net(2, k)), 24).unwrap();
        s.push(SpdRule {
            selector: Selector::between(src, dst),
            action: Action::Protect(k as usize),
            also: Vec::new(),
        });
    }
    s
}

fn packets(n: u32) -> Vec<PacketInfo> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x % u64::from(n)) as u32;
            let host = (x >> 32) as u32 & 0xff;
            PacketInfo {
                src: IpAddr::V4(Ipv4Addr::from(u32::from(net(1, k)) | host)),
                dst: IpAddr::V4(Ipv4Addr::from(u32::from(net(2, k)) | (host ^ 1))),
                protocol: 6,
                src_port: Some(40_000),
                dst_port: Some(443),
            }
        })
        .collect()
}

fn ns_per_lookup(f: &dyn Fn(&PacketInfo) -> usize, ps: &[PacketInfo]) -> f64 {
    let t = Instant::now();
    let mut sum = 0usize;
    for i in 0..LOOKUPS {
        sum = sum.wrapping_add(f(black_box(&ps[i % ps.len()])));
    }
    black_box(sum);
    t.elapsed().as_nanos() as f64 / LOOKUPS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ns: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a tunnel count"))
        .collect();
    let ns = if ns.is_empty() {
        vec![1, 16, 256, 1024, 4096]
    } else {
        ns
    };
    let mut rows = Vec::new();
    for &n in &ns {
        let s = spd(n);
        let ps = packets(n);
        let action = |r: Option<&SpdRule>| match r.map(|r| r.action) {
            Some(Action::Protect(k)) => k,
            _ => usize::MAX,
        };
        // the same answers first: the benchmark times equal work
        for p in &ps {
            assert_eq!(action(s.rule(p)), action(s.scan(p)));
        }
        let (mut index, mut scan) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            index.push(ns_per_lookup(&|p| action(s.rule(p)), &ps));
            scan.push(ns_per_lookup(&|p| action(s.scan(p)), &ps));
        }
        let (i, l) = (median(index), median(scan));
        rows.push(format!(
            "{{\"tunnels\": {n}, \"rules\": {}, \"index_ns\": {i:.1}, \"scan_ns\": {l:.1}, \
             \"scan_over_index\": {:.2}}}",
            s.rules().len(),
            l / i
        ));
    }
    println!(
        "{{\"benchmark\": \"spd_scale\", \"rounds\": {ROUNDS}, \"lookups\": {LOOKUPS}, \
         \"rows\": [{}]}}",
        rows.join(", ")
    );
}
