//! The run user: the unprivileged uid every command the agent starts (runs,
//! setup steps, execs, shell sessions) runs as, when the agent is root in a
//! container (`--run-user`). It cannot read the agent's token, trace the
//! agent or a shim (other uid, and both are non-dumpable), or open the
//! journal dir (root's, 0700). Without `--run-user` (the local provider)
//! everything runs as the agent's own user.
//!
//! At start the agent gives the user what git and ssh expect: a passwd
//! entry (and a group entry) when the image lacks one, FROM-scratch images
//! with no `/etc/passwd` included, and a HOME it owns. The workspace is
//! handed to the user the first time; files the agent writes on the API's
//! behalf are created as the user ([`FsAs`]).

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use shared::error::Error;

/// Name given to a run user the image has no passwd entry for.
pub const DEFAULT_NAME: &str = "sandhold";
/// HOME of a run user the image gives none (or `/nonexistent`).
pub const DEFAULT_HOME: &str = "/home/sandhold";

/// Who commands run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunUser {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub home: PathBuf,
}

impl RunUser {
    /// Resolve `spec` (`uid[:gid]` or `name[:group]`) against `<etc>/passwd`
    /// and `<etc>/group`; `home` is used when the image gives the user none.
    /// Refuses root: a run user must not be able to read what the agent
    /// keeps.
    pub fn resolve(spec: &str, home: &Path, etc: &Path) -> anyhow::Result<Self> {
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap_or_default();
        let groups = std::fs::read_to_string(etc.join("group")).unwrap_or_default();
        let r =
            shared::user::resolve(spec, &passwd, &groups).with_context(|| format!("run user {spec:?}"))?;
        anyhow::ensure!(r.uid != 0, "run user {spec:?} is root; it must be an unprivileged user");
        let taken = |name: &str| passwd.lines().any(|l| l.split(':').next() == Some(name));
        let name = r.name.unwrap_or_else(|| match taken(DEFAULT_NAME) {
            false => DEFAULT_NAME.to_string(),
            true => format!("{DEFAULT_NAME}-{}", r.uid),
        });
        let image_home = r.home.filter(|h| h != "/nonexistent" && h != "/").map(PathBuf::from);
        Ok(Self { uid: r.uid, gid: r.gid, name, home: image_home.unwrap_or_else(|| home.to_path_buf()) })
    }

    /// Add the passwd and group entries the image lacks (creating `<etc>`
    /// when missing) and create HOME owned by the user. A read-only root
    /// filesystem refuses both: that is logged, not fatal.
    pub fn prepare(&self, etc: &Path) {
        if let Err(e) = self.add_entries(etc) {
            tracing::warn!(error = format!("{e:#}"), "cannot add the run user to the image's passwd");
        }
        let made = std::fs::create_dir_all(&self.home)
            .and_then(|()| std::os::unix::fs::lchown(&self.home, Some(self.uid), Some(self.gid)));
        if let Err(e) = made {
            tracing::warn!(home = %self.home.display(), error = %e, "cannot create the run user's home");
        }
    }

    fn add_entries(&self, etc: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(etc)?;
        let passwd = std::fs::read_to_string(etc.join("passwd")).unwrap_or_default();
        if !has_id(&passwd, 2, self.uid) {
            let line =
                format!("{}:x:{}:{}::{}:/bin/sh\n", self.name, self.uid, self.gid, self.home.display());
            append(&etc.join("passwd"), &passwd, &line)?;
        }
        let groups = std::fs::read_to_string(etc.join("group")).unwrap_or_default();
        if !has_id(&groups, 2, self.gid) {
            append(&etc.join("group"), &groups, &format!("{}:x:{}:\n", self.name, self.gid))?;
        }
        Ok(())
    }

    /// Hand the tree at `root` to the user, once: only while `root` itself
    /// is not the user's yet (a fresh container, before any command of the
    /// user runs, so nothing can swap a directory for a link mid-walk).
    /// The walk stays on `root`'s filesystem: a mount inside it (the
    /// operator's host directories, the agent's own) keeps its owners.
    pub fn adopt(&self, root: &Path) -> std::io::Result<()> {
        if std::fs::symlink_metadata(root)?.uid() == self.uid {
            return Ok(());
        }
        let walk =
            walkdir::WalkDir::new(root).follow_links(false).follow_root_links(false).same_file_system(true);
        for entry in walk.into_iter().flatten() {
            let _ = std::os::unix::fs::lchown(entry.path(), Some(self.uid), Some(self.gid));
        }
        std::os::unix::fs::lchown(root, Some(self.uid), Some(self.gid))
    }

