//! How much of the node's disk a task uses: its own directory (`HOME`), its job's checkpoint directory, its log, a
//! container's writable layer and volumes (the overlay's upper directory, `emptyDir`s), and the files its processes
//! hold open after deleting them. The directories are walked as root without following any symbolic link (every
//! directory is opened beneath its parent's descriptor with `openat2` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`,
//! every entry is `statat`ed with `AT_SYMLINK_NOFOLLOW`, names need not be UTF-8), so a link planted by the job can
//! neither hide what it wrote nor make the agent count (or walk) anything else. The walk holds one open directory
//! per level and no names, and stops as soon as the tree has more entries or levels than the node allows: a tree
//! built to be slow or costly to walk is itself over the limit. Space is what the filesystem allocated
//! (`st_blocks`), so a sparse file counts what it really holds. Deleted files still open are found through
//! `/proc/PID/fd` of every process in the task's cgroups (those on the node's disk: the data directory's device).
//!
//! A walk is not a snapshot: a job that keeps moving data between directories as the walk passes can hide it from
//! one walk (filesystem project quotas would close that; they need a filesystem mounted for them). And a task can
//! write until the next measure: at most `--task-disk-check-s`, or six times that when walks are slow.
//!
//! The launcher measures each task every few seconds (see [`next_check`]) and stops a task over its limit like one
//! over its time limit; see `Launcher::attach_extras`.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default most bytes one task may use on its node (`gpunet agent --task-disk-max`).
pub const DEFAULT_TASK_DISK_MAX: u64 = 100 << 30;
/// The default most entries (files, directories, links) one task may have on its node (`--task-files-max`).
pub const DEFAULT_TASK_FILES_MAX: u64 = 1_000_000;
/// Deepest directory level a task may make in the directories measured.
pub const MAX_DEPTH: usize = 256;

/// What [`measure`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes the filesystem allocated to everything measured (`st_blocks` × 512), directories included.
    pub bytes: u64,
    /// Entries beneath the measured directories (files, directories, links, anything), the files measured included.
    pub entries: u64,
    /// Deepest level seen (entries directly in a measured directory are level 1).
    pub depth: usize,
}

/// A task's limits on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub bytes: u64,
    pub entries: u64,
}

impl Usage {
    /// Why this usage is over `l`, in words (`None`: within).
    pub fn over(&self, l: &Limits) -> Option<String> {
        if self.bytes > l.bytes {
            Some(format!(
                "exceeded its disk limit of {} (its directory, checkpoints and log on the node use {} or more)",
                size(l.bytes),
                size(self.bytes)
            ))
        } else if self.entries > l.entries {
            Some(format!("exceeded its disk limit of {} files and directories on the node", l.entries))
        } else if self.depth > MAX_DEPTH {
            Some(format!("exceeded its disk limit: directories nested deeper than {MAX_DEPTH} levels on the node"))
        } else {
            None
        }
    }
}

