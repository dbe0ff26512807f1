//! Differential fuzzing of GRO into the TUN device (`ipsec_gw::gro::Coalescer`).
//!
//! The input drives a generator of opened packets — three TCP and UDP connections over
//! IPv4 and IPv6 whose segments mostly follow each other (so they join), with gaps, PSH,
//! FIN, SYN, RST, short segments, changed TOS/TTL/flow label/DF/IPv4 ID, bad checksums,
//! and raw garbage between them. They are pushed as the inbound worker pushes them (a
//! flush whenever the coalescer is full) and every packet written is cut back as the
//! kernel would cut it — by tun-rs's `gso_split`, an implementation apart from ours —
//! after checking the partial checksum the kernel is asked to complete. Then:
//!
//! - every input packet comes back exactly once, byte for byte (IPv4 with DF: but for
//!   the ID and header checksum, which segmentation renumbers, as Linux's TSO does);
//! - per connection, in the order it came (GRO never reorders a flow);
//! - every cut segment of a joined packet has valid IP and transport checksums.
//!
//! Nothing may panic.

#![no_main]

use ipsec_gw::gro::Coalescer;
use libfuzzer_sys::fuzz_target;
use tun_rs::{VirtioNetHdr, VIRTIO_NET_HDR_GSO_UDP_L4, VIRTIO_NET_HDR_LEN};

const TCP: u8 = 6;
const UDP: u8 = 17;

/// RFC 1071 over `parts`: the one plain checksum (`ipsec::wire::checksum`, checked
/// against RFC 1071 §3's example), a reference apart from the vectorised sums of tun-rs
/// the gateway uses.
fn rfc1071(parts: &[&[u8]]) -> u16 {
    ipsec::wire::checksum(&parts.concat())
}

use ipsec::wire::l4::pseudo_header as pseudo;

fn iph(pkt: &[u8]) -> usize {
    if pkt[0] >> 4 == 6 {
        40
    } else {
        20
    }
}

/// Whether `pkt`'s IPv4 header (if any) and transport checksums verify.
fn checksums_ok(pkt: &[u8], proto: u8) -> bool {
    let h = iph(pkt);
    (h == 40 || rfc1071(&[&pkt[..20]]) == 0)
        && rfc1071(&[&pseudo(pkt, proto, pkt.len() - h), &pkt[h..]]) == 0
}

/// One connection's state in the generator.
struct Flow {
    v6: bool,
    proto: u8,
    src_port: u16,
    seq: u32,
    ack: u32,
    id: u16,
    mss: usize,
}

struct Gen<'a> {
    data: &'a [u8],
    at: usize,
}

impl Gen<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }
}

