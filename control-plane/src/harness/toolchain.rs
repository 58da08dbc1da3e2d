//! What a harness's CLI is as a package for the toolchain dir (the dir
//! itself, its install and listing: the top-level `toolchain` module). Each harness
//! folder pins its own ([`Harness::toolchain`](super::Harness::toolchain)).

/// Which C library a binary needs: what the image must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libc {
    Glibc,
    Musl,
}

impl Libc {
    pub const ALL: [Libc; 2] = [Libc::Glibc, Libc::Musl];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Glibc => "glibc",
            Self::Musl => "musl",
        }
    }

    /// A shell probe that prints `glibc` and/or `musl` for the loaders an
    /// image has (x86-64).
    pub const PROBE: &'static str = "test -e /lib64/ld-linux-x86-64.so.2 && echo glibc; \
        test -e /lib/ld-musl-x86_64.so.1 && echo musl; true";

    /// The C library of an image from [`Libc::PROBE`]'s output (glibc
    /// first); `None` for an image with neither (scratch, static busybox).
    pub fn of_image(probe_output: &str) -> Option<Libc> {
        let has = |l: Libc| probe_output.lines().any(|line| line.trim() == l.as_str());
        Libc::ALL.into_iter().find(|l| has(*l))
    }
}

/// One npm package holding a native binary for one libc (or for any:
/// a static binary).
#[derive(Debug, Clone, Copy)]
pub struct Package {
    /// `None`: static, runs on either.
    pub libc: Option<Libc>,
    /// `name@version` as npm resolves it.
    pub spec: &'static str,
    /// The binary inside the package (under `package/`).
    pub binary: &'static str,
    /// The tarball's `dist.integrity` as the registry published it when
    /// this version was pinned (`npm view SPEC dist.integrity`): npm checks
    /// a tarball against what the registry says now, this against what it
    /// said then.
    pub integrity: &'static str,
}

/// A harness CLI Sandhold can bring into sandboxes.
#[derive(Debug, Clone, Copy)]
pub struct Cli {
    /// The harness's name (`claude-code`, `codex`, `opencode`).
    pub harness: &'static str,
    /// The program the harness runs.
    pub program: &'static str,
    pub version: &'static str,
    pub packages: &'static [Package],
}

impl Cli {
    /// Whether a build of this CLI runs with `libc` (`None`: an image with
    /// no C library).
    pub fn runs_with(&self, libc: Option<Libc>) -> bool {
        self.packages.iter().any(|p| p.libc.is_none() || p.libc == libc && libc.is_some())
    }
}
