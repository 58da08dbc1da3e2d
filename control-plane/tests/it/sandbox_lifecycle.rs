//! `SandboxService` over a real server socket: one lifecycle suite run for
//! the local provider and for Docker (on the real engine, under runc and
//! under gVisor), plus failed ensures and where secrets must never end up.
//! Its files, watch and exec part runs again on sandboxes on a fleet node.

use sandhold_tests::docker::{self, DockerCleanup, TEST_IMAGE};
use sandhold_tests::fleet::{Place, served};
use sandhold_tests::provider::Kind;
use sandhold_tests::runtime::Runtime;
use sandhold_tests::sandbox::*;
use sandhold_tests::server::{Harness, Sandboxes, captured_logs};
use sandhold_tests::under_each_runtime;
use sandhold_tests::wait::{PATIENCE, eventually};
use shared::proto::v1 as api;

const IMAGE: &str = TEST_IMAGE;

fn provider(kind: Kind) -> api::ProviderSpec {
    let provider = match kind {
        Kind::Local => api::provider_spec::Provider::Local(api::LocalProvider {}),
        Kind::Docker => api::provider_spec::Provider::Docker(api::DockerProvider {
            image: IMAGE.into(),
            ..Default::default()
        }),
    };
    api::ProviderSpec { provider: Some(provider) }
}

fn serial(cmd: &str) -> api::SetupStep {
    api::SetupStep { step: Some(api::setup_step::Step::Serial(cmd.into())) }
}

fn definition(id: &str, kind: Kind, setup: Vec<api::SetupStep>) -> api::SandboxDefinition {
    api::SandboxDefinition {
        id: id.into(),
        provider: Some(provider(kind)),
        workspace: Some(api::WorkspaceDefinition { setup, ..Default::default() }),
        secret_names: vec!["API_TOKEN".into()],
        env: [("PLAIN".to_string(), "plain-value".to_string())].into(),
        ..Default::default()
    }
}

fn ensure_req(def: &str, thread: &str, secret: &str) -> api::EnsureSandboxRequest {
    api::EnsureSandboxRequest {
        definition_id: def.into(),
        thread_id: thread.into(),
        secrets: [("API_TOKEN".to_string(), secret.to_string())].into(),
        run_id: String::new(),
    }
}

