//! Config reload: read -> parse -> validate -> diff -> swap. A bad file never replaces a good one.
//!
//! Triggers: the file changing on disk (its directory is watched, so editors that write a temp
//! file and rename it work), `SIGHUP`, and the admin `POST /reload`. Reloads are serialized; a
//! request keeps the snapshot it started with, so it never sees half of two configs.

mod triggers;

pub use triggers::ReloadService;

use crate::config::{describe_changes, Config};
use crate::routing::Registry;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The config file changed on disk.
    File,
    /// `SIGHUP`.
    Signal,
    /// `POST /reload` on the admin listener.
    Admin,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// A new config is in force.
    Applied {
        /// Its generation.
        generation: u64,
        /// What changed, one line each.
        changes: Vec<String>,
    },
    /// The file holds the config already in force.
    Unchanged {
        /// The generation still in force.
        generation: u64,
    },
    /// The file was refused; the old config keeps serving.
    Rejected {
        /// The generation still in force.
        generation: u64,
        /// Every problem found, with field paths.
        error: String,
    },
}

/// Reload history shown by `/status`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReloadStatus {
    /// The config file.
    pub path: PathBuf,
    /// FNV-1a hash of the file text in force, hex.
    pub hash: String,
    /// Reloads that applied a new config.
    pub applied_total: u64,
    /// Reloads refused because the file was bad.
    pub rejected_total: u64,
    /// Reloads that found nothing new.
    pub unchanged_total: u64,
    /// The error of the last reload, if it was refused and the file has not been fixed since.
    pub last_error: Option<String>,
}

/// Runs reloads of one config file into one registry.
pub struct Reloader {
    registry: Arc<Registry>,
    state: Mutex<ReloadStatus>,
}

/// FNV-1a, 64 bits: a stable fingerprint of the config text.
pub fn text_hash(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

impl Reloader {
    /// A reloader for `path`, whose current text (already loaded into `registry`) hashes to `hash`.
    pub fn new(path: &Path, hash: String, registry: Arc<Registry>) -> Self {
        Reloader {
            registry,
            state: Mutex::new(ReloadStatus {
                path: path.to_path_buf(),
                hash,
                ..ReloadStatus::default()
            }),
        }
    }

    /// The config file path.
    pub fn path(&self) -> PathBuf {
        self.status().path
    }

    /// Reload history so far.
    pub fn status(&self) -> ReloadStatus {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads the file and applies it if it is new and valid.
    pub fn reload(&self, trigger: Trigger) -> Outcome {
        let Ok(mut state) = self.state.lock() else {
            let generation = self.registry.load().generation;
            let error = "reload state poisoned by an earlier panic".to_string();
            return Outcome::Rejected { generation, error };
        };
        let current = self.registry.load();
        let text = match std::fs::read_to_string(&state.path) {
            Ok(text) => text,
            Err(e) => {
                let error = format!("cannot read {}: {e}", state.path.display());
                return reject(&mut state, trigger, current.generation, error);
            }
        };
        let hash = text_hash(&text);
        if hash == state.hash {
            state.unchanged_total += 1;
            state.last_error = None;
            tracing::debug!(?trigger, "config unchanged");
            return Outcome::Unchanged {
                generation: current.generation,
            };
        }
        let config = match Config::from_yaml(&text) {
            Ok(config) => config,
            Err(e) => return reject(&mut state, trigger, current.generation, e.to_string()),
        };
        let changes = describe_changes(&self.registry.file_config(), &config);
        let generation = self.registry.apply(config);
        state.hash = hash;
        state.applied_total += 1;
        state.last_error = None;
        tracing::info!(?trigger, generation, changes = %changes.join("; "), "config reloaded");
        Outcome::Applied {
            generation,
            changes,
        }
    }
}

fn reject(state: &mut ReloadStatus, trigger: Trigger, generation: u64, error: String) -> Outcome {
    state.rejected_total += 1;
    state.last_error = Some(error.clone());
    tracing::error!(?trigger, generation, %error, "config reload refused; the running config keeps serving");
    Outcome::Rejected { generation, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "backends:\n  - {name: a, url: 'http://127.0.0.1:9001'}\n";

    fn setup() -> (tempfile::TempDir, PathBuf, Reloader, Arc<Registry>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpulb.yaml");
        std::fs::write(&path, GOOD).unwrap();
        let registry = Arc::new(Registry::new(Config::from_yaml(GOOD).unwrap()));
        let reloader = Reloader::new(&path, text_hash(GOOD), Arc::clone(&registry));
        (dir, path, reloader, registry)
    }

    #[test]
    fn same_text_is_unchanged() {
        let (_dir, _path, reloader, registry) = setup();
        assert_eq!(
            reloader.reload(Trigger::Signal),
            Outcome::Unchanged { generation: 1 }
        );
        assert_eq!(registry.load().generation, 1);
    }

    #[test]
    fn new_valid_text_is_applied_with_its_changes() {
        let (_dir, path, reloader, registry) = setup();
        std::fs::write(&path, GOOD.replace("a,", "b,")).unwrap();
        let outcome = reloader.reload(Trigger::Admin);
        assert_eq!(
            outcome,
            Outcome::Applied {
                generation: 2,
                changes: vec![
                    "backend a removed".into(),
                    "backend b added".into(),
                    "pool default changed".into()
                ]
            }
        );
        assert_eq!(registry.load().backends[0].state.name, "b");
        assert_eq!(reloader.status().applied_total, 1);
    }

    #[test]
    fn bad_text_is_refused_and_the_old_config_stays() {
        let (_dir, path, reloader, registry) = setup();
        std::fs::write(&path, "backends:\n  - {name: a, url: 'ftp://x'}\n").unwrap();
        let Outcome::Rejected { generation, error } = reloader.reload(Trigger::File) else {
            panic!("bad file accepted");
        };
        assert_eq!(generation, 1);
        assert!(error.contains("backends[0].url"), "{error}");
        assert_eq!(registry.load().backends[0].url, "http://127.0.0.1:9001");
        assert_eq!(
            reloader.status().last_error.as_deref(),
            Some(error.as_str())
        );
        // Fixing the file (back to what is in force) clears the error.
        std::fs::write(&path, GOOD).unwrap();
        assert_eq!(
            reloader.reload(Trigger::File),
            Outcome::Unchanged { generation: 1 }
        );
        assert_eq!(reloader.status().last_error, None);
    }

    #[test]
    fn missing_file_is_refused() {
        let (dir, path, reloader, _registry) = setup();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            reloader.reload(Trigger::Signal),
            Outcome::Rejected { .. }
        ));
        drop(dir);
    }
}
