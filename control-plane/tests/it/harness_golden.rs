//! The harness translators on journals recorded from the real CLIs against
//! the fake model API (`scripts/record-golden-journals`): the exact chunk
//! sequence of each, and determinism (the same bytes twice give the same
//! fingerprints, whatever the clock says).

use std::path::PathBuf;

use control_plane::harness::Harness;
use serde_json::{Value, json};
use shared::chunk::{self, Chunk};
use shared::ids::RunId;

const RUN: &str = "run-1";
const THREAD: &str = "thread-1";

fn journal(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/journals")
        .join(format!("{name}.ndjson"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn translate_with(h: Harness, bytes: &[u8], exit: i32, stderr: &str, clock: fn() -> i64) -> Vec<Chunk> {
    let mut t = h.translator(&RunId::parse(RUN).unwrap(), THREAD, clock);
    let mut out = Vec::new();
    for line in bytes.split(|&b| b == b'\n') {
        if !line.is_empty() {
            out.extend(t.feed(line));
        }
    }
    out.extend(t.finish(exit, stderr));
    out
}

fn translate(h: Harness, bytes: &[u8], exit: i32, stderr: &str) -> Vec<Chunk> {
    translate_with(h, bytes, exit, stderr, || 0)
}

/// The chunks as JSON lines without run and thread ids (checked here to be
/// the run's on every chunk).
fn shape(chunks: &[Chunk]) -> Vec<Value> {
    chunks
        .iter()
        .map(|c| {
            assert_eq!((c.run_id.as_str(), c.thread_id.as_str()), (RUN, THREAD), "{c:?}");
            let mut v = chunk::to_json(c);
            let m = v.as_object_mut().unwrap();
            m.remove("run_id");
            m.remove("thread_id");
            v
        })
        .collect()
}

fn assert_chunks(got: &[Chunk], want: Vec<Value>) {
    let got = shape(got);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "chunk {i}");
    }
    assert_eq!(got.len(), want.len(), "number of chunks: {got:#?}");
}

fn usage(input: u64, output: u64, cost: Option<f64>) -> Value {
    let mut u = json!({"input_tokens": input, "output_tokens": output, "cache_read_tokens": 0,
                       "cache_write_tokens": 0, "reasoning_tokens": 0});
    if let Some(c) = cost {
        u["cost_usd"] = json!(c);
    }
    u
}

fn text(id: &str, t: &str) -> [Value; 3] {
    [
        json!({"type": "TEXT_MESSAGE_START", "message_id": id}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "message_id": id, "delta": t}),
        json!({"type": "TEXT_MESSAGE_END", "message_id": id}),
    ]
}

fn session(harness: &str, id: &str) -> Value {
    json!({"type": "CUSTOM", "name": format!("{harness}.session-id"), "value": {"session_id": id}})
}

fn tool(id: &str, name: &str, args: Value) -> [Value; 3] {
    [
        json!({"type": "TOOL_CALL_START", "tool_call_id": id, "tool_name": name}),
        json!({"type": "TOOL_CALL_ARGS", "tool_call_id": id, "delta": args.to_string()}),
        json!({"type": "TOOL_CALL_END", "tool_call_id": id}),
    ]
}

const PLAIN: &str = "Hello from the fake model.";
const FINAL: &str = "I wrote hello.txt.";
const METADATA_WARNING: &str = "Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.";

fn started() -> Value {
    json!({"type": "RUN_STARTED"})
}

fn finished(reason: &str, usage: Value) -> Value {
    json!({"type": "RUN_FINISHED", "finish_reason": reason, "usage": usage})
}

#[test]
fn claude_code_plain() {
    let got = translate(Harness::ClaudeCode, &journal("claude-code-plain"), 0, "");
    let mut want = vec![started(), session("claude-code", "8faf2143-2757-44d9-bab2-b7fdc6d9e80c")];
    want.extend(text("run-1-0", PLAIN));
    want.push(finished("stop", usage(12, 7, Some(0.000235))));
    assert_chunks(&got, want);
}

