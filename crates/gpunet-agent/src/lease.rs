//! Fencing a frozen agent from outside it: the node's lease.
//!
//! The server gives a silent node's tasks to other nodes once it has not heard from the node for its fence time
//! (the sync answer's `fence_after_ms`; the node is lost after `lost_after_ms`, and its tasks are held for the rest).
//! An agent that cannot reach the server stops its tasks itself a little before that (self-fencing, in
//! [`crate::run`]), but an agent that is frozen (`SIGSTOP`, a debugger, a livelock) stops nothing, and the same job
//! would run twice: here and wherever the server restarted it.
//!
//! So the agent also writes, after each sync, until when its tasks may run: the file `lease` in its data directory
//! holds the point (milliseconds of `CLOCK_BOOTTIME`, which counts a suspended machine's time too, and is the same for
//! every process of the machine) at which self-fencing would start, counted from when the sync was sent (the server
//! counts from when it arrived), and the grace until the server gives the tasks away, as `DEADLINE GRACE`, or
//! `none` while the server gives no fence time. Every task's wrapper — a process of its own, which runs on while the
//! agent is frozen — reads it about once a second ([`Fence::tick`]). Past the deadline it stops its task as the agent
//! would: `SIGTERM` to the task's group, and at the end of the grace `SIGKILL` to the task's init and to every
//! process in its cgroups. A task therefore ends before the server gives its GPUs away whether or not its agent is
//! alive.
//!
//! The file is root's (the data directory is), opened without following symbolic links, and rewritten in place with
//! one write of a fixed-width line (no new file or block to allocate where the filesystem writes in place); the line
//! carries a check of its numbers, so a reader that sees it half rewritten reads no lease and looks again. A missing, unreadable or `none` lease fences nothing:
//! a node whose server gives no fence time is not fenced by time at all, as before.

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The length of the lease file's one line.
const LINE: usize = 59;

/// The lease file's name in the agent's data directory.
pub const FILE: &str = "lease";

/// Milliseconds of `CLOCK_BOOTTIME`: monotonic, the same in every process of the machine, and counting suspension.
pub fn now_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(t) => t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000,
        Err(_) => 0,
    }
}

/// What the lease says: tasks may run until `deadline_ms` (of [`now_ms`]), then get `grace_ms` to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub deadline_ms: u64,
    pub grace_ms: u64,
}

impl Lease {
    /// A check of the two numbers: a line read while it was being rewritten (in place) does not pass it.
    fn check(deadline_ms: u64, grace_ms: u64) -> u64 {
        (deadline_ms ^ grace_ms.rotate_left(32) ^ 0x6770_756e_6574_6c65).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// The file's line: fixed width (59 bytes), so that every renewal overwrites the whole of the last one in place.
    fn to_line(l: Option<Lease>) -> String {
        match l {
            Some(l) => {
                format!("{:020} {:020} {:016x}\n", l.deadline_ms, l.grace_ms, Lease::check(l.deadline_ms, l.grace_ms))
            }
            None => format!("{:<58}\n", "none"),
        }
    }

    /// Reads a lease line; `None` for `none` and anything that is not two numbers and their check.
    pub fn parse(text: &str) -> Option<Lease> {
        let mut it = text.split_whitespace();
        let deadline_ms = it.next()?.parse().ok()?;
        let grace_ms = it.next()?.parse().ok()?;
        let check = u64::from_str_radix(it.next()?, 16).ok()?;
        (it.next().is_none() && check == Lease::check(deadline_ms, grace_ms)).then_some(Lease { deadline_ms, grace_ms })
    }
}

/// Reads the lease at `path` (without following a symbolic link); `None`: nothing to fence by.
pub fn read(path: &Path) -> Option<Lease> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_NOFOLLOW).open(path).ok()?;
    let mut text = String::new();
    f.by_ref().take(128).read_to_string(&mut text).ok()?;
    Lease::parse(&text)
}

/// The agent's side: renews the lease after each sync.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    written: Option<Option<Lease>>,
}

