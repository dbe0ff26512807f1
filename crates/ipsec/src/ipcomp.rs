//! IPComp (RFC 3173) with DEFLATE (RFC 2394), through zlib-rs.
//!
//! IPComp is stateless per datagram (RFC 3173 §2.2): each packet is compressed on its own.
//! One compressor and one decompressor are kept per SA and reset per packet, so nothing is
//! allocated on the hot path; the SA's 64 KiB scratch buffer takes each output.
//!
//! Outbound, a payload shorter than the SA's minimum is not compressed (counted as
//! `too_small`), and a payload that does not come out smaller, IPComp header included, is
//! sent as it was (counted as `incompressible`): the receiver sees no IPComp header then.
//! Inbound, any DEFLATE window of 8 to 15 bits is accepted, the output is bounded by
//! 65,535 bytes, and a stream that would exceed it is a counted drop
//! (`decompressed_too_big`), not an allocation spree.

use zlib_rs::{Deflate, DeflateFlush, Inflate, InflateFlush, Status};

use crate::buf::PacketBuf;
use crate::constants::{proto, IPCOMP_HEADER_LEN, MAX_PACKET};
use crate::drop::{DropCounters, DropReason};
use crate::locate::{ipsec_location, rewrite_ip_header, TransportSplit};
use crate::stage::{Stage, StageTimes};
use crate::wire::ipcomp::{IpcompHeader, IpcompRepr};

/// Linux's default: payloads under 90 bytes are not worth compressing
/// (net/xfrm/xfrm_algo.c, the deflate threshold).
pub const DEFAULT_MIN_SIZE: usize = 90;
/// Linux compresses with an 11-bit window (crypto/deflate.c, DEFLATE_DEF_WINBITS).
pub const DEFAULT_WINDOW_BITS: u8 = 11;
/// zlib's default level.
pub const DEFAULT_LEVEL: i32 = 6;
/// RFC 3173 §3.3 / RFC 2394 §2: the well-known CPI of DEFLATE.
pub const CPI_DEFLATE: u16 = 2;

/// How an IPComp SA compresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcompConfig {
    /// Compression Parameter Index: 2 (DEFLATE, well known) or a negotiated value
    /// 256–61439 (RFC 3173 §3.3).
    pub cpi: u16,
    /// Payloads shorter than this go out uncompressed.
    pub min_size: usize,
    /// DEFLATE window for compressing, 9–15 bits (8 is not writable by zlib).
    pub window_bits: u8,
    /// DEFLATE level 1–9.
    pub level: i32,
}

impl IpcompConfig {
    pub fn new(cpi: u16) -> Self {
        IpcompConfig {
            cpi,
            min_size: DEFAULT_MIN_SIZE,
            window_bits: DEFAULT_WINDOW_BITS,
            level: DEFAULT_LEVEL,
        }
    }

    pub fn check(&self) -> Result<(), IpcompConfigError> {
        if !(self.cpi == CPI_DEFLATE || (256..=61439).contains(&self.cpi)) {
            return Err(IpcompConfigError::ReservedCpi(self.cpi));
        }
        if !(9..=15).contains(&self.window_bits) {
            return Err(IpcompConfigError::WindowBits(self.window_bits));
        }
        if !(1..=9).contains(&self.level) {
            return Err(IpcompConfigError::Level(self.level));
        }
        Ok(())
    }
}

/// Why an [`IpcompConfig`] is refused: the configuration's (the caller's) mistake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpcompConfigError {
    /// A CPI neither DEFLATE's well-known 2 nor a negotiable 256–61439 (RFC 3173 §3.3).
    ReservedCpi(u16),
    /// A compression window zlib cannot write: 9 to 15 bits.
    WindowBits(u8),
    /// A DEFLATE level outside 1 to 9.
    Level(i32),
}

impl core::fmt::Display for IpcompConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            IpcompConfigError::ReservedCpi(cpi) => write!(
                f,
                "CPI {cpi} is reserved (RFC 3173 §3.3): use 2 (DEFLATE) or 256 to 61439"
            ),
            IpcompConfigError::WindowBits(b) => {
                write!(f, "DEFLATE window of {b} bits: compress with 9 to 15")
            }
            IpcompConfigError::Level(l) => write!(f, "DEFLATE level {l}: 1 to 9"),
        }
    }
}

impl std::error::Error for IpcompConfigError {}

/// The message, for callers that collect messages (the gateway's config checks).
impl From<IpcompConfigError> for String {
    fn from(e: IpcompConfigError) -> String {
        e.to_string()
    }
}

