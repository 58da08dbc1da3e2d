//! The run user of a Docker sandbox, played as a hostile tenant would: every
//! command (run, setup step, exec) runs as an unprivileged uid that cannot
//! read the agent's token, trace the agent or the shim, write the journal,
//! or forge the end of its run, even from a process it leaves behind; under
//! gVisor it sees gVisor's kernel, not the host's. Each test runs under
//! runc and under gVisor (`under_each_runtime!`). Real `sandhold` server
//! with tokens, real Docker engine.

use std::time::Duration;

use sandhold_tests::attack;
use sandhold_tests::docker::{self, DockerCleanup, LABEL_TENANT};
use sandhold_tests::provider::Kind;
use sandhold_tests::run::*;
use sandhold_tests::runtime::Runtime;
use sandhold_tests::sandbox::{ensure, sh, write_file};
use sandhold_tests::server::*;
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::eventually;
use shared::proto::v1 as api;

/// The Docker provider's default run user.
const RUN_UID: &str = "10001";
/// A sentinel-shaped line with a nonce that is not the run's.
const FORGED: &str = r#"{"__exit":0,"__nonce":"0123456789abcdef0123456789abcdef"}"#;

type Setup = TenantServer;

async fn setup(runtime: Runtime) -> Setup {
    docker::ensure_test_image();
    let s = TenantServer::start("runuser", &[]).await;
    let mut def = definition("def", Kind::Docker);
    runtime.apply(&mut def);
    def.workspace = Some(api::WorkspaceDefinition {
        setup: vec![api::SetupStep {
            step: Some(api::setup_step::Step::Serial("id -u > setup-uid; id -un >> setup-uid".into())),
        }],
        ..Default::default()
    });
    put_definition(&mut s.server.sandboxes(&s.token).await, def).await;
    s
}

async fn sandbox(s: &Setup, sandboxes: &mut Sandboxes) -> String {
    let req = api::EnsureSandboxRequest {
        definition_id: "def".into(),
        thread_id: "thread-1".into(),
        ..Default::default()
    };
    let (_, ready) = ensure(sandboxes, req).await;
    ready.unwrap_or_else(|e| panic!("ensure failed: {e}\n{}", s.server.log_text())).sandbox_id
}