/// The suite on `kind` (Docker: under `runtime`; a native snapshot taken
/// after setup, and restored once its container is gone, under each).
async fn lifecycle_suite(kind: Kind, runtime: Runtime) {
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret1 = format!("s3cret-one-{}", h.nonce);
    let secret2 = format!("s3cret-two-{}", h.nonce);
    let mut def = definition(
        "dev",
        kind,
        vec![
            serial("mkdir -p d && echo one > d/f && echo tok=$API_TOKEN && cd d"),
            api::SetupStep {
                step: Some(api::setup_step::Step::Parallel(api::ParallelGroup {
                    // Parallel commands start from the shell's cwd (d/).
                    commands: vec!["echo a > a.txt".into(), "echo b > b.txt".into()],
                })),
            },
        ],
    );
    if kind == Kind::Docker {
        runtime.apply(&mut def);
    }
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def.clone()) }).await.unwrap();
    let got = h
        .acme
        .get_definition(api::GetDefinitionRequest { id: "dev".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.definition.unwrap(), def);

    // create
    let (progress, ready) = ensure(&mut h.acme, ensure_req("dev", "t1", &secret1)).await;
    let ready = ready.expect("first ensure");
    assert_eq!(ready.outcome, api::EnsureOutcome::Created as i32);
    let sandbox = ready.sandbox_id.clone();
    let mut expected = vec![api::EnsurePhase::Resolving, api::EnsurePhase::Creating, api::EnsurePhase::Setup];
    if kind == Kind::Docker {
        expected.push(api::EnsurePhase::Snapshotting);
    }
    assert_eq!(phases(&progress), expected);
    let steps: Vec<(u32, u32)> = progress
        .iter()
        .filter(|p| p.phase == api::EnsurePhase::Setup as i32)
        .map(|p| (p.step, p.steps))
        .collect();
    assert!(steps.contains(&(1, 2)) && steps.contains(&(2, 2)), "{steps:?}");
    let lines: Vec<&str> =
        progress.iter().map(|p| p.output_line.as_str()).filter(|l| !l.is_empty()).collect();
    assert!(lines.contains(&"tok=[secret:API_TOKEN]"), "secret echoed by setup is redacted: {lines:?}");
    let elapsed: Vec<u64> = progress.iter().map(|p| p.elapsed_ms).collect();
    assert!(elapsed.windows(2).all(|w| w[0] <= w[1]), "in order: {elapsed:?}");
    assert_eq!(sh(&mut h.acme, &sandbox, "cat d/f d/a.txt d/b.txt").await, (0, "one\na\nb\n".into()));
    assert_eq!(
        sh(&mut h.acme, &sandbox, "echo $PLAIN $API_TOKEN").await.1,
        format!("plain-value {secret1}\n")
    );
    let provider_id = ready.sandbox.as_ref().unwrap().provider_sandbox_id.clone();

    // resume, with a rotated secret: same key, same sandbox, new value
    let (progress, ready) = ensure(&mut h.acme, ensure_req("dev", "t1", &secret2)).await;
    let ready = ready.expect("second ensure");
    assert_eq!(ready.outcome, api::EnsureOutcome::Resumed as i32);
    assert_eq!(ready.sandbox_id, sandbox, "rotating a secret keeps the key");
    assert_eq!(ready.sandbox.unwrap().provider_sandbox_id, provider_id);
    assert_eq!(phases(&progress), vec![api::EnsurePhase::Resolving, api::EnsurePhase::Resuming]);
    assert_eq!(sh(&mut h.acme, &sandbox, "echo $API_TOKEN").await.1, format!("{secret2}\n"));

    // a changed setup is another sandbox
    let mut changed = def.clone();
    changed.id = "dev2".into();
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(changed) }).await.unwrap();

    files_watch_and_exec(&mut h.acme, &sandbox).await;

    // tenant isolation: the other tenant sees nothing of it
    let nf = |r: Result<(), tonic::Status>| assert_eq!(r.unwrap_err().code(), tonic::Code::NotFound);
    nf(h.other.get_sandbox(api::GetSandboxRequest { sandbox_id: sandbox.clone() }).await.map(drop));
    nf(h.other
        .exec(api::ExecRequest {
            sandbox_id: sandbox.clone(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("true".into())) }),
            ..Default::default()
        })
        .await
        .map(drop));
    nf(h.other.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: sandbox.clone() }).await.map(drop));
    nf(h.other
        .get_definition(api::GetDefinitionRequest { id: "dev".into(), ..Default::default() })
        .await
        .map(drop));
    assert!(
        h.other
            .list_sandboxes(api::ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes
            .is_empty()
    );

    // concurrent ensures of a new thread: one sandbox
    let mut calls = Vec::new();
    for _ in 0..4 {
        let mut c = h.acme.clone();
        let req = ensure_req("dev", "t-conc", &secret1);
        calls.push(tokio::spawn(async move { ensure(&mut c, req).await.1.expect("concurrent ensure") }));
    }
    let mut readies = Vec::new();
    for c in calls {
        readies.push(c.await.unwrap());
    }
    let created = readies.iter().filter(|r| r.outcome == api::EnsureOutcome::Created as i32).count();
    assert_eq!(created, 1, "{readies:?}");
    assert!(readies.iter().all(|r| r.sandbox_id == readies[0].sandbox_id));
    assert_ne!(readies[0].sandbox_id, sandbox, "another thread is another sandbox");
    if kind == Kind::Docker {
        let key = &readies[0].sandbox_id;
        assert_eq!(docker::containers(&format!("dev.sandhold.sandbox-key={key}")).len(), 1);
    }
    let listed =
        h.acme.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner().sandboxes;
    assert_eq!(listed.len(), 2);
    let by_thread = h
        .acme
        .list_sandboxes(api::ListSandboxesRequest { thread_id: "t-conc".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .sandboxes;
    assert_eq!(by_thread.len(), 1, "{by_thread:?}");
    assert_eq!((by_thread[0].thread_id.as_str(), by_thread[0].definition_id.as_str()), ("t-conc", "dev"));
    assert_eq!(by_thread[0].sandbox_id, readies[0].sandbox_id);

    // restore from the native snapshot: the container is gone, the image is not
    if kind == Kind::Docker {
        let out = std::process::Command::new("docker").args(["rm", "-f", &provider_id]).output().unwrap();
        assert!(out.status.success());
        let (progress, ready) = ensure(&mut h.acme, ensure_req("dev", "t1", &secret1)).await;
        let ready = ready.expect("restore");
        assert_eq!(ready.outcome, api::EnsureOutcome::SnapshotRestored as i32);
        assert_eq!(ready.sandbox_id, sandbox);
        assert!(!phases(&progress).contains(&api::EnsurePhase::Setup), "setup does not run again");
        assert_eq!(
            sh(&mut h.acme, &sandbox, "cat d/f; echo $API_TOKEN").await.1,
            format!("one\n{secret1}\n")
        );
    }

    // destroy
    for id in [sandbox.clone(), readies[0].sandbox_id.clone()] {
        h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id.clone() }).await.unwrap();
        nf(h.acme.get_sandbox(api::GetSandboxRequest { sandbox_id: id.clone() }).await.map(drop));
        if kind == Kind::Docker {
            assert!(docker::containers(&format!("dev.sandhold.sandbox-key={id}")).is_empty());
        }
    }
    if kind == Kind::Local {
        let left = std::fs::read_dir(h.dir.path().join("sandboxes")).unwrap().count();
        assert_eq!(left, 0, "destroy removes the local sandbox directories");
    }

    h.stop().await;
    // Secret values went to sandboxes only: not to the database, not to logs.
    for secret in [&secret1, &secret2] {
        for entry in std::fs::read_dir(h.dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with("sandhold.db") {
                let bytes = std::fs::read(&path).unwrap();
                assert!(!contains(&bytes, secret.as_bytes()), "{} holds a secret", path.display());
            }
        }
        let logs = captured_logs().lock().unwrap();
        assert!(!logs.is_empty(), "logs were captured");
        assert!(!contains(&logs, secret.as_bytes()), "the server logged a secret");
    }
}

