//! The task spawner: `gpunet task-spawner`, one process per agent, forks every task wrapper
//! ([`crate::wrapper`]) instead of the agent executing `gpunet task-exec` for each.
//!
//! **Why.** An `execve` of the `gpunet` binary (34 MB, some 43,000 relocations the dynamic loader applies, each page
//! it writes a copy-on-write fault) and the unmapping of all that at the wrapper's exit were the largest single cost
//! of a task start: measured with `perf record -a` during `gpunet bench e2e --tenant-uids`, the wrappers' page faults
//! (nearly all in `_dl_relocate_object`), their `exit_group` and the loader were about a third of the machine's CPU.
//! The spawner is executed once; each wrapper is a `fork` of it (one thread, a small address space already
//! relocated), which then runs exactly what `gpunet task-exec` runs, with the same arguments.
//!
//! **What the wrapper gets** is what an executed wrapper got: standard input, output and error from the agent
//! (passed over the socket with `SCM_RIGHTS`), its own process group (set by both the spawner and the child, so the
//! group exists when the agent learns the pid), `/` as its directory, the spawner's environment (the agent starts it
//! with nothing but `PATH`), the forwarded signals blocked (as the wrapper blocks them first thing), default dispositions (Rust's ignored `SIGPIPE` aside, as in any
//! Rust program) and no other descriptor. A forked child keeps no parent-death signal, so a wrapper outlives the
//! spawner and the agent, as its task must (a restarted agent adopts it).
//!
//! **Exits without a reused pid.** The spawner is the wrappers' parent, so it learns how each ended (`waitid` with
//! `WNOWAIT`) and tells the agent, but reaps it only when the agent says so: until then the zombie keeps its pid,
//! so the agent's last signal to the task's group (and any stop racing the end) can never reach a process that got
//! the pid since, as with the agent's own children before.
//!
//! **Trust.** The agent and the spawner share a socket pair and nothing else: nobody else can send it a request. The
//! spawner dies with the agent's thread that started it (`PR_SET_PDEATHSIG`, checked against a parent that died
//! first: the agent's first message gives its pid, which is not on the spawner's command line, since a task sees
//! that command line as its namespace's init's); if the spawner dies, the agent learns of its wrappers' ends as it does for adopted tasks (the wrapper's
//! status file, once its pid is gone) and starts another spawner for the next task.
//!
//! **Protocol** (a stream socket; little-endian): every message starts with 13 bytes, a kind and three `i32`.
//! Agent → spawner: `H pid 0 0` first (the agent's pid), then `S len 0 0` then `len` bytes of arguments (each a `u32` length and its bytes), the wrapper's
//! standard input, output and error attached; `R pid 0 0` (reap). Spawner → agent: `P pid lo hi` (forked, started at `hi << 32 | lo`; answers
//! the requests in order, with the child's start time in two halves), `F errno 0 0` (could not fork), `X pid code signal` (ended: `code` -1 when killed by
//! `signal`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

/// The spawner's subcommand.
pub const SUBCOMMAND: &str = "task-spawner";

/// Every message's first bytes.
const HEADER: usize = 13;
/// The most bytes of arguments one request may carry (a job's command is at most 256 KiB).
const ARGS_MAX: usize = 8 << 20;
/// How long a start waits for the spawner's answer.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a wrapper the spawner started ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// As its parent saw it: the exit code, or the signal that killed it.
    Ended {
        /// Exit code.
        code: Option<i32>,
        /// Terminating signal.
        signal: Option<i32>,
    },
    /// The spawner died first: the wrapper runs on (or ended unseen); the caller watches it as an adopted task.
    Lost,
}

/// A forked wrapper's pid, its start time (`/proc/PID/stat`, read by the spawner while the pid is surely its
/// child's) and how it will end.
type Answer = io::Result<(i32, u64, tokio::sync::oneshot::Receiver<Exit>)>;

#[derive(Default)]
struct Shared {
    /// Requests sent and not answered, in order.
    waiting: VecDeque<std::sync::mpsc::Sender<Answer>>,
    /// Wrappers running, by pid.
    exits: HashMap<i32, tokio::sync::oneshot::Sender<Exit>>,
    dead: bool,
}

