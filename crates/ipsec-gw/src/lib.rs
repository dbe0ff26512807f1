//! The ipsec-lab gateway as a library: what the `ipsec-gw` binary (`main.rs`: command
//! line, start-up, signals, routing) runs, and what the fuzz targets reach (the config's
//! parse into engines, GRO into the TUN device).
//!
//! - [`config`]: the TOML config, checked key by key.
//! - [`dataplane`]: the workers and each direction's path, SAs and outer sockets.
//! - [`gro`]: joining opened segments for the TUN device.
//! - [`guard`]: the boundary closed to clear traffic, running or down.
//! - [`claim`]: the routing table one gateway holds for its life.
//! - [`seqstate`]: sequence numbers that outlive the process.
//! - [`stats`]: counters and the stats socket.
//! - [`privilege`]: dropping to the capabilities the data path needs.
//! - [`reload`]: what a reload is checked against before the workers get it.
//! - [`sys`]: every system call that needs `unsafe` — the only module allowed any.

#![deny(unsafe_code)]

pub mod claim;
pub mod config;
pub mod dataplane;
pub mod gro;
pub mod guard;
pub mod prefixes;
pub mod privilege;
pub mod reload;
pub mod seqstate;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod tun_mtu;