    /// Make `cmd` run as the user, with the user's HOME, USER and LOGNAME
    /// (a request's own env still wins). Dropping from root also drops the
    /// supplementary groups (std calls `setgroups(0)`).
    pub fn apply(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        cmd.uid(self.uid).gid(self.gid);
        self.apply_env(cmd);
    }

    /// Only the environment of [`RunUser::apply`]: for a supervisor that
    /// stays root and drops to the user for the command it starts.
    pub fn apply_env(&self, cmd: &mut std::process::Command) {
        cmd.envs(self.env());
    }

    /// The user's HOME, USER and LOGNAME.
    pub fn env(&self) -> [(&'static str, &std::ffi::OsStr); 3] {
        [("HOME", self.home.as_os_str()), ("USER", self.name.as_ref()), ("LOGNAME", self.name.as_ref())]
    }

    /// `uid:gid`, as `sandhold-agent shim --run-as` takes it.
    pub fn ids(&self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }
}

/// Make the sandbox root a directory of its own before it is handed to the
/// run user: whatever the image has at its path that is not a directory (a
/// link to `/etc`, a file) is removed first, as a copy into the container
/// would replace it. Handing over a link would hand over what it names.
pub fn make_root(root: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(root) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(meta) => {
            tracing::warn!(
                root = %root.display(),
                kind = if meta.is_symlink() { "a symbolic link" } else { "not a directory" },
                "the image's sandbox root is replaced by a directory"
            );
            std::fs::remove_file(root)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(root)
}

/// Refuse a root that is `/` or holds one of the agent's `own` paths (its
/// binary, its journal dir): handing it to the run user would hand those
/// too.
pub fn check_root(root: &Path, own: &[&Path]) -> anyhow::Result<()> {
    let root = std::path::absolute(root)?;
    anyhow::ensure!(root.parent().is_some(), "the sandbox root may not be / when commands run as a run user");
    for path in own {
        let path = std::path::absolute(path)?;
        anyhow::ensure!(
            !path.starts_with(&root),
            "the sandbox root {} holds the agent's {}; the run user must not own it",
            root.display(),
            path.display()
        );
    }
    Ok(())
}

fn has_id(text: &str, field: usize, id: u32) -> bool {
    let id = id.to_string();
    text.lines().any(|l| l.split(':').nth(field) == Some(id.as_str()))
}

fn append(path: &Path, existing: &str, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).create(true).mode(0o644).open(path)?;
    if !existing.is_empty() && !existing.ends_with('\n') {
        file.write_all(b"\n")?;
    }
    file.write_all(line.as_bytes())
}

/// Filesystem work done as the run user: while alive, the calling thread's
/// filesystem uid and gid are the user's (`setfsuid`, per thread), so what
/// it creates is the user's and it can reach nothing the user could not,
/// whatever links the user plants. Without a run user, or when the agent is
/// not root, it changes nothing.
///
/// Fails closed: a thread that cannot take the user's ids is an error, never
/// work done as root on the user's behalf (root would follow a link the user
/// planted to a file only root may write).
pub struct FsAs {
    restore: Option<Restore>,
}

/// How the calling thread's ids were changed, to be changed back.
enum Restore {
    /// `setfsuid`/`setfsgid`: the previous file-system ids.
    Fs(u32, u32),
    /// The thread's effective ids (root's kept as the saved ids).
    Effective,
}

impl FsAs {
    pub fn new(user: Option<&RunUser>) -> Result<Self, Error> {
        match user {
            Some(user) => Self::ids(user.uid, user.gid),
            None => Ok(Self { restore: None }),
        }
    }

