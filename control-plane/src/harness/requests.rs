//! Sealed request records (the agent's, verified by it) into chunks, for
//! every harness alike: a permission request is PERMISSION_REQUESTED and
//! its answer PERMISSION_RESOLVED; a client tool call is a TOOL_CALL_START
//! (awaiting the client), ARGS and END, and its answer a TOOL_CALL_RESULT.
//! A record repeated after an agent crash yields nothing the second time.

use std::collections::HashMap;

use shared::chunk::{Chunk, ChunkRequest, ChunkType};
use shared::requests::{Answer, Record, Request, RequestKind};

use super::emit::{Emitter, Translate};

/// What the translation knows of a run's requests.
#[derive(Debug, Default)]
pub(super) struct Requests {
    /// Request id → (its kind, its tool, the tool call id its chunks use).
    asked: HashMap<String, (RequestKind, String, String)>,
    answered: std::collections::HashSet<String>,
}

impl Requests {
    pub(super) fn record(&mut self, em: &mut Emitter, inner: &dyn Translate, record: &[u8]) {
        match shared::requests::parse(record) {
            Some(Record::Request(r)) => self.request(em, inner, r),
            Some(Record::Answer(a)) => self.answer(em, a),
            None => {
                let text = String::from_utf8_lossy(record);
                em.push(em.f.warning("an unreadable request record", Some(&text)));
            }
        }
    }

    fn request(&mut self, em: &mut Emitter, inner: &dyn Translate, r: Request) {
        if self.asked.contains_key(&r.request_id) {
            return;
        }
        let input_json = r.input.to_string();
        let mut request = ChunkRequest {
            request_id: r.request_id.clone(),
            kind: r.kind.as_str().into(),
            rule: r.rule.clone(),
            deadline_ms: r.deadline_ms,
            input_json: input_json.clone(),
            ..Default::default()
        };
        match r.kind {
            RequestKind::Permission | RequestKind::Network => {
                // The CLI's id of the call, as this run's chunks name it.
                let call = match r.tool_call_id.as_str() {
                    "" => String::new(),
                    cli => inner.tool_call_id(cli).unwrap_or_else(|| cli.to_owned()),
                };
                em.push(Chunk {
                    tool_name: r.tool.clone(),
                    tool_call_id: call.clone(),
                    request: Some(request),
                    ..em.f.chunk(ChunkType::PermissionRequested)
                });
                self.asked.insert(r.request_id, (r.kind, r.tool, call));
            }
            RequestKind::ClientTool => {
                let call = em.new_id();
                request.awaiting_client = true;
                em.push(Chunk { request: Some(request), ..em.f.tool_call_start(&call, &r.tool, "") });
                em.push(em.f.tool_call_args(&call, &input_json));
                em.push(em.f.tool_call_end(&call));
                self.asked.insert(r.request_id, (r.kind, r.tool, call));
            }
        }
    }

