//! Device access on cgroup v2: a `BPF_PROG_TYPE_CGROUP_DEVICE` program per task group, the v2 equivalent of the v1
//! `devices.deny`/`devices.allow` files. The same rules ([`crate::cgroups::device_rules`], v1 syntax
//! `c MAJOR:MINOR rwm`, `*` for any number) are compiled into a short eBPF program ([`program`]: one block per rule,
//! the first that matches allows, the end denies) that the kernel runs at every open, `mknod` or read/write check of
//! a device node by a process in the group; a denied access fails with `EPERM`.
//!
//! The program is attached with `BPF_F_ALLOW_MULTI`, so programs of parent groups (systemd's device policy, for one)
//! still run: a task gets at most what both allow. Without `BPF_F_ALLOW_OVERRIDE` a child group cannot replace it.
//! A classic `BPF_PROG_ATTACH` attachment (not a `bpf_link`) lives as long as the group, not as long as the agent's
//! file descriptor: an agent that restarts and adopts its tasks leaves their filters in place.
//!
//! The bytecode is assembled here (no compiler, no ELF object): it is a handful of loads, compares and returns, and
//! [`evaluate`] — an interpreter of exactly that subset — lets unit tests check its verdicts without a kernel. The two
//! `bpf(2)` calls are, with `fds`' `fcntl` on inherited descriptors, the only `unsafe` in the agent.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// What a rule's device type is: `c`, `b`, or `a` (any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevKind {
    /// Block devices (`BPF_DEVCG_DEV_BLOCK`).
    Block,
    /// Character devices (`BPF_DEVCG_DEV_CHAR`).
    Char,
}

impl DevKind {
    fn code(self) -> i32 {
        match self {
            DevKind::Block => 1,
            DevKind::Char => 2,
        }
    }
}

/// One allow rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// `None`: any type (`a`).
    pub kind: Option<DevKind>,
    /// `None`: any major (`*`).
    pub major: Option<u32>,
    /// `None`: any minor (`*`).
    pub minor: Option<u32>,
    /// Allowed accesses: `BPF_DEVCG_ACC_MKNOD` (1), `_READ` (2), `_WRITE` (4).
    pub access: u8,
}

/// Access bits of the kernel's `bpf_cgroup_dev_ctx`.
pub const ACC_MKNOD: u8 = 1;
/// Read.
pub const ACC_READ: u8 = 2;
/// Write.
pub const ACC_WRITE: u8 = 4;

impl Rule {
    /// Parses a v1 rule: `c 195:0 rwm`, `c 136:* rwm`, `b 8:0 r`, `a`.
    pub fn parse(s: &str) -> Result<Rule, String> {
        let bad = || format!("device rule {s:?}: expected `c|b|a MAJOR:MINOR ACCESS`");
        let mut it = s.split_whitespace();
        let kind = match it.next().ok_or_else(bad)? {
            "a" => return Ok(Rule { kind: None, major: None, minor: None, access: 7 }),
            "c" => DevKind::Char,
            "b" => DevKind::Block,
            _ => return Err(bad()),
        };
        let (ma, mi) = it.next().and_then(|n| n.split_once(':')).ok_or_else(bad)?;
        let num = |x: &str| -> Result<Option<u32>, String> {
            if x == "*" {
                Ok(None)
            } else {
                x.parse().map(Some).map_err(|_| bad())
            }
        };
        let mut access = 0;
        for c in it.next().unwrap_or("rwm").chars() {
            access |= match c {
                'r' => ACC_READ,
                'w' => ACC_WRITE,
                'm' => ACC_MKNOD,
                _ => return Err(bad()),
            };
        }
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Rule { kind: Some(kind), major: num(ma)?, minor: num(mi)?, access })
    }
}

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    code: u8,
    /// dst_reg (low nibble) and src_reg (high nibble).
    regs: u8,
    off: i16,
    imm: i32,
}

const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU64_AND_K: u8 = 0x57; // BPF_ALU64 | BPF_AND | BPF_K
const ALU64_RSH_K: u8 = 0x77; // BPF_ALU64 | BPF_RSH | BPF_K
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const ALU64_MOV_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | (dst & 0xf), off, imm }
}

