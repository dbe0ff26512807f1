//! Least privilege: the gateway keeps only the capabilities its data path and its own
//! set-up need — CAP_NET_ADMIN (the TUN device, routes and rules, SO_MARK, forced socket
//! buffers) and CAP_NET_RAW (raw ESP/AH sockets) — and sets `no_new_privs`, so nothing
//! it runs (`ip`) can gain more. A bug in the packet path then cannot read or write
//! files root alone may (CAP_DAC_OVERRIDE), load modules, trace processes, and so on.
//!
//! Done first thing, before any file, device or socket is made, so every step of the
//! start-up — the sequence state written, the TUN device created — is proven to work
//! without the rest: a gateway that starts keeps running with what it has.
//!
//! Hand-written: capset(2) is one system call with two plain structs (the `caps` crate
//! would be a dependency for 30 lines). Capabilities are per thread: called on the main
//! thread before any other is spawned, every thread has the same set.

/// capset(2)'s header, `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`: one per 32 capabilities (version 3 takes two).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;

/// Keep CAP_NET_ADMIN and CAP_NET_RAW (effective and permitted; nothing inheritable)
/// and set no_new_privs. An error names what failed.
pub fn drop_to_net_admin_and_raw() -> Result<(), String> {
    let keep = (1u32 << CAP_NET_ADMIN) | (1u32 << CAP_NET_RAW);
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0, // this thread
    };
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: 0,
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
        return Err(format!(
            "cannot drop capabilities to CAP_NET_ADMIN and CAP_NET_RAW: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(format!(
            "cannot set no_new_privs: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