/// What the agent's writer thread sends to the spawner.
enum Out {
    Spawn { payload: Vec<u8>, stdio: [OwnedFd; 3], waiter: std::sync::mpsc::Sender<Answer> },
    Reap(i32),
}

/// The agent's side of one spawner process. Its three threads never wait for one another through the socket: one
/// writes every request (fed by a channel, so a caller never blocks on the socket, nor holds a lock while it
/// writes), one reads every answer (and never writes), and the one that started the process waits for it.
pub struct Spawner {
    out: std::sync::mpsc::Sender<Out>,
    shared: Arc<Mutex<Shared>>,
    /// Our end of the socket, to shut it down when dropped.
    sock: UnixStream,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawner").field("dead", &self.is_dead()).finish()
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the task spawner is gone")
}

fn message(kind: u8, a: i32, b: i32, c: i32) -> [u8; HEADER] {
    let mut m = [0u8; HEADER];
    m[0] = kind;
    m[1..5].copy_from_slice(&a.to_le_bytes());
    m[5..9].copy_from_slice(&b.to_le_bytes());
    m[9..13].copy_from_slice(&c.to_le_bytes());
    m
}

fn parse(m: &[u8; HEADER]) -> (u8, i32, i32, i32) {
    let i = |k: usize| i32::from_le_bytes(m[k..k + 4].try_into().expect("4 bytes"));
    (m[0], i(1), i(5), i(9))
}

impl Spawner {
    /// Starts `exe task-spawner` with nothing of the agent's environment but `PATH`; returns once it said it is ready.
    pub fn start(exe: &std::path::Path, path: &str) -> io::Result<Arc<Spawner>> {
        let (ours, theirs) = UnixStream::pair()?;
        let (mut reader, writer, keep) = (ours.try_clone()?, ours.try_clone()?, ours);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (out_tx, out_rx) = std::sync::mpsc::channel::<Out>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let (exe, path) = (exe.to_path_buf(), path.to_string());
        let (sh, reaps) = (shared.clone(), out_tx.clone());
        // This thread starts the spawner and lives as long as it does (a parent-death signal follows the thread
        // that started the process, not the process); it reads the answers.
        std::thread::Builder::new().name("gpunet-spawner".into()).spawn(move || {
            use std::os::unix::process::CommandExt as _;
            // Its command line is what a task sees as its init's: `gpunet task-spawner`, no path, no pid.
            let child = std::process::Command::new(&exe)
                .arg0("gpunet")
                .arg(SUBCOMMAND)
                .env_clear()
                .env("PATH", &path)
                .current_dir("/")
                .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
                .stdout(std::process::Stdio::null())
                .process_group(0)
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            // Who its parent must be (not on its command line), then its word that it serves.
            let mut first = [0u8; HEADER];
            let ready = (&writer)
                .write_all(&message(b'H', std::process::id() as i32, 0, 0))
                .and_then(|()| reader.read_exact(&mut first));
            if ready.is_ok() && first[0] == b'K' {
                let _ = ready_tx.send(Ok(()));
                let sh2 = sh.clone();
                let w = std::thread::Builder::new()
                    .name("gpunet-spawner-out".into())
                    .spawn(move || write_requests(writer, out_rx, &sh2));
                if w.is_ok() {
                    read_answers(reader, &sh, &reaps);
                }
            } else {
                let _ = ready_tx.send(Err(gone()));
            }
            let (waiting, exits) = {
                let mut g = sh.lock().expect("spawner state");
                g.dead = true;
                (std::mem::take(&mut g.waiting), std::mem::take(&mut g.exits))
            };
            for w in waiting {
                let _ = w.send(Err(gone()));
            }
            for (_, tx) in exits {
                let _ = tx.send(Exit::Lost);
            }
            let _ = child.kill();
            let _ = child.wait();
        })?;
        ready_rx.recv().map_err(|_| gone())??;
        Ok(Arc::new(Spawner { out: out_tx, shared, sock: keep }))
    }

    /// Whether the spawner process is gone (a new one is needed).
    pub fn is_dead(&self) -> bool {
        self.shared.lock().expect("spawner state").dead
    }

