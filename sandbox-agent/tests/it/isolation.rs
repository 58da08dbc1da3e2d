//! The run user's confinement, attacked through the real agent: execs,
//! shell sessions, terminals and journaled runs (through the real shim)
//! cannot make the denied system calls, cannot write outside the root,
//! HOME and scratch dirs, nor into a directory their run's policy denies;
//! reads and ordinary work still succeed.

use sandhold_tests::agent::TestAgent;
use sandhold_tests::attack;
use shared::proto::agent::v1::info_service_client::InfoServiceClient;
use shared::proto::agent::v1::journal_service_client::JournalServiceClient;
use shared::proto::agent::v1::process_service_client::ProcessServiceClient;
use shared::proto::agent::v1::shell_service_client::ShellServiceClient;
use shared::proto::agent::v1::{
    Command, ExecRequest, FollowRequest, GetInfoRequest, OpenShellRequest, RequestSetup, RunInShellRequest,
    StartRunRequest, command, follow_response, run_in_shell_response,
};
use tokio_stream::StreamExt;

const KEY: &[u8] = b"isolation-test-key";

fn shell(script: &str) -> Option<Command> {
    Some(Command { kind: Some(command::Kind::Shell(script.into())) })
}

/// A directory outside everything the run user may write (not under
/// `/tmp`, HOME or the root): in the build's own scratch dir.
fn outside() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

async fn exec(agent: &TestAgent, script: &str) -> (i32, String, String) {
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let r = c.exec(ExecRequest { command: shell(script), ..Default::default() }).await.unwrap().into_inner();
    let code = match r.status.and_then(|s| s.status) {
        Some(shared::proto::agent::v1::exit_status::Status::Code(c)) => c,
        other => panic!("{other:?}"),
    };
    (code, String::from_utf8_lossy(&r.stdout).into_owned(), String::from_utf8_lossy(&r.stderr).into_owned())
}

fn kernel_confines() -> bool {
    sandbox_agent::isolation::landlock::abi_version().is_some()
}

