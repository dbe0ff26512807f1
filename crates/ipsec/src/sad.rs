//! The Security Association Database: inbound lookup by (SPI, destination, protocol)
//! (RFC 4301 §4.4.2). An SA registered without a destination matches any (unicast SAs
//! may be found by SPI alone, RFC 4301 §4.1).

use std::collections::HashMap;

use core::net::IpAddr;

/// Index of an SA in the [`crate::Engine`].
pub type SaId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SadKey {
    pub spi: u32,
    pub dst: Option<IpAddr>,
    pub protocol: u8,
}

#[derive(Debug, Default)]
pub struct Sad {
    map: HashMap<SadKey, SaId>,
    /// How many keys have a destination: a lookup skips the form no key has (one hash
    /// per packet instead of two, in the usual SAD where all keys are of one form).
    with_dst: usize,
}

impl Sad {
    /// Register `id` under `key`; returns the SA it displaced, if any.
    pub fn insert(&mut self, key: SadKey, id: SaId) -> Option<SaId> {
        let old = self.map.insert(key, id);
        if old.is_none() && key.dst.is_some() {
            self.with_dst += 1;
        }
        old
    }
    pub fn remove(&mut self, key: &SadKey) -> Option<SaId> {
        let old = self.map.remove(key);
        if old.is_some() && key.dst.is_some() {
            self.with_dst -= 1;
        }
        old
    }
    pub fn contains(&self, key: &SadKey) -> bool {
        self.map.contains_key(key)
    }
    /// The most specific match: exact destination first, then any destination.
    pub fn lookup(&self, spi: u32, dst: IpAddr, protocol: u8) -> Option<SaId> {
        let exact = (self.with_dst > 0)
            .then(|| {
                self.map.get(&SadKey {
                    spi,
                    dst: Some(dst),
                    protocol,
                })
            })
            .flatten();
        exact
            .or_else(|| {
                (self.with_dst < self.map.len())
                    .then(|| {
                        self.map.get(&SadKey {
                            spi,
                            dst: None,
                            protocol,
                        })
                    })
                    .flatten()
            })
            .copied()
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(spi: u32, dst: Option<[u8; 4]>) -> SadKey {
        SadKey {
            spi,
            dst: dst.map(IpAddr::from),
            protocol: 50,
        }
    }

    #[test]
    fn the_exact_destination_wins_and_any_destination_is_the_fallback() {
        let (a, b) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        let mut sad = Sad::default();
        assert_eq!(sad.lookup(0x100, a, 50), None);
        sad.insert(key(0x100, None), 1);
        assert_eq!(
            sad.lookup(0x100, a, 50),
            Some(1),
            "only keys without destination"
        );
        sad.insert(key(0x100, Some([192, 0, 2, 1])), 2);
        assert_eq!(sad.insert(key(0x100, Some([192, 0, 2, 1])), 3), Some(2)); // displaced
        assert_eq!(sad.lookup(0x100, a, 50), Some(3));
        assert_eq!(sad.lookup(0x100, b, 50), Some(1));
        assert_eq!(sad.lookup(0x100, a, 51), None, "another protocol");
        assert_eq!(sad.remove(&key(0x100, None)), Some(1));
        assert_eq!(sad.lookup(0x100, b, 50), None, "only keys with destination");
        assert_eq!(sad.lookup(0x100, a, 50), Some(3));
        assert_eq!(sad.remove(&key(0x100, Some([192, 0, 2, 1]))), Some(3));
        assert_eq!(sad.remove(&key(0x100, Some([192, 0, 2, 1]))), None);
        sad.insert(key(0x200, None), 4);
        assert_eq!(sad.lookup(0x200, b, 50), Some(4), "the counts stayed right");
        assert_eq!(sad.len(), 1);
    }
}
