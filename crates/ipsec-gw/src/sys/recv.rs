//! recvmmsg(2) for the inbound worker, with its control messages (UDP GRO's segment size,
//! the kernel's receive time): part of `sys`, the gateway's one home of `unsafe` (in a
//! file of its own for length).
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

use ipsec::{HEADROOM, MAX_PACKET, TAILROOM};

use super::resident;

/// A datagram's control buffer: twice what UDP_GRO's and SCM_TIMESTAMPNS's messages take.
const CTRL_BYTES: usize = 128;
const _: () = assert!(
    CTRL_BYTES >= 2 * (16 + 8 + 16 + 16),
    "CMSG_SPACE(4) + CMSG_SPACE(16), twice"
);

/// Datagrams taken per recvmmsg(2).
pub const RECV_BATCH: usize = 16;

/// recvmmsg(2) arrays: each datagram lands after HEADROOM in its own buffer, so the
/// engine can put an IP header before it (UDP and raw IPv6 give no header) and open it in
/// place. Kept for the worker's life: nothing is allocated per packet.
pub struct RecvBatch {
    pub bufs: Vec<Vec<u8>>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Per datagram, room for its control messages: UDP_GRO (the segment size, 24 bytes
    /// with its header) and SCM_TIMESTAMPNS (a timespec, 32) — with room to spare, so a
    /// message added later cannot push UDP_GRO's out (CTRL_BYTES), aligned.
    ctrl: Vec<[u64; CTRL_BYTES / 8]>,
}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBatch {
    pub fn new() -> RecvBatch {
        RecvBatch {
            bufs: (0..RECV_BATCH)
                .map(|_| resident(HEADROOM + MAX_PACKET + TAILROOM))
                .collect(),
            // SAFETY: all-zero bytes are a valid sockaddr_storage (plain integers).
            addrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            // SAFETY: a zeroed iovec is a null pointer and length 0, a valid value.
            iovs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            // SAFETY: a zeroed mmsghdr holds null pointers and zero lengths, a valid value.
            hdrs: vec![unsafe { std::mem::zeroed() }; RECV_BATCH],
            ctrl: vec![[0; CTRL_BYTES / 8]; RECV_BATCH],
        }
    }

    /// Take what is queued on `fd`, up to RECV_BATCH datagrams, without blocking: how
    /// many (0 when none). Datagram `i` is in `bufs[i][HEADROOM..HEADROOM + len(i)]`.
    pub fn recv(&mut self, fd: RawFd) -> usize {
        for i in 0..RECV_BATCH {
            let b = &mut self.bufs[i][HEADROOM..HEADROOM + MAX_PACKET];
            self.iovs[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
            // SAFETY: zeroed mmsghdr is valid; the pointers set point into `self`'s
            // vectors, which neither move nor change size while the call runs.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.ctrl[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = std::mem::size_of_val(&self.ctrl[i]);
            self.hdrs[i] = h;
        }
        loop {
            // SAFETY: `hdrs` holds RECV_BATCH valid mmsghdr (see above); the kernel writes
            // at most iov_len bytes into each buffer and msg_namelen into each address.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    RECV_BATCH as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                return n as usize;
            }
            if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return 0; // EAGAIN: drained (or an error the next poll will show again)
            }
        }
    }

    pub fn len(&self, i: usize) -> usize {
        self.hdrs[i].msg_len as usize
    }

    pub fn source(&self, i: usize) -> Option<IpAddr> {
        sockaddr_ip(&self.addrs[i])
    }

    /// When the kernel received datagram `i` (CLOCK_REALTIME, ns), on a socket with
    /// `timestamps` on (an SCM_TIMESTAMPNS control message).
    pub fn received_at(&self, i: usize) -> Option<u64> {
        let d = self.control(i, libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS)?;
        if d.len() < std::mem::size_of::<libc::timespec>() {
            return None;
        }
        // SAFETY: `d` holds a whole timespec (checked above), read unaligned.
        let ts = unsafe { std::ptr::read_unaligned(d.as_ptr().cast::<libc::timespec>()) };
        let s = u64::try_from(ts.tv_sec).ok()?;
        let ns = u64::try_from(ts.tv_nsec).ok()?;
        s.checked_mul(1_000_000_000)?.checked_add(ns)
    }

