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
}

impl Sad {
    /// Register `id` under `key`; returns the SA it displaced, if any.
    pub fn insert(&mut self, key: SadKey, id: SaId) -> Option<SaId> {
        self.map.insert(key, id)
    }
    pub fn remove(&mut self, key: &SadKey) -> Option<SaId> {
        self.map.remove(key)
    }
    pub fn contains(&self, key: &SadKey) -> bool {
        self.map.contains_key(key)
    }
    /// The most specific match: exact destination first, then any destination.
    pub fn lookup(&self, spi: u32, dst: IpAddr, protocol: u8) -> Option<SaId> {
        self.map
            .get(&SadKey {
                spi,
                dst: Some(dst),
                protocol,
            })
            .or_else(|| {
                self.map.get(&SadKey {
                    spi,
                    dst: None,
                    protocol,
                })
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
