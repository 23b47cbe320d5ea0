//! The checkpoint copier: `gpunet checkpoint-copy`, a short-lived process that takes one snapshot of a job's
//! checkpoint directory to a tier (and prunes the tier) or restores the newest snapshot, as the job's own user.
//!
//! Why a process: the agent is root and multi-threaded, so it can neither change its ids for one copy nor `fork()`.
//! When tasks run as their tenant's user (`--tenant-uids` or `--run-as`, the agent root), every copy is done by a
//! fresh copier process (the agent's own binary, [`How::Child`]):
//! 1. The agent starts it with an empty environment, in its own process group, with the request (a JSON document,
//!    S3 credentials included) on stdin: nothing of it on the command line or in the environment, where the job's
//!    processes could read it (`/proc/PID/cmdline` is world-readable).
//! 2. The copier makes itself non-dumpable, reads the request, and — still root — opens what it works beneath: the
//!    job's checkpoint directory, and per tier the tier's directory (made root's, 0700, where missing) and beneath it
//!    the job's own directory `job-J`, made 0700 and owned by the job's user (an existing one must be the job's
//!    user's). Every open goes through [`crate::beneath`] (no symlink followed). This is the only work done as root;
//!    the tier's own directory (e.g. `/srv/ckpt/{tenant}`, what the admin configured) is created by it as root's
//!    0700 when missing — the tenant's jobs reach their own `job-J` through the held descriptor and need no right
//!    on it, and one tenant's user never owns a directory another tenant's job could be given.
//! 3. It drops to the job's uid and gid for good ([`crate::identity::drop_to`]: no groups, gid, uid, checked, still
//!    non-dumpable), then copies: every file is read and written with the job's rights, so a file the job could not
//!    read (a root-only file placed in its checkpoint directory) fails with EACCES and is skipped and reported like a
//!    symlink, and everything it writes (snapshot directories 0700, files 0600, restored files) is the job's user's.
//! 4. It writes one JSON line ([`Reply`]) on stdout and exits. A watchdog thread ends it at the request's deadline;
//!    the agent also waits at most that long (plus a little) and kills it otherwise (`kill_on_drop`), and a
//!    parent-death signal (SIGKILL, set after the drop) ends it with the agent. (That signal follows the thread that
//!    started the copier: a tokio worker, which lives as long as the agent's runtime.)
//!
//! The copier is in no cgroup of the task's: the final copy runs after the attempt's cgroup was emptied and removed,
//! and a copy must not count against (or be killed by) the task's memory limit. It is bounded instead: in memory by
//! streaming every file through one [`crate::beneath::COPY_BUF`] buffer (an object-store upload holds at most two
//! parts; the reply says its peak RSS), in disk by keeping holes and by the snapshot's byte limit
//! ([`Request::max_bytes`], the agent's `--checkpoint-snapshot-max-bytes`), in time by its deadline; and it never
//! outlives the attempt: the periodic copies stop when the task ends, and the final copy is
//! awaited before the end is reported.
//!
//! Without per-tenant identities (the agent not root, or neither `--tenant-uids` nor `--run-as`) there is no user to
//! drop to, and the copy runs in the agent's process ([`How::InProcess`]), still only through [`crate::beneath`].

use crate::checkpoints;
use gpunet_api::agent::{CheckpointTier, TaskRef};
use serde::{Deserialize, Serialize};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The hidden subcommand of the `gpunet` binary that runs the copier.
pub const SUBCOMMAND: &str = "checkpoint-copy";

/// How long one copy may take (the copier's deadline).
pub const COPY_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Largest request read from stdin.
const MAX_REQUEST: u64 = 1 << 20;

/// Most skipped entries reported (the names are the job's: a directory full of symlinks must not make the reply
/// huge).
const MAX_SKIPPED: usize = 100;

/// What the copier does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Work {
    /// Copy the checkpoint directory to `tier` as the snapshot `at_ms`, then prune the tier.
    Snapshot {
        /// The tier.
        tier: CheckpointTier,
        /// The snapshot's timestamp.
        at_ms: u64,
    },
    /// Restore the newest snapshot of any of `tiers` into the checkpoint directory.
    Restore {
        /// The tiers.
        tiers: Vec<CheckpointTier>,
    },
}

/// The copier's input (its stdin).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// What to do.
    pub work: Work,
    /// Whose checkpoint.
    pub task: TaskRef,
    /// The job's checkpoint directory (read by a snapshot, written by a restore).
    pub dir: PathBuf,
    /// Where tiers without a URL live on this node.
    pub local_root: PathBuf,
    /// The job's uid and gid.
    pub user: (u32, u32),
    /// The agent's `AWS_*` settings (S3 credentials: never logged, never on a command line).
    pub aws: Vec<(String, String)>,
    /// The copier's deadline, from its start.
    pub timeout_ms: u64,
    /// The most bytes a snapshot may write (see [`checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES`]).
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
}

fn default_max_bytes() -> u64 {
    checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES
}

