//! EgressService over a real agent (real Unix socket, real loopback
//! listener): the model broker and the proxy, carried by a test-side
//! carrier that plays the control plane's part (it connects to servers on
//! 127.0.0.1 the test started, and refuses the hosts it is told to).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use sandhold_tests::agent::TestAgent;
use sandhold_tests::tls::TestCa;
use shared::proto::agent::v1::egress_service_client::EgressServiceClient;
use shared::proto::agent::v1::secret_service_client::SecretServiceClient;
use shared::proto::agent::v1::{
    CarryClose, CarryDial, CarryDialed, CarryPurpose, CarryRequest, ConfigureEgressRequest, EgressRoute,
    NamedSecret, PutSecretsRequest, ReadUsageRequest, RouteBudget, carry_request, carry_response,
};
use shared::transport::AuthedChannel;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

const PLACEHOLDER: &str = "sandhold-placeholder-5f0c1d2e3a4b";
const SECRET: &str = "sk-real-value-9a8b7c6d5e4f";

// ---------------------------------------------------------------------------
// The test-side carrier.

/// Keeps `IDLE` carriers open on an agent; each connects its dial to
/// 127.0.0.1:port (whatever the host), unless the host is to be refused.
struct TestCarrier {
    dials: Arc<Mutex<Vec<CarryDial>>>,
    stop: CancellationToken,
}

const IDLE: usize = 2;

#[derive(Clone)]
struct CarrierCtx {
    client: EgressServiceClient<AuthedChannel>,
    refuse: Arc<HashSet<String>>,
    dials: Arc<Mutex<Vec<CarryDial>>>,
    stop: CancellationToken,
}

impl TestCarrier {
    async fn start(agent: &TestAgent, refuse: &[&str]) -> Self {
        let ctx = CarrierCtx {
            client: EgressServiceClient::new(agent.channel().await),
            refuse: Arc::new(refuse.iter().map(|h| h.to_string()).collect()),
            dials: Arc::default(),
            stop: CancellationToken::new(),
        };
        for _ in 0..IDLE {
            spawn_carrier(ctx.clone());
        }
        Self { dials: ctx.dials.clone(), stop: ctx.stop.clone() }
    }

    fn dials(&self) -> Vec<CarryDial> {
        self.dials.lock().unwrap().clone()
    }
}

impl Drop for TestCarrier {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn spawn_carrier(ctx: CarrierCtx) {
    let stop = ctx.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = carry_one(ctx) => {},
            () = stop.cancelled() => {},
        }
    });
}

fn send(tx: &mpsc::Sender<CarryRequest>, message: carry_request::Message) -> bool {
    tx.try_send(CarryRequest { message: Some(message) }).is_ok()
}

