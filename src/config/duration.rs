//! Human-friendly durations in config files: `250ms`, `2s`, `1m`, `1h30m`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// Deserializes a duration written as text (`"2s"`) using humantime's grammar.
pub fn deserialize<'de, D>(deserializer: D) -> Result<Duration, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(deserializer)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// Parses `"250ms"`, `"2s"`, `"1m"`; a bare number is refused so the unit is never guessed.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("invalid duration {text:?} ({e}); write it with a unit, like \"250ms\", \"2s\" or \"1m\"")
    })
}

/// Optional durations: `Option<Duration>` fields with `#[serde(default, with = "duration::option")]`.
pub mod option {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Deserializes an optional duration written as text.
    pub fn deserialize<'de, D>(deserializer: D) -> Result<Option<Duration>, D::Error>
    where
        D: Deserializer<'de>,
    {
        Option::<String>::deserialize(deserializer)?
            .map(|text| super::parse(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Durations that may be turned off: `Option<Duration>` fields with
/// `#[serde(default = ..., with = "duration::or_off")]`; the text `off` is `None`.
pub mod or_off {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// Deserializes `off` as `None`, anything else as a duration.
    pub fn deserialize<'de, D>(deserializer: D) -> Result<Option<Duration>, D::Error>
    where
        D: Deserializer<'de>,
    {
        let text = String::deserialize(deserializer)?;
        if text.trim() == "off" {
            return Ok(None);
        }
        super::parse(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// Formats a duration the way the config file writes it.
pub fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_units() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse(" 1h30m "), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn refuses_missing_unit_and_garbage() {
        assert!(parse("5").unwrap_err().contains("with a unit"));
        assert!(parse("soon").is_err());
        assert!(parse("").is_err());
    }
}