/// `1.5Gi`, `64Mi`, `512Ki`, `17B`.
pub fn size(bytes: u64) -> String {
    let units = [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (u, m) in units {
        if bytes >= m {
            let v = bytes as f64 / m as f64;
            return if bytes.is_multiple_of(m) { format!("{}{u}", bytes / m) } else { format!("{v:.1}{u}") };
        }
    }
    format!("{bytes}B")
}

/// What counts for one task (see [`task_paths`]).
#[derive(Debug, Clone, Default)]
pub struct Paths {
    /// Directories walked, the task's own.
    pub dirs: Vec<PathBuf>,
    /// Directories walked that the job's `share` tasks on the node share (its checkpoint directory): each task is
    /// charged its share of them.
    pub shared: Vec<PathBuf>,
    /// How many tasks share `shared` (at least 1).
    pub share: u64,
    /// Files counted (never followed if links).
    pub files: Vec<PathBuf>,
    /// The task's `cgroup.procs` files: the deleted open files of their processes, and of those in groups beneath
    /// them (a container's), count.
    pub procs: Vec<PathBuf>,
}

/// One measure at a time on a node: a walk holds a descriptor per level (up to [`MAX_DEPTH`]), and the agent's own
/// descriptors must not run out.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Most descriptors of a task's processes looked at in one measure (a task may hold many open files; each costs a
/// `readlink`).
pub const MAX_FDS_SCANNED: usize = 100_000;

/// Adds up what `p` names (missing directories and files count nothing). Stops once over `l` (the figures then say
/// by what, at least). An error (out of descriptors or memory) fails the measure rather than count less.
pub fn measure(p: &Paths, l: &Limits) -> io::Result<Usage> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut w = Walker::default();
    for f in &p.files {
        if let Ok(st) = rustix::fs::lstat(f.as_path()) {
            w.u.bytes += st.st_blocks as u64 * 512;
            w.u.entries += 1;
        }
    }
    w.u.bytes += deleted_open(&p.procs);
    for d in &p.dirs {
        if w.u.over(l).is_some() {
            return Ok(w.u);
        }
        if let Ok(fd) = crate::beneath::open_trusted(d) {
            w.walk(fd, l)?;
        }
    }
    // The shared directories: walked apart, with the limits scaled up by the share, then charged by the share.
    let share = p.share.max(1);
    let mut shared = Walker { seen: std::mem::take(&mut w.seen), ..Walker::default() };
    let scaled = Limits { bytes: l.bytes.saturating_mul(share), entries: l.entries.saturating_mul(share) };
    for d in &p.shared {
        if shared.u.over(&scaled).is_some() {
            break;
        }
        if let Ok(fd) = crate::beneath::open_trusted(d) {
            shared.walk(fd, &scaled)?;
        }
    }
    w.u.bytes += shared.u.bytes / share;
    w.u.entries += shared.u.entries / share;
    w.u.depth = w.u.depth.max(shared.u.depth);
    Ok(w.u)
}

/// `TMPFS_MAGIC`: files there are memory, charged to the task's memory limit, not disk.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Bytes allocated to regular files, not on a tmpfs, that the processes in the groups of `procs` (and the groups
/// beneath them) hold open and that have no name left; each file once, at most [`MAX_FDS_SCANNED`] descriptors.
fn deleted_open(procs: &[PathBuf]) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut scanned) = (0, 0);
    for pid in crate::cgroups::pids_in(procs) {
        {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
            for fd in fds.flatten() {
                scanned += 1;
                if scanned > MAX_FDS_SCANNED {
                    return bytes;
                }
                // The link's text ends with " (deleted)" for such a file; its metadata is the open file's.
                let deleted = std::fs::read_link(fd.path())
                    .is_ok_and(|t| t.as_os_str().as_encoded_bytes().ends_with(b" (deleted)"));
                if !deleted {
                    continue;
                }
                let Ok(st) = rustix::fs::stat(fd.path()) else { continue };
                let on_tmpfs = rustix::fs::statfs(fd.path()).is_ok_and(|f| f.f_type == TMPFS_MAGIC);
                if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
                    && st.st_nlink == 0
                    && !on_tmpfs
                    && seen.insert((st.st_dev, st.st_ino))
                {
                    bytes += st.st_blocks as u64 * 512;
                }
            }
        }
    }
    bytes
}

/// A walk's figures, and the files with more than one name already counted (each counts once).
#[derive(Default)]
struct Walker {
    u: Usage,
    seen: std::collections::HashSet<(u64, u64)>,
}

