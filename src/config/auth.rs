//! Bearer tokens gpulb reads from the environment or a file: the admin listener's, and the
//! key a backend's model server wants (`auth` on a backend or a pool), sent as its
//! `Authorization` and never shown in logs, `/status` or error messages.

use http::HeaderValue;
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// `auth` of a backend or a pool: the API key its model server requires (vLLM, SGLang and
/// llama.cpp `--api-key`), from an environment variable or a file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BackendAuth {
    /// Environment variable holding the key.
    #[serde(default)]
    pub token_env: Option<String>,
    /// File holding the key (its first line), instead of `token_env`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

impl BackendAuth {
    /// `Authorization: Bearer <key>`, the key read now.
    pub fn credential(&self) -> Result<Credential, TokenError> {
        let token = read_token(self.token_env.as_deref(), self.token_file.as_deref())?
            .ok_or(TokenError::Neither)?;
        let mut value =
            HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| TokenError::NotAHeader)?;
        value.set_sensitive(true);
        Ok(Credential(value))
    }
}

/// An `Authorization` value for a backend; its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credential(HeaderValue);

impl Credential {
    /// The header value to send.
    pub fn header(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// The token in environment variable `env` or in the first line of `file`, trimmed; `None`
/// when neither is named.
pub fn read_token(env: Option<&str>, file: Option<&Path>) -> Result<Option<String>, TokenError> {
    match (env, file) {
        (Some(_), Some(_)) => Err(TokenError::Both),
        (Some(var), None) => match std::env::var(var) {
            Ok(token) if !token.trim().is_empty() => Ok(Some(token.trim().to_string())),
            _ => Err(TokenError::EnvUnset(var.to_string())),
        },
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| TokenError::Unreadable {
                path: path.display().to_string(),
                cause: e.to_string(),
            })?;
            match text.lines().next().map(str::trim) {
                Some(token) if !token.is_empty() => Ok(Some(token.to_string())),
                _ => Err(TokenError::Empty(path.display().to_string())),
            }
        }
        (None, None) => Ok(None),
    }
}

/// Why a token could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Both sources are set.
    #[error("set token_env or token_file, not both")]
    Both,
    /// Neither source is set where one is needed.
    #[error("set token_env or token_file")]
    Neither,
    /// The environment variable is missing or blank.
    #[error("token_env: environment variable {0} is not set or empty")]
    EnvUnset(String),
    /// The file could not be read.
    #[error("token_file: cannot read {path}: {cause}")]
    Unreadable {
        /// The file.
        path: String,
        /// The cause.
        cause: String,
    },
    /// The file's first line is blank.
    #[error("token_file: {0} holds no token")]
    Empty(String),
    /// The token holds a byte a header value cannot carry (not shown: it is a secret).
    #[error("the token holds a control character, so it cannot be sent in a header")]
    NotAHeader,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_read_from_a_file_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "  sk-secret-1 \nignored\n").unwrap();
        let auth = BackendAuth {
            token_env: None,
            token_file: Some(path.clone()),
        };
        let credential = auth.credential().unwrap();
        assert_eq!(credential.header(), "Bearer sk-secret-1");
        assert!(credential.header().is_sensitive());
        assert!(!format!("{credential:?}").contains("secret"));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(auth.credential(), Err(TokenError::Empty(_))));
        assert_eq!(
            BackendAuth::default().credential(),
            Err(TokenError::Neither)
        );
        let env = BackendAuth {
            token_env: Some("GPULB_TEST_UNSET_KEY_VAR".into()),
            token_file: None,
        };
        assert_eq!(
            env.credential(),
            Err(TokenError::EnvUnset("GPULB_TEST_UNSET_KEY_VAR".into()))
        );
    }
}