#[test]
fn claude_code_tool() {
    let got = translate(Harness::ClaudeCode, &journal("claude-code-tool"), 0, "");
    let mut want = vec![started(), session("claude-code", "f0bd3703-62d5-4743-97c4-a80113dec402")];
    want.extend(tool(
        "run-1-0",
        "Bash",
        json!({"command": "printf 'hello from the tool\\n' > hello.txt", "description": "Write hello.txt"}),
    ));
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-0", "content": "(Bash completed with no output)"}));
    want.extend(text("run-1-1", FINAL));
    want.push(finished("stop", usage(24, 14, Some(0.00047))));
    assert_chunks(&got, want);
}

#[test]
fn codex_plain() {
    let got = translate(Harness::Codex, &journal("codex-plain"), 0, "");
    let mut want = vec![
        started(),
        session("codex", "01a22a5b-0d60-7443-8d4a-94c581bf2e47"),
        json!({"type": "CUSTOM", "name": "harness.warning", "value": {"message": METADATA_WARNING}}),
    ];
    want.extend(text("run-1-0", PLAIN));
    want.push(finished("stop", usage(12, 7, None)));
    assert_chunks(&got, want);
}

#[test]
fn codex_tool() {
    let got = translate(Harness::Codex, &journal("codex-tool"), 0, "");
    let mut want = vec![
        started(),
        session("codex", "01a22a5b-ff23-7361-a920-8138d347081f"),
        json!({"type": "CUSTOM", "name": "harness.warning", "value": {"message": METADATA_WARNING}}),
    ];
    want.extend(tool(
        "run-1-0",
        "command_execution",
        json!({"command": "/bin/bash -lc \"printf 'hello from the tool\\\\n' > hello.txt\""}),
    ));
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-0", "exit_code": 0}));
    want.extend(text("run-1-1", FINAL));
    want.push(finished("stop", usage(24, 14, None)));
    assert_chunks(&got, want);
}

#[test]
fn opencode_plain() {
    let got = translate(Harness::OpenCode, &journal("opencode-plain"), 0, "");
    let mut want = vec![started(), session("opencode", "ses_dd5a4a0a4ffesulGF7zjNl4BJA")];
    want.extend(text("run-1-0", PLAIN));
    want.push(finished("stop", usage(12, 7, Some(0.0))));
    assert_chunks(&got, want);
}

#[test]
fn opencode_tool() {
    let got = translate(Harness::OpenCode, &journal("opencode-tool"), 0, "");
    let mut want = vec![started(), session("opencode", "ses_dd5a3a8dbffeRq9dzhRWRgICez")];
    want.extend(tool("run-1-0", "bash", json!({"command": "printf 'hello from the tool\\n' > hello.txt"})));
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-0", "content": "(no output)", "exit_code": 0}));
    want.extend(text("run-1-1", FINAL));
    want.push(finished("stop", usage(24, 14, Some(0.0))));
    assert_chunks(&got, want);
}

#[test]
fn gemini_plain() {
    let got = translate(Harness::Gemini, &journal("gemini-plain"), 0, "");
    let mut want = vec![started(), session("gemini", "db70c8e3-b3cf-4618-b535-fd156d7c6810")];
    want.extend(text("run-1-0", PLAIN));
    want.push(finished("stop", usage(12, 7, None)));
    assert_chunks(&got, want);
}

#[test]
fn gemini_tool() {
    let got = translate(Harness::Gemini, &journal("gemini-tool"), 0, "");
    let mut want = vec![started(), session("gemini", "44f35d34-7b08-4277-83c3-940a66186596")];
    want.extend(tool(
        "run-1-0",
        "run_shell_command",
        json!({"command": "printf 'hello from the tool\\n' > hello.txt", "description": "Write hello.txt"}),
    ));
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-0"}));
    want.extend(text("run-1-1", FINAL));
    want.push(finished("stop", usage(24, 14, None)));
    assert_chunks(&got, want);
}

const CODEX_METADATA_TEXT: &str = "Model metadata for `fake-model` not found. Defaulting to fallback metadata; this can degrade performance and cause issues.";

fn acp_finished() -> Value {
    json!({"type": "RUN_FINISHED", "finish_reason": "stop"})
}

