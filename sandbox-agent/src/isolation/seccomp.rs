//! The seccomp denylist: system calls the run user's tools have no use
//! for and that widen the kernel surface a sandbox can reach. Every call
//! listed here fails with `EPERM` (so tools that probe for a feature fall
//! back as they do in a container without it), except `clone3`, which
//! fails with `ENOSYS`: its flags live in a struct a filter cannot read,
//! and libc falls back to `clone` on `ENOSYS`, whose flags the filter
//! checks. The rationale of each entry is in `docs/security.md`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// Denied whatever their arguments.
pub const DENIED: &[(&str, i64)] = &[
    // The mount family: a new view of the file system, or a file system
    // driver's parser, from inside the sandbox.
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("fsconfig", libc::SYS_fsconfig),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    // Kernel programs, counters and replacement kernels.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    // The kernel keyring is not namespaced.
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    // A favourite of kernel exploits (stalling the kernel mid-copy).
    ("userfaultfd", libc::SYS_userfaultfd),
    // A second system-call interface that seccomp does not see into.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    // Tracing: the run user's processes may not trace each other (nor what
    // the agent starts later as the same user).
    ("ptrace", libc::SYS_ptrace),
    // Opening a file by handle walks around path checks (Landlock's too).
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    // Kernel modules.
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
];

/// Denied when their flags (argument 0) ask for a new user namespace: in
/// one, the run user is root again for the kernel's namespaced checks,
/// the door to most of the calls above.
pub const NEW_USER_NAMESPACE: &[(&str, i64)] = &[("unshare", libc::SYS_unshare), ("clone", libc::SYS_clone)];

/// Answered `ENOSYS` (see the module docs).
pub const NOT_IMPLEMENTED: &[(&str, i64)] = &[("clone3", libc::SYS_clone3)];

/// The filters to install, in order, for this machine's architecture;
/// `None` where seccompiler knows no such architecture.
pub fn programs() -> Option<Vec<BpfProgram>> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
    let mut denied: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let newuser = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
        libc::CLONE_NEWUSER as u64,
    )
    .ok()?;
    for (_, nr) in NEW_USER_NAMESPACE {
        denied.insert(*nr, vec![SeccompRule::new(vec![newuser.clone()]).ok()?]);
    }
    let eperm = SeccompAction::Errno(libc::EPERM as u32);
    let enosys = SeccompAction::Errno(libc::ENOSYS as u32);
    let not_implemented = NOT_IMPLEMENTED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let mut programs = vec![
        SeccompFilter::new(denied, SeccompAction::Allow, eperm, arch).ok()?.try_into().ok()?,
        SeccompFilter::new(not_implemented, SeccompAction::Allow, enosys, arch).ok()?.try_into().ok()?,
    ];
    if cfg!(target_arch = "x86_64") {
        programs.push(no_x32());
    }
    Some(programs)
}

/// x86_64 kernels may also accept the x32 numbering (the number with bit
/// 30 set), which would reach every call above under another number:
/// refuse all of it (nothing in a sandbox is built for x32).
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    // Offsets and opcodes of classic BPF over `struct seccomp_data`.
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let errno = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    vec![
        sock_filter { code: LD_W_ABS, jt: 0, jf: 0, k: 0 },
        sock_filter { code: JGE_K, jt: 1, jf: 0, k: X32_SYSCALL_BIT },
        sock_filter { code: RET_K, jt: 0, jf: 0, k: libc::SECCOMP_RET_ALLOW },
        sock_filter { code: RET_K, jt: 0, jf: 0, k: errno },
    ]
}