async fn carry_one(mut ctx: CarrierCtx) {
    let (tx, rx) = mpsc::channel::<CarryRequest>(64);
    let Ok(resp) = ctx.client.carry(ReceiverStream::new(rx)).await else { return };
    let mut responses = resp.into_inner();
    let dial = match responses.message().await {
        Ok(Some(m)) => match m.message {
            Some(carry_response::Message::Dial(dial)) => dial,
            other => panic!("the agent's first carrier message must be dial, got {other:?}"),
        },
        _ => return,
    };
    // Another stands by in this one's place.
    spawn_carrier(ctx.clone());
    ctx.dials.lock().unwrap().push(dial.clone());
    if ctx.refuse.contains(&dial.host) {
        let refused =
            CarryDialed { error: format!("{} is not on the allowlist", dial.host), refused: true, ask: None };
        send(&tx, carry_request::Message::Dialed(refused));
        while let Ok(Some(_)) = responses.message().await {}
        return;
    }
    let tcp = match TcpStream::connect(("127.0.0.1", dial.port as u16)).await {
        Ok(tcp) => tcp,
        Err(e) => {
            send(
                &tx,
                carry_request::Message::Dialed(CarryDialed {
                    error: e.to_string(),
                    refused: false,
                    ask: None,
                }),
            );
            // Until the agent ends the stream: dropping the response
            // stream now could reset it before the answer is sent.
            while let Ok(Some(_)) = responses.message().await {}
            return;
        }
    };
    send(&tx, carry_request::Message::Dialed(CarryDialed::default()));
    let (mut read, mut write) = tcp.into_split();
    let up = async {
        loop {
            match responses.message().await {
                Ok(Some(m)) => match m.message {
                    Some(carry_response::Message::Data(d)) => {
                        if write.write_all(&d).await.is_err() {
                            return;
                        }
                    }
                    Some(carry_response::Message::Close(_)) => {
                        let _ = write.shutdown().await;
                    }
                    other => panic!("unexpected carrier message {other:?}"),
                },
                _ => return,
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let data =
                        CarryRequest { message: Some(carry_request::Message::Data(buf[..n].to_vec())) };
                    if tx.send(data).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(CarryRequest { message: Some(carry_request::Message::Close(CarryClose {})) }).await;
        // The carrier ends when the agent ends its side.
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = up => {},
        () = down => {},
    }
}

// ---------------------------------------------------------------------------
// Upstreams started by the test.

/// One request as an upstream saw it.
#[derive(Debug, Clone)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 upstream on 127.0.0.1 (TLS when given an acceptor) that
/// records each request and answers with an event stream in two pieces:
/// the first at once, the second only once `release` is notified.
struct Upstream {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

const FIRST: &str = "event: message_start\ndata: {\"n\":1}\n\n";
const LAST: &str = "event: message_stop\ndata: {\"n\":2}\n\n";

impl Upstream {
    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let release = Arc::new(Notify::new());
        let (seen2, release2) = (seen.clone(), release.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (seen, release, tls) = (seen2.clone(), release2.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                answer(stream, &seen, &release).await;
                            }
                        }
                        None => answer(tcp, &seen, &release).await,
                    }
                });
            }
        });
        Self { port, seen, release, task }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer<S: AsyncRead + AsyncWrite + Unpin>(stream: S, seen: &Mutex<Vec<Seen>>, release: &Notify) {
    let mut stream = BufReader::new(stream);
    let mut request_line = String::new();
    if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
        return;
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize =
        headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.parse().unwrap()).unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    seen.lock().unwrap().push(Seen { request_line: request_line.trim_end().to_string(), headers, body });
    let stream = stream.get_mut();
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(format!("{:x}\r\n{FIRST}\r\n", FIRST.len()).as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    release.notified().await;
    stream.write_all(format!("{:x}\r\n{LAST}\r\n0\r\n\r\n", LAST.len()).as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let _ = stream.shutdown().await;
}

// ---------------------------------------------------------------------------
// Clients of the agent's listener.

/// Send `req` to the listener on `port`, on a new connection.
async fn request(port: u16, req: http::Request<Full<Bytes>>) -> http::Response<Incoming> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    sender.send_request(req).await.unwrap()
}

fn post(path: &str, headers: &[(&str, &str)], body: &str) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::post(path).header("host", "127.0.0.1");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    req.body(Full::new(Bytes::from(body.to_string()))).unwrap()
}

async fn json_error(resp: http::Response<Incoming>) -> (u16, String) {
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    (status, json["error"]["message"].as_str().unwrap().to_string())
}

/// Read the body's next data frame.
async fn next_data(body: &mut Incoming) -> Option<Bytes> {
    loop {
        let frame =
            tokio::time::timeout(Duration::from_secs(10), body.frame()).await.expect("a frame in time")?;
        if let Ok(data) = frame.unwrap().into_data() {
            return Some(data);
        }
    }
}

fn route(upstream_port: u16, scheme: &str, host: &str, secret: &str) -> EgressRoute {
    EgressRoute {
        placeholder: PLACEHOLDER.to_string(),
        scheme: scheme.to_string(),
        host: host.to_string(),
        port: u32::from(upstream_port),
        secret_name: secret.to_string(),
        label: "claude-code".to_string(),
        ..Default::default()
    }
}