/// This process's peak resident memory in KiB (`VmHWM` of `/proc/self/status`; 0 where unknown).
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse().ok()))
        .unwrap_or(0)
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("work", &self.work)
            .field("task", &self.task)
            .field("dir", &self.dir)
            .field("user", &self.user)
            .field("aws", &self.aws.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The copier's answer (one JSON line on its stdout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// A snapshot was taken; what was skipped (at most [`MAX_SKIPPED`], then a count).
    Copied {
        /// `path (why)`.
        skipped: Vec<String>,
        /// The copier's peak resident memory (KiB, `VmHWM`): copies stream through a bounded buffer, so this stays
        /// small whatever the files' sizes.
        #[serde(default)]
        peak_rss_kib: u64,
    },
    /// A restore ended: the snapshot restored, `None` when there was none.
    Restored {
        /// Its timestamp.
        snapshot: Option<u64>,
    },
    /// The work failed.
    Failed {
        /// Why.
        error: String,
    },
}

/// Where a copy runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// In the agent's process; restored files are chowned to `owner` when given.
    InProcess {
        /// Owner of restored files.
        owner: Option<(u32, u32)>,
    },
    /// In a copier process started from `exe` (the `gpunet` binary), as `user`.
    Child {
        /// The `gpunet` binary.
        exe: PathBuf,
        /// The job's uid and gid.
        user: (u32, u32),
    },
}

/// Takes a snapshot of `dir` to `tier` writing at most `max_bytes` (see [`checkpoints::snapshot_to`]); returns what
/// was skipped.
#[allow(clippy::too_many_arguments)]
pub async fn snapshot(
    how: &How,
    tier: &CheckpointTier,
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
    at_ms: u64,
    max_bytes: u64,
) -> Result<Vec<String>, String> {
    match how {
        How::InProcess { .. } => checkpoints::snapshot(tier, local_root, t, dir, at_ms, max_bytes).await,
        How::Child { exe, user } => {
            let work = Work::Snapshot { tier: tier.clone(), at_ms };
            let req = Request { max_bytes, ..request(work, t, dir, local_root, *user) };
            match spawn(exe, &req).await? {
                Reply::Copied { skipped, .. } => Ok(skipped),
                other => Err(format!("unexpected copier reply {other:?}")),
            }
        }
    }
}

/// Restores the newest snapshot of any of `tiers` into `dir`; returns its timestamp.
pub async fn restore(
    how: &How,
    tiers: &[CheckpointTier],
    local_root: &Path,
    t: &TaskRef,
    dir: &Path,
) -> Result<Option<u64>, String> {
    match how {
        How::InProcess { owner } => checkpoints::restore(tiers, local_root, t, dir, *owner).await,
        How::Child { exe, user } => {
            let work = Work::Restore { tiers: tiers.to_vec() };
            match spawn(exe, &request(work, t, dir, local_root, *user)).await? {
                Reply::Restored { snapshot } => Ok(snapshot),
                other => Err(format!("unexpected copier reply {other:?}")),
            }
        }
    }
}

fn request(work: Work, t: &TaskRef, dir: &Path, local_root: &Path, user: (u32, u32)) -> Request {
    Request {
        work,
        task: *t,
        dir: dir.to_path_buf(),
        local_root: local_root.to_path_buf(),
        user,
        aws: checkpoints::aws_env(),
        timeout_ms: COPY_TIMEOUT.as_millis() as u64,
        max_bytes: checkpoints::DEFAULT_SNAPSHOT_MAX_BYTES,
    }
}

/// Runs one copier process (`exe checkpoint-copy`) on `req` and returns its reply; a [`Reply::Failed`], an exit
/// without a reply and a copier past its deadline are errors.
pub async fn spawn(exe: &Path, req: &Request) -> Result<Reply, String> {
    use tokio::io::AsyncWriteExt as _;
    let input = serde_json::to_vec(req).map_err(|e| format!("encode the copier's request: {e}"))?;
    let mut child = tokio::process::Command::new(exe)
        .arg(SUBCOMMAND)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start the checkpoint copier {}: {e}", exe.display()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // A little more than the copier's own deadline: its watchdog answers first when it can.
    let limit = Duration::from_millis(req.timeout_ms) + Duration::from_secs(5);
    let run = async move {
        stdin.write_all(&input).await.map_err(|e| format!("send the copier its request: {e}"))?;
        drop(stdin);
        child.wait_with_output().await.map_err(|e| format!("wait for the checkpoint copier: {e}"))
    };
    // On timeout the future is dropped with the child in it: kill_on_drop kills the copier.
    let out = tokio::time::timeout(limit, run)
        .await
        .map_err(|_| format!("the checkpoint copier ran past its deadline ({} s): killed", limit.as_secs()))??;
    let reply = String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str::<Reply>(l).ok());
    match reply {
        Some(Reply::Failed { error }) => Err(error),
        Some(r) if out.status.success() => Ok(r),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: String = err.chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
            Err(format!("the checkpoint copier ended with {} and no answer: {}", out.status, tail.trim()))
        }
    }
}

