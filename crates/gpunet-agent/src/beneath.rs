//! File work that root (or the checkpoint copier, as the job's user) does in directories a job controls (its checkpoint
//! and working directories) or that a job names (a checkpoint tier): every path is opened relative to a directory
//! descriptor with `openat2` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, so no symlink is ever
//! followed and no `..` leaves the directory; each name is checked to be a plain name first; files are checked to be
//! regular files (and not hard links, which could name a file the job may not read) on the opened descriptor, never on
//! a path. Directories are made 0700 and files 0600. Copies stream through a bounded buffer and keep a file's holes
//! ([`copy_sparse`]): a job's sparse file of any claimed size costs the copier neither memory nor disk.

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

pub(crate) const RESOLVE: ResolveFlags =
    ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);
/// Deepest directory tree walked or removed.
const MAX_DEPTH: usize = 64;
/// Most entries walked in one tree.
const MAX_ENTRIES: usize = 100_000;

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

/// Whether `p` is a plain file name: not empty, not `.` or `..`, without `/` or NUL.
pub fn plain_name(p: &str) -> bool {
    !p.is_empty() && p != "." && p != ".." && !p.contains('/') && !p.contains('\0')
}

/// Opens a directory the agent trusts (its data directory, the node's tier root); only the last component must not
/// be a symlink.
pub fn open_trusted(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(path, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty())?)
}

/// Opens the directory `parts` beneath `base` (no symlinks anywhere).
pub fn open_dir(base: &OwnedFd, parts: &[&str]) -> io::Result<OwnedFd> {
    if parts.is_empty() {
        return base.try_clone();
    }
    if !parts.iter().all(|p| plain_name(p)) {
        return Err(invalid("a path part that is not a plain name"));
    }
    let rel = parts.join("/");
    Ok(rustix::fs::openat2(
        base,
        rel.as_str(),
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        RESOLVE,
    )?)
}

/// Makes (0700, owned by `owner` when given) and opens the directories `parts` beneath `base`, one at a time.
pub fn make_dirs(base: &OwnedFd, parts: &[&str], owner: Option<(u32, u32)>) -> io::Result<OwnedFd> {
    let mut cur = base.try_clone()?;
    for p in parts {
        if !plain_name(p) {
            return Err(invalid("a path part that is not a plain name"));
        }
        match rustix::fs::mkdirat(&cur, *p, Mode::from_raw_mode(0o700)) {
            Ok(()) => {
                let d = open_dir(&cur, &[p])?;
                if let Some((u, g)) = owner {
                    rustix::fs::fchown(&d, Some(uid(u)), Some(gid(g)))?;
                }
                cur = d;
            }
            Err(rustix::io::Errno::EXIST) => cur = open_dir(&cur, &[p])?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(cur)
}

fn uid(u: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(u)
}

fn gid(g: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(g)
}

/// A regular file found by [`walk`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Path relative to the walked directory, `/`-separated.
    pub rel: String,
    /// Size in bytes.
    pub len: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, i64),
}

/// What a walk found: regular files, and what it skipped (symlinks, devices, fifos, sockets, hard links, too deep).
#[derive(Debug, Default)]
pub struct Walk {
    /// Regular files, sorted by path.
    pub files: Vec<Entry>,
    /// `path (why)` of everything skipped.
    pub skipped: Vec<String>,
}

/// Lists the regular files beneath `dir` without following any symlink.
pub fn walk(dir: &OwnedFd) -> io::Result<Walk> {
    let mut out = Walk::default();
    let mut stack: Vec<(OwnedFd, String, usize)> = vec![(dir.try_clone()?, String::new(), 0)];
    let mut seen = 0usize;
    while let Some((fd, prefix, depth)) = stack.pop() {
        for e in rustix::fs::Dir::read_from(&fd)? {
            let e = e?;
            let Ok(name) = e.file_name().to_str().map(str::to_string) else {
                out.skipped.push(format!("{prefix}{} (not UTF-8)", e.file_name().to_string_lossy()));
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            seen += 1;
            if seen > MAX_ENTRIES {
                out.skipped.push(format!("{prefix}{name} (over {MAX_ENTRIES} entries)"));
                return Ok(out);
            }
            let rel = format!("{prefix}{name}");
            let st = match rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(_) => continue, // gone meanwhile
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if depth + 1 < MAX_DEPTH => match open_dir(&fd, &[&name]) {
                    Ok(d) => stack.push((d, format!("{rel}/"), depth + 1)),
                    Err(e) => out.skipped.push(format!("{rel} ({e})")),
                },
                FileType::Directory => out.skipped.push(format!("{rel} (deeper than {MAX_DEPTH})")),
                FileType::RegularFile if st.st_nlink > 1 => out.skipped.push(format!("{rel} (a hard link)")),
                FileType::RegularFile => out.files.push(Entry {
                    rel,
                    len: st.st_size as u64,
                    mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
                }),
                FileType::Symlink => out.skipped.push(format!("{rel} (a symlink)")),
                other => out.skipped.push(format!("{rel} (a {other:?})")),
            }
        }
    }
    out.files.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Opens the regular file `rel` beneath `dir` for reading (no symlink, no device or fifo, no hard link).
pub fn open_file(dir: &OwnedFd, rel: &str) -> io::Result<std::fs::File> {
    let parts: Vec<&str> = rel.split('/').collect();
    if !parts.iter().all(|p| plain_name(p)) {
        return Err(invalid("a path part that is not a plain name"));
    }
    let fd = rustix::fs::openat2(
        dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
        RESOLVE,
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink > 1 {
        return Err(invalid("not a regular file of its own"));
    }
    Ok(std::fs::File::from(fd))
}

/// Reads the regular file `rel` beneath `dir` (see [`open_file`]), at most `max` bytes: a longer file is an error.
pub fn read_file(dir: &OwnedFd, rel: &str, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut data = Vec::new();
    // Never sized by the file's own length (a sparse file claims any): it grows with what is read.
    open_file(dir, rel)?.take(max.saturating_add(1)).read_to_end(&mut data)?;
    if data.len() as u64 > max {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, format!("{rel} is over {max} bytes")));
    }
    Ok(data)
}