    fn answer(&mut self, em: &mut Emitter, a: Answer) {
        let Some((kind, tool, call)) = self.asked.get(&a.request_id).cloned() else {
            let line = serde_json::to_string(&a).unwrap_or_default();
            em.push(em.f.warning("an answer to a request the journal does not hold", Some(&line)));
            return;
        };
        if !self.answered.insert(a.request_id.clone()) {
            return;
        }
        let request = ChunkRequest {
            request_id: a.request_id.clone(),
            kind: kind.as_str().into(),
            allowed: a.allowed,
            answered_by: a.by.as_str().into(),
            scope: a.scope.clone(),
            ..Default::default()
        };
        match kind {
            RequestKind::Permission | RequestKind::Network => em.push(Chunk {
                tool_name: tool,
                tool_call_id: call,
                content: a.message,
                request: Some(request),
                ..em.f.chunk(ChunkType::PermissionResolved)
            }),
            RequestKind::ClientTool => em.push(Chunk {
                request: Some(request),
                ..em.f.tool_call_result(&call, &a.message, a.is_error || !a.allowed, None)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared::chunk::ChunkType;
    use shared::ids::RunId;
    use shared::requests::{Answer, AnsweredBy, Record, Request, RequestKind};

    use crate::harness::Harness;

    fn record(r: &Record) -> Vec<u8> {
        serde_json::to_vec(r).unwrap()
    }

    fn asked(id: &str, kind: RequestKind, tool_call_id: &str) -> Record {
        Record::Request(Request {
            request_id: id.into(),
            kind,
            tool: if kind == RequestKind::Permission { "Bash".into() } else { "lookup".into() },
            input: json!({"command": "echo hi > f"}),
            tool_call_id: tool_call_id.into(),
            rule: "ask command:*".into(),
            deadline_ms: 99,
        })
    }

    fn answered(id: &str, allowed: bool, message: &str) -> Record {
        Record::Answer(Answer {
            request_id: id.into(),
            allowed,
            message: message.into(),
            is_error: false,
            always: false,
            scope: String::new(),
            by: AnsweredBy::Client,
        })
    }

    #[test]
    fn a_permission_request_and_its_answer_name_the_claude_tool_call() {
        let run = RunId::parse("run-1").unwrap();
        let mut t = Harness::ClaudeCode.translator(&run, "t", || 0);
        let tool_use = json!({"type":"assistant","message":{"id":"m1","content":[
            {"type":"tool_use","id":"toolu_9","name":"Bash","input":{"command":"echo hi > f"}}]}});
        let ours = t
            .feed(tool_use.to_string().as_bytes())
            .find(|c| c.r#type() == ChunkType::ToolCallStart)
            .expect("the CLI's tool call")
            .tool_call_id;
        let req: Vec<_> = t.feed_record(&record(&asked("r1", RequestKind::Permission, "toolu_9"))).collect();
        assert_eq!(req.len(), 1);
        assert_eq!(req[0].r#type(), ChunkType::PermissionRequested);
        assert_eq!(req[0].tool_call_id, ours);
        let r = req[0].request.as_ref().unwrap();
        assert_eq!((r.request_id.as_str(), r.rule.as_str(), r.deadline_ms), ("r1", "ask command:*", 99));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&r.input_json).unwrap(),
            json!({"command": "echo hi > f"})
        );
        // Repeated records (an agent that crashed between append and mark)
        // yield nothing more.
        assert!(t.feed_record(&record(&asked("r1", RequestKind::Permission, "toolu_9"))).next().is_none());
        let ans: Vec<_> = t.feed_record(&record(&answered("r1", false, "not now"))).collect();
        assert_eq!(ans[0].r#type(), ChunkType::PermissionResolved);
        assert_eq!(ans[0].content, "not now");
        let r = ans[0].request.as_ref().unwrap();
        assert_eq!((r.allowed, r.answered_by.as_str()), (false, "client"));
        assert!(t.feed_record(&record(&answered("r1", true, ""))).next().is_none());
    }

    #[test]
    fn a_client_tool_call_is_a_tool_call_awaiting_the_client_and_its_result() {
        let run = RunId::parse("run-1").unwrap();
        let mut t = Harness::Codex.translator(&run, "t", || 0);
        let chunks: Vec<_> = t.feed_record(&record(&asked("t1", RequestKind::ClientTool, ""))).collect();
        let types: Vec<_> = chunks.iter().map(|c| c.r#type()).collect();
        assert_eq!(
            types,
            [
                ChunkType::RunStarted,
                ChunkType::ToolCallStart,
                ChunkType::ToolCallArgs,
                ChunkType::ToolCallEnd
            ]
        );
        assert!(chunks[1].request.as_ref().unwrap().awaiting_client);
        assert_eq!(chunks[1].tool_name, "lookup");
        let result: Vec<_> = t.feed_record(&record(&answered("t1", true, "42"))).collect();
        assert_eq!(result[0].r#type(), ChunkType::ToolCallResult);
        assert_eq!(
            (result[0].tool_call_id.as_str(), result[0].content.as_str()),
            (chunks[1].tool_call_id.as_str(), "42")
        );
        // An answer to nothing is a warning, not a chunk that claims a request.
        let stray: Vec<_> = t.feed_record(&record(&answered("nope", true, ""))).collect();
        assert_eq!(stray[0].name, "harness.warning");
        assert!(stray[0].request.is_none());
    }

    #[test]
    fn the_same_records_translate_to_the_same_chunks_twice() {
        let run = RunId::parse("run-1").unwrap();
        let feed = || {
            let mut t = Harness::OpenCode.translator(&run, "t", || 0);
            let mut out: Vec<_> = t.feed_record(&record(&asked("t1", RequestKind::ClientTool, ""))).collect();
            out.extend(t.feed_record(&record(&answered("t1", true, "x"))));
            out.iter().map(shared::chunk::fingerprint_hex).collect::<Vec<_>>()
        };
        assert_eq!(feed(), feed());
    }
}
