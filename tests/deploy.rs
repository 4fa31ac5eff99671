//! What `docker/` ships holds together: the Kubernetes manifests and the compose file parse,
//! refer to each other consistently (probe paths, ports, labels, the drain inside the grace
//! period), every gpulb config in them (and the README's example configs) passes `gpulb check`,
//! and the image's commands work (`gpulb sim` serves, `gpulb probe` tells up from down, the
//! default command parses).

mod common;

use clap::Parser;
use common::{eventually, free_port, Killed, WAIT};
use serde::Deserialize;
use serde_yaml::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Every YAML document of `path`.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{path:?}: {e}")))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Every manifest under `docker/k8s/` but the kustomization, which must list them all.
fn manifests() -> Vec<Value> {
    let dir = repo("docker/k8s");
    let kustomization = &documents(&dir.join("kustomization.yaml"))[0];
    let mut listed: Vec<String> = strings(&kustomization["resources"]);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    listed.sort();
    files.sort();
    assert_eq!(listed, files, "kustomization.yaml lists every manifest");
    files
        .iter()
        .flat_map(|file| documents(&dir.join(file)))
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    let items = value.as_sequence().expect("a list");
    items
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn seconds(value: &Value) -> Duration {
    humantime::parse_duration(value.as_str().expect("a duration")).expect("a duration")
}

fn port_of(listen: &Value) -> u16 {
    let addr: std::net::SocketAddr = listen.as_str().unwrap().parse().unwrap();
    addr.port()
}

/// Runs `gpulb check` on the config text with the admin token its `token_env` names set.
fn assert_checks(config: &str, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpulb.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpulb"))
        .args(["check", "--config"])
        .arg(&path)
        .env("GPULB_ADMIN_TOKEN", "test-token")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `selector` (a `matchLabels` map or a Service selector) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels[k] == *v)
}

#[test]
fn kubernetes_manifests_agree_with_each_other_and_the_config() {
    let docs = manifests();
    let config_text = find(&docs, "ConfigMap", "gpulb")["data"]["gpulb.yaml"]
        .as_str()
        .expect("gpulb.yaml in the ConfigMap")
        .to_string();
    assert_checks(&config_text, "the ConfigMap's gpulb.yaml");
    let config: Value = serde_yaml::from_str(&config_text).unwrap();

    let deployment = find(&docs, "Deployment", "gpulb");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"];
    let pod_labels = &pod["metadata"]["labels"];
    assert!(selects(
        &deployment["spec"]["selector"]["matchLabels"],
        pod_labels
    ));
    let container = &pod["spec"]["containers"][0];
    let container_port = |name: &str| {
        let ports = container["ports"].as_sequence().unwrap();
        let port = ports.iter().find(|p| p["name"] == name);
        port.unwrap_or_else(|| panic!("container port {name}"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        container_port("http"),
        u64::from(port_of(&config["listen"]))
    );
    assert_eq!(
        container_port("admin"),
        u64::from(port_of(&config["admin"]["listen"]))
    );

    // Probes: the admin listener's public paths.
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "admin", "{probe}");
    }
    // The token the config names comes from a Secret that exists.
    let token_env = config["admin"]["token_env"].as_str().unwrap();
    let env = container["env"].as_sequence().unwrap();
    let token = env
        .iter()
        .find(|e| e["name"] == token_env)
        .expect("token env");
    let secret_ref = &token["valueFrom"]["secretKeyRef"];
    let secret = find(&docs, "Secret", secret_ref["name"].as_str().unwrap());
    assert!(!secret["stringData"][secret_ref["key"].as_str().unwrap()].is_null());

    // preStop + drain_delay + shutdown_timeout fit in the grace period.
    let pre_stop = strings(&container["lifecycle"]["preStop"]["exec"]["command"]);
    assert_eq!(pre_stop[0], "sleep");
    let pre_stop = Duration::from_secs(pre_stop[1].parse().unwrap());
    let drain = seconds(&config["drain_delay"]) + seconds(&config["shutdown_timeout"]);
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(
        Duration::from_secs(grace) >= pre_stop + drain,
        "grace {grace}s < preStop {pre_stop:?} + drain {drain:?}"
    );
    // The config is mounted where the command reads it.
    let args = strings(&container["args"]);
    assert_eq!(args[..2], ["serve", "--config"]);
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let config_mount = mounts.iter().find(|m| m["name"] == "config").unwrap();
    let mounted = Path::new(config_mount["mountPath"].as_str().unwrap());
    assert_eq!(
        Path::new(&args[2]),
        mounted.join("gpulb.yaml"),
        "the ConfigMap's key is the file served"
    );

    // The Service selects the pods and names their ports; the ServiceMonitor scrapes its admin port.
    let service = find(&docs, "Service", "gpulb");
    assert!(selects(&service["spec"]["selector"], pod_labels));
    let service_ports = service["spec"]["ports"].as_sequence().unwrap();
    for port in service_ports {
        let target = port["targetPort"].as_str().unwrap();
        container_port(target);
    }
    let monitor = find(&docs, "ServiceMonitor", "gpulb");
    assert!(selects(
        &monitor["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    ));
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let scraped = service_ports.iter().find(|p| p["name"] == endpoint["port"]);
    assert_eq!(scraped.expect("scraped port")["targetPort"], "admin");
    assert_eq!(
        config["admin"]["public_metrics"], true,
        "scraped without a token"
    );

    let pdb = find(&docs, "PodDisruptionBudget", "gpulb");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], pod_labels));
    assert!(pdb["spec"]["minAvailable"].as_u64().unwrap() < 2);

    // The model servers' headless Service, and the pool discovering them through its name.
    let headless = find(&docs, "Service", "vllm");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    let model_port = headless["spec"]["ports"][0]["port"].as_u64().unwrap();
    let discover = &config["pools"][0]["discover"];
    let dns = discover["dns"]
        .as_str()
        .expect("the pool discovers its backends");
    assert!(
        dns.starts_with("vllm.") && dns.ends_with(&format!(".svc.cluster.local:{model_port}")),
        "{dns}"
    );
}