/// The raw input of the journal's first ACP `tool_call` that has one.
fn acp_raw_input(name: &str) -> Value {
    let bytes = journal(name);
    let text = String::from_utf8(bytes).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| v.pointer("/update/rawInput").cloned())
        .find(|v| v.as_object().is_some_and(|m| !m.is_empty()))
        .expect("a tool call with its input")
}

#[test]
fn acp_codex_plain() {
    let got = translate(Harness::Acp, &journal("acp-codex-plain"), 0, "");
    let want = vec![
        started(),
        session("acp", "01a235ed-c0d9-7813-b90e-0eb5b2c7cf9f"),
        json!({"type": "TEXT_MESSAGE_START", "message_id": "run-1-0"}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "message_id": "run-1-0", "delta": CODEX_METADATA_TEXT}),
        json!({"type": "TEXT_MESSAGE_CONTENT", "message_id": "run-1-0", "delta": PLAIN}),
        json!({"type": "TEXT_MESSAGE_END", "message_id": "run-1-0"}),
        acp_finished(),
    ];
    assert_chunks(&got, want);
}

#[test]
fn acp_codex_tool() {
    let got = translate(Harness::Acp, &journal("acp-codex-tool"), 0, "");
    let mut want = vec![started(), session("acp", "01a235ed-f451-7602-9204-df2a42bcabf1")];
    want.extend(text("run-1-0", CODEX_METADATA_TEXT));
    let input = acp_raw_input("acp-codex-tool");
    assert_eq!(input["command"], json!(["/bin/bash", "-lc", "printf 'hello from the tool\\n' > hello.txt"]));
    let mut call = tool("run-1-1", "execute", input);
    call[0]["parent_message_id"] = json!("run-1-0");
    want.extend(call);
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-1", "exit_code": 0}));
    want.extend(text("run-1-2", FINAL));
    want.push(acp_finished());
    assert_chunks(&got, want);
}

#[test]
fn acp_claude_code_plain() {
    let got = translate(Harness::Acp, &journal("acp-claude-code-plain"), 0, "");
    let mut want = vec![started(), session("acp", "531cce9a-e86b-4a81-9723-06e45514e9ef")];
    want.extend(text("run-1-0", PLAIN));
    want.push(acp_finished());
    assert_chunks(&got, want);
}

#[test]
fn acp_claude_code_tool_asks_and_is_allowed() {
    let got = translate(Harness::Acp, &journal("acp-claude-code-tool"), 0, "");
    let mut want = vec![started(), session("acp", "c773894a-cf2b-4672-b442-fc2e70d9af34")];
    // Announced twice (without, then with its input): one call.
    let input =
        json!({"command": "printf 'hello from the tool\\n' > hello.txt", "description": "Write hello.txt"});
    want.extend(tool("run-1-0", "Bash", input.clone()));
    want.push(json!({"type": "CUSTOM", "name": "acp.permission", "value": {
        "toolCall": {"rawInput": input, "title": "`printf 'hello from the tool\\n' > hello.txt`", "toolCallId": "toolu_fake_1"},
        "optionId": "allow", "allowed": true}}));
    want.push(json!({"type": "TOOL_CALL_RESULT", "tool_call_id": "run-1-0"}));
    want.extend(text("run-1-1", FINAL));
    want.push(acp_finished());
    assert_chunks(&got, want);
}

const GOLDEN: [(Harness, &str); 12] = [
    (Harness::ClaudeCode, "claude-code-plain"),
    (Harness::ClaudeCode, "claude-code-tool"),
    (Harness::Codex, "codex-plain"),
    (Harness::Codex, "codex-tool"),
    (Harness::OpenCode, "opencode-plain"),
    (Harness::OpenCode, "opencode-tool"),
    (Harness::Gemini, "gemini-plain"),
    (Harness::Gemini, "gemini-tool"),
    (Harness::Acp, "acp-codex-plain"),
    (Harness::Acp, "acp-codex-tool"),
    (Harness::Acp, "acp-claude-code-plain"),
    (Harness::Acp, "acp-claude-code-tool"),
];

