//! The one home of `unsafe` in the gateway (with `sys/recv.rs`, recvmmsg's part): the
//! system calls and C structures the data path and start-up need that std, socket2 and
//! tun-rs do not wrap — poll(2), sendmmsg(2)/recvmmsg(2) with their cmsgs (UDP GSO/GRO,
//! receive times), setsockopt(2)/getsockopt(2), write(2) to the TUN device, kill(2) on
//! ourselves, capset(2)/prctl(2), and touching buffer pages. Each `unsafe` block says why
//! it is sound; everything here is a safe API whose raw pointers never outlive the call
//! that uses them, or point into buffers the same value owns.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

use ipsec::MAX_PACKET;
use socket2::SockAddr;

use crate::stats::Io;

mod recv;
pub use recv::{RecvBatch, RECV_BATCH};

/// A zeroed buffer of `len` bytes whose pages are already resident (each written once):
/// the gateway's memory at start is what it keeps, rather than growing as traffic first
/// reaches deeper into its buffers (a fresh zeroed allocation is mapped lazily).
pub fn resident(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for i in (0..len).step_by(4096) {
        // SAFETY: `i < len`: in bounds of the allocation. Volatile, so the write of a zero
        // the allocator already put there is not elided.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
    }
    v
}

/// Socket buffers of SOCKET_BUFFER bytes (beyond net.core.[rw]mem_max: we run as root):
/// a burst must wait in the socket, not be dropped before the worker reads it.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