#[test]
fn the_compose_fleet_is_wired_together() {
    let compose = &documents(&repo("docker/compose.yaml"))[0];
    let services = &compose["services"];
    let gpulb = &services["gpulb"];
    let command = strings(&gpulb["command"]);
    assert_eq!(command[..2], ["serve", "--config"]);
    let volumes = strings(&gpulb["volumes"]);
    let (host, _) = volumes
        .iter()
        .find_map(|v| {
            let (host, rest) = v.split_once(':')?;
            rest.starts_with(&command[2]).then_some((host, rest))
        })
        .expect("the served config is mounted");
    let config_text = std::fs::read_to_string(repo("docker").join(host)).unwrap();
    assert_checks(&config_text, "docker/compose/gpulb.yaml");
    let config: Value = serde_yaml::from_str(&config_text).unwrap();

    // Three simulated workers, each a backend of the config at the port it listens on.
    let workers: Vec<(String, Vec<String>)> = services
        .as_mapping()
        .unwrap()
        .iter()
        .filter_map(|(name, service)| {
            let command = strings(service.get("command")?);
            (command[0] == "sim").then(|| (name.as_str().unwrap().to_string(), command))
        })
        .collect();
    assert_eq!(workers.len(), 3);
    let urls: Vec<&str> = config["backends"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|b| b["url"].as_str().unwrap())
        .collect();
    for (name, command) in &workers {
        let listen = command.iter().position(|a| a == "--listen").unwrap();
        let port = port_of(&Value::from(command[listen + 1].as_str()));
        let url = format!("http://{name}:{port}");
        assert!(urls.contains(&url.as_str()), "{url} not in {urls:?}");
        // The worker's own command line parses.
        let argv = std::iter::once("gpulb").chain(command.iter().map(String::as_str));
        gpulb::cli::Cli::try_parse_from(argv).expect("a valid sim command");
    }

    // Prometheus scrapes gpulb's admin port (no token needed there) and every worker.
    let prometheus = &documents(&repo("docker/compose/prometheus.yml"))[0];
    let targets: Vec<String> = prometheus["scrape_configs"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|job| strings(&job["static_configs"][0]["targets"]))
        .collect();
    let admin_port = port_of(&config["admin"]["listen"]);
    assert!(targets.contains(&format!("gpulb:{admin_port}")));
    assert_eq!(config["admin"]["public_metrics"], true);
    for (name, _) in &workers {
        assert!(targets.iter().any(|t| t.starts_with(&format!("{name}:"))));
    }

    // Grafana is provisioned with the datasource and the dashboard that exists in examples/.
    let grafana_volumes = strings(&services["grafana"]["volumes"]);
    for host in grafana_volumes.iter().map(|v| v.split(':').next().unwrap()) {
        let path = repo("docker").join(host);
        assert!(path.exists(), "{path:?}");
        if host.ends_with(".json") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_json::from_str::<serde_json::Value>(&text).expect("dashboard JSON");
        }
    }
    let datasource = &documents(&repo("docker/compose/grafana/datasource.yaml"))[0];
    assert_eq!(
        datasource["datasources"][0]["url"],
        "http://prometheus:9090"
    );

    let grace = seconds(&gpulb["stop_grace_period"]);
    assert!(grace >= seconds(&config["drain_delay"]) + seconds(&config["shutdown_timeout"]));
}

/// The instruction `name` of the Dockerfile's final stage, as JSON-form arguments.
fn dockerfile_exec_form(dockerfile: &str, name: &str) -> Vec<String> {
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let joined = last_stage.replace("\\\n", " ");
    let line = joined
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name}"));
    let json = &line[line.find('[').expect("exec form")..];
    serde_json::from_str(json).expect("a JSON list")
}

