//! Throwaway PostgreSQL databases, so store, fault and reaper tests and the
//! benches run in parallel on one server.

use sqlx::Connection;

/// A database created for one test, on a server whose role may create
/// databases. [`ScratchDatabase::drop_database`] removes it; a test that
/// panics leaves it behind (named `sandhold_test_*`).
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    pub async fn create(admin_url: &str) -> anyhow::Result<Self> {
        let name = format!("sandhold_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(admin_url).await?;
        // The name is ours (hex), so formatting it into the statement is safe.
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await?;
        admin.close().await?;
        Ok(Self { admin_url: admin_url.to_owned(), url: with_database(admin_url, &name)?, name })
    }

    /// URL of the new database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Make the database unavailable for `lasting`, as a restart or a
    /// failover would: new connections are refused and open ones are
    /// terminated; then it takes connections again.
    pub async fn outage(&self, lasting: std::time::Duration) -> anyhow::Result<()> {
        let mut admin = sqlx::PgConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!("ALTER DATABASE {} ALLOW_CONNECTIONS false", self.name))
            .execute(&mut admin)
            .await?;
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(&self.name)
            .execute(&mut admin)
            .await?;
        tokio::time::sleep(lasting).await;
        sqlx::query(&format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", self.name))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(())
    }

    /// Drop the database, disconnecting whoever is still connected.
    pub async fn drop_database(self) -> anyhow::Result<()> {
        let mut admin = sqlx::PgConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        Ok(())
    }
}

/// `url` with its database name replaced by `database`.
fn with_database(url: &str, database: &str) -> anyhow::Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base
        .find("://")
        .map(|i| i + 3)
        .ok_or_else(|| anyhow::anyhow!("database_url: expected postgres://..."))?;
    let path_start = base[authority_start..].find('/').map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{database}", &base[..path_start]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn replaces_the_database_name_only() {
        assert_eq!(
            with_database("postgres://u:p@127.0.0.1:5432/sandhold", "x").unwrap(),
            "postgres://u:p@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1/db?sslmode=disable", "x").unwrap(),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "x").unwrap(), "postgres://h:1/x");
    }
}
