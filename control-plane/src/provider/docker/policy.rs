//! The Docker half of the operator policy: which images, networks, mounts
//! and limits a definition's `provider.docker` may ask for, each breach a
//! field violation that names the rule; and the default limits a
//! definition that names none gets.
//!
//! Before a create, bind sources are also resolved on this host (symlinks
//! followed, as the engine will) and must still be under a prefix: a link
//! a sandbox left in a writable prefix cannot point a later bind at `/`.

use std::path::{Path, PathBuf};

use shared::proto::v1::DockerProvider;

use super::DockerOptions;
use crate::config::{Policy, Runtime, forbidden_network, plain_absolute};

/// Image repositories the control plane makes for native snapshots and
/// forks: never a tenant's to name (they hold other sandboxes' files).
const RESERVED_IMAGE_REPOS: [&str; 2] = ["sandhold-snapshot", "sandhold-fork"];
/// Container paths the agent owns: its binary and its host directory.
const RESERVED_TARGETS: [&str; 2] = ["/.sandhold", "/run/sandhold"];

pub(super) fn violations(d: &DockerProvider, p: &Policy, on_host: bool, out: &mut Vec<(String, String)>) {
    let mut bad = |field: &str, why: String| out.push((format!("definition.provider.docker.{field}"), why));
    if !d.image.is_empty() {
        let repo = d.image.split(['@', ':']).next().unwrap_or_default();
        if RESERVED_IMAGE_REPOS.contains(&repo) {
            bad("image", format!("{:?} is an image Sandhold made for another sandbox", d.image));
        } else if !p.docker_images.iter().any(|allowed| image_allowed(allowed, &d.image)) {
            bad("image", format!("{:?} is not an allowed image (operator policy: docker_images)", d.image));
        }
    }
    if !d.network.is_empty() && d.network != "none" {
        if forbidden_network(&d.network) {
            bad(
                "network",
                format!(
                    "{:?} shares the host's or another container's namespaces and is never allowed \
                     (operator policy: docker_networks)",
                    d.network
                ),
            );
        } else if !p.docker_networks.iter().any(|n| n == "*" || *n == d.network) {
            bad(
                "network",
                format!("{:?} is not an allowed network (operator policy: docker_networks)", d.network),
            );
        }
    }
    for (i, m) in d.mounts.iter().enumerate() {
        let field = format!("mounts[{i}]");
        let target = Path::new(&m.target);
        if RESERVED_TARGETS.iter().any(|r| target.starts_with(r) || Path::new(r).starts_with(target)) {
            bad(&field, format!("target {:?} is reserved for the sandbox agent", m.target));
        }
        if m.source.starts_with('/') {
            if let Some(why) = bind_refusal(p, Path::new(&m.source), m.read_only, on_host) {
                bad(&field, why);
            }
        } else if !p.docker_volumes.contains(&m.source) {
            bad(
                &field,
                format!("volume {:?} is not an allowed volume (operator policy: docker_volumes)", m.source),
            );
        }
    }
    if let Some(why) = runtime_refusal(d, p) {
        bad("runtime", why);
    }
    let over = |value: f64, max: f64| max > 0.0 && value > max;
    if over(d.memory_bytes as f64, p.docker_max_memory_bytes as f64) {
        bad(
            "memory_bytes",
            format!(
                "{} is over the maximum of {} (operator policy: docker_max_memory_bytes)",
                d.memory_bytes, p.docker_max_memory_bytes
            ),
        );
    }
    if over(d.cpus, p.docker_max_cpus) {
        bad(
            "cpus",
            format!(
                "{} is over the maximum of {} (operator policy: docker_max_cpus)",
                d.cpus, p.docker_max_cpus
            ),
        );
    }
    if over(d.pids_limit as f64, p.docker_max_pids_limit as f64) {
        bad(
            "pids_limit",
            format!(
                "{} is over the maximum of {} (operator policy: docker_max_pids_limit)",
                d.pids_limit, p.docker_max_pids_limit
            ),
        );
    }
}

/// Why the runtime `d` names is refused for the tenant `p` is the policy
/// of, or `None`.
fn runtime_refusal(d: &DockerProvider, p: &Policy) -> Option<String> {
    // An unknown name is the definition's own error (`Kind::validate`).
    let asked = Runtime::named(&d.runtime)?;
    if let Some(required) = p.require_runtime.filter(|r| *r != asked) {
        return Some(format!(
            "{:?} is refused: this tenant's Docker sandboxes must run under {} (operator policy: \
             require_runtime); name {:?} or leave the runtime out",
            d.runtime,
            required.as_str(),
            required.as_str()
        ));
    }
    (!p.docker_runtimes.contains(&asked))
        .then(|| format!("{:?} is not an allowed runtime (operator policy: docker_runtimes)", d.runtime))
}

/// The runtime a sandbox of `d` runs under: the one it names, else the one
/// the tenant is required to use; `None` (runc) otherwise.
pub(super) fn runtime(d: Option<&DockerProvider>, p: &Policy) -> Option<Runtime> {
    d.and_then(|d| Runtime::named(&d.runtime)).or(p.require_runtime)
}