async fn configure(agent: &TestAgent, req: ConfigureEgressRequest) -> u16 {
    let mut client = EgressServiceClient::new(agent.channel().await);
    u16::try_from(client.configure(req).await.unwrap().into_inner().port).unwrap()
}

async fn put_secret(agent: &TestAgent, name: &str, value: &str) {
    SecretServiceClient::new(agent.channel().await)
        .put_secrets(PutSecretsRequest {
            secrets: vec![NamedSecret { name: name.to_string(), value: value.to_string() }],
        })
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------
// The broker.

/// An agent holding `held` (=[`SECRET`]) with an `http` route to a new
/// upstream whose key is `ANTHROPIC_API_KEY`; the listener's port.
async fn http_route(held: &str) -> (TestAgent, Upstream, u16) {
    let agent = TestAgent::start().await;
    let upstream = Upstream::start(None).await;
    put_secret(&agent, held, SECRET).await;
    let port = configure(
        &agent,
        ConfigureEgressRequest {
            routes: vec![route(upstream.port, "http", "api.model.test", "ANTHROPIC_API_KEY")],
            ..Default::default()
        },
    )
    .await;
    (agent, upstream, port)
}

#[tokio::test]
async fn the_broker_adds_the_key_and_streams_the_response_piece_by_piece() {
    let (agent, upstream, port) = http_route("ANTHROPIC_API_KEY").await;
    let carrier = TestCarrier::start(&agent, &[]).await;

    let resp = request(
        port,
        post(
            "/v1/messages?beta=true",
            &[
                ("x-api-key", PLACEHOLDER),
                ("authorization", &format!("Bearer {PLACEHOLDER}")),
                ("x-keep", "as-is"),
            ],
            r#"{"model":"m","stream":true}"#,
        ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The first piece arrives while the upstream still holds the last back.
    assert_eq!(next_data(&mut body).await.unwrap(), FIRST.as_bytes());
    upstream.release.notify_one();
    let mut rest = Vec::new();
    while let Some(data) = next_data(&mut body).await {
        rest.extend_from_slice(&data);
    }
    assert_eq!(rest, LAST.as_bytes());

    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.request_line, "POST /v1/messages?beta=true HTTP/1.1");
    assert_eq!(seen.header("x-api-key"), Some(SECRET));
    assert_eq!(seen.header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    assert_eq!(seen.header("x-keep"), Some("as-is"));
    assert_eq!(seen.header("host"), Some(format!("api.model.test:{}", upstream.port).as_str()));
    assert_eq!(seen.body, br#"{"model":"m","stream":true}"#);
    assert!(seen.headers.iter().all(|(_, v)| !v.contains(PLACEHOLDER)), "{seen:?}");
    let dials = carrier.dials();
    assert_eq!(dials.len(), 1);
    assert_eq!(
        (dials[0].host.as_str(), dials[0].port, dials[0].purpose(), dials[0].route.as_str()),
        ("api.model.test", u32::from(upstream.port), CarryPurpose::Model, "claude-code")
    );
    agent.stop().await;
}

#[tokio::test]
async fn no_placeholder_is_401_and_a_secret_not_held_is_503_naming_it() {
    let (agent, upstream, port) = http_route("OTHER_KEY").await;
    let carrier = TestCarrier::start(&agent, &[]).await;

    let (status, message) =
        json_error(request(port, post("/v1/messages", &[("x-api-key", "sk-mine")], "{}")).await).await;
    assert_eq!(status, 401, "{message}");
    assert!(message.contains("no Sandhold placeholder"), "{message}");

    let (status, message) =
        json_error(request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await).await;
    assert_eq!(status, 503, "{message}");
    assert!(message.contains("ANTHROPIC_API_KEY"), "{message}");
    assert!(!message.contains(SECRET), "{message}");
    assert!(upstream.seen().is_empty());
    assert!(carrier.dials().is_empty(), "nothing is dialed for a request that cannot go");
    agent.stop().await;
}

/// An upstream on 127.0.0.1 that answers every request with its whole head
/// (request line and every header, as received) as the body: what an API
/// does that quotes an unknown header value in its error. Records each head.
async fn echo_upstream() -> (u16, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let answer = |head: &str| {
        format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{head}",
            head.len()
        )
    };
    recording_upstream(answer, str::to_owned).await
}

/// An upstream on 127.0.0.1 that reads each request (head, and body by its
/// length), records `record(head)` and writes `answer(head)`, then closes.
async fn recording_upstream(
    answer: fn(&str) -> String,
    record: fn(&str) -> String,
) -> (u16, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut tcp = BufReader::new(tcp);
                let (mut head, mut length) = (String::new(), 0usize);
                loop {
                    let mut line = String::new();
                    if tcp.read_line(&mut line).await.unwrap_or(0) == 0 || line.trim_end().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    head.push_str(&line);
                }
                let mut body = vec![0u8; length];
                let _ = tcp.read_exact(&mut body).await;
                seen.lock().unwrap().push(record(&head));
                let _ = tcp.get_mut().write_all(answer(&head).as_bytes()).await;
                let _ = tcp.get_mut().shutdown().await;
            });
        }
    });
    (port, heads, task)
}

