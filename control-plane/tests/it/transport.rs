//! The gRPC listener's transport through the real `sandhold serve` and the
//! real CLI: TLS (trust, refusal, reload), the refusal to serve tokens in
//! plain text beyond loopback, and tokens that never touch a command line.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use sandhold_tests::cli::{ServeOptions, Served, ok, sandhold};
use sandhold_tests::local::TestDir;
use sandhold_tests::tls::{Leaf, TestCa, presented};
use sandhold_tests::wait::PATIENCE;

const TOKEN: &str = "transport-token-0123";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn tokens_env() -> Vec<(String, String)> {
    vec![
        ("SANDHOLD_TOKENS".into(), format!("acme={TOKEN}")),
        // The runs here are local sandboxes: the operator's opt-in.
        ("SANDHOLD_ALLOW_LOCAL_WITH_TOKENS".into(), "true".into()),
    ]
}

/// A server on every interface with TLS from `ca`'s certificate `serial`.
fn tls_server(ca: &TestCa, serial: u64) -> (Served, Leaf) {
    let dir = TestDir::new("sh-tls");
    let leaf = ca.leaf(serial);
    let files = ca.write(dir.path(), &leaf);
    let served = Served::start_with(
        dir,
        ServeOptions {
            host: Some("0.0.0.0"),
            env: tokens_env(),
            token: Some(TOKEN.into()),
            tls: Some(files),
            ..Default::default()
        },
    );
    (served, leaf)
}

#[test]
fn a_run_over_tls_needs_the_right_ca_and_tls() {
    let ca = TestCa::new("sandhold test CA");
    let (server, _) = tls_server(&ca, 1);

    let run = server
        .cli()
        .env("SANDHOLD_TOKEN", TOKEN)
        .args(["run", "--", "sh", "-c", "echo over-tls"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ok(&run).stdout), "over-tls\n");

    // Plain text to the TLS port: no answer a gRPC client accepts.
    let plain = server
        .cli()
        .env("SANDHOLD_TOKEN", TOKEN)
        .env("SANDHOLD_SERVER", &server.addr)
        .env_remove("SANDHOLD_CA_CERT")
        .args(["definitions", "ls"])
        .output()
        .unwrap();
    assert!(!plain.status.success(), "plain text reached a TLS listener: {}", stderr(&plain));

    // Another CA's certificate is not trusted.
    let other = TestCa::new("someone else's CA");
    let other_ca = server.dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, other.pem()).unwrap();
    let wrong = server
        .cli()
        .env("SANDHOLD_TOKEN", TOKEN)
        .env("SANDHOLD_CA_CERT", &other_ca)
        .args(["definitions", "ls"])
        .output()
        .unwrap();
    assert!(!wrong.status.success(), "a certificate of an untrusted CA was accepted");
    assert!(stderr(&wrong).to_lowercase().contains("certificate"), "{}", stderr(&wrong));
}