    pub fn ids(uid: u32, gid: u32) -> Result<Self, Error> {
        // SAFETY: plain syscalls on the calling thread's credentials.
        unsafe {
            if libc::geteuid() != 0 {
                return Ok(Self { restore: None });
            }
            let old_gid = libc::setfsgid(gid) as u32;
            let old_uid = libc::setfsuid(uid) as u32;
            // An invalid id changes nothing and returns the current one:
            // whether the switch took. gVisor accepts setfsuid and ignores it.
            if libc::setfsuid(u32::MAX) as u32 == uid && libc::setfsgid(u32::MAX) as u32 == gid {
                return Ok(Self { restore: Some(Restore::Fs(old_uid, old_gid)) });
            }
            libc::setfsuid(old_uid);
            libc::setfsgid(old_gid);
            // The thread's effective ids decide file access as well. Raw
            // system calls change only this thread (libc's wrappers change
            // every thread of the process); the saved ids stay root's, so
            // `Drop` can switch back.
            let keep = libc::c_long::from(-1i32);
            if libc::syscall(libc::SYS_setresgid, keep, libc::c_long::from(gid), keep) != 0 {
                return Err(cannot_act_as(uid, gid, std::io::Error::last_os_error()));
            }
            if libc::syscall(libc::SYS_setresuid, keep, libc::c_long::from(uid), keep) != 0 {
                let why = std::io::Error::last_os_error();
                libc::syscall(libc::SYS_setresgid, keep, 0 as libc::c_long, keep);
                return Err(cannot_act_as(uid, gid, why));
            }
            Ok(Self { restore: Some(Restore::Effective) })
        }
    }
}

fn cannot_act_as(uid: u32, gid: u32, why: std::io::Error) -> Error {
    Error::internal(format!(
        "cannot act as the run user (uid {uid}, gid {gid}) on this thread ({why}); \
         refusing to do the user's file work as root"
    ))
}

impl Drop for FsAs {
    fn drop(&mut self) {
        // SAFETY: as in `ids`.
        unsafe {
            match self.restore {
                Some(Restore::Fs(uid, gid)) => {
                    libc::setfsuid(uid);
                    libc::setfsgid(gid);
                }
                Some(Restore::Effective) => {
                    let keep = libc::c_long::from(-1i32);
                    libc::syscall(libc::SYS_setresuid, keep, 0 as libc::c_long, keep);
                    libc::syscall(libc::SYS_setresgid, keep, 0 as libc::c_long, keep);
                }
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that cannot take the run user's ids (here: root without
    /// CAP_SETUID, capabilities being per thread) gets an error, not work
    /// done as root; and the group it had taken is given back.
    #[test]
    fn a_thread_that_cannot_become_the_run_user_is_refused_not_left_root() {
        // SAFETY: plain syscalls.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        std::thread::spawn(|| {
            #[repr(C)]
            struct Header {
                version: u32,
                pid: i32,
            }
            #[repr(C)]
            #[derive(Clone, Copy, Default)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            const VERSION_3: u32 = 0x2008_0522;
            const CAP_SETUID: u32 = 7;
            let mut header = Header { version: VERSION_3, pid: 0 };
            let mut data = [Data::default(); 2];
            // SAFETY: the kernel's own structures, for this thread (pid 0).
            unsafe {
                assert_eq!(libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()), 0);
                data[0].effective &= !(1 << CAP_SETUID);
                data[0].permitted &= !(1 << CAP_SETUID);
                assert_eq!(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()), 0);
            }
            let err = FsAs::ids(65534, 65534).err().expect("acting as root must be refused");
            assert!(err.to_string().contains("cannot act as the run user"), "{err}");
            let (mut r, mut e, mut s) = (1u32, 1u32, 1u32);
            // SAFETY: out-pointers to locals.
            unsafe { libc::syscall(libc::SYS_getresgid, &mut r, &mut e, &mut s) };
            assert_eq!((r, e, s), (0, 0, 0), "the group taken before the refusal is given back");
            assert!(FsAs::new(None).is_ok(), "no run user: nothing to take");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_root_over_the_agents_paths_is_refused() {
        let journal = Path::new("/run/sandhold/journal");
        let agent = Path::new("/.sandhold/sandhold-agent");
        for bad in ["/", "/run", "/run/sandhold", "/.sandhold"] {
            let err = check_root(Path::new(bad), &[journal, agent]).unwrap_err();
            assert!(format!("{err:#}").contains("root"), "{bad}: {err:#}");
        }
        check_root(Path::new("/workspace"), &[journal, agent]).unwrap();
        check_root(Path::new("/runner"), &[journal, agent]).unwrap();
    }

    /// A mount inside the root (here a tmpfs, when the test may mount one)
    /// keeps its owner: the walk stays on the root's filesystem.
    #[test]
    fn adopting_stays_on_the_roots_filesystem() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let inner = root.path().join("mnt");
        std::fs::create_dir(&inner).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&inner)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            return;
        }
        std::fs::write(inner.join("host-file"), b"x").unwrap();
        let user = RunUser { uid: 10001, gid: 10001, name: "u".into(), home: DEFAULT_HOME.into() };
        user.adopt(root.path()).unwrap();
        let owner = std::fs::metadata(inner.join("host-file")).unwrap().uid();
        let _ = std::process::Command::new("umount").arg(&inner).status();
        assert_eq!(owner, 0, "the walk crossed into a mount");
        assert_eq!(std::fs::metadata(root.path()).unwrap().uid(), 10001);
    }

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\n";

