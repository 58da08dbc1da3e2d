//! The sandbox's secret values, in the agent's memory only.
//!
//! The control plane hands them over at every ensure (`SecretService`); the
//! agent masks them at the source in everything it serves that the control
//! plane stores (journal lines, stderr tails) and zeroes them in snapshot
//! captures, so every replica, a successor that never saw the values
//! included, gets the same masked bytes. Values are never written to disk:
//! only their names are (`.secret-names` in the journal dir, and
//! `<run_id>.secrets` for each run started while some were held), so an
//! agent restarted without them knows what it lacks and refuses rather than
//! serve unmasked output. The agent is non-dumpable and runs as another
//! user than every command, so the run user cannot read them from here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use shared::error::{Error, ErrorCode};
use shared::mask::Masks;
use shared::secret::Secret;

/// Values by name (every value a name was given stays, so a rotated value
/// does not unmask the old one). Cheap to clone.
#[derive(Clone, Default)]
pub struct Vault {
    values: Arc<Mutex<BTreeMap<String, Vec<Secret>>>>,
    /// Held across the read-modify-write of `.secret-names`: two ensures
    /// handing values over at once must not lose each other's names.
    names_file: Arc<Mutex<()>>,
    /// Where `.secret-names` lives (the journal dir); `None` in tests that
    /// have no journal dir.
    dir: Option<PathBuf>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault").field("names", &self.names()).finish_non_exhaustive()
    }
}

impl Vault {
    pub fn new(journal_dir: &Path) -> Self {
        Self { values: Arc::default(), names_file: Arc::default(), dir: Some(journal_dir.to_path_buf()) }
    }

    /// Add `(name, value)` pairs; returns the names held now.
    pub fn put(&self, pairs: impl IntoIterator<Item = (String, String)>) -> Result<Vec<String>, Error> {
        let pairs: Vec<(String, String)> = pairs.into_iter().collect();
        for (name, value) in &pairs {
            if !shared::secret::valid_env_name(name) {
                return Err(Error::invalid_field(format!("secrets[{name}]"), "not a valid variable name"));
            }
            if let Some(why) = shared::mask::refusal(value) {
                return Err(Error::invalid_field(format!("secrets[{name}]"), why));
            }
        }
        let names = {
            let mut values = self.values.lock().expect("vault poisoned");
            for (name, value) in pairs {
                let held = values.entry(name).or_default();
                // Last is latest: a value handed over again moves to the end.
                match held.iter().position(|s| s.expose() == value) {
                    Some(i) => {
                        let again = held.remove(i);
                        held.push(again);
                    }
                    None => held.push(Secret::new(value)),
                }
            }
            values.keys().cloned().collect::<Vec<_>>()
        };
        if let Some(dir) = &self.dir {
            let _one_writer = self.names_file.lock().unwrap_or_else(|e| e.into_inner());
            let mut known = read_names(&dir.join(shared::journal::SANDBOX_SECRETS_FILE));
            known.extend(names.iter().cloned());
            known.sort();
            known.dedup();
            write_names(&dir.join(shared::journal::SANDBOX_SECRETS_FILE), &known)?;
        }
        Ok(names)
    }

    /// The names held now.
    pub fn names(&self) -> Vec<String> {
        self.values.lock().expect("vault poisoned").keys().cloned().collect()
    }

    /// The value handed over last for `name` (what a rotated secret is
    /// now), if any.
    pub fn latest(&self, name: &str) -> Option<Secret> {
        self.values.lock().expect("vault poisoned").get(name).and_then(|held| held.last().cloned())
    }

    /// Every value held.
    pub fn values(&self) -> Vec<String> {
        let values = self.values.lock().expect("vault poisoned");
        values.values().flatten().map(|s| s.expose().to_string()).collect()
    }

    /// The masks of the secrets `names`; `SECRETS_MISSING` naming those
    /// this agent holds no value for.
    pub fn masks(&self, names: &[String], doing: &str) -> Result<Masks, Error> {
        let values = self.values.lock().expect("vault poisoned");
        let missing: Vec<&str> =
            names.iter().filter(|n| !values.contains_key(*n)).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(Error::new(
                ErrorCode::SecretsMissing,
                format!(
                    "{doing}: this agent holds no value of the secret(s) {} (it restarted since they were handed over); ensure the sandbox with them first",
                    missing.join(", ")
                ),
            ));
        }
        let pairs = names
            .iter()
            .flat_map(|n| values[n].iter().map(move |v| (n.as_str(), v.expose())))
            .collect::<Vec<_>>();
        Masks::new(pairs)
    }

    /// The names of every secret this sandbox was handed (by this agent or
    /// one before it).
    pub fn declared(&self) -> Vec<String> {
        let mut names = self.names();
        if let Some(dir) = &self.dir {
            names.extend(read_names(&dir.join(shared::journal::SANDBOX_SECRETS_FILE)));
        }
        names.sort();
        names.dedup();
        names
    }
}

/// Names in a names file, one a line; none when it is missing.
pub fn read_names(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Write a names file (names only, never a value), replacing it.
pub fn write_names(path: &Path, names: &[String]) -> Result<(), Error> {
    // A temporary of its own: concurrent writers never rename another's.
    let tmp = path.with_extension(format!("tmp-names-{:016x}", rand::random::<u64>()));
    let mut body = names.join("\n");
    body.push('\n');
    std::fs::write(&tmp, body)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::internal(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_in_memory_and_names_go_to_disk() {
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path());
        vault.put([("TOK".to_string(), "value-one-1".to_string())]).unwrap();
        vault.put([("TOK".to_string(), "value-two-2".to_string())]).unwrap();
        let masks = vault.masks(&["TOK".to_string()], "reading").unwrap();
        assert_eq!(masks.mask("value-one-1 value-two-2"), "[secret:TOK] [secret:TOK]");
        assert_eq!(vault.latest("TOK").unwrap().expose(), "value-two-2");
        vault.put([("TOK".to_string(), "value-one-1".to_string())]).unwrap();
        assert_eq!(vault.latest("TOK").unwrap().expose(), "value-one-1", "handed over again: latest");
        assert!(vault.latest("OTHER").is_none());
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let body = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!body.contains("value-"), "{body}");
        }
        // A restarted agent knows the names, not the values.
        let restarted = Vault::new(dir.path());
        assert_eq!(restarted.declared(), ["TOK"]);
        let err = restarted.masks(&["TOK".to_string()], "reading").unwrap_err();
        assert_eq!(err.code, ErrorCode::SecretsMissing);
        assert!(err.message.contains("TOK"), "{}", err.message);
    }

    #[test]
    fn concurrent_hand_overs_all_land_and_no_name_is_lost() {
        // Two saves racing on one thread hand values over at once; a shared
        // temporary once made one of them fail its rename.
        let dir = tempfile::tempdir().unwrap();
        let vault = Vault::new(dir.path());
        let threads: Vec<_> = (0..16)
            .map(|i| {
                let vault = vault.clone();
                std::thread::spawn(move || {
                    for j in 0..20 {
                        vault.put([(format!("TOK_{i}_{j}"), format!("value-{i}-{j}-xyz"))]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("every hand-over succeeds");
        }
        assert_eq!(Vault::new(dir.path()).declared().len(), 16 * 20);
    }

    #[test]
    fn short_values_are_refused() {
        let vault = Vault::default();
        let err = vault.put([("PIN".to_string(), "1234".to_string())]).unwrap_err();
        assert!(err.message.contains("at least 8"), "{}", err.message);
        assert!(vault.names().is_empty());
    }
}