/// Makes the new file `rel` beneath `dir` (mode 0600, owned by `owner` when given) and its parent directories, and
/// opens it for writing; an existing file of that name is replaced, never written through.
pub fn create_file(dir: &OwnedFd, rel: &str, owner: Option<(u32, u32)>) -> io::Result<std::fs::File> {
    let parts: Vec<&str> = rel.split('/').collect();
    let Some((name, parents)) = parts.split_last() else { return Err(invalid("an empty path")) };
    if !plain_name(name) {
        return Err(invalid("a path part that is not a plain name"));
    }
    let parent = make_dirs(dir, parents, owner)?;
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fd = match rustix::fs::openat2(&parent, *name, flags, Mode::from_raw_mode(0o600), RESOLVE) {
        Err(rustix::io::Errno::EXIST) => {
            remove(&parent, name)?;
            rustix::fs::openat2(&parent, *name, flags, Mode::from_raw_mode(0o600), RESOLVE)?
        }
        r => r?,
    };
    if let Some((u, g)) = owner {
        rustix::fs::fchown(&fd, Some(uid(u)), Some(gid(g)))?;
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600))?;
    Ok(std::fs::File::from(fd))
}

/// Writes `data` to the new file `rel` beneath `dir` (see [`create_file`]).
pub fn write_file(dir: &OwnedFd, rel: &str, data: &[u8], owner: Option<(u32, u32)>) -> io::Result<()> {
    use std::io::Write as _;
    create_file(dir, rel, owner)?.write_all(data)
}

/// The buffer a copy streams through: a copy never holds more of a file in memory.
pub const COPY_BUF: usize = 1 << 20;

/// The error of a copy that would write more than its budget allows.
pub fn over_budget(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::FileTooLarge, format!("{what}: over the snapshot's byte limit"))
}

/// Copies the file `from` into the new file `to` through a [`COPY_BUF`] buffer, keeping its holes: only the data
/// extents (`SEEK_DATA`/`SEEK_HOLE`) are read and written, then the length is set, so a sparse file stays sparse.
/// Each byte written is taken from `budget`; a copy that would exceed it fails with [`over_budget`].
pub fn copy_sparse(from: &std::fs::File, to: &std::fs::File, budget: &mut u64) -> io::Result<()> {
    use rustix::fs::SeekFrom;
    use std::os::unix::fs::FileExt as _;
    let len = from.metadata()?.len();
    let mut buf = vec![0u8; COPY_BUF];
    let mut pos = 0u64;
    'extents: while pos < len {
        let data = match rustix::fs::seek(from, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break, // only a hole is left
            Err(rustix::io::Errno::INVAL) => pos,  // a filesystem without SEEK_DATA: all of it is data
            Err(e) => return Err(e.into()),
        };
        let hole = match rustix::fs::seek(from, SeekFrom::Hole(data)) {
            Ok(h) => h.min(len),
            Err(_) => len,
        };
        let mut at = data;
        while at < hole {
            let want = (hole - at).min(COPY_BUF as u64) as usize;
            let got = from.read_at(&mut buf[..want], at)?;
            if got == 0 {
                break 'extents; // shrunk meanwhile
            }
            if got as u64 > *budget {
                return Err(over_budget("copy"));
            }
            *budget -= got as u64;
            to.write_all_at(&buf[..got], at)?;
            at += got as u64;
        }
        pos = hole.max(data + 1).max(at);
    }
    to.set_len(len)
}