/// The default limits where `docker` names none.
pub(super) fn apply_limits(p: &Policy, docker: &mut DockerOptions) {
    if docker.memory_bytes.is_none() && p.docker_default_memory_bytes > 0 {
        docker.memory_bytes = Some(i64::try_from(p.docker_default_memory_bytes).unwrap_or(i64::MAX));
    }
    if docker.cpus.is_none() && p.docker_default_cpus > 0.0 {
        docker.cpus = Some(p.docker_default_cpus);
    }
    if docker.pids_limit.is_none() && p.docker_default_pids_limit > 0 {
        docker.pids_limit = Some(p.docker_default_pids_limit);
    }
}

/// `allowed` (an image, any tag or digest of it, or a prefix ending in
/// `*`) admits `image`.
fn image_allowed(allowed: &str, image: &str) -> bool {
    match allowed.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => {
            image == allowed
                || image
                    .strip_prefix(allowed)
                    .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('@'))
        }
    }
}

/// Why a bind of host path `source` is refused, or `None`.
fn bind_refusal(p: &Policy, source: &Path, read_only: bool, on_host: bool) -> Option<String> {
    if !plain_absolute(source) {
        return Some(format!(
            "bind source {} must be an absolute path without `.` or `..`",
            source.display()
        ));
    }
    // The engine follows links in the source on this host, so the check
    // must too; a missing source the engine refuses anyway.
    let (source, resolve): (PathBuf, fn(&Path) -> PathBuf) = if on_host {
        (std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf()), |prefix| {
            std::fs::canonicalize(prefix).unwrap_or_else(|_| prefix.to_path_buf())
        })
    } else {
        (source.to_path_buf(), Path::to_path_buf)
    };
    let under = |prefixes: &[PathBuf]| prefixes.iter().any(|prefix| source.starts_with(resolve(prefix)));
    if under(&p.docker_writable_bind_prefixes) {
        return None;
    }
    if under(&p.docker_bind_prefixes) {
        return (!read_only).then(|| {
            format!(
                "a read-write bind of {} needs a prefix listed as writable \
                 (operator policy: docker_writable_bind_prefixes)",
                source.display()
            )
        });
    }
    Some(format!(
        "host path {} is not under an allowed bind prefix (operator policy: docker_bind_prefixes)",
        source.display()
    ))
}

#[cfg(test)]
mod tests {
    use shared::proto::v1::Mount;

    use super::*;

    fn docker(d: DockerProvider) -> DockerProvider {
        d
    }

    fn image(name: &str) -> DockerProvider {
        DockerProvider { image: name.into(), ..Default::default() }
    }

    fn mount(source: &str, read_only: bool) -> Mount {
        Mount { source: source.into(), target: "/m".into(), read_only }
    }

    /// The refused fields and their reasons.
    fn refused(policy: &Policy, d: &DockerProvider) -> Vec<(String, String)> {
        let mut out = Vec::new();
        violations(d, policy, false, &mut out);
        out
    }

    fn rule_of(violations: &[(String, String)], field: &str) -> String {
        violations.iter().find(|(f, _)| f == field).map(|(_, w)| w.clone()).unwrap_or_default()
    }

    #[test]
    fn networks_other_than_none_must_be_listed_and_never_host() {
        let listed = Policy { docker_networks: vec!["sandnet".into()], ..Default::default() };
        let policy = listed;
        for ok in ["", "none", "sandnet"] {
            assert!(
                refused(&policy, &docker(DockerProvider { network: ok.into(), ..image("x") })).is_empty()
            );
        }
        for (net, rule) in [
            ("host", "never allowed"),
            ("container:abc", "never allowed"),
            ("bridge", "not an allowed network"),
        ] {
            let v = refused(&policy, &docker(DockerProvider { network: net.into(), ..image("x") }));
            assert!(rule_of(&v, "definition.provider.docker.network").contains(rule), "{net}: {v:?}");
        }
    }

    #[test]
    fn binds_only_under_prefixes_and_read_write_only_under_writable_ones() {
        let policy = Policy {
            docker_bind_prefixes: vec!["/srv/ro".into()],
            docker_writable_bind_prefixes: vec!["/srv/rw".into()],
            docker_volumes: vec!["cache".into()],
            ..Default::default()
        };
        let with = |m: Mount| docker(DockerProvider { mounts: vec![m], ..image("x") });
        for ok in [
            mount("/srv/ro/a", true),
            mount("/srv/rw/b", false),
            mount("/srv/rw", true),
            mount("cache", false),
        ] {
            assert!(refused(&policy, &with(ok.clone())).is_empty(), "{ok:?}");
        }
        let cases = [
            (mount("/", true), "docker_bind_prefixes"),
            (mount("/srv/rox", true), "docker_bind_prefixes"),
            (mount("/srv/ro/../../etc", true), "without `.` or `..`"),
            (mount("/srv/ro/a", false), "docker_writable_bind_prefixes"),
            (mount("other-volume", false), "docker_volumes"),
            (Mount { source: "cache".into(), target: "/run/sandhold/x".into(), read_only: true }, "reserved"),
            (Mount { source: "cache".into(), target: "/run".into(), read_only: true }, "reserved"),
        ];
        for (m, rule) in cases {
            let v = refused(&policy, &with(m.clone()));
            assert!(rule_of(&v, "definition.provider.docker.mounts[0]").contains(rule), "{m:?}: {v:?}");
        }
    }