pub fn big_buffers(fd: RawFd) {
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
        // SAFETY: a valid fd and a pointer to a c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&SOCKET_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            eprintln!(
                "ipsec-gw: warning: cannot enlarge a socket buffer: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// The kernel's receive time on every datagram from now on (SO_TIMESTAMPNS: a control
/// message `RecvBatch::received_at` reads). `false`: refused (said by the caller).
pub fn timestamps(fd: RawFd) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: a valid fd and a pointer to a c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

/// Now on CLOCK_REALTIME (the clock of SO_TIMESTAMPNS), in ns since the epoch.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Whether the kernel offers a UDP socket option (UDP_SEGMENT / UDP_GRO): turn it on
/// (`set`: UDP_GRO) or just ask for it (UDP_SEGMENT, set per send) — as wireguard-go
/// probes its offloads.
pub fn udp_option(fd: RawFd, opt: libc::c_int, set: bool) -> bool {
    let mut v: libc::c_int = 1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd and a pointer to a c_int of the size passed.
    let rc = unsafe {
        if set {
            libc::setsockopt(
                fd,
                libc::SOL_UDP,
                opt,
                (&v as *const libc::c_int).cast(),
                len,
            )
        } else {
            libc::getsockopt(
                fd,
                libc::SOL_UDP,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        }
    };
    rc == 0
}

/// UDP GSO limits: segments per send (the kernel's UDP_MAX_SEGMENTS is 64 before Linux
/// 6.1, 128 after) and UDP payload bytes per send (an IP packet's 65,535 less headers).
const GSO_MAX_SEGMENTS: usize = 64;
const GSO_MAX_BYTES: usize = MAX_PACKET - 40 - 8;

/// One sendmmsg(2) message: `n` consecutive iovecs from `first`, to `addr`. With UDP GSO
/// several ESP packets of `seg` bytes (the last may be shorter) go as one message the
/// kernel cuts into datagrams of `seg` bytes — late, after one trip through the stack.
struct Message {
    addr: SockAddr,
    first: usize,
    n: usize,
    seg: usize,
    bytes: usize,
    /// A shorter packet ended this message: nothing more may join it.
    closed: bool,
}

/// The datagrams of one wakeup for one socket, joined into UDP GSO messages where they
/// can be, and the sendmmsg(2) arrays, kept between wakeups (no allocation once grown).
#[derive(Default)]
pub struct Messages {
    /// Join packets into UDP GSO messages (only for the UDP socket, when the kernel has
    /// UDP_SEGMENT; switched off for good if a GSO send is refused).
    gso: bool,
    msgs: Vec<Message>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// One control buffer per message, for its UDP_SEGMENT cmsg (aligned like cmsghdr).
    ctrl: Vec<[u64; 4]>,
}

impl Messages {
    /// Join datagrams into UDP GSO messages (the UDP socket, when the kernel has
    /// UDP_SEGMENT).
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on;
    }

    /// Send `datagrams` — (address, bytes) — in order with as few sendmmsg(2) calls as
    /// the kernel takes; what is sent and what is refused is counted in `io`. The
    /// iovecs built point into the borrowed datagrams, which outlive this call, and are
    /// cleared before it returns.
    pub fn send_all<'a>(
        &mut self,
        fd: RawFd,
        io: &mut Io,
        datagrams: impl IntoIterator<Item = (&'a SockAddr, &'a [u8])>,
    ) {
        self.clear();
        for (addr, data) in datagrams {
            self.push(addr, data);
        }
        if !self.msgs.is_empty() {
            self.send(fd, io);
        }
        self.clear();
    }

    fn clear(&mut self) {
        self.msgs.clear();
        self.iovs.clear();
        self.hdrs.clear();
    }

    /// One datagram: `data` to `addr`. `data` stays put until `send`: both run inside
    /// one `send_all`, which borrows it.
    fn push(&mut self, addr: &SockAddr, data: &[u8]) {
        let len = data.len();
        self.iovs.push(libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: len,
        });
        if self.gso {
            if let Some(m) = self.msgs.last_mut() {
                if !m.closed
                    && len <= m.seg
                    && m.n < GSO_MAX_SEGMENTS
                    && m.bytes + len <= GSO_MAX_BYTES
                    && m.addr == *addr
                {
                    m.n += 1;
                    m.bytes += len;
                    m.closed = len < m.seg;
                    return;
                }
            }
        }
        self.msgs.push(Message {
            addr: addr.clone(),
            first: self.iovs.len() - 1,
            n: 1,
            seg: len,
            bytes: len,
            closed: false,
        });
    }

    /// sendmmsg(2) until every message has gone or been refused; counts both. A GSO
    /// message the kernel refuses goes again one datagram at a time, and GSO stops.
    fn send(&mut self, fd: RawFd, io: &mut Io) {
        self.hdrs.clear();
        if self.ctrl.len() < self.msgs.len() {
            self.ctrl.resize(self.msgs.len(), [0; 4]);
        }
        for (m, ctrl) in self.msgs.iter().zip(self.ctrl.iter_mut()) {
            // SAFETY: zeroed msghdr/mmsghdr are valid values of the types (null pointers,
            // zero lengths); the fields set below point into `msgs`, `iovs` and `ctrl`,
            // which neither move nor change size until the sendmmsg calls are over.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = m.addr.as_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_namelen = m.addr.len();
            h.msg_hdr.msg_iov = &mut self.iovs[m.first];
            h.msg_hdr.msg_iovlen = m.n;
            if m.n > 1 {
                set_udp_segment(&mut h.msg_hdr, ctrl, m.seg as u16);
            }
            self.hdrs.push(h);
        }
        let mut at = 0;
        while at < self.hdrs.len() {
            let rest = &mut self.hdrs[at..];
            // SAFETY: `rest` is a valid array of `rest.len()` mmsghdr whose name, iovec
            // and control pointers are valid for the call (see above); the kernel writes
            // only msg_len.
            let n = unsafe { libc::sendmmsg(fd, rest.as_mut_ptr(), rest.len() as libc::c_uint, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // The first message was refused. A GSO one the kernel will not cut
                // (EMSGSIZE, EINVAL before Linux 6.x: a segment over the path MTU; EINVAL:
                // no GSO for this route; EIO: no checksum offload) goes again datagram by
                // datagram, and GSO stops for good; otherwise (a full queue, no route)
                // its datagrams are counted lost.
                let m = &self.msgs[at];
                let unsupported = matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EIO | libc::EMSGSIZE)
                );
                if m.n > 1 && unsupported {
                    self.gso = false;
                    eprintln!("ipsec-gw: UDP GSO refused ({e}): one datagram per send from now on");
                    for iov in &self.iovs[m.first..m.first + m.n] {
                        send_one(fd, &m.addr, iov, io);
                    }
                } else {
                    io.send_errors += m.n as u64;
                }
                at += 1;
                continue;
            }
            for (h, m) in rest[..n as usize].iter().zip(&self.msgs[at..]) {
                io.tx_packets += m.n as u64;
                io.tx_bytes += u64::from(h.msg_len);
                io.gso_sends += u64::from(m.n > 1);
            }
            at += n as usize;
        }
    }
}

