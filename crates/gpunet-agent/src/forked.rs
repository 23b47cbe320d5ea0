//! The task wrapper's init is forked, not executed (see [`crate::wrapper`]): an exec of the `gpunet` binary — 34 MB,
//! some 43,000 relocations, glibc's CPU feature probing, which traps to the hypervisor in a VM — cost a few
//! milliseconds of CPU for every task and probe; bench e2e drained 300 jobs 10–15% faster without it.
//!
//! The wrapper itself is forked too, by the task spawner (see [`crate::spawner`]), for the same reason.
//!
//! `fork` is `unsafe` because a child of a multi-threaded process may find locks held by threads it does not have.
//! The wrapper and the spawner have one thread: `gpunet task-exec` and `gpunet task-spawner` run before anything
//! else in `main` (no runtime, no logging thread), and nothing in them starts a thread.
#![allow(unsafe_code)]

use nix::unistd::{fork, ForkResult, Pid};

/// Forks the init; `None` in the child, which closes `wrapper_end` (the wrapper's end of their socket pair, so that
/// the wrapper sees EOF once the init is gone). Refused unless this process has one thread (checked in `/proc`).
pub(crate) fn fork_init(wrapper_end: &std::os::unix::net::UnixStream) -> Result<Option<Pid>, String> {
    use std::os::fd::AsRawFd as _;
    let forked = fork_single()?;
    if forked.is_none() {
        let _ = nix::unistd::close(wrapper_end.as_raw_fd());
    }
    Ok(forked)
}

/// Forks this process: `None` in the child. Refused unless this process has one thread (checked in `/proc`): the
/// task wrapper (for its init) and the task spawner (`crate::spawner`, for each wrapper) call it.
pub(crate) fn fork_single() -> Result<Option<Pid>, String> {
    let threads =
        std::fs::read_dir("/proc/self/task").map_err(|e| format!("count this process's threads: {e}"))?.count();
    if threads != 1 {
        return Err(format!("this process has {threads} threads: it forks only with one"));
    }
    // SAFETY: the calling process has one thread (checked above), so the child inherits no lock another thread
    // held, and it goes on running ordinary Rust code.
    match unsafe { fork() }.map_err(|e| format!("fork: {e}"))? {
        ForkResult::Parent { child } => Ok(Some(child)),
        ForkResult::Child => Ok(None),
    }
}