/// The program for `rules`: r2 = device type, r3 = access, r4 = major, r5 = minor; each rule is a block of compares
/// that jumps past itself on a mismatch and returns 1 (allow) otherwise; the end returns 0 (deny).
pub fn program(rules: &[Rule]) -> Vec<Insn> {
    let mut p = vec![
        insn(LDX_MEM_W, 2, 1, 0, 0),        // r2 = ctx->access_type
        insn(ALU64_AND_K, 2, 0, 0, 0xffff), // r2 &= 0xffff: the type
        insn(LDX_MEM_W, 3, 1, 0, 0),        // r3 = ctx->access_type
        insn(ALU64_RSH_K, 3, 0, 0, 16),     // r3 >>= 16: the access
        insn(LDX_MEM_W, 4, 1, 4, 0),        // r4 = ctx->major
        insn(LDX_MEM_W, 5, 1, 8, 0),        // r5 = ctx->minor
    ];
    for r in rules {
        // The compares of the block, each jumping to the block's end (patched below) on a mismatch.
        let mut block: Vec<Insn> = Vec::new();
        let mut jumps = Vec::new();
        if let Some(k) = r.kind {
            jumps.push(block.len());
            block.push(insn(JNE_K, 2, 0, 0, k.code()));
        }
        if let Some(m) = r.major {
            jumps.push(block.len());
            block.push(insn(JNE_K, 4, 0, 0, m as i32));
        }
        if let Some(m) = r.minor {
            jumps.push(block.len());
            block.push(insn(JNE_K, 5, 0, 0, m as i32));
        }
        if r.access & 7 != 7 {
            // Allowed only if the access asks nothing outside the rule's: (r3 & !allowed) == 0.
            block.push(insn(ALU64_MOV_X, 6, 3, 0, 0));
            block.push(insn(ALU64_AND_K, 6, 0, 0, i32::from(!r.access & 7)));
            jumps.push(block.len());
            block.push(insn(JNE_K, 6, 0, 0, 0));
        }
        block.push(insn(ALU64_MOV_K, 0, 0, 0, 1));
        block.push(insn(EXIT, 0, 0, 0, 0));
        let len = block.len();
        for j in jumps {
            block[j].off = (len - j - 1) as i16;
        }
        p.extend(block);
    }
    p.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

/// Runs `prog` (the subset [`program`] emits) on one access, as the kernel would: `true` allows.
pub fn evaluate(prog: &[Insn], kind: DevKind, access: u8, major: u32, minor: u32) -> bool {
    let ctx = [(u32::from(access) << 16) | kind.code() as u32, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    while let Some(i) = prog.get(pc) {
        let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        pc += 1;
        match i.code {
            LDX_MEM_W => r[dst] = u64::from(ctx[i.off as usize / 4]),
            ALU64_AND_K => r[dst] &= i.imm as i64 as u64,
            ALU64_RSH_K => r[dst] >>= i.imm,
            ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
            ALU64_MOV_X => r[dst] = r[src],
            JNE_K => {
                if r[dst] != i.imm as i64 as u64 {
                    pc += i.off as usize;
                }
            }
            EXIT => return r[0] != 0,
            c => panic!("opcode {c:#x} is not emitted by program()"),
        }
    }
    false
}

const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_ATTACH: i64 = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (the kernel takes a prefix of the union; the rest is zero).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` as `BPF_PROG_ATTACH` reads it.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
}

/// Loads `prog` into the kernel; the verifier's log is in the error when it refuses.
fn load(prog: &[Insn]) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut log = vec![0u8; 16 * 1024];
    let mut name = [0u8; 16];
    name[..13].copy_from_slice(b"gpunet_device");
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        prog_name: name,
        expected_attach_type: BPF_CGROUP_DEVICE,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr` prefix whose pointers (instructions, license, log) outlive the call; the
    // kernel writes only into `log`, within `log_size`.
    let fd = unsafe {
        nix::libc::syscall(nix::libc::SYS_bpf, BPF_PROG_LOAD, &attr as *const ProgLoadAttr, size_of::<ProgLoadAttr>())
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
        let msg = String::from_utf8_lossy(&log[..end]);
        return Err(io::Error::new(e.kind(), format!("load the device filter: {e}; verifier: {}", msg.trim())));
    }
    // SAFETY: a non-negative return of BPF_PROG_LOAD is a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches a filter allowing only `rules` to the v2 group `dir`. Call it before any process joins the group.
pub fn attach(dir: &Path, rules: &[Rule]) -> io::Result<()> {
    let prog = load(&program(rules))?;
    let group = std::fs::File::open(dir)?;
    let attr = ProgAttachAttr {
        target_fd: group.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
    };
    // SAFETY: `attr` is a valid `bpf_attr` prefix for BPF_PROG_ATTACH; both descriptors are open for the call.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            BPF_PROG_ATTACH,
            &attr as *const ProgAttachAttr,
            size_of::<ProgAttachAttr>(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("attach the device filter to {}: {e}", dir.display())));
    }
    Ok(())
}

