//! Config reload: read -> parse -> validate -> diff -> swap. A bad file never replaces a good one.
//!
//! Triggers: the file changing on disk (its directory is watched, so editors that write a temp
//! file and rename it work), `SIGHUP`, and the admin `POST /reload`. Reloads are serialized; a
//! request keeps the snapshot it started with, so it never sees half of two configs.
//!
//! The slow part — reading, parsing, validating and resolving backend names — runs on a thread
//! of its own, holding no lock that `/status` or `/metrics` need; only the swap itself (no I/O)
//! happens after it. A reload that takes longer than `reload.timeout` is abandoned: nothing of
//! it is applied, and it is logged, counted and shown in `/status`.
//!
//! With `listen_tls`, every reload reads its certificate and key files again, even when the
//! config text is unchanged (a renewed certificate is the usual reason to reload): a file that
//! does not serve refuses the reload, and the certificate in force keeps serving.

mod triggers;

pub use triggers::ReloadService;

use crate::config::{describe_changes, Config, ListenTls, ServingCert};
use crate::routing::{resolve_backends, Registry, Resolved};
use crate::tls::CertResolver;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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
    /// Reading, parsing and resolving took longer than `reload.timeout`; nothing was applied.
    Abandoned {
        /// The generation still in force.
        generation: u64,
        /// What happened.
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
    /// Reloads abandoned past `reload.timeout`.
    pub abandoned_total: u64,
    /// The error of the last reload, if it was refused and the file has not been fixed since.
    pub last_error: Option<String>,
}

/// Runs reloads of one config file into one registry.
pub struct Reloader {
    registry: Arc<Registry>,
    /// Held only to read or record the history, never across a reload's work.
    state: Mutex<ReloadStatus>,
    /// Serializes reloads; `/status` never waits on it.
    turn: Mutex<()>,
    /// The proxy listener's certificate, when it serves TLS.
    listener_cert: Option<Arc<CertResolver>>,
}

/// A config file read, parsed, validated and resolved, ready to swap in.
enum Prepared {
    /// The text in force already; the listener's certificate files read again, when it has one.
    Unchanged { cert: Option<ServingCert> },
    /// A new valid config.
    New {
        config: Box<Config>,
        resolved: Resolved,
        hash: String,
    },
}

/// FNV-1a, 64 bits: a stable fingerprint of the config text.
pub fn text_hash(text: &str) -> String {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// Reads, parses, validates and resolves the file at `path`: everything slow, no lock held.
/// `listen_tls` is the listener's certificate files in force, read again if the text is the same.
fn prepare(
    path: &Path,
    hash_in_force: &str,
    listen_tls: Option<ListenTls>,
) -> Result<Prepared, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let hash = text_hash(&text);
    if hash == hash_in_force {
        let cert = listen_tls.map(|files| ServingCert::load(&files));
        let cert = cert.transpose().map_err(|e| e.to_string())?;
        return Ok(Prepared::Unchanged { cert });
    }
    let config = Config::from_yaml(&text).map_err(|e| e.to_string())?;
    let resolved = resolve_backends(&config);
    Ok(Prepared::New {
        config: Box::new(config),
        resolved,
        hash,
    })
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
            turn: Mutex::new(()),
            listener_cert: None,
        }
    }

    /// Has each reload replace `resolver`'s certificate (the proxy listener serves TLS).
    pub fn with_listener_cert(mut self, resolver: Option<Arc<CertResolver>>) -> Self {
        self.listener_cert = resolver;
        self
    }

    /// Serves `cert` on the listener when it differs from the one in force: the change line.
    fn swap_cert(&self, cert: Option<&ServingCert>) -> Option<String> {
        let (resolver, cert) = (self.listener_cert.as_ref()?, cert?);
        resolver
            .replace(cert)
            .then(|| "listen_tls certificate replaced".to_string())
    }

    fn state(&self) -> MutexGuard<'_, ReloadStatus> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The config file path.
    pub fn path(&self) -> PathBuf {
        self.state().path.clone()
    }

    /// Reload history so far.
    pub fn status(&self) -> ReloadStatus {
        self.state().clone()
    }

    /// Reads the file and applies it if it is new and valid, within the running config's
    /// `reload.timeout`. Blocks the calling thread (run it off any event loop).
    pub fn reload(&self, trigger: Trigger) -> Outcome {
        let _turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.registry.load();
        let limit = current.config.reload.timeout;
        let (path, hash_in_force) = {
            let state = self.state();
            (state.path.clone(), state.hash.clone())
        };
        let listen_tls = self
            .listener_cert
            .as_ref()
            .and(current.config.listen_tls.clone());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("gpulb-reload".into())
            .spawn(move || {
                let _ = tx.send(prepare(&path, &hash_in_force, listen_tls));
            });
        if let Err(e) = spawned {
            let error = format!("cannot start the reload thread: {e}");
            return self.reject(trigger, current.generation, error);
        }
        match rx.recv_timeout(limit) {
            Ok(Ok(Prepared::Unchanged { cert })) => {
                if let Some(change) = self.swap_cert(cert.as_ref()) {
                    let generation = current.generation;
                    self.record_applied(None);
                    tracing::info!(?trigger, generation, changes = %change, "config reloaded");
                    return Outcome::Applied {
                        generation,
                        changes: vec![change],
                    };
                }
                let mut state = self.state();
                state.unchanged_total += 1;
                state.last_error = None;
                tracing::debug!(?trigger, "config unchanged");
                Outcome::Unchanged {
                    generation: current.generation,
                }
            }
            Ok(Ok(Prepared::New {
                config,
                resolved,
                hash,
            })) => {
                let mut changes = describe_changes(&self.registry.file_config(), &config);
                let cert = config.compiled.listener_cert.clone();
                let generation = self.registry.apply_resolved(*config, resolved);
                changes.extend(self.swap_cert(cert.as_ref()));
                self.record_applied(Some(hash));
                tracing::info!(?trigger, generation, changes = %changes.join("; "), "config reloaded");
                Outcome::Applied {
                    generation,
                    changes,
                }
            }
            Ok(Err(error)) => self.reject(trigger, current.generation, error),
            Err(_) => self.abandon(trigger, current.generation, limit),
        }
    }

    /// Counts an applied reload; `hash` is the new text's, when the text changed.
    fn record_applied(&self, hash: Option<String>) {
        let mut state = self.state();
        if let Some(hash) = hash {
            state.hash = hash;
        }
        state.applied_total += 1;
        state.last_error = None;
    }

    fn reject(&self, trigger: Trigger, generation: u64, error: String) -> Outcome {
        let mut state = self.state();
        state.rejected_total += 1;
        state.last_error = Some(error.clone());
        tracing::error!(?trigger, generation, %error, "config reload refused; the running config keeps serving");
        Outcome::Rejected { generation, error }
    }

    fn abandon(&self, trigger: Trigger, generation: u64, limit: Duration) -> Outcome {
        let error = format!(
            "reading, parsing and resolving the file took longer than reload.timeout ({limit:?}); nothing was applied"
        );
        let mut state = self.state();
        state.abandoned_total += 1;
        state.last_error = Some(error.clone());
        tracing::error!(?trigger, generation, %error, "config reload abandoned; the running config keeps serving");
        Outcome::Abandoned { generation, error }
    }
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