/// Until a new connection is shown `want` (the reload is asynchronous).
async fn until_presented(addr: &str, ca: &Path, want: &Leaf, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok((der, _)) = presented(addr, ca).await
            && der == want.der
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn the_certificate_is_reloaded_on_sighup_and_on_change_and_a_bad_pair_is_not_taken() {
    let ca = TestCa::new("sandhold test CA");
    let (server, first) = tls_server(&ca, 1_000_001);
    let files = sandhold_tests::tls::ServerFiles {
        cert: server.dir.path().join("cert.pem"),
        key: server.dir.path().join("key.pem"),
        ca: server.ca.clone().unwrap(),
    };
    let (der, alpn) = presented(&server.addr, &files.ca).await.unwrap();
    assert!(der == first.der, "the configured certificate is served");
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "ALPN h2");

    // SIGHUP: the files are rewritten in place with their old size and
    // modification time, so only the signal can make the server notice.
    let second = ca.leaf(2_000_002);
    assert_eq!(second.cert_pem.len(), first.cert_pem.len());
    assert_eq!(second.key_pem.len(), first.key_pem.len());
    let times = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.accessed().unwrap(), m.modified().unwrap())
    };
    let (cert_times, key_times) = (times(&files.cert), times(&files.key));
    second.write(&files);
    for (path, (atime, mtime)) in [(&files.cert, cert_times), (&files.key, key_times)] {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_accessed(atime).set_modified(mtime))
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(presented(&server.addr, &files.ca).await.unwrap().0 == first.der, "no reload before SIGHUP");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    assert!(
        until_presented(&server.addr, &files.ca, &second, PATIENCE).await,
        "SIGHUP reloads: {}",
        server.log()
    );

    // A key that is not the certificate's: logged, the old pair stays.
    let third = ca.leaf(3_000_003);
    let fourth = ca.leaf(4_000_004);
    std::fs::write(&files.cert, &third.cert_pem).unwrap();
    std::fs::write(&files.key, &fourth.key_pem).unwrap();
    let logged = sandhold_tests::wait::eventually(PATIENCE, || async {
        server.log().contains("tls certificate not reloaded")
    })
    .await;
    assert!(logged, "the bad pair is reported: {}", server.log());
    assert!(presented(&server.addr, &files.ca).await.unwrap().0 == second.der, "the previous pair is kept");

    // A good pair renamed into place is picked up without a signal.
    let staged = sandhold_tests::tls::ServerFiles {
        cert: server.dir.path().join("cert.new"),
        key: server.dir.path().join("key.new"),
        ca: files.ca.clone(),
    };
    third.write(&staged);
    std::fs::rename(&staged.key, &files.key).unwrap();
    std::fs::rename(&staged.cert, &files.cert).unwrap();
    assert!(
        until_presented(&server.addr, &files.ca, &third, PATIENCE).await,
        "file change reloads: {}",
        server.log()
    );
}

#[test]
fn tokens_in_plain_text_beyond_loopback_need_insecure_listen() {
    let dir = TestDir::new("sh-tls");
    let refused = sandhold(&dir.path().join("data"))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .envs(tokens_env())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(message.contains("refusing to serve API tokens in plain text"), "{message}");
    assert!(message.contains("--tls-cert") && message.contains("--insecure-listen"), "{message}");

    let served = Served::start_with(
        dir,
        ServeOptions {
            host: Some("0.0.0.0"),
            args: vec!["--insecure-listen".into()],
            env: tokens_env(),
            token: Some(TOKEN.into()),
            ..Default::default()
        },
    );
    ok(&served.cli().env("SANDHOLD_TOKEN", TOKEN).args(["definitions", "ls"]).output().unwrap());
    assert!(served.log().contains("API tokens travel in plain text"), "{}", served.log());
}

#[test]
fn tokens_from_a_file_and_the_environment_authenticate_and_stay_off_the_command_line() {
    let dir = TestDir::new("sh-tls");
    let file = dir.path().join("tokens");
    std::fs::write(&file, "# tenants\nfiletenant=file-token-0123456\n").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let served = Served::start_with(
        dir,
        ServeOptions {
            args: vec!["--tokens-file".into(), file.to_str().unwrap().into()],
            env: vec![("SANDHOLD_TOKENS".into(), "envtenant=env-token-0123456".into())],
            token: Some("file-token-0123456".into()),
            ..Default::default()
        },
    );
    for token in ["file-token-0123456", "env-token-0123456"] {
        ok(&served.cli().env("SANDHOLD_TOKEN", token).args(["definitions", "ls"]).output().unwrap());
    }
    let wrong = served
        .cli()
        .env("SANDHOLD_TOKEN", "not-a-token-0123456")
        .args(["definitions", "ls"])
        .output()
        .unwrap();
    assert!(!wrong.status.success(), "an unknown token was accepted");

    let cmdline = std::fs::read(format!("/proc/{}/cmdline", served.child.id())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(cmdline.contains("--tokens-file"), "{cmdline}");
    for token in ["file-token-0123456", "env-token-0123456"] {
        assert!(!cmdline.contains(token), "{token} on the command line: {cmdline}");
    }
    let ps = std::process::Command::new("ps")
        .args(["-ww", "-o", "args=", "-p"])
        .arg(served.child.id().to_string())
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ps.stdout).contains("token-0123456"));
}