/// The reply is written once: by the copy or by the watchdog, whichever comes first.
static REPLIED: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

fn reply_and_exit(r: &Reply) -> ! {
    let mut done = REPLIED.lock().unwrap_or_else(|e| e.into_inner());
    if !*done {
        *done = true;
        let mut line = serde_json::to_vec(r).unwrap_or_default();
        line.push(b'\n');
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&line);
        let _ = out.flush();
    }
    std::process::exit(if matches!(r, Reply::Failed { .. }) { 1 } else { 0 })
}

/// `gpunet checkpoint-copy`: reads a [`Request`] on stdin, does it as the request's user and writes a [`Reply`]
/// line on stdout (exit 0, or 1 with [`Reply::Failed`]). Must be called before any other thread is started.
pub fn main() -> ! {
    let r = match child() {
        Ok(r) => r,
        Err(error) => Reply::Failed { error },
    };
    reply_and_exit(&r)
}

fn child() -> Result<Reply, String> {
    // Before anything secret is in memory.
    crate::identity::non_dumpable().map_err(|e| e.to_string())?;
    let mut input = Vec::new();
    std::io::stdin().take(MAX_REQUEST + 1).read_to_end(&mut input).map_err(|e| format!("read the request: {e}"))?;
    if input.len() as u64 > MAX_REQUEST {
        return Err(format!("invalid request: over {MAX_REQUEST} bytes"));
    }
    let mut req: Request = serde_json::from_slice(&input).map_err(|e| format!("invalid request: {e}"))?;
    drop(input);
    let (uid, gid) = req.user;
    // As root: open what the copy works beneath (see the module's doc).
    let dir = std::sync::Arc::new(checkpoints::open_dir(&req.dir)?);
    let tiers = match &req.work {
        Work::Snapshot { tier, .. } => vec![tier.clone()],
        Work::Restore { tiers } => tiers.clone(),
    };
    let opened = tiers
        .iter()
        .map(|tier| checkpoints::open_tier(tier, &req.local_root, &req.task, &req.aws, Some(req.user)))
        .collect::<Result<Vec<_>, _>>()?;
    req.aws.clear();
    let agent = rustix::process::getppid();
    crate::identity::drop_to(uid, gid).map_err(|e| e.to_string())?;
    // Dies with the agent (set after the drop: a change of ids clears it); the agent may have gone meanwhile.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("set the parent-death signal: {e}"))?;
    if rustix::process::getppid() != agent {
        return Err("the agent that started the copier is gone".into());
    }
    // From here on the job's user.
    let deadline = Duration::from_millis(req.timeout_ms);
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        reply_and_exit(&Reply::Failed {
            error: format!("the checkpoint copy ran past its deadline ({} s)", deadline.as_secs()),
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the copier's runtime: {e}"))?;
    rt.block_on(async move {
        match req.work {
            Work::Snapshot { at_ms, .. } => {
                let tier = opened.into_iter().next().expect("one tier");
                let mut skipped = checkpoints::snapshot_to(&tier, dir, at_ms, req.max_bytes).await?;
                if skipped.len() > MAX_SKIPPED {
                    let more = skipped.len() - MAX_SKIPPED;
                    skipped.truncate(MAX_SKIPPED);
                    skipped.push(format!("… and {more} more"));
                }
                Ok(Reply::Copied { skipped, peak_rss_kib: peak_rss_kib() })
            }
            Work::Restore { .. } => {
                Ok(Reply::Restored { snapshot: checkpoints::restore_from(opened, dir, None).await? })
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_and_the_debug_form_hides_credentials() {
        let req = Request {
            work: Work::Snapshot {
                tier: CheckpointTier { name: "s".into(), every_ms: 100, keep: 2, url: Some("s3://b/t".into()) },
                at_ms: 5,
            },
            task: TaskRef { job: 1, rank: 0, attempt: 0 },
            dir: "/d".into(),
            local_root: "/l".into(),
            user: (200_000, 200_000),
            aws: vec![("AWS_SECRET_ACCESS_KEY".into(), "very-secret".into())],
            timeout_ms: 1000,
            max_bytes: 1 << 30,
        };
        let text = serde_json::to_string(&req).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), req);
        let dbg = format!("{req:?}");
        assert!(dbg.contains("AWS_SECRET_ACCESS_KEY") && !dbg.contains("very-secret"), "{dbg}");
        for r in [
            Reply::Copied { skipped: vec!["a (a symlink)".into()], peak_rss_kib: 9000 },
            Reply::Restored { snapshot: Some(3) },
            Reply::Failed { error: "x".into() },
        ] {
            assert_eq!(serde_json::from_str::<Reply>(&serde_json::to_string(&r).unwrap()).unwrap(), r);
        }
        assert!(serde_json::from_str::<Request>(r#"{"work":{"restore":{"tiers":[]}},"bogus":1}"#).is_err());
    }
}
