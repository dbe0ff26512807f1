//! What a gateway holds for its whole life so that no second gateway shares it: its
//! routing table in its network namespace ([`table`]) — the table's nftables guard, rule
//! and blackhole routes (`guard`) are rebuilt by whoever starts on it. (Its sequence
//! state has a lock of its own: `seqstate::lock`.)

use std::fmt;

use crate::config::Config;

/// Why a lock a gateway holds for its whole life (its routing table, [`table`]; its
/// sequence state, `seqstate::lock`) could not be taken — told apart because what to do
/// differs: stop the other gateway, or mend what the system refused.
#[derive(Debug)]
pub enum LockError {
    /// Another gateway holds it: what it holds and what to do.
    Held(String),
    /// It could not be tried (the namespace, the lock's directory or file): why.
    Os(String),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Held(why) | LockError::Os(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for LockError {}

impl From<LockError> for String {
    fn from(e: LockError) -> String {
        e.to_string()
    }
}

/// Where gateways claim their routing tables ([`table`]): root's alone.
pub const LOCK_DIR: &str = "/run/ipsec-gw";

/// Claim the gateway's routing table in this network namespace for as long as the
/// returned file is open (the gateway's life): an exclusive `flock` on
/// `LOCK_DIR/table-N.net-INODE.lock`, INODE naming the namespace (gateways in other
/// namespaces have tables, rules and nftables tables of their own). Refused, saying
/// what to do, while another gateway holds it — its guard (nftables table, rule,
/// blackhole routes) would otherwise be replaced by this one's. The directory must be a
/// real directory of root's that no one else may write (else a local user could plant
/// the lock, or a link in its place).
pub fn table(cfg: &Config) -> Result<std::fs::File, LockError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let ns = std::fs::metadata("/proc/self/ns/net")
        .map_err(|e| {
            LockError::Os(format!(
                "cannot tell this network namespace (/proc/self/ns/net): {e}"
            ))
        })?
        .ino();
    match std::fs::DirBuilder::new().mode(0o700).create(LOCK_DIR) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(LockError::Os(format!("cannot create {LOCK_DIR}: {e}"))),
    }
    let m = std::fs::symlink_metadata(LOCK_DIR)
        .map_err(|e| LockError::Os(format!("cannot read {LOCK_DIR}: {e}")))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(LockError::Os(format!(
            "{LOCK_DIR} is not a directory of root's that only root may write (uid {}, mode \
             {:o}{}): remove it and start again",
            m.uid(),
            m.mode() & 0o7777,
            if m.file_type().is_symlink() {
                ", a symlink"
            } else {
                ""
            }
        )));
    }
    let path = format!("{LOCK_DIR}/table-{}.net-{ns}.lock", cfg.table);
    crate::sys::try_lock_file(std::path::Path::new(&path)).map_err(|e| match e {
        Some(why) => LockError::Os(why),
        None => LockError::Held(format!(
            "another ipsec-gw runs on routing table {} in this network namespace (it \
                 holds {path}; its guard is nftables table inet {}): two gateways on one \
                 table would replace each other's guard — give each its own `table`",
            cfg.table,
            crate::guard::table_name(cfg)
        )),
    })
}
