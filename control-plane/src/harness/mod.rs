//! Harness adapters: for each agent CLI (and for any command), build the
//! command line of a run and translate the CLI's stdout, as journaled, line by
//! line into [`Chunk`]s.
//!
//! Translation is deterministic: ids come only from the run's
//! [`RunScopedIds`] counter, and nothing but the journal bytes (and the exit
//! code and stderr tail given to [`Translator::finish`]) decides a chunk. The
//! clock only stamps `timestamp_ms`, which fingerprints ignore. So a takeover
//! that re-translates a journal from byte 0 reproduces what is stored.
//!
//! Every sequence a [`Translator`] produces starts with RUN_STARTED and, once
//! finished, ends with exactly one RUN_FINISHED or RUN_ERROR; text, reasoning
//! and tool calls still open at that point are ended first. A line that is
//! not what the CLI should print becomes a `harness.warning` CUSTOM chunk; an
//! event type an adapter does not know produces nothing.

pub mod claude_code;
pub mod codex;
pub mod command;
pub mod opencode;

mod spec;
mod translator;

#[cfg(test)]
use serde_json::Value;
#[cfg(test)]
use shared::chunk::{self, Chunk, ChunkType};
#[cfg(test)]
use shared::ids::RunId;
#[cfg(test)]
use shared::proto::agent::v1 as agent;

pub use spec::*;
pub use translator::*;

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers for the adapters' unit tests.
    use super::*;

    pub fn translate(h: Harness, journal: &str, exit_code: i32, stderr: &str) -> Vec<Chunk> {
        let mut t = h.translator(&RunId::parse("r").unwrap(), "t", || 0);
        let mut out = Vec::new();
        for line in journal.lines() {
            out.extend(t.feed(line.as_bytes()));
        }
        out.extend(t.finish(exit_code, stderr));
        out
    }

    pub fn types(chunks: &[Chunk]) -> Vec<&'static str> {
        chunks.iter().map(|c| chunk::type_name(c.r#type())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn names_round_trip() {
        for h in Harness::ALL {
            assert_eq!(Harness::parse(h.name()), Ok(h));
        }
        assert!(matches!(Harness::parse("gemini"), Err(HarnessError::Unknown(_))));
    }

    #[test]
    fn terminal_closes_what_is_open_and_ends_the_run() {
        let mut t = Harness::Command.translator(&RunId::parse("r").unwrap(), "t", || 0);
        let first = t.feed(br#"{"type":"REASONING_START","message_id":"x"}"#);
        assert_eq!(types(&first), ["RUN_STARTED", "REASONING_START"]);
        let end = t.feed(br#"{"type":"RUN_ERROR","error_message":"boom","error_code":"b"}"#);
        assert_eq!(types(&end), ["REASONING_END", "RUN_ERROR"]);
        assert_eq!(end[0].message_id, "x");
        assert!(t.is_terminal());
        assert!(t.feed(b"more").is_empty());
        assert!(t.finish(1, "x").is_empty());
    }

    #[test]
    fn finish_without_lines_still_starts_and_ends() {
        let chunks = translate(Harness::Codex, "", 0, "");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_FINISHED"]);
        let chunks = translate(Harness::ClaudeCode, "", 2, "no api key\n");
        assert_eq!(types(&chunks), ["RUN_STARTED", "RUN_ERROR"]);
        assert_eq!(chunks[1].error_message, "claude-code exited with code 2: no api key");
        assert_eq!(chunks[1].error_code, ERROR_CODE_EXIT);
    }

    #[test]
    fn start_run_request_carries_argv_env_and_stdin() {
        let options = HarnessOptions { prompt_file: Some(".sandhold/prompt".into()), ..Default::default() };
        let spec = Harness::ClaudeCode.command(&options, "hi").unwrap();
        assert_eq!(spec.stdin, StdinSpec::File { path: ".sandhold/prompt".into(), contents: b"hi".to_vec() });
        let req = spec.start_run_request(&RunId::parse("r1").unwrap(), "ws", vec![1]);
        assert_eq!(req.run_id, "r1");
        assert_eq!(req.stdin, Some(agent::start_run_request::Stdin::StdinFile(".sandhold/prompt".into())));
        let Some(agent::command::Kind::Argv(argv)) = req.command.and_then(|c| c.kind) else { panic!("argv") };
        assert_eq!(argv.args, spec.argv);
        assert_eq!(req.env.get("IS_SANDBOX").map(String::as_str), Some("1"));
    }

    /// Lines shaped like each CLI's events, to steer arbitrary input into the
    /// adapters' deeper branches rather than only the "not JSON" one.
    fn event_line() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let types = prop::sample::select(vec![
            "system",
            "assistant",
            "user",
            "stream_event",
            "result",
            "thread.started",
            "turn.completed",
            "turn.failed",
            "error",
            "item.started",
            "item.updated",
            "item.completed",
            "text",
            "tool_use",
            "step_finish",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_RESULT",
            "RUN_FINISHED",
            "CUSTOM",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z_]{0,8}".prop_map(Value::String),
        ];
        let value = leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "type",
                        "id",
                        "text",
                        "content",
                        "message",
                        "item",
                        "event",
                        "part",
                        "index",
                        "delta",
                        "tool_use_id",
                        "usage",
                        "subtype",
                        "status",
                        "exit_code",
                        "state",
                        "error",
                        "name",
                    ]),
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        });
        (types, value).prop_map(|(ty, v)| {
            let mut obj = v.as_object().cloned().unwrap_or_default();
            obj.insert("type".into(), Value::String(ty.into()));
            Value::Object(obj).to_string().into_bytes()
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_lines_never_panic_and_the_run_is_well_formed(
            lines in proptest::collection::vec(
                proptest::prop_oneof![proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), event_line()],
                0..24,
            ),
            exit in -2i32..3,
        ) {
            for h in Harness::ALL {
                let mut t = h.translator(&RunId::parse("p").unwrap(), "t", || 0);
                let mut all = Vec::new();
                for line in &lines {
                    all.extend(t.feed(line));
                }
                all.extend(t.finish(exit, "tail"));
                proptest::prop_assert_eq!(all[0].r#type(), ChunkType::RunStarted);
                proptest::prop_assert_eq!(all.iter().filter(|c| c.r#type() == ChunkType::RunStarted).count(), 1);
                let terminals = all.iter().filter(|c| chunk::is_terminal(c)).count();
                proptest::prop_assert_eq!(terminals, 1);
                proptest::prop_assert!(chunk::is_terminal(all.last().unwrap()));
            }
        }
    }

    #[test]
    fn finish_reasons_are_normalised() {
        for (raw, want) in [
            ("end_turn", "stop"),
            ("max_tokens", "length"),
            ("tool-calls", "tool_calls"),
            ("weird-one", "weird_one"),
        ] {
            assert_eq!(finish_reason(raw), want);
        }
    }
}