/// A UDP_SEGMENT control message (UDP GSO, Linux 4.18+: the kernel cuts the payload into
/// datagrams of `seg` bytes) in `ctrl`, attached to `h`.
fn set_udp_segment(h: &mut libc::msghdr, ctrl: &mut [u64; 4], seg: u16) {
    let space = std::mem::size_of_val(ctrl);
    h.msg_control = ctrl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE(2) (24 bytes on 64-bit Linux) fits in `ctrl` (32 bytes, aligned
    // as cmsghdr); CMSG_FIRSTHDR of a msghdr whose control buffer is that large is
    // non-null and points into `ctrl`, as does CMSG_DATA.
    unsafe {
        let len = libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) as usize;
        debug_assert!(len <= space);
        h.msg_controllen = len;
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg);
    }
}

/// One datagram with sendto(2); counted as sent or refused.
fn send_one(fd: RawFd, addr: &SockAddr, iov: &libc::iovec, io: &mut Io) {
    // SAFETY: `iov` points at `iov_len` readable bytes in the worker's buffers; `addr` is
    // a valid socket address of `addr.len()` bytes.
    let n = unsafe { libc::sendto(fd, iov.iov_base, iov.iov_len, 0, addr.as_ptr(), addr.len()) };
    if n < 0 {
        io.send_errors += 1;
    } else {
        io.tx_packets += 1;
        io.tx_bytes += n as u64;
    }
}

