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
//! would be a dependency for 30 lines); the call is in [`crate::sys`]. Capabilities are per thread: called on the main
//! thread before any other is spawned, every thread has the same set.

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;

/// Keep CAP_NET_ADMIN and CAP_NET_RAW (effective and permitted; nothing inheritable)
/// and set no_new_privs. An error names what failed.
pub fn drop_to_net_admin_and_raw() -> Result<(), String> {
    let keep = (1u32 << CAP_NET_ADMIN) | (1u32 << CAP_NET_RAW);
    crate::sys::capset_keep(keep)
        .map_err(|e| format!("cannot drop capabilities to CAP_NET_ADMIN and CAP_NET_RAW: {e}"))?;
    crate::sys::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))
}