    /// Forks a wrapper running `gpunet task-exec ARGS` with `stdio` as its standard input, output and error; returns
    /// its pid and how it will end. Blocking (call it off the async threads). An error of kind `BrokenPipe` (the
    /// spawner is gone) means that no wrapper runs: one forked before the spawner died waits for a word from it
    /// that never comes, and ends.
    pub fn spawn(&self, args: &[String], stdio: [OwnedFd; 3]) -> Answer {
        let mut payload = Vec::new();
        for a in args {
            payload.extend_from_slice(&(a.len() as u32).to_le_bytes());
            payload.extend_from_slice(a.as_bytes());
        }
        if payload.len() > ARGS_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the wrapper's arguments are too long"));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        self.out.send(Out::Spawn { payload, stdio, waiter: tx }).map_err(|_| gone())?;
        match rx.recv_timeout(ANSWER_TIMEOUT) {
            Ok(a) => a,
            // A late answer is killed by the reader (nobody waits for it).
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // A wedged spawner would hold up every start: it goes, and the next start gets a new one.
                let _ = self.sock.shutdown(std::net::Shutdown::Both);
                Err(io::Error::new(io::ErrorKind::TimedOut, "the task spawner did not answer"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }

    /// Lets the spawner reap `pid`, whose end it reported: from now on the pid may name another process. Never blocks.
    pub fn reap(&self, pid: i32) {
        let _ = self.out.send(Out::Reap(pid));
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // The threads hold other descriptors of our end: without this the spawner would never see EOF.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The agent's writer: sends each request, registering its waiter just before (so answers match in order).
fn write_requests(mut w: UnixStream, rx: std::sync::mpsc::Receiver<Out>, sh: &Mutex<Shared>) {
    while let Ok(o) = rx.recv() {
        let sent = match o {
            Out::Spawn { payload, stdio, waiter } => {
                {
                    let mut g = sh.lock().expect("spawner state");
                    if g.dead {
                        let _ = waiter.send(Err(gone()));
                        continue;
                    }
                    g.waiting.push_back(waiter);
                }
                send_with_fds(&w, &message(b'S', payload.len() as i32, 0, 0), &payload, &stdio)
            }
            Out::Reap(pid) => w.write_all(&message(b'R', pid, 0, 0)),
        };
        if sent.is_err() {
            // Half a request leaves the stream unusable: the spawner goes (the reader then fails what waits).
            let _ = w.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

fn send_with_fds(sock: &UnixStream, header: &[u8], payload: &[u8], fds: &[OwnedFd; 3]) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let borrowed = [fds[0].as_fd(), fds[1].as_fd(), fds[2].as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&borrowed));
    let all: Vec<u8> = [header, payload].concat();
    let sent = sendmsg(sock, &[io::IoSlice::new(&all)], &mut control, SendFlags::NOSIGNAL)?;
    // The descriptors went with the first byte; the rest (a signal may cut a long send short) follows.
    let mut s = sock;
    s.write_all(&all[sent..])
}

/// The agent's reader of the spawner's answers, until it closes. It never writes (a reap goes through the writer).
fn read_answers(mut r: UnixStream, sh: &Mutex<Shared>, reaps: &std::sync::mpsc::Sender<Out>) {
    let mut m = [0u8; HEADER];
    while r.read_exact(&mut m).is_ok() {
        let (kind, a, b, c) = parse(&m);
        match kind {
            // A pid the agent could not signal safely (0, 1, negative) is a broken spawner: it goes.
            b'P' if a > 1 => {
                let start = u64::from(b as u32) | (u64::from(c as u32) << 32);
                let (tx, rx) = tokio::sync::oneshot::channel();
                let waiter = {
                    let mut g = sh.lock().expect("spawner state");
                    g.exits.insert(a, tx);
                    g.waiting.pop_front()
                };
                if waiter.is_none_or(|w| w.send(Ok((a, start, rx))).is_err()) {
                    // Nobody waits for it any more (the start gave up): it must not run unknown to the agent.
                    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(a), nix::sys::signal::Signal::SIGKILL);
                }
            }
            b'F' => {
                if let Some(w) = sh.lock().expect("spawner state").waiting.pop_front() {
                    let _ = w.send(Err(io::Error::from_raw_os_error(a)));
                }
            }
            b'X' => {
                let tx = sh.lock().expect("spawner state").exits.remove(&a);
                let ended = Exit::Ended { code: (b >= 0).then_some(b), signal: (c > 0).then_some(c) };
                if tx.is_none_or(|tx| tx.send(ended).is_err()) {
                    // Nobody watches it: reaped at once.
                    let _ = reaps.send(Out::Reap(a));
                }
            }
            _ => break,
        }
    }
    let _ = r.shutdown(std::net::Shutdown::Both);
}

/// A request the spawner forked for: what its child runs, once the spawner says go.
struct Request {
    args: Vec<String>,
    stdio: Vec<OwnedFd>,
    go: io::PipeReader,
}

/// Overwrites a buffer before it is freed (the store is kept: the buffer is read afterwards, as far as the compiler
/// knows).
fn forget(mut b: Vec<u8>) {
    b.fill(0);
    std::hint::black_box(&b);
}

/// `gpunet task-spawner`: serves the agent on its standard input until the agent closes it. Must run while
/// the process has one thread (first thing in `main`).
pub fn main(argv: &[String]) -> ! {
    match serve(argv) {
        Ok(Some(req)) => child(req),
        Ok(None) => std::process::exit(0),
        Err(e) => {
            eprintln!("gpunet task-spawner: {e}");
            std::process::exit(1)
        }
    }
}

/// The spawner's loop; returns in a forked child (with what it runs), or at the agent's EOF (`None`).
fn serve(argv: &[String]) -> Result<Option<Request>, String> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use rustix::event::{poll, PollFd, PollFlags};
    if !argv.is_empty() {
        return Err("usage: gpunet task-spawner (started by the agent, which it serves on standard input)".into());
    }
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| format!("set the parent-death signal: {e}"))?;
    let stdin = io::stdin();
    let sock = stdin.as_fd();
    // The agent's first message names it: a parent that died before the death signal was set is not it.
    let parent = match read_header(sock)? {
        Some((m, _)) if m[0] == b'H' => parse(&m).1,
        _ => return Err("no word from the agent".into()),
    };
    if rustix::process::getppid().map(|p| p.as_raw_pid()) != Some(parent) {
        return Err("the agent is gone".into());
    }
    // Every wrapper is a fork of this process and no exec comes between: a descriptor it has, they would all have.
    crate::fds::close_inherited();
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    chld.thread_block().map_err(|e| format!("block SIGCHLD: {e}"))?;
    let sigs = SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))?;
    let send = |m: [u8; HEADER]| -> Result<(), String> {
        let mut w = &m[..];
        while !w.is_empty() {
            let n = rustix::io::write(sock, w).map_err(|e| format!("answer the agent: {e}"))?;
            w = &w[n..];
        }
        Ok(())
    };
    // Wrappers running, and those whose end was reported (zombies until the agent says reap).
    let (mut live, mut reported) = (HashSet::<i32>::new(), HashSet::<i32>::new());
    send(message(b'K', 0, 0, 0))?;
    loop {
        let mut fds = [PollFd::new(&sock, PollFlags::IN), PollFd::new(&sigs, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let (from_agent, signalled) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if signalled {
            while let Ok(Some(_)) = sigs.read_signal() {}
            use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
            let ended: Vec<(i32, rustix::process::WaitIdStatus)> = live
                .iter()
                .filter_map(|p| {
                    let id = WaitId::Pid(Pid::from_raw(*p)?);
                    let o = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
                    waitid(id, o).ok().flatten().map(|s| (*p, s))
                })
                .collect();
            for (p, s) in ended {
                live.remove(&p);
                reported.insert(p);
                let (code, signal) = (s.exit_status().unwrap_or(-1), s.terminating_signal().unwrap_or(0));
                send(message(b'X', p, code, signal))?;
            }
        }
        if !from_agent {
            continue;
        }
        let (m, stdio) = match read_header(sock)? {
            None => return Ok(None), // the agent closed its end
            Some(x) => x,
        };
        let (kind, a, _, _) = parse(&m);
        match kind {
            b'S' => {
                let len = usize::try_from(a).ok().filter(|n| *n <= ARGS_MAX).ok_or("a request too long")?;
                let mut payload = vec![0u8; len];
                if !read_full(sock, &mut payload)? {
                    return Ok(None);
                }
                let args = decode_args(&payload).ok_or("a malformed request")?;
                forget(payload);
                let refuse = |args: Vec<String>, errno: i32| {
                    for a in args {
                        forget(a.into_bytes());
                    }
                    send(message(b'F', errno, 0, 0))
                };
                if stdio.len() != 3 {
                    refuse(args, nix::libc::EINVAL)?;
                    continue;
                }
                // The child waits for our word, sent once the agent has its pid: if this process dies before
                // (the agent never learns of the child), the child sees EOF and ends without doing anything.
                let (go_r, go_w) = match io::pipe() {
                    Ok(p) => p,
                    Err(e) => {
                        refuse(args, e.raw_os_error().unwrap_or(nix::libc::EMFILE))?;
                        continue;
                    }
                };
                match crate::forked::fork_single() {
                    Ok(None) => {
                        drop(go_w);
                        return Ok(Some(Request { args, stdio, go: go_r }));
                    }
                    Ok(Some(pid)) => {
                        drop(go_r);
                        // Its own group before the agent learns its pid (the child does the same: whichever runs
                        // first).
                        let _ = nix::unistd::setpgid(pid, pid);
                        drop(stdio);
                        // Other tenants' command lines stay out of the wrappers forked later.
                        for a in args {
                            forget(a.into_bytes());
                        }
                        live.insert(pid.as_raw());
                        // Its start time, read while the pid is surely our child's (not reaped before the agent says
                        // so): the agent checks it before every signal. Without it the child gets no word and ends.
                        match crate::launcher::proc_identity(pid.as_raw()) {
                            Some((_, start)) => {
                                let (lo, hi) = (start as u32 as i32, (start >> 32) as u32 as i32);
                                send(message(b'P', pid.as_raw(), lo, hi))?;
                                let _ = (&go_w).write_all(b"g");
                            }
                            None => {
                                drop(go_w);
                                send(message(b'F', nix::libc::ESRCH, 0, 0))?;
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("gpunet task-spawner: {e}");
                        refuse(args, nix::libc::EAGAIN)?;
                    }
                }
            }
            b'R' => {
                if reported.remove(&a) {
                    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(a), None);
                }
            }
            _ => return Err(format!("an unknown request {kind:#x}")),
        }
    }
}

/// A message's first bytes and the descriptors that came with them.
type Header = ([u8; HEADER], Vec<OwnedFd>);

/// Reads one message's first bytes and the descriptors that came with them; `None` at EOF.
fn read_header(sock: std::os::fd::BorrowedFd<'_>) -> Result<Option<Header>, String> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut m = [0u8; HEADER];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(sock, &mut [io::IoSliceMut::new(&mut m)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => break r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(format!("read a request: {e}")),
        }
    };
    let mut fds = Vec::new();
    for c in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = c {
            fds.extend(it);
        }
    }
    if got == 0 {
        return Ok(None);
    }
    if !read_full(sock, &mut m[got..])? {
        return Ok(None);
    }
    Ok(Some((m, fds)))
}

/// Fills `buf` from the agent's socket; `false` at EOF.
fn read_full(sock: std::os::fd::BorrowedFd<'_>, buf: &mut [u8]) -> Result<bool, String> {
    let mut have = 0;
    while have < buf.len() {
        match rustix::io::read(sock, &mut buf[have..]) {
            Ok(0) => return Ok(false),
            Ok(n) => have += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("read a request: {e}")),
        }
    }
    Ok(true)
}

