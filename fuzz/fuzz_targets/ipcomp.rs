//! Fuzz IPComp inbound: arbitrary bytes as an IPComp payload and as an IP packet whose
//! payload is IPComp, and arbitrary data compressed then decompressed (which must round
//! trip). Nothing may panic; a bomb or bad data is a named drop.

#![no_main]

use ipsec::{Compressed, IpcompConfig, IpcompSa, PacketBuf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.is_empty() || data.len() > 8192 {
        return;
    }
    let mut rx = IpcompSa::new(IpcompConfig::new(0x1234)).unwrap();
    let mut buf = vec![0u8; 65_536 + data.len()];
    // As a bare IPComp payload, with the CPI forced to match half the time.
    buf[..data.len()].copy_from_slice(data);
    if data[0] & 1 == 1 && data.len() >= 4 {
        buf[2..4].copy_from_slice(&0x1234u16.to_be_bytes());
    }
    let _ = rx.decompress_payload(&mut buf, 0, data.len());
    // As an IP packet.
    buf[..data.len()].copy_from_slice(data);
    if let Ok(mut p) = PacketBuf::new(&mut buf, 0, data.len()) {
        let _ = rx.open(&mut p);
    }
    // Compress then decompress: the payload must come back.
    let mut tx = IpcompSa::new(IpcompConfig {
        min_size: 0,
        ..IpcompConfig::new(0x1234)
    })
    .unwrap();
    buf[..data.len()].copy_from_slice(data);
    if let Ok(Compressed::Yes(n)) = tx.compress_payload(&mut buf, 0, data.len(), 4) {
        let (m, nh) = rx
            .decompress_payload(&mut buf, 0, n)
            .expect("our own output inflates");
        assert_eq!(nh, 4);
        assert_eq!(&buf[..m], data);
    }
});
