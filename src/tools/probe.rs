//! `gpulb probe URL`: one HTTP GET that exits 0 on a 2xx answer, for container health checks in
//! images without curl.

use std::time::Duration;

/// Why the probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No answer (refused, timed out, bad URL).
    #[error("GET {url}: {source}")]
    Request {
        /// The URL probed.
        url: String,
        /// The cause.
        source: reqwest::Error,
    },
    /// An answer that is not 2xx.
    #[error("GET {url}: {status}")]
    Status {
        /// The URL probed.
        url: String,
        /// The status answered.
        status: reqwest::StatusCode,
    },
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// GETs `url` within `timeout`; Ok on a 2xx answer.
pub fn run(url: &str, timeout: Duration) -> Result<(), ProbeError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProbeError::Runtime)?;
    runtime.block_on(async {
        let request = |source| ProbeError::Request {
            url: url.to_string(),
            source,
        };
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(request)?;
        let status = client.get(url).send().await.map_err(request)?.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(ProbeError::Status {
                url: url.to_string(),
                status,
            })
        }
    })
}