/// Whether this process may load device filters (root with BPF allowed): loads a deny-all program and drops it.
pub fn available() -> bool {
    load(&program(&[])).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(v: &[&str]) -> Vec<Rule> {
        v.iter().map(|r| Rule::parse(r).unwrap()).collect()
    }

    #[test]
    fn rules_parse_like_v1_devices_allow() {
        assert_eq!(
            Rule::parse("c 195:3 rwm").unwrap(),
            Rule { kind: Some(DevKind::Char), major: Some(195), minor: Some(3), access: 7 }
        );
        assert_eq!(Rule::parse("c 136:* rw").unwrap().minor, None);
        assert_eq!(
            Rule::parse("b *:* r").unwrap(),
            Rule { kind: Some(DevKind::Block), major: None, minor: None, access: 2 }
        );
        assert_eq!(Rule::parse("a").unwrap().kind, None);
        for bad in ["", "x 1:2 rwm", "c 1 rwm", "c a:b rwm", "c 1:2 rwx", "c 1:2 rwm extra"] {
            assert!(Rule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_program_allows_exactly_the_rules() {
        let p = program(&rules(&["c 1:3 rwm", "c 195:0 rwm", "c 195:255 rwm", "c 136:* rwm", "b 8:0 r"]));
        assert!(evaluate(&p, DevKind::Char, ACC_READ | ACC_WRITE, 1, 3)); // /dev/null
        assert!(evaluate(&p, DevKind::Char, ACC_READ, 195, 0)); // its own GPU
        assert!(evaluate(&p, DevKind::Char, ACC_WRITE, 195, 255)); // nvidiactl
        assert!(evaluate(&p, DevKind::Char, ACC_READ, 136, 12345)); // any pts
        assert!(!evaluate(&p, DevKind::Char, ACC_READ, 195, 1)); // another GPU
        assert!(!evaluate(&p, DevKind::Block, ACC_READ, 1, 3)); // the type counts
        assert!(evaluate(&p, DevKind::Block, ACC_READ, 8, 0));
        assert!(!evaluate(&p, DevKind::Block, ACC_WRITE, 8, 0)); // the disk only for reading
        assert!(!evaluate(&p, DevKind::Block, ACC_MKNOD | ACC_READ, 8, 0));
        assert!(!evaluate(&p, DevKind::Char, ACC_READ, 4, 1)); // a tty
        assert!(!evaluate(&program(&[]), DevKind::Char, ACC_READ, 1, 3), "no rules: deny all");
        assert!(evaluate(&program(&rules(&["a"])), DevKind::Block, 7, 259, 0));
    }

    /// The agent's own rules for GPUs 0 and 2, against every GPU number: only those two and the control devices pass.
    #[test]
    fn a_task_reaches_only_its_own_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let rs: Vec<Rule> =
            crate::cgroups::device_rules(dir.path(), &[0, 2]).iter().map(|r| Rule::parse(r).unwrap()).collect();
        let p = program(&rs);
        for minor in 0..=255 {
            let want = matches!(minor, 0 | 2 | 254 | 255);
            assert_eq!(evaluate(&p, DevKind::Char, ACC_READ | ACC_WRITE, 195, minor), want, "nvidia minor {minor}");
        }
    }
}