#[test]
fn the_image_build_copies_every_local_path_cargo_needs() {
    // `cargo build --locked` inside the image needs the manifest, the lock file, the sources and
    // every local path Cargo.toml names (the vendored pingora-core of `[patch.crates-io]`).
    let manifest = std::fs::read_to_string(repo("Cargo.toml")).unwrap();
    let local: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.split("path = \"").nth(1)?.split('"').next())
        .collect();
    assert!(local.contains(&"vendor/pingora-core"), "{local:?}");
    let dockerfile = std::fs::read_to_string(repo("docker/Dockerfile")).unwrap();
    let build_stage = dockerfile.rsplit_once("\nFROM ").unwrap().0;
    let copied: Vec<&str> = build_stage
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words[..words.len() - 1].to_vec()
        })
        .collect();
    let ignore = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    let ignored: Vec<&str> = ignore
        .lines()
        .map(|l| l.trim().trim_end_matches('/'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let needed = ["Cargo.toml", "Cargo.lock", "src", "examples"];
    for path in needed.iter().copied().chain(local) {
        let top = path.split('/').next().unwrap();
        assert!(
            copied.contains(&path) || copied.contains(&top),
            "the Dockerfile's build stage does not copy {path}: {copied:?}"
        );
        assert!(!ignored.contains(&top), ".dockerignore leaves out {path}");
    }
}

#[test]
fn the_image_runs_as_a_user_checks_livez_and_its_default_command_parses() {
    let dockerfile = std::fs::read_to_string(repo("docker/Dockerfile")).unwrap();
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = last_stage
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER");
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "{user}"
    );
    let health = dockerfile_exec_form(&dockerfile, "HEALTHCHECK");
    assert_eq!(health[..2], ["gpulb", "probe"]);
    assert!(health[2].ends_with("/livez"));
    let entrypoint = dockerfile_exec_form(&dockerfile, "ENTRYPOINT");
    let command = dockerfile_exec_form(&dockerfile, "CMD");
    assert_eq!(entrypoint, ["gpulb"]);
    let argv = entrypoint.iter().chain(&command).map(String::as_str);
    let cli = gpulb::cli::Cli::try_parse_from(argv).expect("the default command parses");
    // The demo on a non-loopback admin listener makes up a token (unit-tested in tools::demo);
    // the HEALTHCHECK reaches that listener on loopback.
    let gpulb::cli::Command::Demo { admin, .. } = cli.command else {
        panic!("the default command is the demo");
    };
    assert!(health[2].contains(&format!(":{}/", admin.port())));
    let ignore = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim_end_matches('/') == "target"));
    // https backends without `tls.ca_file` are verified against the system's roots.
    assert!(
        last_stage.contains("install -y --no-install-recommends ca-certificates"),
        "the runtime image installs the system root store:\n{last_stage}"
    );
}

fn gpulb(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpulb"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpulb_sim_serves_a_worker_and_gpulb_probe_tells_up_from_down() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "sim", "--listen", &listen, "--name", "gpu9", "--models", "m1",
    ];
    // Its log piped, as a container runtime or journald takes it.
    let mut sim = Killed(
        gpulb(&args)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let health = format!("http://{listen}/health");
    eventually(WAIT, "gpulb sim to answer /health", || async {
        let probe = gpulb(&["probe", &health]).status().unwrap();
        probe.success().then_some(())
    })
    .await;
    let answer = reqwest::Client::new()
        .post(format!("http://{listen}/v1/completions"))
        .json(&serde_json::json!({"model": "m1", "prompt": "hi", "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-sim-worker"], "gpu9");
    let metrics = reqwest::get(format!("http://{listen}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("vllm:num_requests_running"));

    let missing = format!("http://{listen}/nope");
    assert!(!gpulb(&["probe", &missing]).status().unwrap().success());
    let closed = format!("http://127.0.0.1:{}/livez", free_port());
    assert!(!gpulb(&["probe", &closed]).status().unwrap().success());

    sim.stop();
    let mut log = String::new();
    if let Some(mut err) = sim.0.stderr.take() {
        let _ = err.read_to_string(&mut log);
    }
    assert!(log.contains("gpulb sim serving"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "a piped log has no terminal colour codes:\n{log}"
    );
}

/// The first fenced YAML block after `heading` in the README.
fn readme_yaml_after(heading: &str) -> String {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let section = &readme[readme.find(heading).expect(heading)..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = section[start..].find("```").expect("the block's end");
    section[start..start + end].to_string()
}

#[test]
fn the_readme_configs_pass_gpulb_check() {
    for heading in ["### In front of my vLLM servers", "### Backends from DNS"] {
        assert_checks(&readme_yaml_after(heading), heading);
    }
}
