//! A newcomer's afternoon, typed into a real terminal (tmux) with nothing
//! but the README's setup: no `--server`, the background server, the local
//! provider. Each command's output is what the person sees; at the end
//! nothing runs and nothing is left on disk that the CLI did not name (a
//! sandbox it said it kept, until the person removed it).

use std::path::Path;
use std::time::{Duration, Instant};

use sandhold_tests::cli::{Background, agent, sandhold_bin};
use sandhold_tests::local::{TestDir, alive, processes_under};
use sandhold_tests::tmux::{Tmux, has_line};
use sandhold_tests::wait::{PATIENCE, until};

/// The pane's whole history, not only what is on screen; lines as the
/// terminal shows them (a line the spinner filled to the edge is not joined
/// to the next).
fn history(tmux: &Tmux) -> String {
    tmux.run(&["capture-pane", "-p", "-S", "-", "-t", "s"])
}

/// Type `command` at the shell's prompt and wait for it to end; its exit
/// code and what the terminal showed after the command line.
fn type_command(tmux: &Tmux, step: &str, command: &str) -> (i32, String) {
    let marker = format!("{step}-exit=");
    tmux.run(&["send-keys", "-t", "s", &format!("{command}; echo \"{marker}$?\""), "Enter"]);
    let deadline = Instant::now() + PATIENCE * 2;
    loop {
        let text = history(tmux);
        let lines: Vec<&str> = text.lines().collect();
        let typed = lines.iter().rposition(|l| l.starts_with("$ ") && l.contains(&marker));
        let seen = &lines[typed.map_or(lines.len(), |i| i + 1)..];
        if let Some(code) = seen.iter().find_map(|l| l.trim_end().strip_prefix(&marker)) {
            return (code.parse().unwrap(), seen.join("\n"));
        }
        assert!(Instant::now() < deadline, "{step}: `{command}` did not end:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Live processes working for `data`: started with a path under it (a
/// local sandbox's agent) or working in it (what a run started in its
/// workspace).
fn processes_of(data: &Path) -> Vec<String> {
    processes_under(data)
        .into_iter()
        .filter(|(pid, _)| alive(*pid))
        .map(|(pid, args)| format!("{pid}: {}", args.join(" ")))
        .collect()
}

/// Entries of the local provider's sandbox folder.
fn sandbox_dirs(data: &Path) -> Vec<String> {
    std::fs::read_dir(data.join("sandboxes"))
        .map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// Output and warnings on the terminal as they come, a failed run's
/// stderr, a detached run finished by the background server and read back,
/// a kept sandbox named with how to remove it; and afterwards no sandbox,
/// agent, or process a run started is left once the person removed what
/// the CLI named and stopped the server. Before: a run's stderr was
/// dropped, a detached run never ran, and failed or detached runs left
/// their sandbox and its agent behind unnamed.
#[test]
fn a_newcomers_afternoon_leaves_nothing_the_cli_did_not_name() {
    let dir = TestDir::new("first-hour");
    let data = dir.path().join("data");
    let background = Background(data.clone());
    let bin_dir = sandhold_bin().parent().unwrap().to_path_buf();
    let tmux = Tmux::new();
    // The shell's settings in a script beside the data dir, so that no
    // command line of the test's own names the data dir.
    let shell = dir.path().join("newcomer.sh");
    let script = format!(
        "exec env -i HOME={home} TERM=xterm-256color PATH={bin}:/usr/local/bin:/usr/bin:/bin \
         SANDHOLD_DATA_DIR={data} SANDHOLD_AGENT_BINARY={agent} PS1='$ ' bash --norc --noprofile\n",
        home = dir.path().display(),
        bin = bin_dir.display(),
        data = data.display(),
        agent = agent().display(),
    );
    std::fs::write(&shell, script).unwrap();
    tmux.run(&["new-session", "-d", "-s", "s", "-x", "250", "-y", "50", "sh", &shell.to_string_lossy()]);
    tmux.run(&["set-option", "-t", "s", "status", "off"]);
    tmux.run(&["set-option", "-t", "s", "history-limit", "20000"]);

    // Output and the command's own stderr, as they come.
    let (code, seen) = type_command(&tmux, "s1", "sandhold run --local -- sh -c 'echo out; echo warn >&2'");
    assert_eq!(code, 0, "{seen}");
    assert!(has_line(&seen, "out") && has_line(&seen, "warn"), "stdout and stderr both shown:\n{seen}");
    assert!(seen.contains("started your background server"), "the server's start is said:\n{seen}");
    assert!(seen.contains("this sandbox has NO isolation"), "the local sandbox says what it is:\n{seen}");

    // A failing command: its stderr on the terminal, a non-zero exit.
    let (code, seen) = type_command(&tmux, "s2", "sandhold run --local -- sh -c 'echo broke >&2; exit 3'");
    assert_ne!(code, 0, "{seen}");
    assert!(has_line(&seen, "broke"), "the failure's stderr is shown:\n{seen}");

    // A run that leaves a process behind in its sandbox.
    let (code, seen) = type_command(
        &tmux,
        "s3",
        "sandhold run --local -- sh -c 'sleep 600 >/dev/null 2>&1 & echo bg-started'",
    );
    assert_eq!(code, 0, "{seen}");

    // Detached: it runs with nobody attached; attach reads it to its end.
    let (code, seen) = type_command(
        &tmux,
        "s4",
        "sandhold run --local --detach --run-id later-1 -- sh -c 'sleep 1; echo later'",
    );
    assert_eq!(code, 0, "{seen}");
    assert!(seen.contains("sandhold attach later-1"), "how to follow it is said:\n{seen}");
    let (code, seen) = type_command(&tmux, "s5", "sandhold attach later-1");
    assert_eq!(code, 0, "{seen}");
    assert!(has_line(&seen, "later"), "{seen}");

    // A thread keeps its sandbox, and the CLI says which and how to remove it.
    let (code, seen) = type_command(
        &tmux,
        "s6",
        "sandhold run --local --thread afternoon -- sh -c 'echo kept > note.txt; echo wrote'",
    );
    assert_eq!(code, 0, "{seen}");
    let named = seen
        .lines()
        .find_map(|l| l.split("remove it with `sandhold sandboxes rm ").nth(1))
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("the kept sandbox is named:\n{seen}"))
        .to_string();

    // Everything else went: the other runs' sandboxes, their agents, and
    // what a run left running in its own.
    until("the finished runs' sandboxes to go", || sandbox_dirs(&data).len() == 1);
    let left = sandbox_dirs(&data);
    let (code, seen) = type_command(&tmux, "s7", "sandhold sandboxes ls");
    assert_eq!(code, 0, "{seen}");
    let listed: Vec<&str> =
        seen.lines().filter(|l| l.contains("afternoon") || l.contains("thread-")).collect();
    assert!(listed.len() == 1 && listed[0].contains(&named), "only the named sandbox is listed:\n{seen}");
    let strays = || -> Vec<String> {
        processes_of(&data)
            .into_iter()
            .filter(|p| !p.contains("daemon serve") && !p.contains(&left[0]))
            .collect()
    };
    until(&format!("the processes of the removed sandboxes to end: {:?}", strays()), || strays().is_empty());

    assert!(processes_of(&data).iter().any(|p| p.contains(&left[0])), "the kept sandbox's agent is seen");
    let (code, seen) = type_command(&tmux, "s8", &format!("sandhold sandboxes rm {named}"));
    assert_eq!(code, 0, "{seen}");
    let (code, seen) = type_command(&tmux, "s9", "sandhold daemon stop");
    assert_eq!(code, 0, "{seen}");
    assert!(seen.contains("stopped the background server"), "{seen}");
    assert_eq!(background.pid(), None, "the background server is gone");
    until("nothing of the afternoon to run", || processes_of(&data).is_empty());
    assert!(sandbox_dirs(&data).is_empty(), "{:?}", sandbox_dirs(&data));
    drop(background);
}