impl Walker {
    /// Walks the tree of `top` depth first, one open directory per level.
    fn walk(&mut self, top: OwnedFd, l: &Limits) -> io::Result<()> {
        use rustix::io::Errno;
        if let Ok(st) = rustix::fs::fstat(&top) {
            self.u.bytes += st.st_blocks as u64 * 512;
        }
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mut stack = vec![rustix::fs::Dir::new(top)?];
        loop {
            let depth = stack.len();
            let Some(dir) = stack.last_mut() else { break };
            if self.u.over(l).is_some() {
                return Ok(());
            }
            let entry = match dir.read() {
                Some(Ok(e)) => e,
                // The end of this directory, or one removed while it was read.
                Some(Err(Errno::NOENT)) | None => {
                    stack.pop();
                    continue;
                }
                Some(Err(e)) => return Err(e.into()),
            };
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            self.u.entries += 1;
            self.u.depth = self.u.depth.max(depth);
            let fd = dir.fd()?;
            // Gone since it was listed: nothing to count.
            let Ok(st) = rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if is_dir || st.st_nlink <= 1 || self.seen.insert((st.st_dev, st.st_ino)) {
                self.u.bytes += st.st_blocks as u64 * 512;
            }
            if !is_dir {
                continue;
            }
            match rustix::fs::openat2(fd, name, flags, Mode::empty(), crate::beneath::RESOLVE) {
                Ok(sub) => stack.push(rustix::fs::Dir::new(sub)?),
                // Gone, or replaced by a link (not followed), since it was listed: nothing to count there.
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::XDEV | Errno::AGAIN) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// When to measure again after a walk that took `took`: every `every`, or twenty times the walk's time if longer
/// (so measuring a task costs its node about 5% of one core at most), but at least every six `every`s (a tree
/// whose walk takes over a second and a half then costs more).
pub fn next_check(every: Duration, took: Duration) -> Duration {
    every.max(took * 20).min(every * 6)
}

/// What counts for a task: its own directory and log, its share of its job's checkpoint directory (`share`: the
/// job's tasks on this node), and its processes' deleted open files; see [`Paths`].
pub fn task_paths(home: &Path, checkpoints: &Path, log: &Path, share: u64, procs: Vec<PathBuf>) -> Paths {
    Paths {
        dirs: vec![home.to_path_buf()],
        shared: vec![checkpoints.to_path_buf()],
        share: share.max(1),
        files: vec![log.to_path_buf()],
        procs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt as _;

    const WIDE: Limits = Limits { bytes: u64::MAX, entries: u64::MAX };

    fn dirs(dirs: &[&Path], files: &[&Path]) -> Paths {
        Paths {
            dirs: dirs.iter().map(|d| d.to_path_buf()).collect(),
            files: files.iter().map(|f| f.to_path_buf()).collect(),
            share: 1,
            ..Paths::default()
        }
    }

    /// Bytes that no filesystem compresses away (zeros take no blocks on a compressing one).
    fn noise(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn usage_counts_allocated_bytes_and_entries_beneath_never_through_a_link() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        std::fs::create_dir_all(home.join("a/b")).unwrap();
        std::fs::write(home.join("a/b/data"), noise(1 << 20)).unwrap();
        // A name that is not UTF-8 hides nothing.
        let odd = home.join(std::ffi::OsStr::from_bytes(b"\xff\xfe"));
        std::fs::create_dir(&odd).unwrap();
        std::fs::write(odd.join("more"), noise(1 << 20)).unwrap();
        // A sparse file counts what it holds, not what it claims.
        let f = std::fs::File::create(home.join("sparse")).unwrap();
        f.set_len(1 << 40).unwrap();
        // Links to elsewhere count as links, never what they point at.
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("big"), vec![0u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, home.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("big"), home.join("file-link")).unwrap();
        let log = d.path().join("log");
        std::fs::write(&log, noise(1 << 20)).unwrap();
        let u = measure(&dirs(&[&home], &[&log]), &WIDE).unwrap();
        // a, a/b, a/b/data, the odd dir, more, sparse, link, file-link, and the log.
        assert_eq!(u.entries, 9, "{u:?}");
        assert_eq!(u.depth, 3, "{u:?}");
        assert!(u.bytes >= 3 << 20 && u.bytes < (3 << 20) + (1 << 20), "{u:?}");
        assert_eq!(u.over(&WIDE), None);
        // A link in place of a measured directory is not followed either.
        let planted = d.path().join("planted");
        std::os::unix::fs::symlink(&outside, &planted).unwrap();
        assert_eq!(measure(&dirs(&[&planted], &[]), &WIDE).unwrap(), Usage::default());
    }

    #[test]
    fn a_walk_stops_once_over_the_limits_and_says_which() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        for i in 0..50 {
            std::fs::write(home.join(format!("f{i}")), noise(64 << 10)).unwrap();
        }
        let by_bytes = Limits { bytes: 1 << 20, entries: u64::MAX };
        let u = measure(&dirs(&[&home], &[]), &by_bytes).unwrap();
        assert!(u.entries < 50, "stopped early: {u:?}");
        assert!(u.over(&by_bytes).unwrap().contains("disk limit of 1Mi"), "{:?}", u.over(&by_bytes));
        let by_entries = Limits { bytes: u64::MAX, entries: 10 };
        let u = measure(&dirs(&[&home], &[]), &by_entries).unwrap();
        assert_eq!(u.entries, 11, "{u:?}");
        assert!(u.over(&by_entries).unwrap().contains("10 files and directories"));
        // Deep nesting is over the limit by itself, found without walking further.
        let mut p = d.path().join("deep");
        for _ in 0..(MAX_DEPTH + 5) {
            p = p.join("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        let u = measure(&dirs(&[&d.path().join("deep")], &[]), &WIDE).unwrap();
        assert_eq!(u.depth, MAX_DEPTH + 1, "{u:?}");
        assert!(u.over(&WIDE).unwrap().contains("deeper than 256"));
    }

    #[test]
    fn a_deleted_file_a_process_holds_open_counts_once_and_not_on_a_tmpfs() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("gone");
        std::fs::write(&f, noise(2 << 20)).unwrap();
        // A child holds it open (twice: its input and its output), nameless; a cgroup.procs-like file lists it.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::fs::File::open(&f).unwrap())
            .stdout(std::fs::OpenOptions::new().append(true).open(&f).unwrap())
            .spawn()
            .unwrap();
        std::fs::remove_file(&f).unwrap();
        let procs = d.path().join("procs");
        std::fs::write(&procs, format!("{}\n", child.id())).unwrap();
        let p = Paths { procs: vec![procs.clone()], share: 1, ..Paths::default() };
        let u = measure(&p, &WIDE).unwrap();
        let on_tmpfs = rustix::fs::statfs(d.path()).unwrap().f_type as i64 == TMPFS_MAGIC;
        if on_tmpfs {
            assert_eq!(u.bytes, 0, "a tmpfs file is memory: {u:?}");
        } else {
            assert!(u.bytes >= 2 << 20 && u.bytes < 3 << 20, "counted once: {u:?}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(measure(&p, &WIDE).unwrap().bytes, 0, "closed: gone");
    }

    #[test]
    fn a_file_with_two_names_counts_once_and_a_shared_directory_by_its_share() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("a"), noise(1 << 20)).unwrap();
        std::fs::hard_link(home.join("a"), home.join("b")).unwrap();
        let one = measure(&dirs(&[&home], &[]), &WIDE).unwrap();
        assert!(one.bytes < (1 << 20) + (64 << 10), "{one:?}");
        assert_eq!(one.entries, 2);
        // The job's checkpoint directory, shared by 4 tasks on the node: each is charged a quarter.
        let ckpt = d.path().join("ckpt");
        std::fs::create_dir(&ckpt).unwrap();
        std::fs::write(ckpt.join("state"), noise(4 << 20)).unwrap();
        let p = Paths { shared: vec![ckpt], share: 4, ..Paths::default() };
        let u = measure(&p, &WIDE).unwrap();
        assert!(u.bytes >= 1 << 20 && u.bytes < (1 << 20) + (64 << 10), "{u:?}");
    }

    #[test]
    fn sizes_and_check_intervals() {
        assert_eq!(size(64 << 20), "64Mi");
        assert_eq!(size(3 << 29), "1.5Gi");
        assert_eq!(size(17), "17B");
        assert_eq!(next_check(Duration::from_secs(5), Duration::from_millis(10)), Duration::from_secs(5));
        assert_eq!(next_check(Duration::from_secs(5), Duration::from_secs(1)), Duration::from_secs(20));
        assert_eq!(next_check(Duration::from_secs(5), Duration::from_secs(10)), Duration::from_secs(30));
    }
}
