//! Why a backend failed: an active check, or an attempt on live traffic.

use crate::config::ResolveError;
use std::time::Duration;

/// Why one active health check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckFailure {
    /// The backend's name gave no address.
    #[error("{0}")]
    Unresolved(ResolveError),
    /// The check answered with a status other than 2xx.
    #[error("GET {url} answered {status}")]
    Status {
        /// The URL checked.
        url: String,
        /// The status it answered.
        status: u16,
    },
    /// No answer within the check's timeout.
    #[error("GET {url} timed out after {timeout:?}")]
    Timeout {
        /// The URL checked.
        url: String,
        /// The check's timeout.
        timeout: Duration,
    },
    /// The connection was refused or could not be made.
    #[error("GET {url}: cannot connect")]
    Connect {
        /// The URL checked.
        url: String,
    },
    /// Anything else the HTTP client reported.
    #[error("GET {url}: {cause}")]
    Other {
        /// The URL checked.
        url: String,
        /// The client's error.
        cause: String,
    },
}

/// Why one attempt on live traffic counts against a backend for outlier ejection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttemptFailure {
    /// The connection could not be made.
    #[error("connect failed: {0}")]
    Connect(String),
    /// The backend answered with a 5xx status.
    #[error("answered {0}")]
    ServerError(u16),
    /// The backend timed out or broke the exchange after it began.
    #[error("{0}")]
    Broken(String),
}
