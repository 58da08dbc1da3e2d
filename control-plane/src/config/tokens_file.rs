//! The tokens file (`--tokens-file`): one `TENANT=TOKEN` a line, blank
//! lines and `#` comments ignored. It holds every tenant's secret, so a
//! file that its group or others may read or write is refused (as ssh does
//! with a private key); a message never quotes a line, only its number.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, bail};

use super::ApiToken;

pub(super) fn read(path: &Path) -> anyhow::Result<Vec<ApiToken>> {
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading the tokens file {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "the tokens file {} is open to its group or others (mode {:o}); make it private: chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the tokens file {}", path.display()))?;
    parse(&text).map_err(|e| anyhow::anyhow!("the tokens file {}: {e}", path.display()))
}

fn parse(text: &str) -> Result<Vec<ApiToken>, String> {
    let mut tokens = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let token = match line.split_once('=') {
            Some((tenant, token)) => ApiToken::new(tenant, token.trim()),
            None => Err("expected TENANT=TOKEN".to_string()),
        };
        tokens.push(token.map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_comments_and_errors_that_name_no_secret() {
        let tokens = parse("# tenants\n\nacme=token-acme-1\n  beta = token-beta-2\n").unwrap();
        let pairs: Vec<_> = tokens.iter().map(|t| (t.tenant.as_str(), t.token.expose())).collect();
        assert_eq!(pairs, [("acme", "token-acme-1"), ("beta", "token-beta-2")]);
        let err = parse("acme=token-acme-1\nnot a pair secret-xyz\n").unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(!err.contains("secret-xyz"), "{err}");
    }

    #[test]
    fn a_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "acme=token-acme-1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap()[0].tenant, "acme");
    }
}
