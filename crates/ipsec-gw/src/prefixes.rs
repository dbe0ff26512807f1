//! Prefixes by the addresses they cover: which stored prefixes share an address with a
//! given one. Two prefixes meet only when one lies within the other, so a query is an
//! ordered range (those within it) and one look-up per shorter length in use (those
//! containing it) — not a pass over every prefix stored. The config's overlap warnings
//! and the guard's nftables sets use it at thousands of tunnels.

use std::collections::{BTreeMap, BTreeSet};

use ipsec::spd::Prefix;

/// Values by prefix, both families.
#[derive(Debug)]
pub struct PrefixMap<T> {
    /// (IPv6?, network, length) -> the values stored under that prefix
    by: BTreeMap<(bool, u128, u8), Vec<T>>,
    /// the lengths in use, per family (IPv4, IPv6)
    lens: [BTreeSet<u8>; 2],
}

impl<T> Default for PrefixMap<T> {
    fn default() -> Self {
        PrefixMap {
            by: BTreeMap::new(),
            lens: Default::default(),
        }
    }
}

/// The first `len` bits of the prefix (at most its own length), as a number.
fn network(p: &Prefix, len: u8) -> u128 {
    ipsec::spd::masked(p.addr, len.min(p.len))
}

impl<T> PrefixMap<T> {
    pub fn insert(&mut self, p: &Prefix, value: T) {
        let v6 = p.addr.is_ipv6();
        self.by
            .entry((v6, network(p, p.len), p.len))
            .or_default()
            .push(value);
        self.lens[usize::from(v6)].insert(p.len);
    }

    /// The values of every stored prefix that shares an address with `p` (within it,
    /// equal, or containing it), each once, in no particular order.
    pub fn meeting<'a>(&'a self, p: &Prefix) -> impl Iterator<Item = &'a T> + 'a {
        let p = *p;
        let v6 = p.addr.is_ipv6();
        let lo = network(&p, p.len);
        let span = if v6 { 128 } else { 32 } - u32::from(p.len);
        let hi = if span >= 128 {
            u128::MAX
        } else {
            lo | ((1u128 << span) - 1)
        };
        let len = p.len;
        // within it or equal: a network from its own onwards, of its length or longer
        // (a shorter prefix cannot start strictly inside it)
        let within = self
            .by
            .range((v6, lo, len)..=(v6, hi, u8::MAX))
            .filter(move |((_, _, l), _)| *l >= len)
            .flat_map(|(_, vs)| vs);
        // containing it: at each shorter length in use, the network it falls in
        let containing = self.lens[usize::from(v6)]
            .range(..len)
            .filter_map(move |&l| self.by.get(&(v6, network(&p, l), l)))
            .flatten();
        within.chain(containing)
    }

    pub fn meets(&self, p: &Prefix) -> bool {
        self.meeting(p).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the pairwise test, over nested, equal and disjoint prefixes of both
    /// families and every length class from /0 (the same cases every run).
    #[test]
    fn meeting_is_every_prefix_that_shares_an_address() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut below = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // the reference: the shorter contains the longer's address (the SPD's test)
        let shares = |a: &Prefix, b: &Prefix| {
            let (short, long) = if a.len <= b.len { (a, b) } else { (b, a) };
            a.addr.is_ipv4() == b.addr.is_ipv4() && short.contains(long.addr)
        };
        let mut met = 0;
        for _ in 0..300 {
            let mut m = PrefixMap::default();
            let mut all = Vec::new();
            for k in 0..1 + below(60) as usize {
                let p = if below(3) == 0 {
                    let a = 0x2001_0db8_u128 << 96 | u128::from(below(4) as u32) << 88;
                    let len = [0, 8, 32, 33, 64, 128][below(6) as usize];
                    Prefix::new(std::net::Ipv6Addr::from(a).into(), len).unwrap()
                } else {
                    let a = 10 << 24 | (below(4) as u32) << 16 | (below(3) as u32) << 8;
                    let len = [0, 1, 8, 14, 16, 23, 24, 32][below(8) as usize];
                    Prefix::new(std::net::Ipv4Addr::from(a).into(), len).unwrap()
                };
                m.insert(&p, k);
                all.push(p);
            }
            for q in &all {
                let mut got: Vec<usize> = m.meeting(q).copied().collect();
                got.sort_unstable();
                let want: Vec<usize> = (0..all.len()).filter(|&k| shares(&all[k], q)).collect();
                assert_eq!(got, want, "{q:?} in {all:?}");
                assert_eq!(m.meets(q), !want.is_empty());
                met += want.len();
            }
        }
        assert!(met > 5_000, "only {met}: the cases do not nest");
    }
}