/// What IPComp did with an outbound payload, and per-SA totals of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpcompCounters {
    /// Sent with an IPComp header.
    pub compressed: u64,
    /// Tried, but not smaller: sent as they were (RFC 3173 §2.2).
    pub incompressible: u64,
    /// Under the minimum size: not tried.
    pub too_small: u64,
    /// Payload bytes before and after IPComp, outbound (header included after).
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Inbound packets decompressed.
    pub decompressed: u64,
    pub drops: DropCounters,
}

/// What [`IpcompSa::compress_payload`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressed {
    /// The payload now starts with an IPComp header; its new length.
    Yes(usize),
    /// Not smaller: left as it was.
    Incompressible,
    /// Under the minimum size: left as it was.
    TooSmall,
}

/// An IPComp SA: one direction's compressor state and counters. Holds no keys.
pub struct IpcompSa {
    cfg: IpcompConfig,
    deflate: Deflate,
    inflate: Inflate,
    scratch: Vec<u8>,
    pub counters: IpcompCounters,
    /// Per-stage time (compress, decompress, copy), when a clock is lent.
    pub stages: StageTimes,
}

impl core::fmt::Debug for IpcompSa {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "IpcompSa(cpi {}, {:?})", self.cfg.cpi, self.counters)
    }
}

impl IpcompSa {
    pub fn new(cfg: IpcompConfig) -> Result<Self, IpcompConfigError> {
        cfg.check()?;
        Ok(IpcompSa {
            cfg,
            deflate: Deflate::new(cfg.level, false, cfg.window_bits),
            // A 15-bit window inflates streams written with any smaller window.
            inflate: Inflate::new(false, 15),
            scratch: vec![0; MAX_PACKET],
            counters: IpcompCounters::default(),
            stages: StageTimes::off(),
        })
    }

    pub fn config(&self) -> &IpcompConfig {
        &self.cfg
    }

    /// Compress `buf[at..at + len]`, whose protocol is `next_header`, in place: on
    /// [`Compressed::Yes`] the IPComp header and the DEFLATE data start at `at`.
    pub fn compress_payload(
        &mut self,
        buf: &mut [u8],
        at: usize,
        len: usize,
        next_header: u8,
    ) -> Result<Compressed, DropReason> {
        let end = at.checked_add(len).filter(|e| *e <= buf.len());
        let end = end.ok_or(DropReason::NoRoom)?;
        self.counters.bytes_in += len as u64;
        if len < self.cfg.min_size {
            self.counters.too_small += 1;
            self.counters.bytes_out += len as u64;
            return Ok(Compressed::TooSmall);
        }
        // Worth sending only if header + data is strictly smaller. DEFLATE gets the whole
        // scratch buffer and the size is judged afterwards: with less room than a stored
        // block needs, zlib-rs 0.6.8 panics in its block flush instead of returning
        // BufError (found by this project's benchmark; see the regression test).
        let t = self.stages.start();
        self.deflate.reset();
        let st = self
            .deflate
            .compress(&buf[at..end], &mut self.scratch, DeflateFlush::Finish);
        let out = self.deflate.total_out() as usize;
        let t = self.stages.stop(Stage::Compress, t);
        if st != Ok(Status::StreamEnd) || out + IPCOMP_HEADER_LEN >= len {
            self.counters.incompressible += 1;
            self.counters.bytes_out += len as u64;
            return Ok(Compressed::Incompressible);
        }
        // RFC 3173 §2.2: next header, flags (0), CPI, then the compressed data.
        let header = IpcompRepr {
            next_header,
            cpi: self.cfg.cpi,
        };
        let n = header.buffer_len(out);
        let mut h = IpcompHeader::new_unchecked(&mut buf[at..at + n]);
        header.emit(&mut h);
        h.payload_mut().copy_from_slice(&self.scratch[..out]);
        self.stages.stop(Stage::Copy, t);
        self.counters.compressed += 1;
        self.counters.bytes_out += n as u64;
        Ok(Compressed::Yes(n))
    }

    /// Decompress the IPComp payload (header + DEFLATE data) at `buf[at..at + len]` in
    /// place; the output may grow up to `buf.len()`. Returns (length, next header).
    pub fn decompress_payload(
        &mut self,
        buf: &mut [u8],
        at: usize,
        len: usize,
    ) -> Result<(usize, u8), DropReason> {
        let r = self.decompress_inner(buf, at, len);
        if let Err(d) = r {
            self.counters.drops.count(d);
        }
        r
    }

