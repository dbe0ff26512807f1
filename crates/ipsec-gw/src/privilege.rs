//! Least privilege, in two steps, as strongSwan's charon does with `charon.user`.
//!
//! 1. [`limit_for_setup`], first thing: keep only what the set-up needs — CAP_NET_ADMIN
//!    (the TUN device, routes and rules, nftables, SO_MARK, forced socket buffers),
//!    CAP_NET_RAW (raw ESP/AH sockets), and CAP_SETUID, CAP_SETGID and CAP_SETPCAP for
//!    step 2 — and set `no_new_privs`, so nothing it runs (`ip`, `nft`) gains more.
//! 2. [`become_user`], once the TUN device, sockets, routes, the guard, the state files
//!    (opened and locked) and the stats socket exist, before any other thread does:
//!    lock `SECBIT_NOROOT` (uid 0 gains nothing by being 0, ever again), drop every
//!    other capability from the bounding set, switch to the configured user
//!    (`[gateway] user`, default `ipsec-gw`, a system user the Makefile creates) with no
//!    supplementary groups, and keep CAP_NET_ADMIN and CAP_NET_RAW only — CAP_NET_ADMIN
//!    also ambient, so the `ip` and `nft` a reload runs keep it. A compromised data path
//!    then holds no uid 0: root's files (`/etc/passwd`, cron) are not writable to it.
//!
//! With `user = "root"` step 2 only drops the bounding set and the setup capabilities.
//!
//! Hand-written: capset(2) and prctl(2) are single system calls with plain arguments (the
//! `caps` crate would be a dependency for 30 lines); the calls are in [`crate::sys`].

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_NET_RAW: u32 = 13;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
const CAP_SETPCAP: u32 = 8;

/// The capabilities a running gateway keeps.
pub const KEEP: u32 = (1 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW);

// securebits (linux/securebits.h)
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_KEEP_CAPS: libc::c_ulong = 1 << 4;

/// Step 1: the set-up's capabilities only, and no_new_privs.
pub fn limit_for_setup() -> Result<(), String> {
    let setup = KEEP | (1 << CAP_SETUID) | (1 << CAP_SETGID) | (1 << CAP_SETPCAP);
    crate::sys::capset_keep(setup, 0)
        .map_err(|e| format!("cannot drop capabilities to those the set-up needs: {e}"))?;
    crate::sys::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))
}

/// The uid and gid of `[gateway] user`, looked up before anything is made (None: root,
/// stay uid 0).
pub fn lookup(user: &str) -> Result<Option<(u32, u32)>, String> {
    if user == "root" {
        return Ok(None);
    }
    match crate::sys::user_ids(user) {
        Ok(Some((0, _))) => Err(format!(
            "user {user:?} is uid 0: name an unprivileged user, or \"root\" to stay root"
        )),
        Ok(Some(ids)) => Ok(Some(ids)),
        Ok(None) => Err(format!(
            "no user {user:?} on this host: create it (`make` does: useradd --system \
             --no-create-home --shell /usr/sbin/nologin {user}) or set gateway.user"
        )),
        Err(e) => Err(format!("cannot look up user {user:?}: {e}")),
    }
}

/// Step 2: the bounding set cut to [`KEEP`], then (unless `ids` is None) the switch to
/// that user with SECBIT_NOROOT locked, keeping CAP_NET_ADMIN and CAP_NET_RAW.
pub fn become_user(ids: Option<(u32, u32)>) -> Result<(), String> {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(63);
    for cap in (0..=last).filter(|c| KEEP & (1u32.checked_shl(*c).unwrap_or(0)) == 0) {
        crate::sys::capbset_drop(cap)
            .map_err(|e| format!("cannot drop capability {cap} from the bounding set: {e}"))?;
    }
    if let Some((uid, gid)) = ids {
        // permitted capabilities survive the uid change (KEEP_CAPS); NOROOT, locked: no
        // exec ever regains root's capabilities by being uid 0
        crate::sys::set_securebits(SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_KEEP_CAPS)
            .map_err(|e| format!("cannot set securebits: {e}"))?;
        crate::sys::become_user(uid, gid)
            .map_err(|e| format!("cannot switch to uid {uid}, gid {gid}: {e}"))?;
    }
    crate::sys::capset_keep(KEEP, 1 << CAP_NET_ADMIN)
        .map_err(|e| format!("cannot keep CAP_NET_ADMIN and CAP_NET_RAW: {e}"))?;
    crate::sys::ambient_raise(CAP_NET_ADMIN)
        .map_err(|e| format!("cannot make CAP_NET_ADMIN ambient: {e}"))
}