/// Base64 (standard alphabet, no padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=group.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// The forms of `secret` a run could find in bytes it reads: raw, hex
/// (either case) and base64 at each of the three alignments a longer text
/// may put it in (the stable middle of each).
fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_string(), hex::encode(secret), hex::encode_upper(secret)];
    for shift in 0..3 {
        let mut bytes = vec![b'x'; shift];
        bytes.extend_from_slice(secret.as_bytes());
        let encoded = base64(&bytes);
        forms.push(encoded[4..encoded.len() - 4].to_string());
    }
    forms
}

/// Issue 33, critical 1: a hostile run asks the broker to put the key in a
/// header the upstream repeats back. It sends the placeholder in the auth
/// header and in `anthropic-beta` (and variants); every byte it gets back,
/// from an upstream that echoes every header, holds the key in no form.
#[tokio::test]
async fn hostile_a_placeholder_outside_the_auth_header_never_brings_the_key_back() {
    let agent = TestAgent::start().await;
    let (echo, heads, echo_task) = echo_upstream().await;
    put_secret(&agent, "ANTHROPIC_API_KEY", SECRET).await;
    let port = configure(
        &agent,
        ConfigureEgressRequest {
            routes: vec![route(echo, "http", "127.0.0.1", "ANTHROPIC_API_KEY")],
            ..Default::default()
        },
    )
    .await;
    let _carrier = TestCarrier::start(&agent, &[]).await;
    let bearer = format!("Bearer {PLACEHOLDER}");
    let suffixed = format!("{PLACEHOLDER}-2023-06-01");
    let attacks: [&[(&str, &str)]; 4] = [
        &[("x-api-key", PLACEHOLDER), ("anthropic-beta", PLACEHOLDER)],
        &[("x-api-key", PLACEHOLDER), ("anthropic-beta", &suffixed)],
        &[("authorization", &bearer), ("x-request-note", &bearer)],
        &[("x-api-key", &suffixed)],
    ];
    let mut seen_by_the_run = Vec::new();
    for headers in attacks {
        // Raw bytes, as the run's own client would read them.
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut raw = String::from("POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\n");
        for (n, v) in headers {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        raw.push_str("content-length: 2\r\nconnection: close\r\n\r\n{}");
        tcp.write_all(raw.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut answer)).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert!(text.starts_with("HTTP/1.1 "), "{headers:?}: {text}");
        seen_by_the_run.push(text);
    }
    let everything = seen_by_the_run.concat();
    for form in forms(SECRET) {
        assert!(!everything.contains(&form), "the run read the key (as {form}): {everything}");
    }
    // Refused, and said so: nothing reached the upstream with the key in it.
    assert!(seen_by_the_run.iter().all(|t| t.starts_with("HTTP/1.1 400")), "{seen_by_the_run:?}");
    assert!(everything.contains("placeholder key stands in the header"), "{everything}");
    assert!(heads.lock().unwrap().iter().all(|h| !h.contains(SECRET)), "{:?}", heads.lock().unwrap());
    echo_task.abort();
    agent.stop().await;
}

