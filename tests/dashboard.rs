//! The dashboard in a real headless browser (Debian's chromium): the page loads, shows every
//! backend with its state, and its charts grow as samples arrive.

mod common;

use common::{eventually, start_workers, Config, Proxy, Req, PAGE_DUMP, WAIT};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Kills a whole process group (the browser and its helpers) when dropped.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: signals only the process group this test created; ESRCH when already gone.
        unsafe {
            libc::kill(-self.0, libc::SIGKILL);
        }
    }
}

/// Loads `url` in headless chromium and returns the DOM after `budget_ms` of virtual time.
async fn dump_dom(url: &str, budget_ms: u32) -> String {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} not found: the dashboard test needs Debian's chromium; run `bash .ci/setup`"
    );
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let out_path = dir.path().join("dom.html");
    let out = std::fs::File::create(&out_path).expect("dom file");
    let mut child = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1600",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg("--dump-dom")
        .arg(url)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start chromium");
    let group = Group(child.id() as i32);
    let status = eventually(PAGE_DUMP, "chromium to finish its dump", || {
        let exited = child.try_wait().expect("wait for chromium");
        async move { exited }
    })
    .await;
    drop(group);
    assert!(status.success(), "chromium failed: {status}");
    std::fs::read_to_string(&out_path).expect("read dom")
}

/// Attributes of every element that has attribute `key`, by that attribute's value.
fn elements_with(dom: &str, key: &str) -> HashMap<String, HashMap<String, String>> {
    let mut found = HashMap::new();
    for (at, _) in dom.match_indices(&format!(" {key}=\"")) {
        let Some(open) = dom[..at].rfind('<') else {
            continue;
        };
        let Some(close) = dom[at..].find('>') else {
            continue;
        };
        let tag = &dom[open..at + close];
        let attrs: HashMap<String, String> = tag
            .split('"')
            .collect::<Vec<_>>()
            .chunks(2)
            .filter_map(|kv| {
                let name = kv[0].trim().strip_suffix('=')?.rsplit(' ').next()?;
                Some((name.to_string(), kv.get(1)?.to_string()))
            })
            .collect();
        if let Some(v) = attrs.get(key) {
            found.insert(v.clone(), attrs);
        }
    }
    found
}

fn points(dom: &str) -> HashMap<String, u64> {
    elements_with(dom, "data-chart")
        .into_iter()
        .map(|(chart, attrs)| {
            let n = attrs
                .get("data-points")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("chart {chart} without data-points"));
            (chart, n)
        })
        .collect()
}

/// `seq` of the newest history sample.
async fn latest(proxy: &Proxy) -> u64 {
    let page: serde_json::Value = reqwest::get(format!("{}/history?since=0", proxy.admin))
        .await
        .expect("history")
        .json()
        .await
        .expect("history json");
    page["latest"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn dashboard_shows_the_fleet_and_its_charts_update_in_a_browser() {
    let workers = start_workers(2, |_| {}).await;
    let proxy = Proxy::start(Config::telemetry_fleet(&workers)).await;
    proxy.send_n(4, &Req::completion(4)).await;
    let page = reqwest::get(format!("{}/dashboard", proxy.admin))
        .await
        .expect("dashboard");
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("dashboard html");
    assert!(
        !html.contains("://"),
        "the dashboard must not load anything from elsewhere"
    );
    eventually(WAIT, "two history samples", || async {
        (latest(&proxy).await >= 2).then_some(())
    })
    .await;

    let url = format!("{}/dashboard", proxy.admin);
    let first = dump_dom(&url, 3000).await;
    assert!(first.contains("gpulb dashboard"), "{first}");
    let before = points(&first);
    assert_eq!(before.len(), 10, "charts: {before:?}");
    assert!(before.values().all(|&n| n >= 2), "{before:?}");
    let backends = elements_with(&first, "data-backend");
    for name in ["w0", "w1"] {
        assert_eq!(
            backends[name]["data-state"], "healthy",
            "{name}: {backends:?}"
        );
    }
    let charts = elements_with(&first, "data-chart");
    assert!(
        charts["gpu_util"]["data-series"] != "0",
        "no GPU series: {charts:?}"
    );

    // A backend dies and more samples arrive: the next load shows both.
    workers[1].kill_and_wait().await;
    let seen = latest(&proxy).await;
    eventually(WAIT, "w1 unhealthy and newer samples", || async {
        let status = proxy.status().await;
        let down = status["backends"][1]["eligible"] == false;
        (down && latest(&proxy).await >= seen + 2).then_some(())
    })
    .await;
    let second = dump_dom(&url, 3000).await;
    let after = points(&second);
    for (chart, n) in &before {
        assert!(
            after[chart] > *n,
            "chart {chart} did not grow: {n} -> {}",
            after[chart]
        );
    }
    let backends = elements_with(&second, "data-backend");
    assert_eq!(backends["w0"]["data-state"], "healthy");
    let w1 = backends["w1"]["data-state"].as_str();
    assert!(["unhealthy", "ejected"].contains(&w1), "{backends:?}");
}