/// Copies the regular file `rel` beneath `src` to the new file `to_rel` beneath `dst` (see [`open_file`],
/// [`create_file`], [`copy_sparse`]).
pub fn copy_file(
    src: &OwnedFd,
    rel: &str,
    dst: &OwnedFd,
    to_rel: &str,
    owner: Option<(u32, u32)>,
    budget: &mut u64,
) -> io::Result<()> {
    let from = open_file(src, rel)?;
    let to = create_file(dst, to_rel, owner)?;
    copy_sparse(&from, &to, budget)
}

/// Names in the directory (not `.`/`..`).
pub fn names(dir: &OwnedFd) -> io::Result<Vec<String>> {
    let mut v = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let e = e?;
        if let Ok(n) = e.file_name().to_str() {
            if n != "." && n != ".." {
                v.push(n.to_string());
            }
        }
    }
    Ok(v)
}

/// Removes `name` from `dir`: a directory with everything in it, anything else (a symlink included) as the entry
/// itself. Never follows a symlink.
pub fn remove(dir: &OwnedFd, name: &str) -> io::Result<()> {
    remove_depth(dir, name, 0)
}

fn remove_depth(dir: &OwnedFd, name: &str, depth: usize) -> io::Result<()> {
    if !plain_name(name) {
        return Err(invalid("a path part that is not a plain name"));
    }
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
        if depth >= MAX_DEPTH {
            return Err(invalid("a directory tree too deep to remove"));
        }
        let sub = open_dir(dir, &[name])?;
        for n in names(&sub)? {
            remove_depth(&sub, &n, depth + 1)?;
        }
        drop(sub);
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    #[test]
    fn walks_and_writes_never_follow_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let src = root.path().join("src");
        let outside = root.path().join("outside");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "root only").unwrap();
        std::fs::write(src.join("state"), "ok").unwrap();
        std::fs::write(src.join("sub/w"), "w").unwrap();
        symlink(outside.join("secret"), src.join("leak")).unwrap();
        symlink(&outside, src.join("dirlink")).unwrap();
        std::fs::hard_link(outside.join("secret"), src.join("hard")).unwrap();
        let fd = open_trusted(&src).unwrap();
        let w = walk(&fd).unwrap();
        let rels: Vec<&str> = w.files.iter().map(|e| e.rel.as_str()).collect();
        assert_eq!(rels, ["state", "sub/w"]);
        assert_eq!(w.skipped.len(), 3, "{:?}", w.skipped);
        assert!(read_file(&fd, "leak", 100).is_err() && read_file(&fd, "dirlink/secret", 100).is_err());
        assert!(read_file(&fd, "hard", 100).is_err(), "a hard link to another file is not read");
        assert!(read_file(&fd, "../outside/secret", 100).is_err());
        assert_eq!(read_file(&fd, "sub/w", 100).unwrap(), b"w");
        assert!(read_file(&fd, "sub/w", 0).is_err(), "over the limit");
        // Writing through a planted symlink (file or directory) replaces the link; the target is untouched.
        write_file(&fd, "leak", b"new", None).unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "root only");
        assert!(write_file(&fd, "dirlink/x", b"x", None).is_err());
        assert!(!outside.join("x").exists());
        let m = std::fs::metadata(src.join("leak")).unwrap();
        assert!(m.is_file() && m.permissions().mode() & 0o777 == 0o600);
        // Removing a tree removes links, not what they point at.
        remove(&fd, "dirlink").unwrap();
        let top = open_trusted(root.path()).unwrap();
        remove(&top, "src").unwrap();
        assert!(!src.exists());
        assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "root only");
        assert!(make_dirs(&top, &[".."], None).is_err());
    }
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    #[test]
    fn a_sparse_file_is_copied_sparse_and_a_budget_is_kept() {
        use std::os::unix::fs::{FileExt as _, MetadataExt as _};
        let root = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(root.path().join("sparse")).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", 1 << 30).unwrap();
        let fd = open_trusted(root.path()).unwrap();
        let mut budget = 1 << 20;
        copy_file(&fd, "sparse", &fd, "copy/sparse", None, &mut budget).unwrap();
        let m = std::fs::metadata(root.path().join("copy/sparse")).unwrap();
        assert_eq!(m.len(), (1 << 30) + 4);
        assert!(m.blocks() * 512 < 1 << 20, "{} blocks", m.blocks());
        let c = std::fs::File::open(root.path().join("copy/sparse")).unwrap();
        let mut b = [0u8; 4];
        c.read_exact_at(&mut b, 1 << 30).unwrap();
        assert_eq!(&b, b"tail");
        assert!(((1 << 20) - 2 * 4096 * 16..1 << 20).contains(&budget), "{budget}");
        let mut small = 2;
        assert!(copy_file(&fd, "sparse", &fd, "copy/again", None, &mut small).is_err());
    }
}