fn tls_acceptor(ca: &TestCa) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let leaf = ca.leaf(1);
    let certs = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[tokio::test]
async fn an_https_route_trusts_the_extra_roots_and_only_them() {
    let agent = TestAgent::start().await;
    let ca = TestCa::new("egress-test-ca");
    let upstream = Upstream::start(Some(tls_acceptor(&ca))).await;
    put_secret(&agent, "ANTHROPIC_API_KEY", SECRET).await;
    let with_root = ConfigureEgressRequest {
        routes: vec![route(upstream.port, "https", "localhost", "ANTHROPIC_API_KEY")],
        extra_roots_pem: ca.pem().to_string(),
        ..Default::default()
    };
    let port = configure(&agent, with_root).await;
    let _carrier = TestCarrier::start(&agent, &[]).await;

    let resp = request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    assert_eq!(next_data(&mut body).await.unwrap(), FIRST.as_bytes());
    upstream.release.notify_one();
    while next_data(&mut body).await.is_some() {}
    assert_eq!(upstream.seen()[0].header("x-api-key"), Some(SECRET));

    // The same route (kept), the extra root gone: the test CA is no webpki root.
    assert_eq!(configure(&agent, ConfigureEgressRequest::default()).await, port);
    let (status, message) =
        json_error(request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await).await;
    assert_eq!(status, 502, "{message}");
    assert!(message.contains("TLS failed") && message.contains("invalid peer certificate"), "{message}");
    assert_eq!(upstream.seen().len(), 1);
    agent.stop().await;
}

#[tokio::test]
async fn configure_refuses_what_is_malformed_naming_the_field() {
    let agent = TestAgent::start().await;
    let mut client = EgressServiceClient::new(agent.channel().await);
    let mut bad = route(443, "https", "api.model.test", "ANTHROPIC_API_KEY");
    bad.placeholder = "short".into();
    let cases = [
        (ConfigureEgressRequest { routes: vec![bad], ..Default::default() }, "routes[0].placeholder"),
        (ConfigureEgressRequest { extra_roots_pem: "junk".into(), ..Default::default() }, "extra_roots_pem"),
    ];
    for (req, field) in cases {
        let status = client.configure(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let err = shared::error::Error::from_status(&status);
        assert!(err.field_violations.iter().any(|(f, _)| f == field), "{field}: {err:?}");
    }
    agent.stop().await;
}

// ---------------------------------------------------------------------------
// The proxy.

/// An upper-casing echo server on 127.0.0.1.
async fn echo_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = tcp.read(&mut buf).await {
                    if tcp.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, task)
}

/// `CONNECT target` on a new connection; the status and the connection.
async fn connect(port: u16, target: &str) -> (u16, BufReader<TcpStream>) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).await.unwrap();
    let mut tcp = BufReader::new(tcp);
    let mut status_line = String::new();
    tcp.read_line(&mut status_line).await.unwrap();
    let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut content_length = 0;
    loop {
        let mut line = String::new();
        tcp.read_line(&mut line).await.unwrap();
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap();
        }
        if line.trim_end().is_empty() {
            break;
        }
    }
    let mut body = vec![0u8; content_length];
    tcp.read_exact(&mut body).await.unwrap();
    (status, tcp)
}

