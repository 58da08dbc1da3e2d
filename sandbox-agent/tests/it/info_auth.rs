//! InfoService and authentication, over a real Unix socket.

use sandhold_tests::agent::TestAgent;
use shared::proto::agent::v1::GetInfoRequest;
use shared::proto::agent::v1::info_service_client::InfoServiceClient;
use tonic::Code;

#[tokio::test]
async fn get_info_reports_version_protocol_and_root() {
    let agent = TestAgent::start().await;
    let mut client = InfoServiceClient::new(agent.channel().await);
    let info = client.get_info(GetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.protocol_version, shared::AGENT_PROTOCOL_VERSION);
    assert_eq!(info.root, agent.root.display().to_string());
    assert_eq!(info.pid, std::process::id());
    let caps = info.capabilities.expect("capabilities");
    assert!(caps.background_processes && caps.killable_processes && caps.writable_stdin);
    agent.stop().await;
}

#[tokio::test]
async fn missing_wrong_and_foreign_tokens_are_unauthenticated() {
    let agent = TestAgent::start().await;
    let other = TestAgent::start().await;

    let status =
        InfoServiceClient::new(agent.raw_channel().await).get_info(GetInfoRequest {}).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(shared::error::Error::from_status(&status).code, shared::error::ErrorCode::Unauthenticated);

    let status = InfoServiceClient::new(agent.channel_with_token("wrong").await)
        .get_info(GetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // The token of another agent is not this agent's token.
    let status = InfoServiceClient::new(agent.channel_with_token(&other.token).await)
        .get_info(GetInfoRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    // ... and a prefix of the right token is not it either.
    let status =
        InfoServiceClient::new(agent.channel_with_token(&agent.token[..agent.token.len() - 1]).await)
            .get_info(GetInfoRequest {})
            .await
            .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    agent.stop().await;
    other.stop().await;
}