    /// `<dir>/etc` holding a passwd, and `<dir>/workspace` a link to it.
    fn workspace_linked_to_etc(dir: &Path) -> (PathBuf, PathBuf) {
        let (etc, link) = (dir.join("etc"), dir.join("workspace"));
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("passwd"), PASSWD).unwrap();
        std::os::unix::fs::symlink(&etc, &link).unwrap();
        (etc, link)
    }

    /// An image whose workdir is a link to `/etc`, or a file: the root
    /// becomes an empty directory of its own and what the link named is
    /// untouched; a directory the image has keeps its content.
    #[test]
    fn a_root_that_is_a_link_or_a_file_becomes_a_directory_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let (etc, link) = workspace_linked_to_etc(dir.path());
        make_root(&link).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_dir(), "the link is a directory now");
        assert_eq!(std::fs::read_dir(&link).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(etc.join("passwd")).unwrap(), PASSWD);

        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        make_root(&file).unwrap();
        assert!(std::fs::symlink_metadata(&file).unwrap().is_dir());

        let kept = dir.path().join("repo");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("README"), "hi").unwrap();
        make_root(&kept).unwrap();
        assert_eq!(std::fs::read_to_string(kept.join("README")).unwrap(), "hi");
        make_root(&dir.path().join("new/deeper")).unwrap();
        assert!(dir.path().join("new/deeper").is_dir());
    }

    /// Were a link ever handed over as the root, only the link would change
    /// owner, never the tree it names.
    #[test]
    fn adopting_a_link_hands_over_the_link_not_what_it_names() {
        // SAFETY: a plain syscall.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (etc, link) = workspace_linked_to_etc(dir.path());
        let user = RunUser { uid: 10001, gid: 10001, name: "u".into(), home: DEFAULT_HOME.into() };
        user.adopt(&link).unwrap();
        assert_eq!(std::fs::metadata(&etc).unwrap().uid(), 0, "the link's target was handed over");
        assert_eq!(std::fs::metadata(etc.join("passwd")).unwrap().uid(), 0);
        assert_eq!(std::fs::symlink_metadata(&link).unwrap().uid(), 10001);
    }

    #[test]
    fn an_image_without_passwd_gets_the_default_name_and_home() {
        let etc = tempfile::tempdir().unwrap();
        let user = RunUser::resolve("10001:10001", Path::new(DEFAULT_HOME), etc.path()).unwrap();
        assert_eq!(
            user,
            RunUser { uid: 10001, gid: 10001, name: "sandhold".into(), home: DEFAULT_HOME.into() }
        );
        user.add_entries(&etc.path().join("etc")).unwrap();
        let passwd = std::fs::read_to_string(etc.path().join("etc/passwd")).unwrap();
        assert_eq!(passwd, "sandhold:x:10001:10001::/home/sandhold:/bin/sh\n");
        let group = std::fs::read_to_string(etc.path().join("etc/group")).unwrap();
        assert_eq!(group, "sandhold:x:10001:\n");
        // Idempotent: a second start adds nothing.
        user.add_entries(&etc.path().join("etc")).unwrap();
        assert_eq!(std::fs::read_to_string(etc.path().join("etc/passwd")).unwrap(), passwd);
    }

    #[test]
    fn an_image_entry_keeps_its_name_and_home_and_root_is_refused() {
        let etc = tempfile::tempdir().unwrap();
        std::fs::write(
            etc.path().join("passwd"),
            "root:x:0:0::/root:/bin/sh\nsandhold:x:500:500::/h:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/false",
        )
        .unwrap();
        let user = RunUser::resolve("500", Path::new(DEFAULT_HOME), etc.path()).unwrap();
        assert_eq!((user.name.as_str(), user.home.as_path()), ("sandhold", Path::new("/h")));
        let other = RunUser::resolve("10001:10001", Path::new(DEFAULT_HOME), etc.path()).unwrap();
        assert_eq!(other.name, "sandhold-10001", "the name is taken by another uid");
        let nobody = RunUser::resolve("nobody", Path::new(DEFAULT_HOME), etc.path()).unwrap();
        assert_eq!((nobody.uid, nobody.home.as_path()), (65534, Path::new(DEFAULT_HOME)));
        // The last line lacks its newline: the added entry starts a line.
        other.add_entries(etc.path()).unwrap();
        let passwd = std::fs::read_to_string(etc.path().join("passwd")).unwrap();
        assert!(
            passwd.ends_with("/bin/false\nsandhold-10001:x:10001:10001::/home/sandhold:/bin/sh\n"),
            "{passwd}"
        );
        for root in ["root", "0", "0:0"] {
            let err = RunUser::resolve(root, Path::new(DEFAULT_HOME), etc.path()).unwrap_err();
            assert!(format!("{err:#}").contains("is root"), "{err:#}");
        }
    }
}