impl Writer {
    pub fn new(data_dir: &Path) -> Writer {
        Writer { path: data_dir.join(FILE), written: None }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// After a sync at `synced_ms` (of [`now_ms`]): tasks may run until `at` later, then get `grace` to end
    /// (`fence`; `None`: the server gives no fence time). The file is rewritten only when the deadline moved by at
    /// least a tenth of `at` (at most 1 s), so a busy agent writes it a few times a second at most.
    pub fn renew(&mut self, synced_ms: u64, fence: Option<(Duration, Duration)>) -> std::io::Result<()> {
        let lease = fence.map(|(at, grace)| Lease {
            deadline_ms: synced_ms + at.as_millis() as u64,
            grace_ms: grace.as_millis() as u64,
        });
        let step = fence.map_or(0, |(at, _)| (at.as_millis() as u64 / 10).min(1000));
        let fresh = match (self.written, lease) {
            (Some(Some(old)), Some(new)) => {
                new.grace_ms != old.grace_ms
                    || new.deadline_ms < old.deadline_ms
                    || new.deadline_ms - old.deadline_ms >= step
            }
            (Some(old), new) => old != new,
            (None, _) => true,
        };
        if !fresh {
            return Ok(());
        }
        let write = || -> std::io::Result<()> {
            use std::io::{Seek as _, Write as _};
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&self.path)?;
            f.seek(std::io::SeekFrom::Start(0))?;
            f.write_all(Lease::to_line(lease).as_bytes())?;
            f.set_len(LINE as u64) // a file left longer (by anyone) ends with the line
        };
        if let Err(e) = write() {
            self.written = None; // written again at the next renewal, whatever it says
            return Err(e);
        }
        self.written = Some(lease);
        Ok(())
    }
}

/// The wrapper's side: watches the lease at `path` and, once it has run out, stops the task as the agent would (see
/// the module's doc): `SIGTERM` to this process's group (the task's: the wrapper's forwarded signals reach the
/// task), then, at the end of the grace, `SIGKILL` to `init` (the task's init, or a container's first process: with
/// a PID namespace that ends every process in it) and to every process in the groups of the `cgroup.procs` files
/// `procs` and the groups beneath them (a container's) but this one — or, with neither cgroups nor a PID namespace, to this process's whole group, the wrapper
/// included. Not a second SIGTERM when the task was asked to stop already (the agent's stop). The wrapper
/// calls [`Fence::tick`] while it waits for its task, between reads of its socket or signals (no thread: a process
/// that unshared a PID namespace cannot start one, and a thread would count against the task's pids limit).
#[derive(Debug)]
pub(crate) struct Fence {
    path: PathBuf,
    init: Pid,
    procs: Vec<PathBuf>,
    /// SIGKILL goes to the whole group, the wrapper included (no cgroups and no PID namespace: nothing else reaches
    /// what the task started).
    whole_group: bool,
    /// The lease that ran out, once the task was sent SIGTERM.
    ran_out: Option<Lease>,
    /// The task was already asked to stop (the agent's SIGTERM, passed on): ours would be a second one.
    asked: bool,
}

impl Fence {
    /// `namespace`: `init` is PID 1 of the task's own PID namespace (killing it ends everything in it).
    pub(crate) fn new(path: PathBuf, init: Pid, procs: Vec<PathBuf>, namespace: bool) -> Fence {
        let whole_group = procs.is_empty() && !namespace;
        Fence { path, init, procs, whole_group, ran_out: None, asked: false }
    }

    /// The task was asked to stop by someone else (a SIGTERM the wrapper passed on).
    pub(crate) fn asked_to_stop(&mut self) {
        self.asked = true;
    }

    /// Looks at the lease and acts on it; returns when to look again (at least 1 ms, at most 1 s from now).
    pub(crate) fn tick(&mut self) -> Duration {
        let now = now_ms();
        let Some(l) = self.ran_out else {
            return match read(&self.path) {
                Some(l) if now >= l.deadline_ms => {
                    // The signal first: the message goes to the task's log, which may block. Not a second SIGTERM
                    // when the agent's (a live agent fences too) reached the group already: it is pending here.
                    if !self.asked && !term_pending() {
                        let _ = killpg(nix::unistd::getpgrp(), Signal::SIGTERM);
                    }
                    self.ran_out = Some(l);
                    eprintln!(
                        "gpunet: the server has not heard from this node's agent for too long: the task is stopped \
                         here before the server gives it to another node (fencing)"
                    );
                    Duration::from_millis(1)
                }
                Some(l) => Duration::from_millis((l.deadline_ms - now).clamp(100, 1000)),
                None => Duration::from_secs(1),
            };
        };
        let end = l.deadline_ms.saturating_add(l.grace_ms);
        if now < end {
            return Duration::from_millis((end - now).clamp(1, 200));
        }
        // SIGKILL, again on every look until the task's end ends the wait.
        if self.whole_group {
            let _ = killpg(nix::unistd::getpgrp(), Signal::SIGKILL);
        }
        let _ = kill(self.init, Signal::SIGKILL);
        let me = std::process::id() as i32;
        for pid in crate::cgroups::pids_in(&self.procs).into_iter().filter(|&p| p != me) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        Duration::from_millis(100)
    }
}