#[tokio::test]
async fn the_proxy_tunnels_where_the_control_plane_allows_only() {
    let agent = TestAgent::start().await;
    let (echo, echo_task) = echo_server().await;
    let upstream = Upstream::start(None).await;
    let port = configure(&agent, ConfigureEgressRequest::default()).await;
    let carrier = TestCarrier::start(&agent, &["refused.test", "elsewhere.test"]).await;

    // Allowed: bytes both ways.
    let (status, mut tunnel) = connect(port, &format!("127.0.0.1:{echo}")).await;
    assert_eq!(status, 200);
    for word in ["hello", "tunnel"] {
        tunnel.get_mut().write_all(word.as_bytes()).await.unwrap();
        let mut back = vec![0u8; word.len()];
        tunnel.read_exact(&mut back).await.unwrap();
        assert_eq!(back, word.to_ascii_uppercase().as_bytes());
    }
    drop(tunnel);
    assert_eq!(carrier.dials().len(), 1);
    assert_eq!(carrier.dials()[0].purpose(), CarryPurpose::Proxy);

    // Refused by the control plane: 403, and the control plane saw the
    // attempt (the agent dials everything; it is not trusted to decide).
    let (status, _) = connect(port, &format!("refused.test:{echo}")).await;
    assert_eq!(status, 403);
    assert_eq!(carrier.dials().last().unwrap().host, "refused.test");
    // A destination the control plane cannot connect to: 502.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (status, _) = connect(port, &format!("127.0.0.1:{closed}")).await;
    assert_eq!(status, 502);
    assert_eq!(carrier.dials().len(), 3, "{:?}", carrier.dials());

    // Absolute-form http:// is forwarded in origin-form, the proxy's own
    // headers stripped.
    let req = http::Request::get(format!("http://127.0.0.1:{}/simple/pkg/?x=1", upstream.port))
        .header("host", format!("127.0.0.1:{}", upstream.port))
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("proxy-connection", "keep-alive")
        .body(Full::new(Bytes::new()))
        .unwrap();
    upstream.release.notify_one();
    let resp = request(port, req).await;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, format!("{FIRST}{LAST}").as_bytes());
    let seen = &upstream.seen()[0];
    assert_eq!(seen.request_line, "GET /simple/pkg/?x=1 HTTP/1.1");
    assert!(seen.header("proxy-authorization").is_none() && seen.header("proxy-connection").is_none());
    let req = http::Request::get("http://elsewhere.test/")
        .header("host", "elsewhere.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(request(port, req).await.status(), 403);
    assert_eq!(carrier.dials().len(), 5, "{:?}", carrier.dials());

    echo_task.abort();
    agent.stop().await;
}

