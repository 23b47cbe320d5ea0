//! Dropping root for good in a helper process the agent started (the checkpoint copier, [`crate::copier`]): no
//! supplementary groups, then the gid, then the uid (real, effective and saved), checked afterwards — the ids read
//! back, and getting root back (`setuid(0)`, `setgid(0)`) fails. The process is also made non-dumpable, so that
//! other processes of the same user (the job's) can neither ptrace it nor read its `/proc/PID/environ`, `mem` or
//! `fd/`: it may hold secrets (S3 credentials) that the job must not see.
//!
//! Must run while the process has a single thread: the ids are changed with the C library's calls, which change
//! every thread, but nothing may run as root meanwhile.

use nix::unistd::{Gid, Uid};

/// What went wrong while dropping privileges (the process must then stop: it may still be root).
#[derive(Debug, thiserror::Error)]
pub enum DropError {
    /// The target is root itself.
    #[error("invalid identity {uid}:{gid}: the copier never runs as root (uid or gid 0)")]
    Root {
        /// Uid asked for.
        uid: u32,
        /// Gid asked for.
        gid: u32,
    },
    /// A call failed.
    #[error("failed to {step}")]
    Call {
        /// Which call.
        step: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ids read back are not the ones asked for, or root could be regained.
    #[error("failed to drop privileges: {0}")]
    Check(String),
}

fn call<T>(step: &'static str, r: Result<T, nix::Error>) -> Result<T, DropError> {
    r.map_err(|e| DropError::Call { step, source: std::io::Error::from(e) })
}

/// Makes this process non-dumpable (no ptrace, no `/proc/PID/{environ,mem,fd}` for processes of the same user).
pub fn non_dumpable() -> Result<(), DropError> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| DropError::Call { step: "make the process non-dumpable", source: e.into() })
}

/// Whether this process is dumpable.
pub fn dumpable() -> bool {
    !matches!(rustix::process::dumpable_behavior(), Ok(rustix::process::DumpableBehavior::NotDumpable))
}

/// Becomes `uid`:`gid` with no supplementary groups, for good, and non-dumpable. See the module's doc.
pub fn drop_to(uid: u32, gid: u32) -> Result<(), DropError> {
    if uid == 0 || gid == 0 {
        return Err(DropError::Root { uid, gid });
    }
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(|e| DropError::Call { step: "count this process's threads", source: e })?
        .count();
    if threads != 1 {
        return Err(DropError::Check(format!("{threads} threads: privileges are dropped with one thread only")));
    }
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    non_dumpable()?;
    call("drop the supplementary groups (setgroups)", nix::unistd::setgroups(&[]))?;
    call("set the gid (setresgid)", nix::unistd::setresgid(g, g, g))?;
    call("set the uid (setresuid)", nix::unistd::setresuid(u, u, u))?;
    // The kernel clears "dumpable" on a change of ids; set it again all the same, then check everything.
    non_dumpable()?;
    let ru = call("read the uids back", nix::unistd::getresuid())?;
    let rg = call("read the gids back", nix::unistd::getresgid())?;
    if [ru.real, ru.effective, ru.saved] != [u; 3] || [rg.real, rg.effective, rg.saved] != [g; 3] {
        return Err(DropError::Check(format!(
            "ids are uid {}/{}/{} gid {}/{}/{}, not {uid}:{gid}",
            ru.real, ru.effective, ru.saved, rg.real, rg.effective, rg.saved
        )));
    }
    let groups = call("read the groups back", nix::unistd::getgroups())?;
    if groups.iter().any(|x| *x != g) {
        return Err(DropError::Check(format!("supplementary groups left: {groups:?}")));
    }
    if nix::unistd::setuid(Uid::from_raw(0)).is_ok() || nix::unistd::setgid(Gid::from_raw(0)).is_ok() {
        return Err(DropError::Check("root could be regained".into()));
    }
    if dumpable() {
        return Err(DropError::Check("the process is still dumpable".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_never_a_target() {
        // (A real drop would change this test process's ids: `crates/gpunet/tests/checkpoint_copier.rs` checks it
        // in copier processes.)
        assert!(matches!(drop_to(0, 1000), Err(DropError::Root { .. })));
        assert!(matches!(drop_to(1000, 0), Err(DropError::Root { .. })));
    }
}