fn decode_args(mut p: &[u8]) -> Option<Vec<String>> {
    let mut v = Vec::new();
    while !p.is_empty() {
        let n = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as usize;
        let a = p.get(4..4 + n)?;
        v.push(String::from_utf8(a.to_vec()).ok()?);
        p = &p[4 + n..];
    }
    Some(v)
}

/// The forked child: becomes the wrapper.
fn child(mut req: Request) -> ! {
    use nix::sys::signal::SigmaskHow;
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("gpunet task-spawner: {what}: {e}");
        std::process::exit(125)
    };
    // The signals the wrapper forwards stay blocked (pending, never lost: it blocks them itself first thing), the
    // others go through, as in an executed wrapper.
    if let Err(e) = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&crate::wrapper::forwarded()), None) {
        fail("set the signal mask", &e);
    }
    let mut go = [0u8; 1];
    loop {
        match req.go.read(&mut go) {
            Ok(1) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            _ => std::process::exit(125), // the spawner died (or gave up on us) before the agent learned of us
        }
    }
    drop(req.go);
    let [i, o, e]: [OwnedFd; 3] = match req.stdio.try_into() {
        Ok(a) => a,
        Err(_) => fail("standard descriptors", &"not three"),
    };
    if let Err(err) = rustix::stdio::dup2_stdin(&i)
        .and_then(|()| rustix::stdio::dup2_stdout(&o))
        .and_then(|()| rustix::stdio::dup2_stderr(&e))
    {
        fail("take the standard descriptors", &err);
    }
    drop((i, o, e));
    let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
    crate::wrapper::main(&req.args)
}