/// Issue 33, medium 8: an absolute-form request for an allowed host whose
/// `Host` names another (a shared front would serve that one) is refused
/// before anything is dialed.
#[tokio::test]
async fn hostile_a_host_header_other_than_the_target_is_refused() {
    let agent = TestAgent::start().await;
    let upstream = Upstream::start(None).await;
    upstream.release.notify_one();
    let port = configure(&agent, ConfigureEgressRequest::default()).await;
    let carrier = TestCarrier::start(&agent, &[]).await;
    let fronted = |host: &str| {
        http::Request::get(format!("http://allowed.test:{}/", upstream.port))
            .header("host", host)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (status, message) = json_error(request(port, fronted("forbidden.test")).await).await;
    assert_eq!(status, 403, "{message}");
    assert!(message.contains("forbidden.test") && message.contains("allowed.test"), "{message}");
    let (status, _) =
        json_error(request(port, fronted(&format!("forbidden.test:{}", upstream.port))).await).await;
    assert_eq!(status, 403);
    assert!(upstream.seen().is_empty(), "{:?}", upstream.seen());
    assert!(carrier.dials().is_empty(), "{:?}", carrier.dials());
    // The same request naming its target goes.
    let resp = request(port, fronted(&format!("Allowed.Test:{}", upstream.port))).await;
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    assert_eq!(upstream.seen()[0].header("host"), Some(format!("Allowed.Test:{}", upstream.port).as_str()));
    agent.stop().await;
}

/// A TCP server on 127.0.0.1 that answers nothing and keeps every byte
/// each connection sent it.
async fn recorder() -> (u16, Arc<Mutex<Vec<Vec<u8>>>>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let kept = received.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else { return };
            let kept = kept.clone();
            let index = {
                let mut kept = kept.lock().unwrap();
                kept.push(Vec::new());
                kept.len() - 1
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = tcp.read(&mut buf).await {
                    kept.lock().unwrap()[index].extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    (port, received, task)
}

/// A TLS handshake for `server_name` through a tunnel to `target`; the
/// handshake's outcome within 2 s (`None`: still waiting on the server).
async fn tls_through_tunnel(port: u16, target: &str, server_name: &str) -> Option<Result<(), String>> {
    let (status, tunnel) = connect(port, target).await;
    assert_eq!(status, 200, "{target}");
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).unwrap();
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tunnel.into_inner());
    tokio::time::timeout(Duration::from_secs(2), handshake)
        .await
        .ok()
        .map(|r| r.map(drop).map_err(|e| e.to_string()))
}

/// Issue 33, medium 8: a tunnel allowed for one name whose TLS ClientHello
/// asks for another (domain fronting) ends before a byte of it reaches the
/// destination; a ClientHello for the tunnel's own name goes through.
#[tokio::test]
async fn hostile_a_tls_server_name_other_than_the_connect_target_is_refused() {
    let agent = TestAgent::start().await;
    let (dest, received, task) = recorder().await;
    let port = configure(&agent, ConfigureEgressRequest::default()).await;
    let _carrier = TestCarrier::start(&agent, &[]).await;
    let target = format!("allowed.test:{dest}");

    let fronted = tls_through_tunnel(port, &target, "forbidden.test").await;
    assert!(matches!(fronted, Some(Err(_))), "the fronted handshake was not ended: {fronted:?}");
    let by_ip = tls_through_tunnel(port, &format!("127.0.0.1:{dest}"), "forbidden.test").await;
    assert!(matches!(by_ip, Some(Err(_))), "a server name through an IP tunnel: {by_ip:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let received = received.lock().unwrap();
        assert_eq!(received.len(), 2, "each tunnel was dialed");
        assert!(received.iter().all(Vec::is_empty), "the destination got the fronted bytes: {received:?}");
    }

    // The tunnel's own name: the ClientHello reaches the destination (which
    // never answers, so the handshake is still waiting).
    assert!(tls_through_tunnel(port, &target, "allowed.test").await.is_none());
    let hello = received.lock().unwrap()[2].clone();
    assert_eq!(hello.first(), Some(&0x16), "{hello:?}");
    assert!(memchr::memmem::find(&hello, b"allowed.test").is_some());
    task.abort();
    agent.stop().await;
}

// ---------------------------------------------------------------------------
// Restart.

#[tokio::test]
async fn routes_and_port_survive_an_agent_restart() {
    let (mut agent, upstream, port) = http_route("ANTHROPIC_API_KEY").await;
    let saved = agent.journal_dir.join(sandbox_agent::egress::CONFIG_FILE);
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(text.contains("ANTHROPIC_API_KEY") && !text.contains(SECRET), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777, 0o600);

    agent.restart().await;
    // The value went with the old agent's memory; the route did not.
    let (status, message) =
        json_error(request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await).await;
    assert_eq!(status, 503, "{message}");
    assert!(message.contains("ANTHROPIC_API_KEY"), "{message}");
    put_secret(&agent, "ANTHROPIC_API_KEY", SECRET).await;
    let _carrier = TestCarrier::start(&agent, &[]).await;
    upstream.release.notify_one();
    let resp = request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await;
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    assert_eq!(upstream.seen()[0].header("x-api-key"), Some(SECRET));
    // Configuring again keeps the port.
    assert_eq!(configure(&agent, ConfigureEgressRequest::default()).await, port);
    agent.stop().await;
}

// ---------------------------------------------------------------------------
// Metering and budgets.

/// An Anthropic upstream on 127.0.0.1 answering every request with a
/// streamed message whose usage is 12 input, 7 output, 5 cache reads and 3
/// cache writes; records each request's head.
async fn usage_upstream() -> (u16, Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let answer = |_: &str| {
        let events = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m-1\",\
            \"usage\":{\"input_tokens\":12,\"output_tokens\":1,\"cache_read_input_tokens\":5,\
            \"cache_creation_input_tokens\":3}}}\n\n\
            event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n\
            event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{events}",
            events.len()
        )
    };
    recording_upstream(answer, str::to_ascii_lowercase).await
}