    /// UDP GRO: the size of the segments datagram `i` was coalesced from, when the kernel
    /// coalesced it (a UDP_GRO control message, an int; Linux 5.0+).
    pub fn gro_segment(&self, i: usize) -> Option<usize> {
        let size = match *self.control(i, libc::SOL_UDP, libc::UDP_GRO)? {
            [a, b, c, d, ..] => usize::try_from(i32::from_ne_bytes([a, b, c, d])).ok()?,
            [a, b] => usize::from(u16::from_ne_bytes([a, b])),
            _ => return None,
        };
        (size > 0).then_some(size)
    }

    /// The data of datagram `i`'s first control message of `level` and `kind`, as the
    /// kernel wrote it.
    fn control(&self, i: usize, level: i32, kind: i32) -> Option<&[u8]> {
        let h = &self.hdrs[i].msg_hdr;
        let end = (h.msg_control as usize).saturating_add(h.msg_controllen);
        // SAFETY: after recvmmsg, `h`'s control pointer and length describe what the
        // kernel wrote into `self.ctrl[i]`, which `self` owns; CMSG_FIRSTHDR/NXTHDR
        // return only headers that lie within it (null past its end); a message's data
        // starts at CMSG_DATA and holds cmsg_len - CMSG_LEN(0) bytes, here also bounded
        // by the buffer's end.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            while !c.is_null() {
                if (*c).cmsg_level == level && (*c).cmsg_type == kind {
                    let p = libc::CMSG_DATA(c);
                    let len = ((*c).cmsg_len as usize)
                        .saturating_sub(libc::CMSG_LEN(0) as usize)
                        .min(end.saturating_sub(p as usize));
                    return Some(std::slice::from_raw_parts(p, len));
                }
                c = libc::CMSG_NXTHDR(h, c);
            }
        }
        None
    }
}

/// The address of a sockaddr the kernel filled in (IPv4 or IPv6), if it is one.
fn sockaddr_ip(from: &libc::sockaddr_storage) -> Option<IpAddr> {
    match i32::from(from.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET) into `from`.
            let a =
                unsafe { &*(from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(IpAddr::from(a.sin_addr.s_addr.to_ne_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6) into `from`.
            let a =
                unsafe { &*(from as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(IpAddr::from(a.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// The batch's datagrams from `rx`, waiting (bounded) until the first comes.
    fn take(b: &mut RecvBatch, rx: &UdpSocket) -> usize {
        for _ in 0..1000 {
            let n = b.recv(rx.as_raw_fd());
            if n > 0 {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("nothing came in a second");
    }

    #[test]
    fn a_datagram_comes_with_its_source_and_receive_time_and_a_coalesced_one_with_its_segment_size()
    {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut b = RecvBatch::new();
        assert!(crate::sys::timestamps(rx.as_raw_fd()));
        let before = crate::sys::realtime_ns();
        tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
        assert_eq!(take(&mut b, &rx), 1);
        let after = crate::sys::realtime_ns();
        assert_eq!(&b.bufs[0][HEADROOM..HEADROOM + b.len(0)], b"hello");
        assert_eq!(b.source(0), Some(IpAddr::from([127, 0, 0, 1])));
        let at = b.received_at(0).expect("SCM_TIMESTAMPNS");
        assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
        assert_eq!(b.gro_segment(0), None); // nothing coalesced

        // three 100-byte segments sent as one (UDP_SEGMENT), taken whole by a socket
        // with UDP_GRO on: one datagram of 300 bytes, its segment size said
        assert!(crate::sys::udp_option(rx.as_raw_fd(), libc::UDP_GRO, true));
        let seg: libc::c_int = 100;
        // SAFETY: a valid fd and a pointer to a c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                tx.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_SEGMENT,
                (&seg as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        let data: Vec<u8> = (0..300u16).map(|i| i as u8).collect();
        tx.send_to(&data, rx.local_addr().unwrap()).unwrap();
        assert_eq!(take(&mut b, &rx), 1);
        assert_eq!(&b.bufs[0][HEADROOM..HEADROOM + b.len(0)], &data[..]);
        assert_eq!(b.gro_segment(0), Some(100));
        assert!(b.received_at(0).is_some()); // both messages found in one buffer
    }
}
