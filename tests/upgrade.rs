//! Zero-downtime binary upgrade: a new `gpulb serve --upgrade` takes the listening sockets over
//! from the running one on SIGQUIT. Requests looping against the port all through the hand-over
//! see no error, a stream in flight on the old process completes, and the old one exits.

mod common;

use common::{eventually, free_port_pair, start_workers, Config, Killed, Req, WAIT};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn serve(config: &Path, socket: &Path, upgrade: bool) -> Killed {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpulb"));
    command
        .args(["serve", "--config"])
        .arg(config)
        .arg("--upgrade-socket")
        .arg(socket)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    if upgrade {
        command.arg("--upgrade");
    }
    Killed(command.spawn().expect("spawn gpulb"))
}

/// Counts of a request loop: answers and failures (no answer, or not a 200).
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
}

/// Sends requests one after another with `client` until `stop`, counting outcomes.
fn request_loop(
    client: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut failures = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let sent = Req::completion(1).request(&client, &url).send().await;
            let answered = match sent.and_then(|r| r.error_for_status()) {
                Ok(resp) => resp.bytes().await.map(drop),
                Err(e) => Err(e),
            };
            match answered {
                Ok(()) => {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => failures.push(e.to_string()),
            }
            if failures.len() > tally.failed.load(Ordering::Relaxed) {
                tally.failed.store(failures.len(), Ordering::Relaxed);
            }
        }
        failures
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_looping_through_a_binary_upgrade_see_no_error() {
    let workers = start_workers(1, |p| p.decode_step = Duration::from_millis(30)).await;
    let (port, admin) = free_port_pair();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpulb.yaml");
    let socket = dir.path().join("upgrade.sock");
    let body = Config::fleet(&workers).set("shutdown_timeout", "20s");
    let text = format!("listen: 127.0.0.1:{port}\nadmin: {{listen: 127.0.0.1:{admin}}}\n{body}");
    std::fs::write(&config, text).unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let status_url = format!("http://127.0.0.1:{admin}/status");

    let mut old = serve(&config, &socket, false);
    eventually(WAIT, "the old process to serve", || async {
        let status: serde_json::Value = reqwest::get(&status_url).await.ok()?.json().await.ok()?;
        (status["backends"][0]["eligible"] == true).then_some(())
    })
    .await;

    // A stream that outlives the hand-over, and two loops: a new connection per request, and
    // one kept-alive client (its idle connection to the old process is closed at the hand-over,
    // and the client reconnects).
    let stream = tokio::spawn({
        let url = url.clone();
        async move {
            let resp = Req::completion_stream(60)
                .send(&reqwest::Client::new(), &url)
                .await;
            resp.text().await.map_err(|e| e.to_string())
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let (fresh, kept) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let no_pool = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let loops = [
        request_loop(no_pool, url.clone(), Arc::clone(&stop), Arc::clone(&fresh)),
        request_loop(
            reqwest::Client::new(),
            url.clone(),
            Arc::clone(&stop),
            Arc::clone(&kept),
        ),
    ];
    eventually(WAIT, "both loops to be served", || async {
        let going = fresh.ok.load(Ordering::Relaxed) > 5 && kept.ok.load(Ordering::Relaxed) > 5;
        going.then_some(())
    })
    .await;

    let _new = serve(&config, &socket, true);
    eventually(
        WAIT,
        "the new process to wait on the upgrade socket",
        || async { socket.exists().then_some(()) },
    )
    .await;
    let old_pid = i32::try_from(old.0.id()).unwrap();
    // SAFETY: kill(2) on the child this test started and still owns.
    assert_eq!(unsafe { libc::kill(old_pid, libc::SIGQUIT) }, 0);

    let exited = eventually(WAIT, "the old process to exit", || {
        let status = old.0.try_wait().expect("try_wait");
        async move { status }
    })
    .await;
    assert!(exited.success(), "{exited:?}");
    let (fresh_before, kept_before) = (
        fresh.ok.load(Ordering::Relaxed),
        kept.ok.load(Ordering::Relaxed),
    );
    // Only the new process is left: the loops keep being served.
    eventually(WAIT, "both loops served by the new process", || async {
        let going = fresh.ok.load(Ordering::Relaxed) > fresh_before + 5
            && kept.ok.load(Ordering::Relaxed) > kept_before + 5;
        going.then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for (name, task) in ["new connection per request", "kept-alive client"]
        .into_iter()
        .zip(loops)
    {
        let failures = task.await.unwrap();
        assert!(failures.is_empty(), "{name}: {failures:?}");
    }
    let streamed = stream.await.unwrap().expect("the stream completes");
    assert_eq!(streamed.matches("data: {").count(), 60);
    assert!(streamed.ends_with("data: [DONE]\n\n"), "{streamed}");
}
