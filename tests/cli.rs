//! `gpulb check` validates like `nginx -t`: a summary, or every error with its field path.

mod common;

use common::gpulb_check as check;
use std::process::Command;

#[test]
fn shipped_config_checks_clean() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpulb"))
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/conf/gpulb.yaml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok: listen 127.0.0.1:8080, 3 backends, 2 pools, 3 classes"),
        "{stdout}"
    );
}

#[test]
fn invalid_config_lists_every_error_by_field() {
    let (ok, _, stderr) = check(
        "backends:\n  - {name: a, url: \"http://127.0.0.1:1\"}\npools:\n  - {name: p, backends: [a, zz]}\n\
         classes:\n  - {name: c, pool: bluk}\n",
    );
    assert!(!ok);
    assert!(
        stderr.contains("pools[0].backends[1]: unknown backend \"zz\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("classes[0].pool: unknown pool \"bluk\""),
        "{stderr}"
    );
}

#[test]
fn syntax_errors_and_missing_files_are_named() {
    let (ok, _, stderr) = check("backends: [}\n");
    assert!(!ok);
    assert!(stderr.contains("invalid"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpulb"))
        .args(["check", "--config", "/nonexistent/gpulb.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/gpulb.yaml"));
}
