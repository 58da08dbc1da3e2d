//! `sandhold serve --print-config`: the layer order (defaults < file < env <
//! flags) and redaction, through the real binary and its real environment
//! handling.

use std::process::Command;

fn print_config(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandhold"));
    cmd.arg("serve").args(args).arg("--print-config");
    // Only the variables this test sets.
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDHOLD_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "print-config failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn value<'a>(toml: &'a str, key: &str) -> &'a str {
    toml.lines()
        .find_map(|l| l.strip_prefix(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("{key} missing in:\n{toml}"))
}

#[test]
fn file_then_env_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sandhold.toml");
    std::fs::write(
        &file,
        r#"
listen = "127.0.0.1:1111"
lease_ttl_ms = 30000
lease_renew_ms = 3000
log_format = "json"
replica_id = "from-file"
data_dir = "/from/file"
"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();

    let only_file = print_config(&["--config", file], &[]);
    assert_eq!(value(&only_file, "listen"), "\"127.0.0.1:1111\"");
    assert_eq!(value(&only_file, "lease_ttl_ms"), "30000");
    assert_eq!(value(&only_file, "log_format"), "\"json\"");
    assert_eq!(
        value(&only_file, "database_url"),
        "\"sqlite:///from/file/sandhold.db\"",
        "default follows data dir"
    );

    let env = [("SANDHOLD_LISTEN", "127.0.0.1:2222"), ("SANDHOLD_REPLICA_ID", "from-env")];
    let file_env = print_config(&["--config", file], &env);
    assert_eq!(value(&file_env, "listen"), "\"127.0.0.1:2222\"", "env beats file");
    assert_eq!(value(&file_env, "replica_id"), "\"from-env\"");
    assert_eq!(value(&file_env, "lease_ttl_ms"), "30000", "unset in env: file value stays");

    let all = print_config(&["--config", file, "--listen", "127.0.0.1:3333"], &env);
    assert_eq!(value(&all, "listen"), "\"127.0.0.1:3333\"", "flag beats env");
    assert_eq!(value(&all, "replica_id"), "\"from-env\"");

    // The config file itself can come from the environment.
    let via_env = print_config(&[], &[("SANDHOLD_CONFIG", file)]);
    assert_eq!(value(&via_env, "replica_id"), "\"from-file\"");

    let defaults = print_config(&["--data-dir", "/d"], &[]);
    assert_eq!(value(&defaults, "listen"), "\"127.0.0.1:7443\"");
    assert_eq!(value(&defaults, "log_format"), "\"pretty\"");
    assert!(!defaults.contains("redis_url"), "no redis by default:\n{defaults}");
}

#[test]
fn secrets_are_redacted_from_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sandhold.toml");
    std::fs::write(&file, "[[tokens]]\ntenant = \"filetenant\"\ntoken = \"file-token-secret\"\n").unwrap();
    let file = file.to_str().unwrap();

    let from_file = print_config(&["--config", file], &[]);
    assert!(from_file.contains("filetenant"), "{from_file}");
    assert!(!from_file.contains("file-token-secret"), "{from_file}");

    let out = print_config(
        &["--config", file, "--database-url", "postgres://sandhold:db-password-secret@127.0.0.1/sandhold"],
        &[
            ("SANDHOLD_TOKENS", "envtenant=env-token-secret-1,other=env-token-secret-2"),
            ("SANDHOLD_REDIS_URL", "redis://:redis-password-secret@127.0.0.1:6379"),
        ],
    );
    for secret in ["db-password-secret", "redis-password-secret", "env-token-secret", "file-token-secret"] {
        assert!(!out.contains(secret), "{secret} printed:\n{out}");
    }
    assert!(out.contains("envtenant") && out.contains("other"), "env tokens replace the file's:\n{out}");
    assert!(!out.contains("filetenant"), "{out}");
    assert_eq!(value(&out, "database_url"), "\"postgres://sandhold:[redacted]@127.0.0.1/sandhold\"");
}

#[test]
fn tokens_come_from_a_file_or_the_environment_never_a_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--token", "flagtenant=flag-token-secret", "--print-config"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--token was removed") && stderr.contains("--tokens-file"), "{stderr}");
    assert!(!stderr.contains("flag-token-secret"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# one a line\nfiletenant=file-token-secret\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let tokens = tokens.to_str().unwrap();
    let out = print_config(&["--tokens-file", tokens], &[("SANDHOLD_TOKENS", "envtenant=env-token-secret")]);
    assert_eq!(value(&out, "tokens_file"), format!("{tokens:?}"));
    assert!(out.contains("tenant = \"envtenant\""), "{out}");
    assert!(!out.contains("file-token-secret") && !out.contains("env-token-secret"), "{out}");

    // The same token under two tenants (file and environment) is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--tokens-file", tokens, "--print-config"])
        .env("SANDHOLD_TOKENS", "other=file-token-secret")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("configured twice"));
}

#[test]
fn tls_needs_a_certificate_and_a_key() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--tls-cert", "/etc/sandhold/cert.pem", "--print-config"])
        .env_remove("SANDHOLD_TLS_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
    let both = print_config(
        &["--tls-cert", "/etc/sandhold/cert.pem", "--insecure-listen"],
        &[("SANDHOLD_TLS_KEY", "/etc/sandhold/key.pem")],
    );
    assert_eq!(value(&both, "tls_cert"), "\"/etc/sandhold/cert.pem\"");
    assert_eq!(value(&both, "tls_key"), "\"/etc/sandhold/key.pem\"");
    assert_eq!(value(&both, "insecure_listen"), "true");
}

#[test]
fn invalid_settings_fail_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_sandhold"))
        .args(["serve", "--lease-ttl-ms", "1000", "--lease-renew-ms", "900", "--print-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most half the ttl"));
}

#[test]
fn metrics_endpoint_is_off_unless_set() {
    let defaults = print_config(&["--data-dir", "/d"], &[]);
    assert!(!defaults.contains("metrics_listen"), "off by default:\n{defaults}");
    let env = print_config(&[], &[("SANDHOLD_METRICS_LISTEN", "127.0.0.1:9464")]);
    assert_eq!(value(&env, "metrics_listen"), "\"127.0.0.1:9464\"");
    let flag =
        print_config(&["--metrics-listen", "0.0.0.0:9465"], &[("SANDHOLD_METRICS_LISTEN", "127.0.0.1:9464")]);
    assert_eq!(value(&flag, "metrics_listen"), "\"0.0.0.0:9465\"", "flag beats env");
}

#[test]
fn tenant_quotas_print_with_their_defaults_and_layers() {
    let defaults = print_config(&["--data-dir", "/d"], &[]);
    assert_eq!(value(&defaults, "max_sandboxes_per_tenant"), "32");
    assert_eq!(value(&defaults, "max_running_runs_per_tenant"), "32");
    assert_eq!(value(&defaults, "tenant_sweep_budget_ms"), "120000");
    let env = [("SANDHOLD_MAX_RUNNING_RUNS_PER_TENANT", "4"), ("SANDHOLD_MAX_SANDBOXES_PER_TENANT", "6")];
    let set = print_config(&["--max-sandboxes-per-tenant", "8", "--tenant-sweep-budget-ms", "5000"], &env);
    assert_eq!(value(&set, "max_running_runs_per_tenant"), "4", "from the environment");
    assert_eq!(value(&set, "max_sandboxes_per_tenant"), "8", "flag beats env");
    assert_eq!(value(&set, "tenant_sweep_budget_ms"), "5000");
}
