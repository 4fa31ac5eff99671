//! Prometheus text exposition format 0.0.4: a small, strict, never-panicking parser.
//!
//! `prometheus-parse` 0.2 was considered and not used: its name pattern `\w+` rejects the
//! `:` in `vllm:num_requests_running`, a `}` inside a label value breaks its label pattern,
//! and it silently skips lines it cannot read.

use std::collections::HashMap;

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (for histograms and summaries including the `_bucket` / `_sum` suffix).
    pub name: String,
    /// Labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value; `NaN` and `±Inf` included.
    pub value: f64,
    /// Milliseconds since the epoch, when given.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `name`, matched exactly.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of label `name`, matched ignoring ASCII case (dcgm renamed `Hostname`).
    pub fn label_ignore_case(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A metric family's declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Monotonic counter.
    Counter,
    /// Value that goes up and down.
    Gauge,
    /// Bucketed histogram.
    Histogram,
    /// Quantile summary.
    Summary,
    /// No type given.
    Untyped,
}

/// A parsed exposition: samples in order, and the declared types and help texts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// Every sample line, in order.
    pub samples: Vec<Sample>,
    /// `# TYPE` declarations by family name.
    pub types: HashMap<String, MetricType>,
    /// `# HELP` texts by family name (unescaped).
    pub help: HashMap<String, String>,
}

impl Scrape {
    /// The samples named exactly `name`.
    pub fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

/// Malformed input, naming the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong there.
    pub message: String,
}

/// Parses a whole exposition; the first malformed line is an error.
pub fn parse(text: &str) -> Result<Scrape, ParseError> {
    let mut scrape = Scrape::default();
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let err = |message: String| ParseError {
            line: i + 1,
            message,
        };
        let trimmed = line.trim_start_matches([' ', '\t']);
        if trimmed.trim_end().is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            parse_comment(comment, &mut scrape).map_err(err)?;
        } else {
            scrape.samples.push(parse_sample(trimmed).map_err(err)?);
        }
    }
    Ok(scrape)
}

fn parse_comment(comment: &str, scrape: &mut Scrape) -> Result<(), String> {
    let mut words = Cursor::new(comment);
    words.skip_blanks();
    let keyword = words.take_while(|b| !is_blank(b));
    if keyword != "HELP" && keyword != "TYPE" {
        return Ok(()); // an ordinary comment
    }
    words.skip_blanks();
    let name = words.take_while(|b| !is_blank(b));
    if !valid_metric_name(name) {
        return Err(format!("# {keyword}: invalid metric name {name:?}"));
    }
    words.skip_blanks();
    let rest = words.rest();
    if keyword == "HELP" {
        scrape.help.insert(name.to_string(), unescape(rest, false));
        return Ok(());
    }
    let typ = match rest.trim_end() {
        "counter" => MetricType::Counter,
        "gauge" => MetricType::Gauge,
        "histogram" => MetricType::Histogram,
        "summary" => MetricType::Summary,
        "untyped" => MetricType::Untyped,
        other => return Err(format!("# TYPE {name}: unknown type {other:?}")),
    };
    scrape.types.insert(name.to_string(), typ);
    Ok(())
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let mut c = Cursor::new(line);
    let name = c.take_while(is_name_byte);
    if !valid_metric_name(name) {
        return Err(format!("expected a metric name at {:?}", truncate(line)));
    }
    c.skip_blanks();
    let labels = if c.eat(b'{') {
        parse_labels(&mut c, name)?
    } else {
        Vec::new()
    };
    c.skip_blanks();
    let value_text = c.take_while(|b| !is_blank(b));
    if value_text.is_empty() {
        return Err(format!("{name}: missing value"));
    }
    let value =
        parse_value(value_text).ok_or_else(|| format!("{name}: bad value {value_text:?}"))?;
    c.skip_blanks();
    let ts_text = c.take_while(|b| !is_blank(b));
    let timestamp_ms = if ts_text.is_empty() {
        None
    } else {
        Some(
            ts_text
                .parse::<i64>()
                .map_err(|_| format!("{name}: bad timestamp {ts_text:?}"))?,
        )
    };
    c.skip_blanks();
    if !c.rest().is_empty() {
        return Err(format!("{name}: unexpected text {:?}", truncate(c.rest())));
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses `label="value", ...}` after the opening brace.
fn parse_labels(c: &mut Cursor<'_>, metric: &str) -> Result<Vec<(String, String)>, String> {
    let mut labels = Vec::new();
    loop {
        c.skip_blanks();
        if c.eat(b'}') {
            return Ok(labels);
        }
        let key = c.take_while(is_name_byte);
        if key.is_empty() || key.as_bytes()[0].is_ascii_digit() || key.contains(':') {
            return Err(format!("{metric}: expected a label name or '}}'"));
        }
        c.skip_blanks();
        if !c.eat(b'=') {
            return Err(format!("{metric}: expected '=' after label {key}"));
        }
        c.skip_blanks();
        if !c.eat(b'"') {
            return Err(format!("{metric}: label {key}: expected '\"'"));
        }
        let raw = c
            .quoted()
            .ok_or_else(|| format!("{metric}: label {key}: unterminated value"))?;
        labels.push((key.to_string(), unescape(raw, true)));
        c.skip_blanks();
        if c.eat(b',') {
            continue;
        }
        if c.eat(b'}') {
            return Ok(labels);
        }
        return Err(format!("{metric}: expected ',' or '}}' after label {key}"));
    }
}

/// Parses a sample value: Go float syntax, `NaN`, `+Inf`, `-Inf`; C's `-nan(ind)` reads as NaN.
fn parse_value(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "+inf" | "inf" => return Some(f64::INFINITY),
        "-inf" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    let unsigned = lower.trim_start_matches(['+', '-']);
    if unsigned.starts_with("nan") {
        return Some(f64::NAN);
    }
    if unsigned.starts_with("inf") {
        return None; // "infinity", "inf0": not exposition syntax
    }
    lower.parse::<f64>().ok()
}

/// Undoes `\\`, `\n` and (in label values) `\"`; any other escape is kept as written.
fn unescape(raw: &str, quotes: bool) -> String {
    if !raw.contains('\\') {
        return raw.to_string();
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(ch) = chars.next() {
        if ch != '\\' {
            out.push(ch);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if quotes => out.push('"'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

fn valid_metric_name(name: &str) -> bool {
    name.bytes().next().is_some_and(|b| !b.is_ascii_digit()) && name.bytes().all(is_name_byte)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A position in one line; every split happens at an ASCII byte, so slices stay valid UTF-8.
struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }
    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.pos += usize::from(hit);
        hit
    }
    fn skip_blanks(&mut self) {
        self.take_while(is_blank);
    }
    /// Takes bytes while `f` holds; `f` must reject every non-ASCII byte or accept all of them.
    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.pos += 1;
        }
        self.text.get(start..self.pos).unwrap_or("")
    }
    /// The raw text up to the closing unescaped `"`, which is consumed.
    fn quoted(&mut self) -> Option<&'a str> {
        let start = self.pos;
        let bytes = self.text.as_bytes();
        while let Some(&b) = bytes.get(self.pos) {
            match b {
                b'\\' => self.pos += 2,
                b'"' => {
                    let raw = self.text.get(start..self.pos);
                    self.pos += 1;
                    return raw;
                }
                _ => self.pos += 1,
            }
        }
        None
    }
    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }
}

#[cfg(test)]
#[path = "prom_text_tests.rs"]
mod tests;