    fn decompress_inner(
        &mut self,
        buf: &mut [u8],
        at: usize,
        len: usize,
    ) -> Result<(usize, u8), DropReason> {
        let end = at.checked_add(len).filter(|e| *e <= buf.len());
        let end = end.ok_or(DropReason::Truncated)?;
        let h = IpcompHeader::new_checked(&buf[at..end])?;
        let IpcompRepr { next_header, cpi } = IpcompRepr::parse(&h)?;
        if cpi != self.cfg.cpi {
            return Err(DropReason::UnknownSpi);
        }
        if next_header == proto::IPCOMP {
            // RFC 3173 §3.5: IPComp is never applied twice.
            return Err(DropReason::BadNextHeader);
        }
        let t = self.stages.start();
        self.inflate.reset(false);
        let st = self
            .inflate
            .decompress(h.payload(), &mut self.scratch, InflateFlush::Finish);
        let out = self.inflate.total_out() as usize;
        let t = self.stages.stop(Stage::Decompress, t);
        match st {
            Ok(Status::StreamEnd) => {}
            // The output buffer filled before the stream ended: more than 65,535 bytes.
            Ok(_) if out == self.scratch.len() => return Err(DropReason::DecompressedTooBig),
            Err(_) if out == self.scratch.len() => return Err(DropReason::DecompressedTooBig),
            _ => return Err(DropReason::BadCompressedData),
        }
        if at + out > buf.len() {
            // the peer's data inflates past the room the caller gave: the peer's doing
            // (counted as such), not a caller fault
            return Err(DropReason::DecompressedTooBig);
        }
        buf[at..at + out].copy_from_slice(&self.scratch[..out]);
        self.stages.stop(Stage::Copy, t);
        self.counters.decompressed += 1;
        Ok((out, next_header))
    }

    /// Transport mode, outbound: compress the IP packet's payload in place (the IP
    /// header now says IPComp), or leave the packet as it was.
    pub fn seal(&mut self, pkt: &mut PacketBuf<'_>) -> Result<Compressed, DropReason> {
        let sp = TransportSplit::parse(pkt.data())?;
        let head = pkt.head();
        let len = sp.pkt_len - sp.hdr_len;
        let c = self.compress_payload(pkt.raw(), head + sp.hdr_len, len, sp.next_header)?;
        if let Compressed::Yes(n) = c {
            let ip = &mut pkt.raw()[head..head + sp.hdr_len];
            rewrite_ip_header(ip, sp.v4, sp.nh_at, proto::IPCOMP, n);
            pkt.set(head, sp.hdr_len + n)?;
        }
        Ok(c)
    }