/// One write(2) of a whole packet (and its virtio-net header) to the TUN device.
pub fn write_packet(fd: RawFd, b: &[u8]) -> bool {
    loop {
        // SAFETY: `b` is a valid, readable slice of `b.len()` bytes.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n >= 0 {
            return n as usize == b.len();
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// poll(2) on `pfds` for up to `timeout_ms`: how many have events (an interrupted call
/// is an `Interrupted` error).
pub fn poll(pfds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()` pollfd.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Take a socket's pending error (SO_ERROR), clearing it: `None` when `fd` is no socket
/// (the TUN device) or the call fails.
pub fn take_socket_error(fd: RawFd) -> Option<libc::c_int> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_ERROR writes one c_int into `err`, `len` says its size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(err)
}

/// SIGTERM to this process, so the main thread wakes and tears down.
pub fn terminate_self() {
    // SAFETY: kill(2) on our own PID with a valid signal number has no memory effects.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGTERM);
    }
}

/// capset(2), version 3: the calling thread's effective and permitted capabilities 0–31
/// become `keep` (a bit mask), inheritable `inherit`, and 32–63 none.
pub fn capset_keep(keep: u32, inherit: u32) -> io::Result<()> {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0, // this thread
    };
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: inherit,
        },
        CapData::default(), // capabilities 32-63: none
    ];
    // SAFETY: capset(2) reads one header and two data structs of the layout above (the
    // version 3 ABI); both live for the call; pid 0 is the calling thread.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// prctl(PR_SET_NO_NEW_PRIVS): no exec from here on gains privileges.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// flock(2), exclusive and non-blocking: `WouldBlock` when another open file holds it.
/// Held until every descriptor of this open file is closed.
pub fn flock_exclusive(f: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock(2) on a descriptor the borrowed File keeps open; no pointers.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Open `path` for a lock (created 0600, never through a symbolic link) and take an
/// exclusive `flock` on it without waiting: `Err(None)` while another process holds it,
/// `Err(Some(why))` when it cannot be opened or locked.
pub fn try_lock_file(path: &std::path::Path) -> Result<std::fs::File, Option<String>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Some(format!("cannot open {}: {e}", path.display())))?;
    match flock_exclusive(&f) {
        Ok(()) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(None),
        Err(e) => Err(Some(format!("cannot lock {}: {e}", path.display()))),
    }
}

/// The uid and gid of user `name` from the password database (getpwnam(3)), or None
/// when there is no such user. Called before any other thread exists (getpwnam is not
/// thread-safe).
pub fn user_ids(name: &str) -> io::Result<Option<(u32, u32)>> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("a NUL in the name"))?;
    // SAFETY: a valid NUL-terminated string; the returned pointer (static storage, valid
    // until the next getpw* call) is read at once, on this thread only.
    unsafe {
        *libc::__errno_location() = 0;
        let pw = libc::getpwnam(c.as_ptr());
        if pw.is_null() {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(0) | Some(libc::ENOENT) | Some(libc::ESRCH) => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(((*pw).pw_uid, (*pw).pw_gid)))
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// prctl(PR_SET_SECUREBITS, bits): needs CAP_SETPCAP.
pub fn set_securebits(bits: libc::c_ulong) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) })
}

/// prctl(PR_CAPBSET_DROP, cap): take `cap` out of the bounding set (CAP_SETPCAP).
/// EINVAL (a capability this kernel does not know) is no error.
pub fn capbset_drop(cap: u32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap): what `ip` and `nft`, run later by
/// a non-root process, keep across their exec.
pub fn ambient_raise(cap: u32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            cap as libc::c_ulong,
            0,
            0,
        )
    })
}

/// setgroups(0) (no supplementary groups), setgid, setuid — glibc's wrappers, which
/// change every thread of the process.
pub fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups with a zero count reads no pointer; setgid/setuid take integers.
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(gid))?;
        check(libc::setuid(uid))
    }
}

/// Run `f` with the process's file mode creation mask set to `mask`, then put the old
/// one back: a file `f` makes (a Unix socket's `bind`) has no wider mode at any instant,
/// where a `chmod` by path after it could be raced (a symlink put in its place). The
/// mask is the process's: call it only while no other thread makes files (set-up).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    // SAFETY: umask(2) takes a mode and cannot fail.
    let old = unsafe { libc::umask(mask as libc::mode_t) };
    let out = f();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    out
}

/// The path MTU from `local` to `remote` as the kernel knows it for the gateway's own
/// (`mark`ed) outer packets: the route's MTU, the outgoing device's, or a smaller one
/// learned from ICMP (RFC 1191 / RFC 8201). A connected UDP socket asks the routing
/// table the question the outer packets will ask; `IP_MTU` / `IPV6_MTU` answers it
/// (ip(7), ipv6(7)).
pub fn path_mtu(local: IpAddr, remote: IpAddr, mark: u32) -> io::Result<u16> {
    use socket2::{Domain, Socket, Type};
    use std::net::SocketAddr;
    use std::os::fd::AsRawFd;
    let domain = if remote.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, None)?;
    s.set_mark(mark)?;
    s.bind(&SocketAddr::new(local, 0).into())?;
    s.connect(&SocketAddr::new(remote, ipsec::constants::NAT_T_PORT).into())?;
    let (level, opt) = if remote.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut mtu: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `mtu`, an int it owns.
    check(unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&mut mtu as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    // loopback's 65536 does not fit a u16; the TUN's MTU is capped at 9000 anyway
    u16::try_from(mtu.min(libc::c_int::from(u16::MAX)))
        .map_err(|_| io::Error::other(format!("path MTU {mtu} out of range")))
}