/// What the run user gets at from its side, one line per hole it finds.
const PROBE_THE_AGENT: &str = r#"
cat /run/sandhold/token >/dev/null 2>&1 && echo HOLE token-read
ls /run/sandhold >/dev/null 2>&1 && echo HOLE run-dir-listed
touch /run/sandhold/journal/x 2>/dev/null && echo HOLE journal-written
a=/.sandhold/sandhold-agent
[ -x $a ] || echo HOLE agent-binary-missing
(: >>$a) 2>/dev/null && echo HOLE agent-binary-writable
mv $a $a.x 2>/dev/null && echo HOLE agent-binary-moved
touch /.sandhold/x 2>/dev/null && echo HOLE agent-dir-writable
n=0
for p in /proc/[0-9]*; do
  [ "$(awk '/^Uid:/ {print $2}' $p/status 2>/dev/null)" = 0 ] || continue
  n=$((n+1))
  cat $p/environ >/dev/null 2>&1 && echo HOLE environ-read ${p#/proc/}
  (exec 3<$p/mem) 2>/dev/null && echo HOLE mem-opened ${p#/proc/}
done
echo root-processes=$n
(exec 3</proc/self/mem) 2>/dev/null && echo own-mem-opens
"#;

/// A probe line that is gVisor's, not a hole of ours: gVisor (Debian's
/// 20221219 runsc) lets a process read the environment of a non-dumpable
/// process of another user, which Linux refuses. Those environments hold
/// the definition's `env` (the run user's own too) and no token or key:
/// the token is a file, the sentinel key reaches the shim on its stdin.
/// Memory (`/proc/<pid>/mem`) stays closed. docs/security.md says so.
fn known_under(runtime: Runtime, line: &str) -> bool {
    runtime == Runtime::Gvisor
        && (line.starts_with("HOLE environ-read") || line.starts_with("HOLE shim-environ"))
}

under_each_runtime! {
async fn the_run_user_cannot_read_the_token_trace_the_agent_or_write_the_journal(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let id = sandbox(&s, &mut sandboxes).await;
    let (code, out) = sh(&mut sandboxes, &id, &format!("id -u; {PROBE_THE_AGENT}")).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with(&format!("{RUN_UID}\n")), "{out}");
    let holes: Vec<&str> = out.lines().filter(|l| l.starts_with("HOLE") && !known_under(runtime, l)).collect();
    assert!(holes.is_empty(), "the run user reached the agent:\n{out}");
    // PID 1 (init) and the daemon at least; the probe itself works.
    let roots: u32 = out.split("root-processes=").nth(1).unwrap().lines().next().unwrap().parse().unwrap();
    assert!(roots >= 2, "{out}");
    assert!(out.contains("own-mem-opens"), "the probe can tell an open mem from a refused one:\n{out}");
    // The agent itself reads them fine: the token is there, the journal dir
    // the agent's.
    let container = docker::running(&format!("{LABEL_TENANT}={}", s.tenant)).pop().expect("the container");
    let stat = std::process::Command::new("docker")
        .args(["exec", &container, "stat", "-c", "%a", "/run/sandhold", "/run/sandhold/journal"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&stat.stdout), "700\n700\n");
    // What a readable environment shows (gVisor) holds nothing the agent
    // keeps: the token is in a file the run user cannot open.
    let token = std::process::Command::new("docker")
        .args(["exec", &container, "cat", "/run/sandhold/token"])
        .output()
        .unwrap();
    let token = String::from_utf8_lossy(&token.stdout).trim().to_string();
    assert!(token.len() >= 16);
    let (_, environs) = sh(&mut sandboxes, &id, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'").await;
    assert!(!environs.contains(&token), "the token is in a process environment");
}

async fn a_run_a_setup_step_an_exec_and_written_files_belong_to_the_run_user(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let id = sandbox(&s, &mut sandboxes).await;
    // The setup step ran as the run user, named by the passwd entry the
    // agent added to an image (busybox) that has none for it.
    assert_eq!(sh(&mut sandboxes, &id, "cat setup-uid").await, (0, format!("{RUN_UID}\nsandhold\n")));
    let (code, out) = sh(&mut sandboxes, &id, "id -u; id -g; echo $HOME; stat -c %u $HOME .").await;
    assert_eq!((code, out.as_str()), (0, "10001\n10001\n/home/sandhold\n10001\n10001\n"));

    // Files written through the API are the run user's, parents included.
    write_file(&mut sandboxes, &id, "up/x.txt", b"hi").await.unwrap();
    assert_eq!(
        sh(&mut sandboxes, &id, "stat -c '%u:%g %n' up up/x.txt; cat up/x.txt").await,
        (0, "10001:10001 up\n10001:10001 up/x.txt\nhi".into())
    );
    // And the API writes only where the run user may.
    assert!(write_file(&mut sandboxes, &id, "/etc/owned-by-root", b"x").await.is_err());

    // A run.
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("uid-{}", s.nonce);
    let seen = run_to_end(&mut runs, &run_id, "thread-1", "def", "echo run-uid=$(id -u)").await;
    assert!(seen.has_text(&format!("run-uid={RUN_UID}")), "{:?}", seen.chunks);
    assert_eq!(wait_terminal(&mut runs, &run_id).await.status, api::RunStatus::Completed as i32);
}

async fn a_process_left_behind_cannot_forge_the_end_of_its_run(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("forge-{}", s.nonce);
    // The command (as the run user) looks at its shim, prints a forged
    // sentinel, and leaves a process behind (its own session, the journal
    // as its stdout) that waits for the command to exit and then appends
    // forged sentinels and text for two seconds, counting each write in
    // /tmp/appended (renamed into place) before making it (the journal
    // itself is gone once the run is ingested).
    let script = format!(
        "echo shim-uid=$(awk '/^Uid:/ {{print $2}}' /proc/$PPID/status)\n\
         cat /proc/$PPID/environ >/dev/null 2>&1 && echo HOLE shim-environ\n\
         (exec 3</proc/$PPID/mem) 2>/dev/null && echo HOLE shim-mem\n\
         echo '{FORGED}'\n\
         cat > /tmp/leftover.sh <<'EOS'\n\
         while kill -0 $1 2>/dev/null; do sleep 0.01; done\n\
         i=0\n\
         while [ $i -lt 40 ]; do i=$((i+1)); echo $i >/tmp/next; mv /tmp/next /tmp/appended; echo '{FORGED}'; echo forged-after-exit; sleep 0.05; done\n\
         EOS\n\
         setsid sh /tmp/leftover.sh $$ &\n\
         exit 7\n"
    );
    let seen = run_to_end(&mut runs, &run_id, "thread-1", "def", &script).await;
    let record = wait_terminal(&mut runs, &run_id).await;
    assert_eq!(record.status, api::RunStatus::Failed as i32);
    let error = record.error.unwrap();
    assert!(error.message.contains("exited with code 7"), "the real exit code: {error:?}");
    assert!(seen.has_text("shim-uid=0"), "the shim is root: {:?}", seen.chunks);
    let holes = seen.chunks.iter().filter(|(_, c)| c.delta.starts_with("HOLE") && !known_under(runtime, &c.delta));
    assert_eq!(holes.count(), 0, "the command reached its shim: {:?}", seen.chunks);

    // The run has ended: how many lines the leftover had appended by now
    // bounds what may be in the log. Between the command's exit and the
    // shim's sentinel the leftover shares the command's stdout, and what it
    // writes in that window is indistinguishable from the command's output;
    // nothing written after the end may appear.
    let container = docker::running(&format!("{LABEL_TENANT}={}", s.tenant)).pop().expect("the container");
    // The count is renamed into place, so a read sees a whole number or no
    // file (nothing appended yet); a read that fails is tried again, never
    // taken for 0 (a low count would blame the log for lines the leftover
    // wrote before the end).
    let appended = || {
        for _ in 0..10 {
            let read = std::process::Command::new("docker")
                .args(["exec", &container, "sh", "-c", "cat /tmp/appended 2>/dev/null || echo 0"])
                .output();
            let count = read.ok().filter(|o| o.status.success());
            if let Some(n) = count.and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<usize>().ok()) {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not read the leftover's count from the container");
    };
    let at_end = appended();
    assert!(at_end < 40, "the leftover finished before the end was seen; the test proves nothing");
    // The leftover did go on appending after the end ...
    let finished = eventually(Duration::from_secs(20), || std::future::ready(appended() == 40)).await;
    assert!(finished, "the leftover process did not write after the exit");
    // ... and the log, read again from the start, is what was seen live:
    // it ends at the real end, with nothing the leftover wrote after it.
    let mut all = Seen::default();
    let mut attach = runs
        .attach_run(api::AttachRunRequest { run_id: run_id.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    read_until(&mut attach, &mut all, |_| false).await.unwrap();
    assert_eq!(all.chunks.len(), seen.chunks.len(), "{:?}", all.chunks);
    assert_eq!(
        all.chunks.last().map(|(_, c)| c.r#type),
        Some(api::ChunkType::RunError as i32),
        "{:?}",
        all.chunks
    );
    let forged = all.chunks.iter().filter(|(_, c)| c.delta.contains("forged-after-exit")).count();
    assert!(
        forged <= at_end,
        "{forged} forged lines in the log, {at_end} written before the end: {:?}",
        all.chunks
    );
    let record = wait_terminal(&mut runs, &run_id).await;
    assert!(record.error.unwrap().message.contains("exited with code 7"));
}

/// A capture reads the workspace as the run user, on every thread it
/// hashes with (one for a few files, several for many). The tenant guesses
/// the bytes of a file only root may read (root in the container put it in
/// the workspace) and saves the guess first: were the file hashed as root,
/// its hash would name the stored guess, so the save would not ask for its
/// bytes and would succeed, confirming the guess. It fails naming the file;
/// the run user's own files alone save.
async fn a_capture_of_few_or_many_files_never_reads_what_the_run_user_cannot(runtime) {
    docker::ensure_test_image();
    let s = TenantServer::start("runuser-capture", &[]).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut def = definition("def", Kind::Docker);
    runtime.apply(&mut def);
    def.lifecycle = Some(api::Lifecycle {
        portable_snapshots: Some(api::PortableSnapshots { enabled: true, ..Default::default() }),
        ..Default::default()
    });
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    put_definition(&mut sandboxes, def).await;
    let mut snapshots = api::snapshot_service_client::SnapshotServiceClient::with_interceptor(
        s.server.channel().await,
        sandhold_tests::auth::bearer(&s.token),
    );
    for (thread, files) in [("few", 20), ("many", 1_200)] {
        let req = api::EnsureSandboxRequest {
            definition_id: "def".into(),
            thread_id: thread.into(),
            ..Default::default()
        };
        let id = ensure(&mut sandboxes, req).await.1.unwrap_or_else(|e| panic!("{e}")).sandbox_id;
        let make = format!(
            "for i in $(seq 1 {files}); do mkdir -p d$((i % 7)); echo $i > d$((i % 7))/f$i; done && \
             echo ROOT-ONLY-BYTES > guess.txt"
        );
        let (code, out) = sh(&mut sandboxes, &id, &make).await;
        assert_eq!(code, 0, "{out}");
        let save = |label: &str| api::SaveSnapshotRequest {
            thread_id: thread.into(),
            label: label.into(),
            ..Default::default()
        };
        snapshots.save_snapshot(save("the guess")).await.unwrap();
        let container = docker::running(&format!("{LABEL_TENANT}={}", s.tenant)).pop().expect("the container");
        let root_only = "umask 077 && echo ROOT-ONLY-BYTES > /workspace/d3/zz-root && chmod 600 /workspace/d3/zz-root";
        let made = std::process::Command::new("docker")
            .args(["exec", "-u", "0", &container, "sh", "-c", root_only])
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let refused = snapshots.save_snapshot(save("with the root file")).await.unwrap_err();
        assert!(refused.message().contains("d3/zz-root"), "{thread}: {refused:?}");
        let (code, out) = sh(&mut sandboxes, &id, "rm -f d3/zz-root").await;
        assert_eq!(code, 0, "{out}");
        let saved = snapshots.save_snapshot(save("own files")).await.unwrap().into_inner();
        assert_eq!(saved.checkpoint.unwrap().file_count, files + 1, "{thread}");
        sandboxes.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id }).await.unwrap();
    }
}

/// The agent binary is one host file bound read-only into every container
/// (so no container carries a copy). A tenant who got root in its
/// container (here: `docker exec` as root, with the container's
/// capabilities) must not change it, since every other container runs it
/// as root: writes, a rename, a copy over it and a read-write remount all
/// fail, and the host file keeps its bytes and mode.
async fn root_in_a_container_cannot_change_the_agent_binary_every_container_runs(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    sandbox(&s, &mut sandboxes).await;
    let container = docker::running(&format!("{LABEL_TENANT}={}", s.tenant)).pop().expect("the container");
    let source = docker::inspect(
        &container,
        r#"{{range .Mounts}}{{if eq .Destination "/.sandhold/sandhold-agent"}}{{.Source}}{{end}}{{end}}"#,
    );
    assert!(!source.is_empty(), "the agent is bound from the host");
    let sha256 = |path: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
    };
    let before = sha256(&source);
    let attack = r#"a=/.sandhold/sandhold-agent
id -u
(: >>$a) 2>/dev/null && echo HOLE appended
(printf x | dd of=$a conv=notrunc 2>/dev/null) && echo HOLE overwritten
cp /bin/sh $a 2>/dev/null && echo HOLE copied-over
mv $a $a.x 2>/dev/null && echo HOLE moved
chmod 777 $a 2>/dev/null && echo HOLE chmod
mount -o remount,rw,bind $a 2>/dev/null && echo HOLE remounted
umount $a 2>/dev/null && echo HOLE unmounted
true"#;
    let out = std::process::Command::new("docker")
        .args(["exec", "-u", "0", &container, "sh", "-c", attack])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.starts_with("0\n"), "the attack runs as the container's root: {out}");
    assert!(!out.contains("HOLE"), "root in the container changed the shared agent:\n{out}");
    assert_eq!(sha256(&source), before, "the host's agent binary changed");
    let mode = std::fs::metadata(&source).map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    assert_eq!(mode.unwrap() & 0o7777, 0o555);
}

/// A tenant's image whose workdir is a link to `/etc`: the workspace the
/// run user is handed is a directory of its own, never what the link names
/// (owning `/etc` would let it write the passwd root logs in by). A
/// workspace the image fills is the run user's, files and all.
async fn an_image_whose_workspace_links_to_etc_hands_the_run_user_a_directory_not_etc(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let label = format!("{LABEL_TENANT}={}", s.tenant);
    let (builder, image) = (format!("sandhold-build-{}", s.nonce), format!("sandhold-test-linked:{}", s.nonce));
    let build = "rmdir /workspace && ln -s /etc /workspace && mkdir /repo && echo hi > /repo/README";
    docker::cli(&["run", "--name", &builder, "--label", &label, "--network", "none", docker::TEST_IMAGE, "sh", "-c", build]);
    docker::cli(&["commit", "--change", "WORKDIR /workspace", "--change", &format!("LABEL {label}"), &builder, &image]);
    docker::cli(&["rm", &builder]);
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    for (id, workdir) in [("linked", ""), ("repo", "/repo")] {
        let mut def = definition(id, Kind::Docker);
        runtime.apply(&mut def);
        if let Some(api::provider_spec::Provider::Docker(d)) = def.provider.as_mut().and_then(|p| p.provider.as_mut()) {
            d.image = image.clone();
            d.workdir = workdir.into();
        }
        put_definition(&mut sandboxes, def).await;
    }
    let ensured = |definition: &str| api::EnsureSandboxRequest {
        definition_id: definition.into(),
        thread_id: format!("thread-{definition}"),
        ..Default::default()
    };
    let (_, ready) = ensure(&mut sandboxes, ensured("linked")).await;
    let id = ready.unwrap_or_else(|e| panic!("ensure failed: {e}\n{}", s.server.log_text())).sandbox_id;
    let probe = "pwd; [ -L /workspace ] && echo HOLE still-a-link; stat -c '%u %n' /workspace /etc /etc/passwd; \
                 touch /etc/x 2>/dev/null && echo HOLE etc-written; ls -A /workspace | wc -l";
    let (code, out) = sh(&mut sandboxes, &id, probe).await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("HOLE"), "the run user got /etc:\n{out}");
    assert_eq!(out, format!("/workspace\n{RUN_UID} /workspace\n0 /etc\n0 /etc/passwd\n0\n"));

    let (_, ready) = ensure(&mut sandboxes, ensured("repo")).await;
    let id = ready.unwrap_or_else(|e| panic!("ensure failed: {e}\n{}", s.server.log_text())).sandbox_id;
    let (code, out) = sh(&mut sandboxes, &id, "stat -c '%u %n' . README; echo more >> README && cat README").await;
    assert_eq!((code, out), (0, format!("{RUN_UID} .\n{RUN_UID} README\nhi\nmore\n")));
}

async fn the_sandbox_runs_under_the_runtime_it_asked_for_and_sees_its_kernel(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let (_, ready) = ensure(
        &mut sandboxes,
        api::EnsureSandboxRequest { definition_id: "def".into(), thread_id: "thread-1".into(), ..Default::default() },
    )
    .await;
    let ready = ready.unwrap_or_else(|e| panic!("ensure failed: {e}\n{}", s.server.log_text()));
    let sandbox = ready.sandbox.unwrap();
    assert_eq!(sandbox.capabilities.unwrap().runtime, runtime.name(), "the capability names the runtime");
    assert_eq!(docker::inspect(&sandbox.provider_sandbox_id, "{{.HostConfig.Runtime}}"), runtime.engine_name());

    // The kernel a process of the run user talks to.
    let host = std::process::Command::new("uname").arg("-r").output().unwrap();
    let host = String::from_utf8_lossy(&host.stdout).trim().to_string();
    let (code, out) = sh(&mut sandboxes, &ready.sandbox_id, "uname -r; dmesg 2>/dev/null | head -n 3; true").await;
    assert_eq!(code, 0, "{out}");
    let seen = out.lines().next().unwrap_or_default();
    match runtime {
        Runtime::Runc => assert_eq!(seen, host, "runc shares the host's kernel"),
        Runtime::Gvisor => {
            assert_ne!(seen, host, "a gVisor sandbox must not see the host's kernel:\n{out}");
            assert!(out.contains("gVisor"), "gVisor's kernel log:\n{out}");
        }
    }
}

async fn the_run_user_cannot_trace_nor_write_where_its_run_policy_denies(runtime) {
    let s = setup(runtime).await;
    let _cleanup = DockerCleanup { tenant: s.tenant.clone() };
    let mut sandboxes = s.server.sandboxes(&s.token).await;
    let id = sandbox(&s, &mut sandboxes).await;
    let helper = std::fs::read(attack::syscalls_binary()).unwrap();
    write_file(&mut sandboxes, &id, "attack/syscalls", &helper).await.unwrap();
    assert_eq!(sh(&mut sandboxes, &id, "mkdir -p protected src && chmod +x attack/syscalls").await.0, 0);

    // The run's own policy denies writes under protected/: a command that
    // ignores it (this one is a plain shell, not a harness that reads it)
    // is stopped by the kernel where Landlock is there.
    let mut runs = s.server.runs(&s.token).await;
    let run_id = format!("deny-{}", s.nonce);
    let mut req = command_run(
        &run_id,
        "thread-1",
        "def",
        "(echo x > protected/new.txt) 2>/dev/null && echo WROTE-protected; echo x > src/free.txt && echo wrote-free; \
         ./attack/syscalls",
    );
    req.policy = Some(api::SandboxPolicy {
        default: api::PolicyEffect::Allow as i32,
        rules: vec![api::PolicyRule {
            action: api::PolicyAction::FileWrite as i32,
            pattern: "protected/**".into(),
            effect: api::PolicyEffect::Deny as i32,
        }],
        ..Default::default()
    });
    let mut stream = runs.start_run(req).await.unwrap().into_inner();
    let mut seen = Seen::default();
    read_until(&mut stream, &mut seen, |_| false).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.server.log_text()));
    let text: String = seen.chunks.iter().map(|(_, c)| c.delta.as_str()).collect::<Vec<_>>().join("\n");
    assert!(text.contains("wrote-free"), "ordinary writes work: {:?}\n{}", seen.chunks, s.server.log_text());
    // Docker's own seccomp profile and ours both stand here; ptrace of a
    // process it did not start is ours alone (Docker allows ptrace).
    let outcomes = attack::outcomes(text.as_bytes());
    assert_eq!(outcomes.get("ptrace").map(String::as_str), Some("EPERM"), "{text}");
    for call in ["mount", "bpf", "unshare_user", "keyctl"] {
        assert_eq!(outcomes.get(call).map(String::as_str), Some("EPERM"), "{call}: {text}");
    }
    let warned = seen
        .chunks
        .iter()
        .any(|(_, c)| c.name == "harness.warning" && c.value_json.contains("Landlock does not confine"));
    match runtime {
        // The host kernel has Landlock: the write is refused, no warning.
        Runtime::Runc => {
            assert!(!text.contains("WROTE-protected"), "the kernel let a denied write through: {text}");
            assert!(!warned, "{text}");
        }
        // gVisor has no Landlock: the run is told so, never silently (the
        // policy then binds only harnesses that apply it).
        Runtime::Gvisor => assert!(warned, "no Landlock warning under gVisor: {:?}", seen.chunks),
    }
}
}