#[tokio::test]
async fn execs_cannot_make_the_denied_system_calls_and_the_capabilities_say_so() {
    if !kernel_confines() {
        eprintln!("skipping: this kernel has no Landlock");
        return;
    }
    let agent = TestAgent::start().await;
    let info = InfoServiceClient::new(agent.channel().await).get_info(GetInfoRequest {}).await.unwrap();
    let caps = info.into_inner().capabilities.unwrap();
    assert!(caps.landlock && caps.seccomp, "{caps:?}");

    let helper = attack::install_syscalls(&agent.root, "syscalls");
    let mut c = ProcessServiceClient::new(agent.channel().await);
    let r = c
        .exec(ExecRequest { command: shell(&helper.display().to_string()), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    attack::assert_denied(&r.stdout);
    agent.stop().await;
}

#[tokio::test]
async fn writes_land_only_in_the_root_home_and_scratch_and_reads_still_work() {
    if !kernel_confines() {
        return;
    }
    let agent = TestAgent::start().await;
    let away = outside();
    let script = format!(
        "echo in > inside.txt && echo tmp > {tmp} && cat /etc/passwd >/dev/null && echo ok; \
         (echo x > {away}/escaped) 2>/dev/null || echo write-refused; mkdir {away}/dir 2>/dev/null || echo mkdir-refused; \
         rm -f {tmp}",
        tmp = format!("/tmp/sandhold-isolation-{}", std::process::id()),
        away = away.path().display(),
    );
    let (code, out, _) = exec(&agent, &script).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok\n"), "{out}");
    assert!(out.contains("write-refused\nmkdir-refused\n"), "{out}");
    assert!(!away.path().join("escaped").exists() && !away.path().join("dir").exists());
    assert_eq!(std::fs::read_to_string(agent.root.join("inside.txt")).unwrap(), "in\n");
    agent.stop().await;
}

#[tokio::test]
async fn a_shell_session_and_its_steps_are_confined_too() {
    if !kernel_confines() {
        return;
    }
    let agent = TestAgent::start().await;
    let away = outside();
    let helper = attack::install_syscalls(&agent.root, "syscalls");
    let mut c = ShellServiceClient::new(agent.channel().await);
    let session = c.open_shell(OpenShellRequest::default()).await.unwrap().into_inner().session_id;
    let script =
        format!("echo step > step.txt; touch {}/escaped; {}", away.path().display(), helper.display());
    let mut stream = c
        .run_in_shell(RunInShellRequest { session_id: session, command: script, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.next().await {
        if let Some(run_in_shell_response::Event::Output(o)) = msg.unwrap().event {
            out.extend(o.data);
        }
    }
    attack::assert_denied(&out);
    assert!(agent.root.join("step.txt").exists());
    assert!(!away.path().join("escaped").exists());
    agent.stop().await;
}

#[tokio::test]
async fn a_run_cannot_write_where_its_policy_denies_nor_make_denied_calls() {
    if !kernel_confines() {
        return;
    }
    sandbox_agent::journal::set_shim_program(env!("CARGO_BIN_EXE_sandhold-agent"));
    let agent = TestAgent::start().await;
    std::fs::create_dir_all(agent.root.join("protected/deep")).unwrap();
    std::fs::write(agent.root.join("protected/deep/keep.txt"), "original\n").unwrap();
    std::fs::create_dir_all(agent.root.join("src")).unwrap();
    let helper = attack::install_syscalls(&agent.root, "syscalls");
    let policy =
        r#"{"default":"allow","rules":[{"action":"file_write","pattern":"protected/**","effect":"deny"}]}"#;
    let script = format!(
        "echo fine > src/ok.txt; (echo nope > protected/new.txt) 2>/dev/null || echo new-refused; \
         (echo over > protected/deep/keep.txt) 2>/dev/null || echo keep-refused; cat protected/deep/keep.txt; \
         echo out >/dev/stderr; {}",
        helper.display()
    );
    let mut c = JournalServiceClient::new(agent.channel().await);
    c.start_run(StartRunRequest {
        run_id: "run-isolated".into(),
        command: shell(&script),
        sentinel_key: KEY.to_vec(),
        requests: Some(RequestSetup { policy_json: policy.into(), tools: vec![] }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut stream = c
        .follow(FollowRequest {
            run_id: "run-isolated".into(),
            sentinel_key: KEY.to_vec(),
            first_byte_timeout_ms: Some(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    let mut exit = None;
    while let Some(msg) = stream.next().await {
        match msg.unwrap().event.unwrap() {
            follow_response::Event::Lines(l) => {
                for line in l.lines {
                    out.extend(line.data);
                    out.push(b'\n');
                }
            }
            follow_response::Event::Exit(e) => exit = Some(e.exit_code),
        }
    }
    assert_eq!(exit, Some(0));
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("new-refused") && text.contains("keep-refused") && text.contains("original"),
        "{text}"
    );
    attack::assert_denied(&out);
    assert!(!agent.root.join("protected/new.txt").exists());
    assert_eq!(std::fs::read_to_string(agent.root.join("protected/deep/keep.txt")).unwrap(), "original\n");
    assert_eq!(std::fs::read_to_string(agent.root.join("src/ok.txt")).unwrap(), "fine\n");
    agent.stop().await;
}

/// An exec started by the spawner thread (clone with CLONE_VM, the seccomp
/// filters and no_new_privs inherited from that thread, Landlock applied
/// in the child) holds every layer a forked one does: the kernel reports
/// no_new_privs and a filter, the denied calls fail, writes outside are
/// refused, and it leads its own process group. Would fail if the thread
/// did not carry the filters or the child skipped its ruleset.
#[tokio::test]
async fn an_exec_started_without_copying_the_agent_is_confined_like_a_forked_one() {
    if !kernel_confines() {
        return;
    }
    let agent = TestAgent::start().await;
    let away = outside();
    let helper = attack::install_syscalls(&agent.root, "syscalls");
    let before = sandbox_agent::spawner::started();
    let script = format!(
        "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; read -r _ _ _ _ group _ < /proc/$$/stat; echo pid=$$ group=$group; \
         (echo x > {away}/escaped) 2>/dev/null || echo write-refused; {helper}",
        away = away.path().display(),
        helper = helper.display(),
    );
    let (code, out, err) = exec(&agent, &script).await;
    assert!(sandbox_agent::spawner::started() > before, "the exec did not go through the spawner thread");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("NoNewPrivs:\t1\n") && out.contains("Seccomp:\t2\n"), "{out}");
    let ids = out.lines().find_map(|l| l.strip_prefix("pid=")).unwrap();
    let (pid, group) = ids.split_once(" group=").unwrap();
    assert_eq!(pid, group, "the exec leads its own process group: {out}");
    assert!(out.contains("write-refused\n"), "{out}");
    assert!(!away.path().join("escaped").exists());
    attack::assert_denied(out.as_bytes());
    agent.stop().await;
}
