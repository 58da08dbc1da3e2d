//! What a chunk does to its run's requests, said to the store beside the
//! chunk so the log's request index is written with it (see
//! [`crate::store::EventLog::requests`]). A leaf: the log's codec asks
//! it, also when it builds an older log's index.

use shared::chunk::{Chunk, ChunkType};

use crate::store::RequestMark;

/// The request a chunk asks or answers: the chunks the translation makes of
/// the agent's sealed records (a command's output never carries a request).
pub(crate) fn request_mark(c: &Chunk) -> Option<RequestMark> {
    let r = c.request.as_ref()?;
    match c.r#type() {
        ChunkType::PermissionRequested => Some(RequestMark::Asked(r.request_id.clone())),
        ChunkType::ToolCallStart if r.awaiting_client => Some(RequestMark::Asked(r.request_id.clone())),
        ChunkType::PermissionResolved | ChunkType::ToolCallResult if !r.answered_by.is_empty() => {
            Some(RequestMark::Answered(r.request_id.clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use shared::chunk::ChunkRequest;

    use super::*;

    #[test]
    fn asks_and_answers_are_marked_and_nothing_else() {
        let chunk = |ty: ChunkType, request: Option<ChunkRequest>| Chunk {
            r#type: ty as i32,
            request,
            ..Default::default()
        };
        let req = |awaiting_client: bool, answered_by: &str| {
            Some(ChunkRequest {
                request_id: "r1".into(),
                awaiting_client,
                answered_by: answered_by.into(),
                ..Default::default()
            })
        };
        let asked = Some(RequestMark::Asked("r1".into()));
        let answered = Some(RequestMark::Answered("r1".into()));
        assert_eq!(request_mark(&chunk(ChunkType::PermissionRequested, req(false, ""))), asked);
        assert_eq!(request_mark(&chunk(ChunkType::ToolCallStart, req(true, ""))), asked);
        assert_eq!(request_mark(&chunk(ChunkType::ToolCallStart, req(false, ""))), None);
        assert_eq!(request_mark(&chunk(ChunkType::PermissionResolved, req(false, "client"))), answered);
        assert_eq!(request_mark(&chunk(ChunkType::ToolCallResult, req(false, "deadline"))), answered);
        assert_eq!(request_mark(&chunk(ChunkType::ToolCallResult, req(false, ""))), None);
        assert_eq!(request_mark(&chunk(ChunkType::PermissionRequested, None)), None);
        assert_eq!(request_mark(&chunk(ChunkType::TextMessageContent, req(true, "client"))), None);
    }
}