    /// Transport mode, inbound: decompress an IP packet whose payload is IPComp. The
    /// caller's buffer must have room behind the packet for the decompressed payload.
    pub fn open(&mut self, pkt: &mut PacketBuf<'_>) -> Result<u8, DropReason> {
        let loc = match ipsec_location(pkt.data(), proto::IPCOMP) {
            Ok(l) => l,
            Err(d) => {
                self.counters.drops.count(d);
                return Err(d);
            }
        };
        let head = pkt.head();
        let (n, nh) = self.decompress_payload(pkt.raw(), head + loc.offset, loc.len)?;
        if loc.offset + n > MAX_PACKET {
            self.counters.drops.count(DropReason::DecompressedTooBig);
            return Err(DropReason::DecompressedTooBig);
        }
        let ip = &mut pkt.raw()[head..head + loc.offset];
        rewrite_ip_header(ip, loc.v4, loc.nh_at, nh, n);
        pkt.set(head, loc.offset + n)?;
        Ok(nh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_configuration_says_which_field_and_why() {
        let cfg = |cpi, window_bits, level| IpcompConfig {
            window_bits,
            level,
            ..IpcompConfig::new(cpi)
        };
        for (c, want, message) in [
            (
                cfg(255, 11, 6),
                IpcompConfigError::ReservedCpi(255),
                "CPI 255 is reserved (RFC 3173 §3.3): use 2 (DEFLATE) or 256 to 61439",
            ),
            (
                cfg(2, 8, 6),
                IpcompConfigError::WindowBits(8),
                "DEFLATE window of 8 bits: compress with 9 to 15",
            ),
            (
                cfg(61439, 15, 10),
                IpcompConfigError::Level(10),
                "DEFLATE level 10: 1 to 9",
            ),
        ] {
            assert_eq!(c.check(), Err(want));
            assert_eq!(IpcompSa::new(c).err(), Some(want));
            assert_eq!(want.to_string(), message);
            assert_eq!(String::from(want), message);
        }
        assert_eq!(cfg(2, 9, 1).check(), Ok(()));
    }

    /// A peer's compressed payload that inflates past the room the caller gave is the
    /// peer's doing: `decompressed_too_big`, counted — never `no_room` (a caller fault).
    #[test]
    fn inflating_past_the_room_given_is_the_peers_drop() {
        let mut c = IpcompSa::new(IpcompConfig::new(0x3000)).unwrap();
        let mut buf = vec![b'a'; 4096];
        let Ok(Compressed::Yes(n)) = c.compress_payload(&mut buf, 0, 1400, 4) else {
            panic!("1400 'a's compress");
        };
        let mut small = buf[..n + 64].to_vec(); // room for 64 more bytes, not 1400
        let mut d = IpcompSa::new(IpcompConfig::new(0x3000)).unwrap();
        assert_eq!(
            d.decompress_payload(&mut small, 0, n),
            Err(DropReason::DecompressedTooBig)
        );
        assert_eq!(d.counters.drops.get(DropReason::DecompressedTooBig), 1);
        // with the room, the same payload opens
        let mut room = buf[..n].to_vec();
        room.resize(4096, 0);
        assert_eq!(d.decompress_payload(&mut room, 0, n), Ok((1400, 4)));
    }

    /// A payload Python's zlib (another DEFLATE implementation) compressed as Linux does,
    /// raw DEFLATE with an 11-bit window at level 6:
    /// `zlib.compressobj(6, zlib.DEFLATED, -11)` over `b"ipsec-lab " * 20`, behind an
    /// IPComp header with the well-known DEFLATE CPI (RFC 3173 §2.2, §3.3) and next
    /// header UDP. It opens to the 200 bytes, and our own compression of the same bytes
    /// opens to them too.
    #[test]
    fn zlibs_deflate_behind_an_ipcomp_header_opens() {
        const ZLIB: [u8; 15] = [
            0xcb, 0x2c, 0x28, 0x4e, 0x4d, 0xd6, 0xcd, 0x49, 0x4c, 0x52, 0xc8, 0x1c, 0xd2, 0x2c,
            0x00,
        ];
        let plain = b"ipsec-lab ".repeat(20);
        let mut buf = [&[0x11, 0x00, 0x00, 0x02][..], &ZLIB].concat();
        let n = buf.len();
        buf.resize(512, 0xa5);
        let mut d = IpcompSa::new(IpcompConfig::new(CPI_DEFLATE)).unwrap();
        assert_eq!(d.decompress_payload(&mut buf, 0, n), Ok((200, 17)));
        assert_eq!(buf[..200], plain[..]);

        let mut ours = plain.clone();
        ours.resize(512, 0xa5);
        let mut c = IpcompSa::new(IpcompConfig::new(CPI_DEFLATE)).unwrap();
        let Ok(Compressed::Yes(m)) = c.compress_payload(&mut ours, 0, 200, 17) else {
            panic!("200 repeated bytes compress");
        };
        assert_eq!(ours[..4], [0x11, 0x00, 0x00, 0x02], "our IPComp header");
        assert_eq!(d.decompress_payload(&mut ours, 0, m), Ok((200, 17)));
        assert_eq!(ours[..200], plain[..]);
        // a CPI not the association's is not ours to open
        let mut other = [&[0x11, 0x00, 0x30, 0x00][..], &ZLIB].concat();
        other.resize(512, 0);
        assert_eq!(
            d.decompress_payload(&mut other, 0, n),
            Err(DropReason::UnknownSpi)
        );
    }

    /// Regression: incompressible payloads, over and over through one association, as the
    /// benchmark sends them. With DEFLATE's output capped at "just smaller than the input",
    /// zlib-rs 0.6.8 panicked in its stored-block flush on the 303rd packet.
    #[test]
    fn many_incompressible_payloads_never_panic() {
        let mut c = IpcompSa::new(IpcompConfig::new(0x3000)).unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut buf = vec![0u8; 4096];
        for round in 0..600 {
            let len = if round % 3 == 0 {
                1420
            } else {
                90 + round % 1400
            };
            for b in buf[..len].iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            assert_eq!(
                c.compress_payload(&mut buf, 0, len, 4),
                Ok(Compressed::Incompressible)
            );
        }
        assert_eq!(c.counters.incompressible, 600);
    }
}