async fn usage_of(agent: &TestAgent, run_id: &str) -> Vec<(u64, u64, u64, u64, u64)> {
    let mut client = EgressServiceClient::new(agent.channel().await);
    let records = client
        .read_usage(ReadUsageRequest { run_id: run_id.into(), after_seq: 0, max_records: 0 })
        .await
        .unwrap()
        .into_inner()
        .records;
    records
        .iter()
        .map(|r| (r.seq, r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens))
        .collect()
}

/// A process in the sandbox with the run's placeholder (any auth header,
/// asking for an encoded answer so as not to be read) is metered under the
/// run like the CLI; past the run's budget every request is answered by the
/// broker itself in Anthropic's error shape, nothing goes upstream, and an
/// agent restarted on the same journal dir still counts what was recorded.
#[tokio::test]
async fn hostile_the_budget_is_the_runs_whatever_process_asks_and_outlives_the_agent() {
    let mut agent = TestAgent::start().await;
    let (upstream, heads, _task) = usage_upstream().await;
    put_secret(&agent, "ANTHROPIC_API_KEY", SECRET).await;
    let mut metered = route(upstream, "http", "api.model.test", "ANTHROPIC_API_KEY");
    metered.run_id = "r-budget".into();
    metered.budget = Some(RouteBudget { max_tokens: 40, ..Default::default() });
    let port =
        configure(&agent, ConfigureEgressRequest { routes: vec![metered], ..Default::default() }).await;
    let carrier = TestCarrier::start(&agent, &[]).await;

    let read_all = |resp: http::Response<Incoming>| async move {
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap().to_bytes()
    };
    // The CLI's request: 27 tokens.
    read_all(request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await).await;
    assert_eq!(usage_of(&agent, "r-budget").await, [(1, 12, 7, 5, 3)]);
    // Another process, another auth header, an encoding it cannot get.
    let bearer = format!("Bearer {PLACEHOLDER}");
    let sneaky = [("authorization", bearer.as_str()), ("accept-encoding", "br, gzip")];
    read_all(request(port, post("/v1/messages", &sneaky, "{}")).await).await;
    assert_eq!(usage_of(&agent, "r-budget").await, [(1, 12, 7, 5, 3), (2, 12, 7, 5, 3)]);
    assert!(heads.lock().unwrap()[1].contains("accept-encoding: identity"), "{:?}", heads.lock().unwrap());
    // 54 of 40: refused, in Anthropic's shape, without a dial.
    let dials = carrier.dials().len();
    for headers in [&[("x-api-key", PLACEHOLDER)][..], &sneaky[..]] {
        let resp = request(port, post("/v1/messages", headers, "{}")).await;
        assert_eq!(resp.status(), 400);
        assert_eq!(resp.headers()["x-should-retry"], "false");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (json["type"].as_str(), json["error"]["type"].as_str()),
            (Some("error"), Some("invalid_request_error"))
        );
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("max_tokens = 40, 54 used"), "{message}");
        assert!(!message.contains(SECRET));
    }
    assert_eq!(heads.lock().unwrap().len(), 2, "nothing past the budget went upstream");
    assert_eq!(carrier.dials().len(), dials);
    // The count is on disk, not in the agent's memory.
    drop(carrier);
    agent.restart().await;
    let resp = request(port, post("/v1/messages", &[("x-api-key", PLACEHOLDER)], "{}")).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(usage_of(&agent, "r-budget").await.len(), 2);
    assert_eq!(heads.lock().unwrap().len(), 2);
    agent.stop().await;
}
