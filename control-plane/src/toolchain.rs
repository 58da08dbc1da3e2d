//! Harness CLIs for sandboxes whose images do not have them: the native
//! binaries of Claude Code, Codex and OpenCode, fetched from the npm
//! registry at pinned versions into a host directory (the toolchain dir,
//! `<data-dir>/toolchains` by default) that Docker sandboxes get read-only
//! at [`MOUNT`], and that runs find first on their `PATH`.
//!
//! ```text
//! <dir>/<harness>/<version>/<libc>/   one npm package, unpacked
//! <dir>/<libc>/bin/<program>          -> the current version's binary
//! ```
//!
//! `libc` is `glibc` or `musl`: which loader the image has decides which
//! `bin` a sandbox gets ([`Libc::of_image`]); a static binary (Codex) is
//! linked into both. The packages are the platform ones the CLIs' own npm
//! packages depend on, fetched with `npm pack` (no install scripts run)
//! and unpacked with `tar`. Each harness pins its own package in its
//! folder ([`Harness::toolchain`]); [`catalogue`] lists them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::harness::Harness;
pub use crate::harness::toolchain::{Cli, Libc, Package};

/// Where Docker sandboxes see the toolchain dir (read-only).
pub const MOUNT: &str = "/opt/sandhold/toolchains";

/// What `sandhold harness install` knows: each harness's pinned CLI (the
/// same versions the tests drive), in the registry's order.
pub fn catalogue() -> impl Iterator<Item = &'static Cli> {
    Harness::ALL.iter().filter_map(|h| h.toolchain())
}

impl Cli {
    pub fn named(harness: &str) -> Option<&'static Cli> {
        Harness::parse(harness).ok().and_then(Harness::toolchain)
    }
}

/// Where one package of `cli` is unpacked under `root`.
fn package_dir(cli: &Cli, root: &Path, package: &Package) -> PathBuf {
    let flavour = package.libc.map(Libc::as_str).unwrap_or("static");
    root.join(cli.harness).join(cli.version).join(flavour)
}

/// A harness CLI found in the toolchain dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub harness: String,
    pub version: String,
    /// The C libraries it has a binary for.
    pub libcs: Vec<&'static str>,
}

/// The toolchain dir.
#[derive(Debug, Clone)]
pub struct Toolchains {
    root: PathBuf,
}

impl Toolchains {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `bin` dir for `libc`, as the host sees it.
    pub fn bin_dir(&self, libc: Libc) -> PathBuf {
        self.root.join(libc.as_str()).join("bin")
    }

    /// Fetch and unpack `cli`'s packages that are not here yet, then point
    /// the `bin` dirs at this version. `say` hears what happens.
    pub fn install(&self, cli: &Cli, say: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.root).with_context(|| format!("creating {}", self.root.display()))?;
        for package in cli.packages {
            let dir = package_dir(cli, &self.root, package);
            if dir.join("package").join(package.binary).is_file() {
                say(&format!("{} {}: {} already here", cli.harness, cli.version, package.spec));
                continue;
            }
            say(&format!("{} {}: fetching {} from the npm registry", cli.harness, cli.version, package.spec));
            fetch(package.spec, package.integrity, &self.root, &dir)?;
            if !dir.join("package").join(package.binary).is_file() {
                bail!("{} has no {} (a changed package layout?)", package.spec, package.binary);
            }
        }
        for libc in Libc::ALL {
            let package = cli
                .packages
                .iter()
                .find(|p| p.libc == Some(libc))
                .or_else(|| cli.packages.iter().find(|p| p.libc.is_none()));
            let Some(package) = package else { continue };
            let bin = self.bin_dir(libc);
            std::fs::create_dir_all(&bin)?;
            // Relative, so the link holds wherever the dir is mounted.
            let target = Path::new("../..")
                .join(package_dir(cli, Path::new(""), package))
                .join("package")
                .join(package.binary);
            let link = bin.join(cli.program);
            let tmp = bin.join(format!(".{}.new", cli.program));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp)?;
            std::fs::rename(&tmp, &link)?;
        }
        say(&format!("{} {} installed", cli.harness, cli.version));
        Ok(())
    }

    /// The harness CLIs the `bin` dirs point at, with their versions.
    pub fn list(&self) -> Vec<Installed> {
        let mut out: Vec<Installed> = Vec::new();
        for cli in catalogue() {
            for libc in Libc::ALL {
                let link = self.bin_dir(libc).join(cli.program);
                let Ok(target) = std::fs::read_link(&link) else { continue };
                if !link.is_file() {
                    continue; // dangling
                }
                // ../../<harness>/<version>/<flavour>/package/...
                let version =
                    target.components().nth(3).map(|c| c.as_os_str().to_string_lossy().into_owned());
                let version = version.unwrap_or_default();
                match out.iter_mut().find(|i| i.harness == cli.harness && i.version == version) {
                    Some(i) => i.libcs.push(libc.as_str()),
                    None => out.push(Installed {
                        harness: cli.harness.into(),
                        version,
                        libcs: vec![libc.as_str()],
                    }),
                }
            }
        }
        out
    }

    /// Whether `cli` has a binary for `libc` here.
    pub fn has(&self, cli: &Cli, libc: Libc) -> bool {
        self.bin_dir(libc).join(cli.program).is_file()
    }
}