/// The agent's spawner, started when first needed and again after it died.
#[derive(Debug, Default)]
pub struct Slot {
    current: Mutex<Option<Arc<Spawner>>>,
}

impl Slot {
    /// The running spawner (started now if there is none, or it died); `None` when it cannot start (the caller
    /// executes the wrapper itself).
    pub fn get(&self, exe: &std::path::Path, path: &str) -> Option<Arc<Spawner>> {
        let mut g = self.current.lock().expect("spawner slot");
        if let Some(s) = g.as_ref().filter(|s| !s.is_dead()) {
            return Some(s.clone());
        }
        match Spawner::start(exe, path) {
            Ok(s) => {
                *g = Some(s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start the task spawner; executing each task's wrapper");
                *g = None;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_go_through_with_any_bytes_and_a_malformed_request_is_refused() {
        let args = vec!["--".to_string(), "sh".into(), String::new(), "a\0b c".into(), "é".into()];
        let mut p = Vec::new();
        for a in &args {
            p.extend_from_slice(&(a.len() as u32).to_le_bytes());
            p.extend_from_slice(a.as_bytes());
        }
        assert_eq!(decode_args(&p).unwrap(), args);
        assert!(decode_args(&p[..p.len() - 1]).is_none());
        assert!(decode_args(&[9, 0, 0, 0, b'x']).is_none());
        assert_eq!(parse(&message(b'X', 42, -1, 9)), (b'X', 42, -1, 9));
    }

    #[test]
    fn answers_are_matched_in_order_an_unwatched_end_is_reaped_and_a_pid_under_2_ends_the_spawner() {
        let (mut theirs, ours) = UnixStream::pair().unwrap();
        let sh = Mutex::new(Shared::default());
        let (reaps, out) = std::sync::mpsc::channel();
        let (w1, r1) = std::sync::mpsc::channel();
        let (w2, r2) = std::sync::mpsc::channel();
        sh.lock().unwrap().waiting.extend([w1, w2]);
        for m in [message(b'P', 100, 9, 7), message(b'F', nix::libc::EAGAIN, 0, 0), message(b'X', 100, 7, 0)] {
            theirs.write_all(&m).unwrap();
        }
        // An end nobody watches (a start that gave up): reaped at once.
        theirs.write_all(&message(b'X', 555, 0, 0)).unwrap();
        // A pid the agent could not signal safely: the reader stops (the spawner is treated as gone).
        theirs.write_all(&message(b'P', 1, 0, 0)).unwrap();
        let (w3, _r3) = std::sync::mpsc::channel();
        sh.lock().unwrap().waiting.push_back(w3);
        read_answers(ours, &sh, &reaps);
        let (pid, start, exit) = r1.recv().unwrap().unwrap();
        assert_eq!((pid, start), (100, 7 << 32 | 9));
        assert_eq!(exit.blocking_recv().unwrap(), Exit::Ended { code: Some(7), signal: None });
        assert_eq!(r2.recv().unwrap().unwrap_err().raw_os_error(), Some(nix::libc::EAGAIN));
        assert!(matches!(out.try_recv(), Ok(Out::Reap(555))));
        assert!(out.try_recv().is_err());
        // The third request got no answer from the bad one: it is failed when the spawner is declared dead.
        assert_eq!(sh.lock().unwrap().waiting.len(), 1);
    }
}
