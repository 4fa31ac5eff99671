//! Unit tests of the TLS keys: https URLs, the `tls` of backends and pools, and the files
//! `listen_tls` and `ca_file` name.

use super::tests::errors_of;
use super::*;
use std::path::{Path, PathBuf};

/// A self-signed certificate for 127.0.0.1 and its key, written to `dir` as `name.pem` and
/// `name.key`.
fn write_cert(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

#[test]
fn https_urls_default_to_port_443_verified_with_the_host_as_server_name() {
    let upstream = Upstream::parse("https://gpu.example.com").unwrap();
    assert_eq!(upstream.port, 443);
    let tls = upstream.tls.unwrap();
    assert_eq!(tls.server_name, "gpu.example.com");
    assert!(tls.verify);
    assert_eq!(tls.ca, None);
    let v6 = Upstream::parse("https://[::1]:8443/").unwrap();
    assert_eq!(
        (v6.port, v6.tls.unwrap().server_name.as_str()),
        (8443, "::1")
    );
    assert_eq!(Upstream::parse("http://127.0.0.1").unwrap().tls, None);
    assert!(Upstream::parse("ftp://x")
        .unwrap_err()
        .contains("https://host:port"));
}

#[test]
fn backend_tls_wins_over_its_pools_and_reads_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = write_cert(dir.path(), "ca");
    let yaml = format!(
        "backends:\n  - {{name: a, url: 'https://127.0.0.1:9001', tls: {{verify: false}}}}\n  \
         - {{name: b, url: 'https://127.0.0.1:9002'}}\npools:\n  \
         - {{name: p, backends: [a, b], tls: {{ca_file: '{}'}}}}\n",
        ca.display()
    );
    let config = Config::from_yaml(&yaml).unwrap();
    let tls: Vec<&UpstreamTls> = config
        .compiled
        .upstreams
        .iter()
        .map(|u| u.tls.as_ref().unwrap())
        .collect();
    assert!(!tls[0].verify);
    assert!(tls[1].verify);
    for t in tls {
        let bundle = t.ca.as_ref().expect("the pool's CA file");
        assert_eq!(
            (bundle.path.as_path(), bundle.certificates().len()),
            (ca.as_path(), 1)
        );
    }
}

#[test]
fn tls_keys_that_cannot_apply_are_errors_naming_the_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("junk.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    assert_eq!(
        errors_of("backends:\n  - {name: a, url: 'http://127.0.0.1:1', tls: {verify: false}}\n"),
        ["backends[0].tls: applies to https:// backends only; this url is http://"]
    );
    let with_ca = |path: &Path| {
        format!(
            "backends:\n  - {{name: a, url: 'https://127.0.0.1:1', tls: {{ca_file: '{}'}}}}\n",
            path.display()
        )
    };
    let errors = errors_of(&with_ca(&missing));
    assert!(
        errors[0].starts_with(&format!(
            "backends[0].tls.ca_file: cannot read {}",
            missing.display()
        )),
        "{errors:?}"
    );
    assert_eq!(
        errors_of(&with_ca(&not_pem)),
        [format!(
            "backends[0].tls.ca_file: {} holds no PEM certificate",
            not_pem.display()
        )]
    );
    let conflict = "backends:\n  - {name: a, url: 'https://127.0.0.1:1'}\npools:\n  \
        - {name: p, backends: [a], tls: {verify: false}}\n  - {name: q, backends: [a], tls: {verify: true}}\n\
        classes:\n  - {name: c, pool: p}\n";
    assert_eq!(
        errors_of(conflict),
        ["pools[1].tls: backend \"a\" is also in pool \"p\", whose tls differs; set tls on the backend instead"]
    );
}

#[test]
fn listen_tls_files_are_read_and_a_bad_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "one");
    let (_, other_key) = write_cert(dir.path(), "two");
    let yaml = |cert: &Path, key: &Path| {
        format!(
            "listen_tls: {{cert: '{}', key: '{}'}}\nbackends: [{{name: a, url: 'http://127.0.0.1:1'}}]\n",
            cert.display(),
            key.display()
        )
    };
    let config = Config::from_yaml(&yaml(&cert, &key)).unwrap();
    assert!(config.compiled.listener_cert.is_some());
    let missing = dir.path().join("gone.pem");
    let errors = errors_of(&yaml(&missing, &key));
    assert!(
        errors[0].starts_with(&format!(
            "listen_tls.cert: cannot read {}",
            missing.display()
        )),
        "{errors:?}"
    );
    assert_eq!(
        errors_of(&yaml(&key, &key)),
        [format!(
            "listen_tls.cert: {} holds no PEM certificate",
            key.display()
        )]
    );
    assert_eq!(
        errors_of(&yaml(&cert, &cert)),
        [format!(
            "listen_tls.key: {} holds no usable PEM private key: no items found",
            cert.display()
        )]
    );
    assert_eq!(
        errors_of(&yaml(&cert, &other_key)),
        [format!(
            "listen_tls.key: {} is not the private key of the certificate in {}",
            other_key.display(),
            cert.display()
        )]
    );
}

#[test]
fn turning_listen_tls_on_or_off_takes_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_cert(dir.path(), "one");
    let plain = "backends: [{name: a, url: 'http://127.0.0.1:1'}]\n";
    let tls = format!(
        "listen_tls: {{cert: '{}', key: '{}'}}\n{plain}",
        cert.display(),
        key.display()
    );
    let (plain, tls) = (
        Config::from_yaml(plain).unwrap(),
        Config::from_yaml(&tls).unwrap(),
    );
    assert_eq!(
        describe_changes(&plain, &tls),
        ["listen_tls changed (takes effect on restart)"]
    );
    assert!(describe_changes(&tls, &tls.clone()).is_empty());
}