    #[test]
    fn a_link_in_a_prefix_is_followed_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("shared");
        std::fs::create_dir(&prefix).unwrap();
        std::os::unix::fs::symlink("/", prefix.join("root")).unwrap();
        let policy = Policy { docker_bind_prefixes: vec![prefix.clone()], ..Default::default() };
        let d = docker(DockerProvider {
            mounts: vec![mount(&prefix.join("root").display().to_string(), true)],
            ..image("x")
        });
        assert!(refused(&policy, &d).is_empty(), "lexically under the prefix");
        let mut on_host = Vec::new();
        violations(&d, &policy, true, &mut on_host);
        let err = rule_of(&on_host, "definition.provider.docker.mounts[0]");
        assert!(err.contains("not under an allowed bind prefix"), "{err:?}");
    }

    #[test]
    fn images_exact_with_any_tag_or_by_prefix_and_never_sandholds_own() {
        let policy = Policy {
            docker_images: vec!["debian".into(), "registry.local/team/*".into()],
            ..Default::default()
        };
        for ok in ["debian", "debian:bookworm", "debian@sha256:abc", "registry.local/team/app:1"] {
            assert!(refused(&policy, &docker(image(ok))).is_empty(), "{ok}");
        }
        for bad in ["debianx", "ubuntu", "registry.local/other/app"] {
            let v = refused(&policy, &docker(image(bad)));
            assert!(
                rule_of(&v, "definition.provider.docker.image").contains("docker_images"),
                "{bad}: {v:?}"
            );
        }
        let any = Policy::default();
        assert!(refused(&any, &docker(image("anything:1"))).is_empty());
        let v = refused(&any, &docker(image("sandhold-snapshot:abc")));
        assert!(rule_of(&v, "definition.provider.docker.image").contains("another sandbox"), "{v:?}");
    }

    #[test]
    fn a_required_runtime_is_the_default_and_no_other_is_allowed() {
        let gvisor = DockerProvider { runtime: "gvisor".into(), ..image("x") };
        let runc = DockerProvider { runtime: "runc".into(), ..image("x") };
        let open = Policy::default();
        assert!(refused(&open, &gvisor).is_empty() && refused(&open, &runc).is_empty());
        assert_eq!(runtime(Some(&image("x")), &open), None, "runc");

        let required = Policy { require_runtime: Some(Runtime::Gvisor), ..Default::default() };
        assert!(refused(&required, &gvisor).is_empty());
        assert!(refused(&required, &image("x")).is_empty(), "naming none is fine");
        assert_eq!(runtime(Some(&image("x")), &required), Some(Runtime::Gvisor), "and gets gvisor");
        let v = refused(&required, &runc);
        assert!(rule_of(&v, "definition.provider.docker.runtime").contains("require_runtime"), "{v:?}");

        let runc_only = Policy { docker_runtimes: vec![Runtime::Runc], ..Default::default() };
        let v = refused(&runc_only, &gvisor);
        assert!(rule_of(&v, "definition.provider.docker.runtime").contains("docker_runtimes"), "{v:?}");
    }

    #[test]
    fn limits_over_the_maximum_are_refused_and_missing_ones_defaulted() {
        let policy = Policy { docker_default_cpus: 1.0, docker_max_cpus: 2.0, ..Default::default() };
        let over = DockerProvider { memory_bytes: 17 << 30, cpus: 2.5, pids_limit: 10_000, ..image("x") };
        let v = refused(&policy, &docker(over));
        for (field, rule) in [
            ("memory_bytes", "docker_max_memory_bytes"),
            ("cpus", "docker_max_cpus"),
            ("pids_limit", "docker_max_pids_limit"),
        ] {
            assert!(rule_of(&v, &format!("definition.provider.docker.{field}")).contains(rule), "{v:?}");
        }
        let at_max = DockerProvider { memory_bytes: 16 << 30, cpus: 2.0, pids_limit: 8192, ..image("x") };
        assert!(refused(&policy, &docker(at_max)).is_empty());

        let mut opts = DockerOptions::default();
        apply_limits(&policy, &mut opts);
        assert_eq!((opts.memory_bytes, opts.cpus, opts.pids_limit), (Some(2 << 30), Some(1.0), Some(1024)));
        let mut named = DockerOptions { memory_bytes: Some(1 << 20), ..Default::default() };
        apply_limits(&policy, &mut named);
        assert_eq!(named.memory_bytes, Some(1 << 20), "a named limit is kept");
    }
}
