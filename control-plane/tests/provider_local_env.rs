//! The local provider's agent must not inherit the control plane's
//! environment, which holds database URLs and tokens. A test binary of its
//! own: it changes this process's environment, which no other test may be
//! reading at the same time.

use control_plane::provider::{LocalProvider, LocalProviderOptions, Provider};
use sandhold_tests::agent::static_agent;
use sandhold_tests::provider::{connect, sh_ok, unique_spec};

#[test]
fn the_agent_and_its_commands_see_none_of_the_control_planes_environment() {
    // SAFETY: the only test in this binary, and it sets the variables before
    // any other thread (the runtime below) exists.
    unsafe {
        std::env::set_var("SANDHOLD_DATABASE_URL", "postgres://user:hunter2@db/sandhold");
        std::env::set_var("DATABASE_URL", "postgres://user:hunter2@db/other");
        std::env::set_var("SANDHOLD_API_TOKEN", "hunter2-token");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "hunter2-aws");
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let tmp = sandhold_tests::local::TestDir::new("sh-e");
        let mut options = LocalProviderOptions::new(tmp.path());
        options.agent_binary = Some(static_agent());
        let provider = LocalProvider::new(options).unwrap();
        let sandbox = provider.create(&unique_spec("env")).await.unwrap();
        let agent = connect(&sandbox).await;

        let env = sh_ok(&agent, "env").await;
        assert!(!env.contains("hunter2"), "a control-plane secret leaked into the sandbox:\n{env}");
        for line in env.lines() {
            let name = line.split('=').next().unwrap_or_default();
            assert!(!name.contains("DATABASE"), "{name} reached the sandbox");
            assert!(
                !name.starts_with("SANDHOLD_") || name == "SANDHOLD_TEST_SPEC_VAR",
                "{name} reached the sandbox"
            );
        }
        // What it does get: the basics and the spec's own variables.
        assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
        assert!(env.lines().any(|l| l == "SANDHOLD_TEST_SPEC_VAR=from-spec"), "{env}");

        // The agent process itself, not only its children.
        let init: u32 = std::fs::read_to_string(
            tmp.path().join("sandboxes").join(&sandbox.provider_id).join("agent.pid"),
        )
        .unwrap()
        .trim()
        .parse()
        .unwrap();
        let environ = std::fs::read(format!("/proc/{init}/environ")).unwrap();
        assert!(!String::from_utf8_lossy(&environ).contains("hunter2"));

        provider.destroy(&sandbox.provider_id).await.unwrap();
    });
}
