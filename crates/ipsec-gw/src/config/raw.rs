//! The file as serde reads it, before any check: every key optional where the
//! gateway has a default, unknown keys refused.

use zeroize::Zeroize;

use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFile {
    pub(super) gateway: RawGateway,
    #[serde(default)]
    pub(super) sa: Vec<RawSa>,
    #[serde(default)]
    pub(super) bundle: Vec<RawBundle>,
    #[serde(default)]
    pub(super) policy: Vec<RawPolicy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBundle {
    pub(super) name: String,
    pub(super) direction: String,
    pub(super) esp: String,
    #[serde(default)]
    pub(super) ah: Option<String>,
    #[serde(default)]
    pub(super) ipcomp_cpi: Option<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGateway {
    pub(super) tun: String,
    /// "auto" (the default) or a number of bytes.
    #[serde(default)]
    pub(super) mtu: Option<RawCount>,
    pub(super) local: String,
    pub(super) remote: String,
    #[serde(default)]
    pub(super) routes: Vec<String>,
    #[serde(default)]
    pub(super) udp_encap: bool,
    #[serde(default)]
    pub(super) stats: Option<String>,
    #[serde(default)]
    pub(super) state: Option<String>,
    #[serde(default = "default_user")]
    pub(super) user: String,
    #[serde(default)]
    pub(super) stage_timing: bool,
    #[serde(default = "default_true")]
    pub(super) offload: bool,
    #[serde(default)]
    pub(super) aqm: bool,
    /// The packets the TUN device's queue holds (its txqueuelen; default 500) or "auto".
    #[serde(default)]
    pub(super) tun_queue: Option<RawCount>,
    #[serde(default = "default_table")]
    pub(super) table: u32,
    #[serde(default = "default_fwmark")]
    pub(super) fwmark: u32,
    #[serde(default = "default_workers")]
    pub(super) workers: u8,
    /// "auto" or a count: threads that seal (or open) one batch together, per direction.
    #[serde(default)]
    pub(super) crypto_workers: Option<RawCount>,
}

/// A count that may also be a word ("auto").
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawCount {
    Number(i64),
    Word(String),
}

impl RawCount {
    /// As an error quotes it: a number as written, a word in quotes.
    pub(super) fn shown(&self) -> String {
        match self {
            RawCount::Number(n) => n.to_string(),
            RawCount::Word(w) => format!("{w:?}"),
        }
    }
}

/// One worker per direction.
pub(super) fn default_workers() -> u8 {
    2
}

pub(super) fn default_true() -> bool {
    true
}

pub(super) fn default_table() -> u32 {
    220
}
/// "LAB" in ASCII: the mark on the gateway's own outer packets.
pub(super) fn default_fwmark() -> u32 {
    0x004c_4142
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSa {
    pub(super) name: String,
    pub(super) direction: String,
    pub(super) spi: u32,
    #[serde(default = "default_esp")]
    pub(super) protocol: String,
    #[serde(default = "default_tunnel")]
    pub(super) mode: String,
    pub(super) encryption: String,
    #[serde(default = "default_null")]
    pub(super) integrity: String,
    #[serde(default)]
    pub(super) enc_key: String,
    #[serde(default)]
    pub(super) integ_key: String,
    #[serde(default = "default_window")]
    pub(super) replay_window: u32,
    #[serde(default)]
    pub(super) esn: bool,
    #[serde(default)]
    pub(super) legacy: bool,
    pub(super) soft_bytes: Option<u64>,
    pub(super) hard_bytes: Option<u64>,
    pub(super) soft_packets: Option<u64>,
    pub(super) hard_packets: Option<u64>,
}

/// The hex (or `@file` names) of the keys, as read: wiped when the raw config goes.
impl Drop for RawSa {
    fn drop(&mut self) {
        self.enc_key.zeroize();
        self.integ_key.zeroize();
    }
}

pub(super) fn default_esp() -> String {
    "esp".into()
}
pub(super) fn default_tunnel() -> String {
    "tunnel".into()
}
pub(super) fn default_null() -> String {
    "null".into()
}
pub(super) fn default_window() -> u32 {
    1024
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub(super) direction: String,
    #[serde(default)]
    pub(super) src: Option<String>,
    #[serde(default)]
    pub(super) dst: Option<String>,
    #[serde(default)]
    pub(super) protocol: Option<u8>,
    pub(super) action: String,
    #[serde(default)]
    pub(super) sa: Option<OneOrMore>,
    #[serde(default)]
    pub(super) bundle: Option<String>,
}

/// A policy's `sa`: one name, or (inbound, during a rekey) a list of names.
pub(super) enum OneOrMore {
    One(String),
    More(Vec<String>),
}

impl<'de> Deserialize<'de> for OneOrMore {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Names;
        impl<'de> serde::de::Visitor<'de> for Names {
            type Value = OneOrMore;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an SA's name, or (an inbound policy) a list of SA names")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMore, E> {
                Ok(OneOrMore::One(v.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMore, A::Error> {
                let mut names = Vec::new();
                while let Some(n) = seq.next_element::<String>()? {
                    names.push(n);
                }
                Ok(OneOrMore::More(names))
            }
        }
        d.deserialize_any(Names)
    }
}

pub(super) fn default_user() -> String {
    "ipsec-gw".into()
}