/// Build one packet of `f` from four control bytes.
fn packet(f: &mut Flow, c: [u8; 4], payload_salt: u8) -> Vec<u8> {
    let [kind, len_lo, len_hi, tweak] = c;
    let payload_len = if len_hi & 0x80 == 0 {
        f.mss // the common case: a full segment, which joins
    } else {
        (usize::from(len_hi & 0x07) << 8 | usize::from(len_lo)) % 1400
    };
    let payload: Vec<u8> = (0..payload_len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(payload_salt))
        .collect();
    let mut l4 = Vec::new();
    if f.proto == TCP {
        let flags = match kind & 7 {
            0..=3 => 0x10, // ACK
            4 => 0x18,     // ACK PSH
            5 => 0x11,     // ACK FIN
            6 => 0x02,     // SYN
            _ => 0x14,     // ACK RST
        };
        if kind & 0x08 != 0 {
            f.seq = f.seq.wrapping_add(1000); // a gap
        }
        if kind & 0x10 != 0 {
            f.ack = f.ack.wrapping_add(1); // a new acknowledgment number
        }
        l4.extend_from_slice(&f.src_port.to_be_bytes());
        l4.extend_from_slice(&[0x9c, 0x40]);
        l4.extend_from_slice(&f.seq.to_be_bytes());
        l4.extend_from_slice(&f.ack.to_be_bytes());
        if kind & 0x20 != 0 {
            l4.extend_from_slice(&[0x50, flags, 0x01, 0xf5, 0, 0, 0, 0]); // no options
        } else {
            l4.extend_from_slice(&[0x80, flags, 0x01, 0xf5, 0, 0, 0, 0]);
            l4.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]); // timestamps
        }
        f.seq = f.seq.wrapping_add(payload_len as u32);
    } else {
        l4.extend_from_slice(&f.src_port.to_be_bytes());
        l4.extend_from_slice(&[0x13, 0x89]);
        l4.extend_from_slice(&((8 + payload_len) as u16).to_be_bytes());
        l4.extend_from_slice(&[0, 0]);
    }
    l4.extend_from_slice(&payload);
    let mut p = if f.v6 {
        let label = if tweak & 0x10 != 0 { 0x5 } else { 0 };
        let tc = if tweak & 0x08 != 0 { 0xb8u8 } else { 0 };
        let mut h = vec![0x60 | (tc >> 4), (tc << 4) | label, 0x23, 0x45];
        h.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        h.extend_from_slice(&[f.proto, if tweak & 0x04 != 0 { 63 } else { 64 }]);
        h.extend_from_slice(&[0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h.extend_from_slice(&[0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h
    } else {
        f.id = if tweak & 0x40 != 0 {
            f.id.wrapping_add(u16::from(tweak) + 7) // not the next ID
        } else {
            f.id.wrapping_add(1)
        };
        let total = (20 + l4.len()) as u16;
        let tos = if tweak & 0x08 != 0 { 0xb8 } else { 0 };
        let df = if tweak & 0x20 != 0 { 0 } else { 0x40 };
        let ttl = if tweak & 0x04 != 0 { 63 } else { 64 };
        let mut h = vec![0x45, tos];
        h.extend_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&f.id.to_be_bytes());
        h.extend_from_slice(&[df, 0, ttl, f.proto, 0, 0, 10, 1, 0, 1, 10, 2, 0, 1]);
        h
    };
    p.extend_from_slice(&l4);
    // Checksums, then perhaps one spoiled.
    let h = iph(&p);
    if h == 20 {
        let c = rfc1071(&[&p[..20]]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let at = h + if f.proto == TCP { 16 } else { 6 };
    let c = rfc1071(&[&pseudo(&p, f.proto, p.len() - h), &p[h..]]);
    p[at..at + 2].copy_from_slice(&c.to_be_bytes());
    if tweak & 0x80 != 0 {
        let n = p.len();
        p[n - 1] ^= 0x01; // a payload bit flipped after the checksum
    }
    p
}

/// A packet's connection (protocol, addresses, ports), or None for anything else.
fn conn(p: &[u8]) -> Option<Vec<u8>> {
    let v = *p.first()? >> 4;
    let (h, proto, addrs) = match v {
        4 if p.len() >= 20 && p[0] & 0x0f == 5 => (20, p[9], p.get(12..20)?),
        6 if p.len() >= 40 => (40, p[6], p.get(8..40)?),
        _ => return None,
    };
    if proto != TCP && proto != UDP {
        return None;
    }
    let mut k = vec![v, proto];
    k.extend_from_slice(addrs);
    k.extend_from_slice(p.get(h..h + 4)?);
    Some(k)
}

/// `p` as the cut-back segment may differ from it: IPv4 with DF gets renumbered (ID and
/// so the header checksum).
fn normalised(p: &[u8]) -> Vec<u8> {
    let mut q = p.to_vec();
    if q.len() >= 20 && q[0] == 0x45 && q[6] & 0x40 != 0 {
        q[4..6].fill(0);
        q[10..12].fill(0);
    }
    q
}

/// Cut one written packet back into the packets it stands for.
fn cut(written: &[u8], outs: &mut [Vec<u8>]) -> Vec<Vec<u8>> {
    let hdr = VirtioNetHdr::decode(written).expect("a virtio-net header");
    let mut pkt = written[VIRTIO_NET_HDR_LEN..].to_vec();
    if hdr.gso_type == 0 {
        return vec![pkt];
    }
    let v6 = pkt[0] >> 4 == 6;
    // Completing the checksum as NEEDS_CSUM asks must give a packet that verifies.
    assert_eq!(
        hdr.flags, 1,
        "a joined packet asks for its checksum to be completed"
    );
    let (start, at) = (
        usize::from(hdr.csum_start),
        usize::from(hdr.csum_start + hdr.csum_offset),
    );
    let mut done = pkt.clone();
    let c = rfc1071(&[&done[start..]]);
    done[at..at + 2].copy_from_slice(&c.to_be_bytes());
    let proto = if hdr.gso_type == VIRTIO_NET_HDR_GSO_UDP_L4 {
        UDP
    } else {
        TCP
    };
    assert!(
        checksums_ok(&done, proto),
        "the completed joined packet verifies"
    );
    let mut sizes = vec![0usize; outs.len()];
    let n = tun_rs::gso_split(&mut pkt, hdr, outs, &mut sizes, 0, v6).expect("gso_split");
    let segs: Vec<Vec<u8>> = (0..n).map(|i| outs[i][..sizes[i]].to_vec()).collect();
    for s in &segs {
        assert!(
            checksums_ok(s, proto),
            "every cut segment's checksums verify"
        );
    }
    segs
}

fuzz_target!(|data: &[u8]| {
    let mut g = Gen { data, at: 0 };
    let Some(setup) = g.byte() else { return };
    let udp_gso = setup & 1 != 0;
    let slots = 2 + usize::from(setup >> 1 & 7);
    let mss = [1000usize, 1200, 536, 1448];
    let mut flows: Vec<Flow> = (0..3)
        .map(|i| Flow {
            v6: setup >> (4 + i) & 1 != 0,
            proto: if i == 2 { UDP } else { TCP },
            src_port: 5201 + i as u16,
            seq: 1_000_000 * (i as u32 + 1),
            ack: 77,
            id: 100,
            mss: mss[i],
        })
        .collect();
    let mut input: Vec<Vec<u8>> = Vec::new();
    while input.len() < 200 {
        let Some(c0) = g.byte() else { break };
        let c = [
            c0,
            g.byte().unwrap_or(0),
            g.byte().unwrap_or(0),
            g.byte().unwrap_or(0),
        ];
        let which = usize::from(c0 >> 6);
        if which == 3 {
            // raw bytes from the input: anything at all
            let n = usize::from(c[1]) % 80;
            let end = (g.at + n).min(data.len());
            input.push(data[g.at..end].to_vec());
            g.at = end;
            continue;
        }
        let salt = input.len() as u8;
        input.push(packet(&mut flows[which], c, salt));
    }
    if input.is_empty() {
        return;
    }
    let mut co = Coalescer::new(slots, true, udp_gso);
    let mut written: Vec<Vec<u8>> = Vec::new();
    let mut flush = |co: &mut Coalescer| {
        let refused = co.flush(|b| {
            written.push(b.to_vec());
            true
        });
        assert_eq!(refused, 0);
    };
    for p in &input {
        co.push(p);
        if co.is_full() {
            flush(&mut co);
        }
    }
    flush(&mut co);
    // Segments are at most a header and one MSS (< 4 KiB); at most 65,535 / 536 of them.
    let mut outs = vec![vec![0u8; 4096]; 128];
    let out: Vec<Vec<u8>> = written.iter().flat_map(|w| cut(w, &mut outs)).collect();
    assert_eq!(
        out.len(),
        input.len(),
        "every packet comes back exactly once"
    );
    // Per connection, in order; everything else as a multiset.
    let by_conn = |pkts: &[Vec<u8>]| {
        let mut m: std::collections::BTreeMap<Option<Vec<u8>>, Vec<Vec<u8>>> =
            std::collections::BTreeMap::new();
        for p in pkts {
            m.entry(conn(p)).or_default().push(normalised(p));
        }
        if let Some(v) = m.get_mut(&None) {
            v.sort();
        }
        m
    };
    let (want, got) = (by_conn(&input), by_conn(&out));
    for (k, w) in &want {
        let g = got.get(k).cloned().unwrap_or_default();
        for (i, (a, b)) in w.iter().zip(&g).enumerate() {
            let at = a.iter().zip(b).position(|(x, y)| x != y);
            assert!(
                a == b,
                "connection {k:02x?}, packet {i}: the cut-back packet differs from the input \
                 (lengths {} and {}, first difference at byte {at:?})",
                a.len(),
                b.len()
            );
        }
        assert_eq!(
            w.len(),
            g.len(),
            "connection {k:02x?}: packets lost or added"
        );
    }
});
