//! Descriptors a process inherited are not handed on: every `gpunet` process (the agent, the task wrapper, its
//! init, the checkpoint copier) marks each descriptor above 2 that it inherited close-on-exec before it does
//! anything else, so a task starts with exactly its standard input, output and error. Without it, whatever
//! launched the agent leaks into every task: `(exec 7</root/secret; gpunet agent …)` let a tenant's `cat <&7` read a
//! root-only file.
//!
//! Every descriptor Rust's standard library and tokio open is close-on-exec already; this is for the inherited ones,
//! which no safe API can name (a `BorrowedFd` of a raw number is `unsafe` to make, and neither `nix` nor `rustix`
//! offers `close_range` without it): one `fcntl(F_SETFD)` per descriptor, and for the task spawner, which forks
//! without executing, a close of each ([`close_inherited`]); with `devfilter`'s `bpf(2)` calls and `forked`'s
//! `fork`, the agent's only `unsafe`.
#![allow(unsafe_code)]

use std::os::fd::{BorrowedFd, FromRawFd as _, RawFd};

/// Marks every open descriptor above 2 close-on-exec. Call it first thing, while the process has one thread (no
/// descriptor can be closed and reused under it). Returns the descriptors it marked (for the log).
pub fn cloexec_inherited() -> Vec<RawFd> {
    // Listed first, then marked: the listing's own descriptor is closed by the time the loop runs.
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(|fd| *fd > 2).collect(),
        Err(_) => (3..1024).collect(), // no /proc: the usual soft limit's range
    };
    let mut marked = Vec::new();
    for fd in fds {
        // SAFETY: `fd` is only borrowed for two fcntl calls on this (single) thread; if it is not open (the
        // listing's own, now closed) they fail with EBADF and nothing else happens.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        if let Ok(flags) = rustix::io::fcntl_getfd(b) {
            if !flags.contains(rustix::io::FdFlags::CLOEXEC)
                && rustix::io::fcntl_setfd(b, flags | rustix::io::FdFlags::CLOEXEC).is_ok()
            {
                marked.push(fd);
            }
        }
    }
    marked
}

/// Closes every open descriptor above 2. For the task spawner (`crate::spawner`), whose children are forks, not
/// executions: close-on-exec would not keep an inherited descriptor from them. Call it while the process has one
/// thread.
pub fn close_inherited() {
    let fds: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(|fd| *fd > 2).collect(),
        Err(_) => (3..1024).collect(),
    };
    for fd in fds {
        // SAFETY: nothing else in this (single-threaded) process uses `fd`: it is closed here once; one that is not
        // open (the listing's own, closed by now) fails with EBADF, which closing ignores.
        if rustix::io::fcntl_getfd(unsafe { BorrowedFd::borrow_raw(fd) }).is_ok() {
            // SAFETY: as above; the descriptor is open and owned by nothing else.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn an_inherited_descriptor_is_marked_close_on_exec() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let b = f.try_clone().unwrap();
        // Clear the flag the standard library set, as if the descriptor had been inherited.
        rustix::io::fcntl_setfd(&b, rustix::io::FdFlags::empty()).unwrap();
        assert!(cloexec_inherited().contains(&b.as_raw_fd()));
        assert!(rustix::io::fcntl_getfd(&b).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
        drop(f);
    }
}
