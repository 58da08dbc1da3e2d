//! The health service's statuses: the whole server and each public
//! service move together.

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

pub(super) async fn set_health(health: &HealthReporter, status: ServingStatus) {
    // "" is the whole server (what a bare `grpc_health_probe` asks).
    health.set_service_status("", status).await;
    health.set_service_status("sandhold.v1.AdminService", status).await;
    health.set_service_status("sandhold.v1.SandboxService", status).await;
    health.set_service_status("sandhold.v1.RunService", status).await;
    health.set_service_status("sandhold.v1.SnapshotService", status).await;
}
