//! SandboxService helpers: ensure streams, exec, and looking for secrets
//! in bytes and in every table of a database.

use shared::proto::v1 as api;

use crate::server::Sandboxes;
use crate::wait::PATIENCE;

/// All events of one ensure: the progress in order, then the ready or the
/// error that ended the stream. Panics if anything follows the end.
pub async fn ensure(
    client: &mut Sandboxes,
    req: api::EnsureSandboxRequest,
) -> (Vec<api::EnsureProgress>, Result<api::EnsureReady, tonic::Status>) {
    let mut stream =
        tokio::time::timeout(PATIENCE, client.ensure_sandbox(req)).await.unwrap().unwrap().into_inner();
    let mut progress = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, stream.message()).await.expect("ensure stalled") {
            Ok(Some(m)) => match m.event.unwrap() {
                api::ensure_sandbox_response::Event::Progress(p) => progress.push(p),
                api::ensure_sandbox_response::Event::Ready(r) => {
                    assert!(stream.message().await.unwrap().is_none(), "nothing after ready");
                    return (progress, Ok(r));
                }
            },
            Ok(None) => panic!("ensure stream ended without ready or error"),
            Err(status) => return (progress, Err(status)),
        }
    }
}

/// The sandbox of `thread`, as ListSandboxes has it (panics without one).
pub async fn of_thread(client: &mut Sandboxes, thread: &str) -> api::Sandbox {
    let list = client.list_sandboxes(api::ListSandboxesRequest::default()).await.unwrap().into_inner();
    list.sandboxes.into_iter().find(|s| s.thread_id == thread).expect("the thread's sandbox")
}

/// The stdout and the exit of an `ExecStream` read to its end.
pub async fn exec_stream_output(
    out: &mut tonic::Streaming<api::ExecStreamResponse>,
) -> (Vec<u8>, Option<api::exit_status::Status>) {
    let (mut stdout, mut exit) = (Vec::new(), None);
    while let Some(m) = tokio::time::timeout(PATIENCE, out.message()).await.unwrap().unwrap() {
        match m.event {
            Some(api::exec_stream_response::Event::Output(o)) => stdout.extend(o.data),
            Some(api::exec_stream_response::Event::Exited(x)) => exit = x.status,
            _ => {}
        }
    }
    (stdout, exit)
}

/// The phases of `progress`, each once where it repeats.
pub fn phases(progress: &[api::EnsureProgress]) -> Vec<api::EnsurePhase> {
    let mut out: Vec<api::EnsurePhase> = Vec::new();
    for p in progress {
        let phase = api::EnsurePhase::try_from(p.phase).unwrap();
        if out.last() != Some(&phase) {
            out.push(phase);
        }
    }
    out
}

/// `script` through `SandboxService.Exec`: its exit code and stdout.
pub async fn sh(client: &mut Sandboxes, sandbox: &str, script: &str) -> (i32, String) {
    let resp = client
        .exec(api::ExecRequest {
            sandbox_id: sandbox.into(),
            command: Some(api::Command { kind: Some(api::command::Kind::Shell(script.into())) }),
            timeout_ms: Some(60_000),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let code = match resp.status.and_then(|s| s.status) {
        Some(api::exit_status::Status::Code(c)) => c,
        other => panic!("no exit code: {other:?}"),
    };
    (code, String::from_utf8_lossy(&resp.stdout).into_owned())
}

/// Whether `needle` occurs in `hay` (image exports and dumps run to many
/// MiB: a real substring search, not a window per byte).
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// Every row of every table of the public schema, as text.
pub async fn table_dump(url: &str) -> String {
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.get::<String, _>(0))
            .collect();
    let mut dump = String::new();
    for table in tables {
        let rows =
            sqlx::query(&format!("SELECT t::text FROM \"{table}\" t")).fetch_all(&mut conn).await.unwrap();
        for r in rows {
            dump.push_str(&r.get::<String, _>(0));
            dump.push('\n');
        }
    }
    dump
}

/// `WriteFile` of `data` at `path` (parents made), as one upload.
pub async fn write_file(
    client: &mut Sandboxes,
    sandbox: &str,
    path: &str,
    data: &[u8],
) -> Result<api::WriteFileResponse, tonic::Status> {
    let header = api::WriteFileRequest {
        request: Some(api::write_file_request::Request::Header(api::WriteFileHeader {
            sandbox_id: sandbox.into(),
            path: path.into(),
            make_parents: true,
            ..Default::default()
        })),
    };
    let data = api::WriteFileRequest { request: Some(api::write_file_request::Request::Data(data.to_vec())) };
    Ok(client.write_file(tokio_stream::iter(vec![header, data])).await?.into_inner())
}
