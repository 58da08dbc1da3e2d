//! A deployment of replicas: one scratch PostgreSQL database and Redis
//! shared by every `sandhold serve` it starts, one data dir (so local
//! sandboxes are shared too), and a nonce that keeps its tenants and ids
//! apart from other tests'.

use std::path::PathBuf;

use crate::database::ScratchDatabase;
use crate::local::TestDir;
use shared::proto::v1 as api;

use crate::server::{Sandboxes, ServerOptions, ServerProcess};

pub struct Cluster {
    pub db: ScratchDatabase,
    pub redis_url: String,
    pub dir: TestDir,
    pub nonce: String,
}

impl Cluster {
    /// `None` when PostgreSQL or Redis is not there (the test skips).
    pub async fn create(prefix: &str) -> Option<Self> {
        let admin_url = crate::services::postgres_url()?;
        let redis_url = crate::services::redis_url()?;
        let db = ScratchDatabase::create(&admin_url).await.unwrap();
        let dir = TestDir::new(prefix);
        let nonce = crate::nonce();
        Some(Self { db, redis_url, dir, nonce })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Replica `name` on the shared database, Redis and data dir, with the
    /// `tenant=token` pairs `tokens`, leases of `lease_ms` (ttl, renewal)
    /// and the flags `extra_args`.
    pub async fn replica(
        &self,
        name: &str,
        tokens: Vec<String>,
        lease_ms: (u64, u64),
        extra_args: Vec<String>,
    ) -> ServerProcess {
        ServerProcess::start(&ServerOptions {
            data_dir: self.data_dir(),
            database_url: Some(self.db.url().to_string()),
            redis_url: Some(self.redis_url.clone()),
            replica_id: Some(format!("{name}-{}", self.nonce)),
            lease_ttl_ms: Some(lease_ms.0),
            lease_renew_ms: Some(lease_ms.1),
            tokens,
            extra_args,
            ..Default::default()
        })
        .await
    }

    /// The directory of the local sandbox `key`, asked through `sandboxes`.
    pub async fn local_sandbox_dir(&self, sandboxes: &mut Sandboxes, key: &str) -> PathBuf {
        let sandbox = sandboxes
            .get_sandbox(api::GetSandboxRequest { sandbox_id: key.into() })
            .await
            .unwrap()
            .into_inner()
            .sandbox
            .unwrap();
        self.data_dir().join("sandboxes").join(sandbox.provider_sandbox_id)
    }

    pub async fn tear_down(self) {
        let _ = self.db.drop_database().await;
    }
}