async fn failed_setup_suite(kind: Kind) {
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret = format!("s3cret-fail-{}", h.nonce);
    let def_id = format!("failing-{}", h.nonce);
    let def = definition(
        &def_id,
        kind,
        vec![serial("echo fine"), serial("echo before; echo oops-$API_TOKEN >&2; exit 7")],
    );
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let (progress, result) = ensure(&mut h.acme, ensure_req(&def_id, "t1", &secret)).await;
    let status = result.expect_err("the setup step fails");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let msg = status.message();
    assert!(msg.contains("setup step 2/2") && msg.contains("exit code 7"), "{msg}");
    assert!(msg.contains("oops-[secret:API_TOKEN]") && !msg.contains(&secret), "{msg}");
    assert!(progress.iter().any(|p| p.output_line == "before"), "step output streamed");
    let err = shared::error::Error::from_status(&status);
    assert_eq!(err.metadata.get("exit_code").map(String::as_str), Some("7"));
    assert_eq!(err.metadata.get("step").map(String::as_str), Some("2"));
    match kind {
        Kind::Docker => assert!(
            docker::containers(&format!("dev.sandhold.definition={def_id}")).is_empty(),
            "a failed ensure leaves no container behind"
        ),
        Kind::Local => assert_eq!(std::fs::read_dir(h.dir.path().join("sandboxes")).unwrap().count(), 0),
    }
    assert!(
        h.acme
            .list_sandboxes(api::ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes
            .is_empty()
    );

    // Invalid definitions are refused with field violations.
    let mut bad = definition("bad id", kind, vec![]);
    bad.env.insert("API_TOKEN".into(), "inline".into());
    bad.workspace.as_mut().unwrap().source = Some(api::Source {
        source: Some(api::source::Source::Git(api::GitSource {
            auth_secret: "UNDECLARED".into(),
            ..Default::default()
        })),
    });
    let status =
        h.acme.put_definition(api::PutDefinitionRequest { definition: Some(bad) }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let fields: Vec<String> =
        shared::error::Error::from_status(&status).field_violations.into_iter().map(|(f, _)| f).collect();
    assert!(
        fields.contains(&"definition.id".to_string())
            && fields.contains(&"definition.env[API_TOKEN]".to_string())
            && fields.contains(&"definition.workspace.source.git.url".to_string())
            && fields.contains(&"definition.workspace.source.git.auth_secret".to_string()),
        "{fields:?}"
    );
    h.stop().await;
}

/// Files written, read, stated, renamed, listed and removed; a watch that
/// sees a write; an exec stream with stdin and an exit code: on the
/// sandbox `sandbox`, wherever it lives.
async fn files_watch_and_exec(sandboxes: &mut Sandboxes, sandbox: &str) {
    // files
    let header = api::WriteFileRequest {
        request: Some(api::write_file_request::Request::Header(api::WriteFileHeader {
            sandbox_id: sandbox.into(),
            path: "up/x.txt".into(),
            make_parents: true,
            ..Default::default()
        })),
    };
    let data = |d: &[u8]| api::WriteFileRequest {
        request: Some(api::write_file_request::Request::Data(d.to_vec())),
    };
    let written = sandboxes
        .write_file(futures::stream::iter(vec![header, data(b"hello "), data(b"world")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(written.bytes_written, 11);
    let mut read = sandboxes
        .read_file(api::ReadFileRequest {
            sandbox_id: sandbox.into(),
            path: "up/x.txt".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut content = Vec::new();
    while let Some(chunk) = read.message().await.unwrap() {
        content.extend(chunk.data);
    }
    assert_eq!(content, b"hello world");
    let stat = sandboxes
        .stat_file(api::StatFileRequest {
            sandbox_id: sandbox.into(),
            path: "up/x.txt".into(),
            no_follow: false,
        })
        .await
        .unwrap()
        .into_inner()
        .info
        .unwrap();
    assert_eq!((stat.size, stat.r#type), (11, api::FileType::File as i32));
    sandboxes
        .rename_file(api::RenameFileRequest {
            sandbox_id: sandbox.into(),
            from: "up/x.txt".into(),
            to: "up/y.txt".into(),
        })
        .await
        .unwrap();
    sandboxes
        .make_dir(api::MakeDirRequest { sandbox_id: sandbox.into(), path: "up/sub".into(), parents: false })
        .await
        .unwrap();
    let names: Vec<String> = sandboxes
        .list_files(api::ListFilesRequest { sandbox_id: sandbox.into(), path: "up".into(), depth: 1 })
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"y.txt".to_string()) && names.contains(&"sub".to_string()), "{names:?}");
    assert!(!names.contains(&"x.txt".to_string()), "{names:?}");
    sandboxes
        .remove_file(api::RemoveFileRequest {
            sandbox_id: sandbox.into(),
            path: "up".into(),
            recursive: true,
        })
        .await
        .unwrap();
    assert_eq!(sh(sandboxes, sandbox, "test -e up; echo $?").await.1, "1\n");

    // watch
    let mut watch = sandboxes
        .watch_files(api::WatchFilesRequest {
            sandbox_id: sandbox.into(),
            recursive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(PATIENCE, watch.message()).await.unwrap().unwrap().unwrap();
    assert!(matches!(first.kind, Some(api::watch_files_response::Kind::Started(_))));
    sh(sandboxes, sandbox, "echo w > watched.txt").await;
    let seen = tokio::time::timeout(PATIENCE, async {
        loop {
            let m = watch.message().await.unwrap().unwrap();
            if let Some(api::watch_files_response::Kind::Event(e)) = m.kind
                && e.path.ends_with("watched.txt")
            {
                return e;
            }
        }
    })
    .await
    .expect("a watch event for watched.txt");
    assert_ne!(seen.r#type, api::FileEventType::Unspecified as i32);
    drop(watch);

    // exec stream: stdin in, output out, exit code
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(api::ExecStreamRequest {
        request: Some(api::exec_stream_request::Request::Start(api::ExecStreamStart {
            sandbox_id: sandbox.into(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell("cat; exit 3".into())) }),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut out =
        sandboxes.exec_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(api::ExecStreamRequest {
        request: Some(api::exec_stream_request::Request::Stdin(b"ping".to_vec())),
    })
    .await
    .unwrap();
    tx.send(api::ExecStreamRequest {
        request: Some(api::exec_stream_request::Request::CloseStdin(api::CloseStdin {})),
    })
    .await
    .unwrap();
    let (stdout, exit) = sandhold_tests::sandbox::exec_stream_output(&mut out).await;
    assert_eq!(stdout, b"ping");
    assert_eq!(exit, Some(api::exit_status::Status::Code(3)));
}

/// Files, watch and exec in sandboxes on a node in another network
/// namespace (a local one and, with Docker, a container): every call goes
/// through the node's tunnel, as on a single host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_watch_and_exec_in_sandboxes_on_a_node() {
    let Some(s) = served(Place::OnANode, "lifecycle-node", &[]).await else { return };
    let s = s.as_ref();
    let _cleanup = DockerCleanup { tenant: s.tenant().to_string() };
    let mut sandboxes = s.server().sandboxes(s.token()).await;
    let mut kinds = vec![Kind::Local];
    if Runtime::Runc.available() {
        docker::ensure_test_image();
        kinds.push(Kind::Docker);
    }
    for kind in kinds {
        let id = format!("on-node-{kind:?}").to_lowercase();
        let mut def = definition(&id, kind, vec![]);
        def.secret_names.clear();
        sandhold_tests::run::put_definition(&mut sandboxes, def).await;
        let req =
            api::EnsureSandboxRequest { definition_id: id, thread_id: "t".into(), ..Default::default() };
        let ready = ensure(&mut sandboxes, req).await.1.unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
        assert_eq!(ready.sandbox.as_ref().unwrap().node, "node-1", "{ready:?}");
        files_watch_and_exec(&mut sandboxes, &ready.sandbox_id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_lifecycle() {
    lifecycle_suite(Kind::Local, Runtime::Runc).await;
}

under_each_runtime! {
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_lifecycle(runtime) {
    lifecycle_suite(Kind::Docker, runtime).await;
}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_failed_setup() {
    failed_setup_suite(Kind::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_failed_setup() {
    if !sandhold_tests::services::docker() {
        return;
    }
    failed_setup_suite(Kind::Docker).await;
}

/// An idle sandbox past `keep_alive` is stopped by the server's sweeper;
/// the next ensure resumes the same sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_idle_sandbox_is_stopped_after_keep_alive() {
    if !sandhold_tests::services::docker() {
        return;
    }
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret = format!("s3cret-idle-{}", h.nonce);
    let mut def = definition("idle", Kind::Docker, vec![]);
    def.lifecycle = Some(api::Lifecycle { keep_alive_ms: 300, ..Default::default() });
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let ready = ensure(&mut h.acme, ensure_req("idle", "t1", &secret)).await.1.unwrap();
    let container = ready.sandbox.unwrap().provider_sandbox_id;
    let running = || {
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.State.Running}}", &container])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "true"
    };
    assert!(running());
    let stopped = eventually(PATIENCE, || std::future::ready(!running())).await;
    assert!(stopped, "the idle sandbox was never stopped");
    let again = ensure(&mut h.acme, ensure_req("idle", "t1", &secret)).await.1.unwrap();
    assert_eq!(again.outcome, api::EnsureOutcome::Resumed as i32);
    assert_eq!(again.sandbox.unwrap().provider_sandbox_id, container);
    assert_eq!(sh(&mut h.acme, &again.sandbox_id, "echo $API_TOKEN").await.1, format!("{secret}\n"));
    h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: again.sandbox_id }).await.unwrap();
    h.stop().await;
}

under_each_runtime! {
/// An image commit never holds a secret value. Setup that writes the value
/// into files (one in the workspace, one outside it) gets no native
/// snapshot, and the ensure says why, naming a file and the secret but not
/// the value; no image is committed. Setup that writes no value gets its
/// snapshot, and nothing of the committed image (layers and config, as
/// `docker save` exports it) holds the value the sandbox was ensured with.
#[tokio_test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_native_snapshot_never_holds_a_secret(runtime) {
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let secret = format!("s3cret-image-{}", h.nonce);
    let tenant_images = || docker::images(&format!("{}={}", docker::LABEL_TENANT, h.tenant));

    let mut leaky = definition(
        "leaky",
        Kind::Docker,
        vec![serial("echo \"key=$API_TOKEN\" > creds.txt && printf '%s' \"$API_TOKEN\" > /tmp/elsewhere")],
    );
    runtime.apply(&mut leaky);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(leaky) }).await.unwrap();
    let (progress, ready) = ensure(&mut h.acme, ensure_req("leaky", "t-leaky", &secret)).await;
    let leaky_sandbox = ready.expect("the sandbox itself is fine").sandbox_id;
    let said: Vec<&str> = progress.iter().map(|p| p.message.as_str()).collect();
    let refusal =
        said.iter().find(|m| m.starts_with("no native snapshot")).unwrap_or_else(|| panic!("{said:#?}"));
    // Under gVisor `/tmp` is the sandbox's own tmpfs, in no layer of the
    // container: an image commit cannot keep what is there, and the search
    // (the engine's list of the container's changes) does not see it.
    let files = match runtime {
        Runtime::Runc => "2 file(s)",
        Runtime::Gvisor => "1 file(s)",
    };
    assert!(refusal.contains("API_TOKEN") && refusal.contains(files), "{refusal}");
    assert!(refusal.contains("creds.txt") || refusal.contains("/tmp/elsewhere"), "{refusal}");
    assert!(progress.iter().all(|p| !format!("{p:?}").contains(&secret)), "{progress:#?}");
    assert!(tenant_images().is_empty(), "an image was committed: {:?}", tenant_images());

    let mut clean = definition("clean", Kind::Docker, vec![serial("echo plain > notes.txt")]);
    runtime.apply(&mut clean);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(clean) }).await.unwrap();
    let (progress, ready) = ensure(&mut h.acme, ensure_req("clean", "t-clean", &secret)).await;
    let clean_sandbox = ready.unwrap().sandbox_id;
    assert!(phases(&progress).contains(&api::EnsurePhase::Snapshotting), "{progress:#?}");
    let images = tenant_images();
    assert_eq!(images.len(), 1, "{images:?}");
    let saved = std::process::Command::new("docker").args(["save", &images[0]]).output().unwrap();
    assert!(
        saved.status.success() && saved.stdout.len() > 1024,
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    assert!(!contains(&saved.stdout, secret.as_bytes()), "the committed image holds the value");
    assert!(contains(&saved.stdout, b"plain\n"), "the export holds setup's file (the search can find)");

    for id in [leaky_sandbox, clean_sandbox] {
        h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: id }).await.unwrap();
    }
    h.stop().await;
}
}

/// On PostgreSQL too, a secret passed to ensure and exec is in no table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_stores_no_secret() {
    let Some(admin_url) = sandhold_tests::services::postgres_url() else { return };
    let db = sandhold_tests::database::ScratchDatabase::create(&admin_url).await.unwrap();
    let mut h = Harness::start_with(Some(db.url().to_string())).await;
    let secret = format!("s3cret-pg-{}", h.nonce);
    let def = definition("pg", Kind::Local, vec![serial("echo $API_TOKEN > token.txt")]);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def) }).await.unwrap();
    let ready = ensure(&mut h.acme, ensure_req("pg", "t1", &secret)).await.1.unwrap();
    assert_eq!(sh(&mut h.acme, &ready.sandbox_id, "cat token.txt").await.1, format!("{secret}\n"));

    let dump = table_dump(db.url()).await;
    assert!(dump.contains(&ready.sandbox_id), "the dump sees the instance record");
    assert!(!dump.contains(&secret), "a secret reached PostgreSQL");
    h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: ready.sandbox_id }).await.unwrap();
    h.stop().await;
    assert!(!contains(&captured_logs().lock().unwrap(), secret.as_bytes()), "the server logged a secret");
    db.drop_database().await.unwrap();
}

/// A sandbox carrying the key's label that the instance store does not know
/// (a replica died between create and record) is removed by the next
/// ensure, not left next to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn docker_unrecorded_sandbox_of_a_key_is_replaced() {
    if !sandhold_tests::services::docker() {
        return;
    }
    let mut h = Harness::start().await;
    let _cleanup = DockerCleanup { tenant: h.tenant.clone() };
    let def = definition("orphan", Kind::Docker, vec![]);
    h.acme.put_definition(api::PutDefinitionRequest { definition: Some(def.clone()) }).await.unwrap();
    let key = control_plane::sandbox::key::sandbox_key(
        &def,
        control_plane::sandbox::key::KeyInput { tenant: &h.tenant, thread_id: "t1", run_id: None },
    );
    let out = std::process::Command::new("docker")
        .args(["create", "--network", "none"])
        .args(["--label", "dev.sandhold.managed=true"])
        .args(["--label", &format!("dev.sandhold.sandbox-key={key}")])
        .args(["--label", &format!("dev.sandhold.tenant={}", h.tenant)])
        .args([IMAGE, "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let orphan = String::from_utf8_lossy(&out.stdout).trim().to_string();

    let ready = ensure(&mut h.acme, ensure_req("orphan", "t1", "orphan-secret-value")).await.1.unwrap();
    assert_eq!(ready.sandbox_id, key, "the test computes the server's key");
    let left = docker::containers(&format!("dev.sandhold.sandbox-key={key}"));
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(!orphan.starts_with(&left[0]), "the unrecorded container is gone");
    h.acme.destroy_sandbox(api::DestroySandboxRequest { sandbox_id: key }).await.unwrap();
    h.stop().await;
}
