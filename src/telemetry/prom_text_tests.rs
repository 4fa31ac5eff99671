//! Tests of the Prometheus text parser: grammar, escapes, special values, errors, garbage.

use super::*;

fn one(line: &str) -> Sample {
    let scrape = parse(line).expect("parses");
    assert_eq!(scrape.samples.len(), 1, "{line}");
    scrape.samples.into_iter().next().expect("one sample")
}

#[test]
fn reads_help_type_comments_and_blank_lines() {
    let text = "# HELP http_requests_total The total number of HTTP requests.\n\
                # TYPE http_requests_total counter\n\
                \n\
                # just a comment\n\
                http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n\
                http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000\n\
                \t\n";
    let s = parse(text).expect("parses");
    assert_eq!(s.types["http_requests_total"], MetricType::Counter);
    assert_eq!(
        s.help["http_requests_total"],
        "The total number of HTTP requests."
    );
    assert_eq!(s.samples.len(), 2);
    assert_eq!(s.samples[0].value, 1027.0);
    assert_eq!(s.samples[0].timestamp_ms, Some(1395066363000));
    assert_eq!(s.samples[1].label("code"), Some("400"));
    assert_eq!(s.samples[1].value, 3.0);
}

#[test]
fn reads_names_with_colons_and_no_labels() {
    let s = one("llamacpp:kv_cache_usage_ratio 0.491063");
    assert_eq!(s.name, "llamacpp:kv_cache_usage_ratio");
    assert!(s.labels.is_empty());
    assert_eq!(s.value, 0.491063);
    let s = one(
        "vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen2.5-0.5B-Instruct\"} 0.0",
    );
    assert_eq!(s.label("model_name"), Some("Qwen/Qwen2.5-0.5B-Instruct"));
}

#[test]
fn unescapes_label_values() {
    let s = one(
        r#"msdos_file_access_time_seconds{path="C:\\DIR\\FILE.TXT",error="Cannot find file:\n\"FILE.TXT\""} 1.458255915e9"#,
    );
    assert_eq!(s.label("path"), Some(r"C:\DIR\FILE.TXT"));
    assert_eq!(s.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
    assert_eq!(s.value, 1.458255915e9);
    let s = one(r#"m{a="}{,=",b="x\ty"} 1"#);
    assert_eq!(s.label("a"), Some("}{,="));
    assert_eq!(s.label("b"), Some(r"x\ty"), "unknown escapes are kept");
}

#[test]
fn reads_special_and_exponent_values() {
    assert!(one("m NaN").value.is_nan());
    assert_eq!(one("m +Inf").value, f64::INFINITY);
    assert_eq!(one("m -Inf").value, f64::NEG_INFINITY);
    assert_eq!(one("m 1.7382173358407154e+09").value, 1.7382173358407154e9);
    assert_eq!(one("m -3.5E-2").value, -0.035);
    assert_eq!(one("m 16.365000").value, 16.365);
    assert_eq!(one("m 9223372036854775794").value, 9223372036854775794.0);
    // A Windows llama.cpp build prints this before its first decode.
    assert!(one("llamacpp:n_busy_slots_per_decode -nan(ind)")
        .value
        .is_nan());
    let b = one("h_bucket{le=\"+Inf\"} 0");
    assert_eq!(b.label("le"), Some("+Inf"));
}

#[test]
fn tolerates_spacing_trailing_commas_and_crlf() {
    let s = parse("m { a = \"1\" , b=\"2\", } 5 \r\nn{} 6\r\n").expect("parses");
    assert_eq!(s.samples[0].labels.len(), 2);
    assert_eq!(s.samples[0].value, 5.0);
    assert_eq!(s.samples[1].value, 6.0);
}

#[test]
fn errors_name_the_line() {
    let cases = [
        ("ok 1\nbad{a=\"1\" 2\n", 2, "expected ',' or '}'"),
        ("ok 1\n\nm{a=\"1} 2\n", 3, "unterminated"),
        ("m{a=1} 2", 1, "expected '\"'"),
        ("m", 1, "missing value"),
        ("m{} ", 1, "missing value"),
        ("m abc", 1, "bad value"),
        ("m 1 2 3", 1, "unexpected text"),
        ("m 1 1.5", 1, "bad timestamp"),
        ("9m 1", 1, "metric name"),
        ("{a=\"1\"} 1", 1, "metric name"),
        ("m{1a=\"1\"} 1", 1, "label name"),
        ("# TYPE m gaugey", 1, "unknown type"),
        ("# TYPE 1m gauge", 1, "invalid metric name"),
        ("m infinity", 1, "bad value"),
    ];
    for (text, line, needle) in cases {
        let e = parse(text).expect_err(text);
        assert_eq!(e.line, line, "{text}: {e}");
        assert!(e.to_string().contains(needle), "{text}: {e}");
        assert!(e.to_string().starts_with(&format!("metrics line {line}:")));
    }
}

#[test]
fn never_panics_on_garbage_or_truncation() {
    let good = "# HELP a_b x\n# TYPE a_b gauge\na_b{x=\"é\\\\\\\"ü\",y=\"\"} 1.5e3 123\nc:d 2\n";
    // Every prefix of a valid exposition: truncated scrapes must give Ok or Err, never panic.
    for (i, _) in good.char_indices() {
        let _ = parse(&good[..i]);
    }
    let garbage = [
        "",
        "\n\n\n",
        "#",
        "# ",
        "# HELP",
        "# TYPE",
        "# TYPE m",
        "{",
        "}",
        "m{",
        "m{a",
        "m{a=",
        "m{a=\"",
        "m{a=\"\\",
        "m{a=\"\\\"",
        "m{a=\"x\"",
        "m{a=\"x\",",
        "\"",
        "\\",
        "é 1",
        "m{é=\"1\"} 1",
        "m 1 é",
        "m\u{0}1",
        "\u{feff}m 1",
        "m{a=\"\u{1F600}\\",
        "\r",
        "m -",
        "m +",
        "m .",
        "m e5",
        "m{,} 1",
        "m{a=\"1\"\"} 1",
    ];
    for g in garbage {
        let _ = parse(g);
    }
    // Deterministic pseudo-random bytes from a small alphabet rich in syntax characters.
    let alphabet: Vec<char> = "ab:_{}=\",\\ \t\n#01.eE+-NaInfé".chars().collect();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..3000 {
        let len = (state % 40) as usize;
        let mut s = String::new();
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            s.push(alphabet[(state % alphabet.len() as u64) as usize]);
        }
        let _ = parse(&s);
    }
}

#[test]
fn every_fixture_parses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/metrics");
    for (file, samples) in [
        ("dcgm-exporter.prom", 23),
        ("llamacpp.prom", 10),
        ("sglang.prom", 91),
        ("tgi.prom", 96),
        ("triton.prom", 89),
        ("vllm-v0.prom", 12),
        ("vllm.prom", 78),
    ] {
        let path = format!("{dir}/{file}");
        let text = std::fs::read_to_string(&path).expect("fixture present");
        let scrape = parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(scrape.samples.len(), samples, "{file}");
        assert!(scrape.samples.iter().all(|s| !s.name.is_empty()));
    }
}
