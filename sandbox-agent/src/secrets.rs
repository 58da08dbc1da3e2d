//! `SecretService`: the control plane hands the sandbox's secret values to
//! the agent's [`Vault`] (memory only), and asks which files hold them
//! (before a native snapshot commits the file system).

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use shared::error::Error;
use shared::mask::Masks;
use shared::proto::agent::v1::secret_service_server::SecretService;
use shared::proto::agent::v1::{
    PutSecretsRequest, PutSecretsResponse, ScanFilesRequest, ScanFilesResponse, SecretHit,
};
use tonic::{Request, Response, Status};

use crate::context::AgentContext;
use crate::vault::Vault;

/// How much of a file is read at once while scanning.
const SCAN_CHUNK: usize = 1 << 20;

pub struct Secrets {
    vault: Vault,
}

impl Secrets {
    pub fn new(ctx: &AgentContext) -> Self {
        Self { vault: ctx.vault.clone() }
    }
}

#[tonic::async_trait]
impl SecretService for Secrets {
    async fn put_secrets(
        &self,
        req: Request<PutSecretsRequest>,
    ) -> Result<Response<PutSecretsResponse>, Status> {
        let pairs = req.into_inner().secrets.into_iter().map(|s| (s.name, s.value));
        let names = self.vault.put(pairs)?;
        tracing::info!(names = ?names, "secret values handed over");
        Ok(Response::new(PutSecretsResponse { names }))
    }

    async fn scan_files(
        &self,
        req: Request<ScanFilesRequest>,
    ) -> Result<Response<ScanFilesResponse>, Status> {
        let paths = req.into_inner().paths;
        let names = self.vault.names();
        let masks = self.vault.masks(&names, "scanning files")?;
        let resp = tokio::task::spawn_blocking(move || scan(&masks, &paths))
            .await
            .map_err(|e| Error::internal(format!("scan task failed: {e}")))?;
        Ok(Response::new(resp))
    }
}

fn scan(masks: &Masks, paths: &[String]) -> ScanFilesResponse {
    let mut resp = ScanFilesResponse::default();
    for path in paths {
        match scan_file(masks, Path::new(path)) {
            Some(found) if !found.is_empty() => {
                resp.hits.push(SecretHit { path: path.clone(), names: found })
            }
            Some(_) => {}
            None => resp.skipped.push(path.clone()),
        }
    }
    resp
}

/// The names of the secrets in the regular file `path`; `None` when it is
/// no regular file (links are never followed) or cannot be read.
fn scan_file(masks: &Masks, path: &Path) -> Option<Vec<String>> {
    if !path.is_absolute() || !std::fs::symlink_metadata(path).ok()?.is_file() {
        return None;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let overlap = masks.longest().saturating_sub(1);
    let mut window: Vec<u8> = Vec::new();
    let mut found = std::collections::BTreeSet::new();
    let mut buf = vec![0u8; SCAN_CHUNK];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        window.extend_from_slice(&buf[..n]);
        found.extend(masks.names_in(&window));
        let keep = window.len().min(overlap);
        window.drain(..window.len() - keep);
    }
    Some(found.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanning_names_the_files_that_hold_a_value_and_skips_links() {
        let dir = tempfile::tempdir().unwrap();
        let masks = Masks::new([("TOK", "supersecretvalue123"), ("Q", r#"has"quote-1"#)]).unwrap();
        let holds = dir.path().join("npmrc");
        std::fs::write(&holds, "//registry/:_authToken=supersecretvalue123\n").unwrap();
        let escaped = dir.path().join("mcp.json");
        std::fs::write(&escaped, r#"{"h":"has\"quote-1"}"#).unwrap();
        // Across the scan's read boundary.
        let big = dir.path().join("big");
        let mut data = vec![b'x'; SCAN_CHUNK - 5];
        data.extend_from_slice(b"supersecretvalue123");
        std::fs::write(&big, data).unwrap();
        let clean = dir.path().join("clean");
        std::fs::write(&clean, "nothing").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&holds, &link).unwrap();
        let paths: Vec<String> =
            [&holds, &escaped, &big, &clean, &link].iter().map(|p| p.display().to_string()).collect();
        let resp = scan(&masks, &paths);
        let hits: Vec<(String, Vec<String>)> = resp.hits.into_iter().map(|h| (h.path, h.names)).collect();
        assert_eq!(
            hits,
            vec![
                (paths[0].clone(), vec!["TOK".to_string()]),
                (paths[1].clone(), vec!["Q".to_string()]),
                (paths[2].clone(), vec!["TOK".to_string()]),
            ]
        );
        assert_eq!(resp.skipped, vec![paths[4].clone()]);
    }
}