/// Whether a SIGTERM is pending for this process (blocked, as the wrapper's forwarded signals are): `SigPnd` or
/// `ShdPnd` of `/proc/self/status`.
fn term_pending() -> bool {
    term_pending_in(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())
}

fn term_pending_in(status: &str) -> bool {
    let bit = 1u64 << (Signal::SIGTERM as i32 - 1);
    status.lines().any(|l| {
        (l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            && l.split_whitespace().nth(1).and_then(|h| u64::from_str_radix(h, 16).ok()).is_some_and(|m| m & bit != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_lines_round_trip_and_anything_else_fences_nothing() {
        let l = Lease { deadline_ms: 123_456, grace_ms: 10_000 };
        assert_eq!(Lease::parse(&Lease::to_line(Some(l))), Some(l));
        for bad in ["none\n", "", "12", "12 x", "-1 5", "1 2 3", "123456 10000"] {
            assert_eq!(Lease::parse(bad), None, "{bad:?}");
        }
        // A line read half rewritten: the old deadline's first digits, the new one's last (both still numbers).
        let (old, new) = (
            Lease::to_line(Some(Lease { deadline_ms: 999_999, grace_ms: 10_000 })),
            Lease::to_line(Some(Lease { deadline_ms: 1_000_999, grace_ms: 10_000 })),
        );
        let torn = format!("{}{}", &old[..16], &new[16..]);
        assert_ne!(torn, old);
        assert_eq!(Lease::parse(&torn), None, "{torn:?}");
        assert_eq!(Lease::to_line(None).len(), Lease::to_line(Some(l)).len());
    }

    #[test]
    fn the_lease_is_renewed_in_steps_in_place_and_never_read_or_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::new(dir.path());
        assert_eq!(read(w.path()), None, "no lease yet");
        let f = Some((Duration::from_secs(50), Duration::from_secs(10)));
        w.renew(1_000, f).unwrap();
        assert_eq!(read(w.path()), Some(Lease { deadline_ms: 51_000, grace_ms: 10_000 }));
        assert_eq!(std::fs::read(w.path()).unwrap().len(), 59, "one fixed-width line");
        // A later sync within the step (a tenth of 50 s, at most 1 s) leaves the file as it is.
        w.renew(1_500, f).unwrap();
        assert_eq!(read(w.path()).unwrap().deadline_ms, 51_000);
        use std::os::unix::fs::MetadataExt as _;
        let inode = std::fs::metadata(w.path()).unwrap().ino();
        w.renew(2_000, f).unwrap();
        assert_eq!(read(w.path()).unwrap().deadline_ms, 52_000);
        assert_eq!(std::fs::metadata(w.path()).unwrap().ino(), inode, "the same file, rewritten in place");
        // The server stops giving a fence time: nothing is fenced.
        w.renew(3_000, None).unwrap();
        assert_eq!(std::fs::read_to_string(w.path()).unwrap().trim(), "none");
        assert_eq!(std::fs::read(w.path()).unwrap().len(), 59, "overwritten whole, in place");
        assert_eq!(read(w.path()), None);
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(w.path()).unwrap().permissions().mode() & 0o777, 0o600);
        // A link planted in its place is not followed by the reader.
        let target = dir.path().join("target");
        std::fs::write(&target, Lease::to_line(Some(Lease { deadline_ms: 1, grace_ms: 1 }))).unwrap();
        std::fs::remove_file(w.path()).unwrap();
        std::os::unix::fs::symlink(&target, w.path()).unwrap();
        assert_eq!(read(w.path()), None);
        // …nor written through by the agent.
        assert!(w.renew(9_000, f).is_err());
        assert_eq!(read_text(&target), Lease::to_line(Some(Lease { deadline_ms: 1, grace_ms: 1 })));
    }

    fn read_text(p: &Path) -> String {
        std::fs::read_to_string(p).unwrap()
    }

    #[test]
    fn a_pending_sigterm_is_seen_in_either_pending_set() {
        let status =
            |sig: &str, shd: &str| format!("Name:\tx\nSigPnd:\t{sig}\nShdPnd:\t{shd}\nSigBlk:\t0000000000004000\n");
        assert!(!term_pending_in(&status("0000000000000000", "0000000000000000")));
        assert!(term_pending_in(&status("0000000000000000", "0000000000004000")), "SIGTERM is bit 14");
        assert!(term_pending_in(&status("0000000000004002", "0000000000000000")));
        assert!(!term_pending_in(&status("0000000000000002", "0000000000000100")), "SIGINT, SIGKILL");
        // This test process has none.
        assert!(!term_pending());
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ms();
        std::thread::sleep(Duration::from_millis(20));
        assert!(now_ms() >= a + 15);
    }
}