#[test]
fn translating_twice_gives_identical_fingerprints() {
    for (h, name) in GOLDEN {
        let bytes = journal(name);
        let first = translate_with(h, &bytes, 0, "", || 1);
        let second = translate_with(h, &bytes, 0, "", shared::chunk::now_ms);
        assert_ne!(first[0].timestamp_ms, second[0].timestamp_ms, "the clocks differ");
        let fps = |cs: &[Chunk]| cs.iter().map(chunk::fingerprint_hex).collect::<Vec<_>>();
        assert_eq!(fps(&first), fps(&second), "{name}");
        // And the fingerprints tell the chunks apart.
        let unique: std::collections::HashSet<_> = fps(&first).into_iter().collect();
        assert_eq!(unique.len(), first.len(), "{name}");
    }
}

#[test]
fn every_golden_run_starts_once_and_ends_once() {
    for (h, name) in GOLDEN {
        for (exit, stderr) in [(0, ""), (1, "boom")] {
            let chunks = translate(h, &journal(name), exit, stderr);
            assert_eq!(chunks[0].r#type(), chunk::ChunkType::RunStarted, "{name}");
            let terminals: Vec<_> =
                chunks.iter().enumerate().filter(|(_, c)| chunk::is_terminal(c)).collect();
            assert_eq!(terminals.len(), 1, "{name}");
            assert_eq!(terminals[0].0, chunks.len() - 1, "{name}");
        }
    }
}

#[test]
fn a_journal_cut_mid_line_warns_and_fails_with_the_stderr_tail() {
    let bytes = journal("codex-tool");
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // Up to and including the command's item.started, then half a line, as
    // a run killed while the CLI was writing.
    let mut cut = lines[..4].join(&b'\n');
    cut.push(b'\n');
    cut.extend_from_slice(&lines[4][..40]);
    let got = translate(Harness::Codex, &cut, 137, "Killed\n");
    let mut want = vec![
        started(),
        session("codex", "01a22a5b-ff23-7361-a920-8138d347081f"),
        json!({"type": "CUSTOM", "name": "harness.warning", "value": {"message": METADATA_WARNING}}),
    ];
    want.extend(tool(
        "run-1-0",
        "command_execution",
        json!({"command": "/bin/bash -lc \"printf 'hello from the tool\\\\n' > hello.txt\""}),
    ));
    want.push(json!({"type": "CUSTOM", "name": "harness.warning", "value": {
        "message": "journal line is not JSON",
        "line": String::from_utf8(lines[4][..40].to_vec()).unwrap()}}));
    want.push(json!({"type": "RUN_ERROR", "error_message": "codex exited with code 137: Killed", "error_code": "exit_code"}));
    assert_chunks(&got, want);
}

#[test]
fn claude_cut_before_its_result_ends_open_calls_and_errors() {
    let bytes = journal("claude-code-tool");
    let first_two: Vec<u8> = bytes.split(|&b| b == b'\n').take(2).collect::<Vec<_>>().join(&b'\n');
    let got = translate(Harness::ClaudeCode, &first_two, 1, "");
    let types: Vec<_> = got.iter().map(|c| chunk::type_name(c.r#type())).collect();
    assert_eq!(
        types,
        ["RUN_STARTED", "CUSTOM", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "RUN_ERROR"]
    );
    assert_eq!(got[5].error_message, "claude-code exited with code 1");
}

#[test]
fn unknown_and_malformed_lines_in_a_golden_journal_change_nothing_else() {
    let clean = translate(Harness::OpenCode, &journal("opencode-tool"), 0, "");
    let mut noisy = b"{\"type\":\"future_event\",\"part\":{}}\n\x00\xff garbage\n".to_vec();
    noisy.extend(journal("opencode-tool"));
    let got = translate(Harness::OpenCode, &noisy, 0, "");
    assert_eq!(got[1].name, "harness.warning");
    let value: Value = serde_json::from_str(&got[1].value_json).unwrap();
    assert_eq!(value["line"], "\u{0}\u{fffd} garbage");
    let without: Vec<_> =
        got.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, c)| chunk::fingerprint(c)).collect();
    assert_eq!(without, clean.iter().map(chunk::fingerprint).collect::<Vec<_>>());
}
