//! TUN → SPD → seal → outside.

use std::io;

use ipsec::engine::Outbound;
use ipsec::{PacketBuf, HEADROOM, TAILROOM};
use tun_rs::SyncDevice;

use super::crew::{Crew, JobSlot};
use super::crypto::{seal, seal_deferred};
use super::outside::{Outside, SendBatch};
use super::sas::DirEngine;
use super::tun_queue::AutoQueue;
use super::BATCH;
use crate::stats::Io;
use crate::sys::resident;
use ipsec::MAX_PACKET;

/// virtio_net_hdr's gso_type bit for ECN (include/uapi/linux/virtio_net.h), beside the type.
const GSO_ECN: u8 = 0x80;

/// TUN → SPD → seal → outside: the outbound direction's buffers and counters, kept for
/// the worker's life. The TUN device is non-blocking: each wakeup drains it and the worker
/// polls only when it is empty. With offloads (IFF_VNET_HDR), one read may bring a TCP or
/// UDP super-packet of up to 64 KiB, which tun-rs splits into MTU-sized packets (as the
/// kernel would have before handing them over one read each).
pub(super) struct OutboundPath {
    original: Vec<u8>,
    bufs: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    batch: SendBatch,
    /// With several crypto workers: the crew, and each slot's job (`crew.rs`).
    crew: Option<Crew>,
    jobs: Vec<JobSlot>,
    pub(super) io: Io,
    /// `tun_queue = "auto"`: the device's queue set by what is read (`tun_queue.rs`).
    queue: Option<AutoQueue>,
}

impl OutboundPath {
    pub(super) fn new(
        mtu: u16,
        outside: &Outside,
        crew: Option<Crew>,
        auto_queue: bool,
    ) -> OutboundPath {
        let slots = tun_rs::IDEAL_BATCH_SIZE;
        let size = HEADROOM + usize::from(mtu) + TAILROOM + 64;
        let mut batch = SendBatch::default();
        batch.udp.set_gso(outside.udp_gso);
        OutboundPath {
            original: resident(tun_rs::VIRTIO_NET_HDR_LEN + MAX_PACKET),
            bufs: (0..slots).map(|_| resident(size)).collect(),
            sizes: vec![0usize; slots],
            batch,
            crew,
            jobs: vec![None; slots],
            io: Io::default(),
            queue: auto_queue.then(|| AutoQueue::new(std::time::Instant::now())),
        }
    }

    /// Up to BATCH reads from the TUN device, each read's packets sealed and sent
    /// together. `Err`: the device failed (the worker stops).
    pub(super) fn drain(
        &mut self,
        tun: &SyncDevice,
        engine: &mut DirEngine,
        outside: &Outside,
    ) -> io::Result<()> {
        let io = &mut self.io;
        for _ in 0..BATCH {
            let n = match tun.recv_multiple(
                &mut self.original,
                &mut self.bufs,
                &mut self.sizes,
                HEADROOM,
            ) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if let Some(q) = &mut self.queue {
                // a super-packet (split into n) brings its virtio header first: a TCP
                // one is TCP's bulk (gso_type, ECN bit aside)
                let gso = self.original[1] & !GSO_ECN;
                let tcp = n > 1
                    && (gso == tun_rs::VIRTIO_NET_HDR_GSO_TCPV4
                        || gso == tun_rs::VIRTIO_NET_HDR_GSO_TCPV6);
                q.read(self.sizes[..n].iter().sum::<usize>() as u64, tcp);
            }
            let batch = &mut self.batch;
            for (b, (buf, &len)) in self.bufs.iter_mut().zip(&self.sizes).take(n).enumerate() {
                io.rx_packets += 1;
                io.rx_bytes += len as u64;
                let Ok(mut pkt) = PacketBuf::new(buf, HEADROOM, len) else {
                    // longer than a slot (tun-rs split it wrongly): named, counted
                    engine.count_drop(None, ipsec::DropReason::TooBig);
                    continue;
                };
                let sealed = match self.crew {
                    Some(_) => seal_deferred(engine, &mut pkt),
                    None => seal(engine, &mut pkt).map(|o| (o, None)),
                };
                match sealed {
                    Ok((Outbound::Sealed { sa }, job)) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                        self.jobs[b] = job.map(|j| (sa, j, Ok(())));
                        // its number is inside the reservation made before (half a
                        // block ahead): a failed write stops the SA for the next ones
                        let _ = engine.after(sa);
                    }
                    Ok((Outbound::SealedBundle { bundle }, _)) => {
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                        let _ = engine.after_bundle(bundle);
                    }
                    Ok((Outbound::Bypass, _)) => {
                        io.bypassed += 1;
                        batch.pkts.push((b, pkt.head(), pkt.len()));
                    }
                    Err(_) => {} // a named drop, counted by the engine
                }
            }
            if let Some(crew) = &self.crew {
                let n = n.min(self.bufs.len());
                crew.run(engine, &mut self.bufs[..n], &mut self.jobs[..n], true);
                failed_out(engine, batch, &mut self.jobs[..n]);
            }
            outside.send_batch(batch, &self.bufs, io);
        }
        Ok(())
    }

    /// `tun_queue = "auto"`, between wakeups (so also once the traffic has stopped), at a
    /// window's end: the device's queue changed when the reads call for another. A change
    /// the kernel refuses (never seen; tun-rs opens a socket for each) is said once and
    /// asked again at the next window's end: the queue is never left short for good.
    pub(super) fn set_queue(&mut self, tun: &SyncDevice) {
        let Some(q) = &mut self.queue else { return };
        let Some(len) = q.due(std::time::Instant::now()) else {
            return;
        };
        match tun.set_tx_queue_len(len) {
            Ok(()) => {
                q.len = len;
                self.io.tun_queue_changes += 1;
            }
            Err(e) => {
                if !q.refused {
                    eprintln!(
                        "ipsec-gw: warning: cannot set the TUN queue to {len} packets \
                         (tun_queue = \"auto\"): {e}; it stays {}, asked again each window",
                        q.len
                    );
                }
                q.refused = true;
            }
        }
    }
}

/// After the crew: a packet whose cryptography failed (the library refused; never
/// seen) does not go — counted on its SA — and every slot is emptied for the next read.
fn failed_out(engine: &mut DirEngine, batch: &mut SendBatch, jobs: &mut [JobSlot]) {
    for (b, slot) in jobs.iter_mut().enumerate() {
        if let Some((sa, _, Err(d))) = slot.take() {
            engine.count_drop(Some(sa), d);
            batch.pkts.retain(|&(slot, _, _)| slot != b);
        }
    }
}