/// A directory for one fetch, removed with everything in it on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(root: &Path) -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let dir = root.join(format!(".fetch-{}-{}", std::process::id(), nanos.as_nanos()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Refuse the tarball at `path` unless its SHA-512 is the pinned
/// `integrity` (`sha512-<base64>`, as npm writes it).
fn check_integrity(spec: &str, path: &Path, integrity: &str) -> anyhow::Result<()> {
    use base64::Engine;
    use sha2::Digest;
    let data = std::fs::read(path).with_context(|| format!("reading the tarball of {spec}"))?;
    let got =
        format!("sha512-{}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(&data)));
    if got != integrity {
        bail!(
            "the tarball of {spec} is not the one pinned in the catalogue (integrity {got}, pinned {integrity}): \
             refusing to install it"
        );
    }
    Ok(())
}

/// `npm pack SPEC` into a scratch dir under `root`, checked against its
/// pinned `integrity`, unpacked into `dir` (moved into place whole, so a
/// broken fetch leaves nothing behind).
fn fetch(spec: &str, integrity: &str, root: &Path, dir: &Path) -> anyhow::Result<()> {
    let scratch = Scratch::new(root)?;
    let npm = Command::new("npm")
        .args(["pack", "--silent", "--pack-destination"])
        .arg(scratch.path())
        .arg(spec)
        .current_dir(scratch.path())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "npm is not installed: `sandhold harness install` fetches the CLIs from the npm registry \
                 (apt-get install npm)"
            ),
            _ => anyhow::anyhow!("running npm: {e}"),
        })?;
    if !npm.status.success() {
        bail!("npm pack {spec} failed: {}", String::from_utf8_lossy(&npm.stderr).trim());
    }
    let tarball = String::from_utf8_lossy(&npm.stdout).lines().last().unwrap_or_default().trim().to_string();
    check_integrity(spec, &scratch.path().join(&tarball), integrity)?;
    let unpacked = scratch.path().join("unpacked");
    std::fs::create_dir_all(&unpacked)?;
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(scratch.path().join(&tarball))
        .arg("-C")
        .arg(&unpacked)
        .arg("--no-same-owner")
        .output()
        .context("running tar")?;
    if !tar.status.success() {
        bail!("unpacking {tarball}: {}", String::from_utf8_lossy(&tar.stderr).trim());
    }
    std::fs::create_dir_all(dir.parent().expect("a package dir has a parent"))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&unpacked, dir).with_context(|| format!("moving the package to {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tarball_that_is_not_the_pinned_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tarball = dir.path().join("p.tgz");
        std::fs::write(&tarball, b"the package").unwrap();
        // sha512 of "the package", as npm writes it.
        use base64::Engine;
        use sha2::Digest;
        let pinned = format!(
            "sha512-{}",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(b"the package"))
        );
        check_integrity("p@1", &tarball, &pinned).unwrap();
        std::fs::write(&tarball, b"the package, tampered").unwrap();
        let err = check_integrity("p@1", &tarball, &pinned).unwrap_err().to_string();
        assert!(err.contains("p@1") && err.contains("not the one pinned") && err.contains(&pinned), "{err}");
        // Every package of the catalogue has a pin of that shape.
        for cli in catalogue() {
            for p in cli.packages {
                let b64 = p.integrity.strip_prefix("sha512-").unwrap_or_else(|| panic!("{}", p.spec));
                let raw = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
                assert_eq!(raw.len(), 64, "{}", p.spec);
            }
        }
    }

    #[test]
    fn the_image_probe_picks_glibc_first_and_knows_none() {
        assert_eq!(Libc::of_image("glibc\nmusl\n"), Some(Libc::Glibc));
        assert_eq!(Libc::of_image("musl\n"), Some(Libc::Musl));
        assert_eq!(Libc::of_image(""), None);
        let claude = Cli::named("claude-code").unwrap();
        let codex = Cli::named("codex").unwrap();
        let opencode = Cli::named("opencode").unwrap();
        assert!(claude.runs_with(Some(Libc::Musl)) && !claude.runs_with(None));
        assert!(codex.runs_with(None) && codex.runs_with(Some(Libc::Glibc)));
        assert!(opencode.runs_with(Some(Libc::Glibc)) && !opencode.runs_with(Some(Libc::Musl)));
    }

    #[test]
    fn installed_clis_are_listed_from_the_bin_links() {
        let dir = tempfile::tempdir().unwrap();
        let chains = Toolchains::new(dir.path());
        assert!(chains.list().is_empty());
        // What an install leaves, made by hand (no registry in a unit test).
        let codex = Cli::named("codex").unwrap();
        let package = &codex.packages[0];
        let binary = package_dir(codex, dir.path(), package).join("package").join(package.binary);
        std::fs::create_dir_all(binary.parent().unwrap()).unwrap();
        std::fs::write(&binary, "#!/bin/sh\n").unwrap();
        chains.install(codex, &mut |_| {}).unwrap();
        assert_eq!(
            chains.list(),
            [Installed { harness: "codex".into(), version: "0.171.0".into(), libcs: vec!["glibc", "musl"] }]
        );
        assert!(chains.has(codex, Libc::Musl));
        assert!(!chains.has(Cli::named("claude-code").unwrap(), Libc::Glibc));
    }
}
