//! DNS discovery against a DNS server the test controls (in-process, UDP on loopback): every A
//! record of the name is a backend, added and removed live with its state kept by name, and a
//! resolver that goes away leaves the last good set serving, reported in `/status` and
//! `/metrics`.

mod common;

use common::{eventually, Proxy, Req, WAIT};
use gpulb::tools::sim::{SimWorker, WorkerProfile};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, UdpSocket};

/// A DNS server answering every A question with the records it is given (AAAA: none).
struct DnsServer {
    addr: SocketAddr,
    records: Arc<Mutex<Vec<Ipv4Addr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DnsServer {
    async fn start(records: &[Ipv4Addr]) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let records = Arc::new(Mutex::new(records.to_vec()));
        let shared = Arc::clone(&records);
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let answer = answer(&buf[..n], &shared.lock().unwrap());
                let _ = socket.send_to(&answer, from).await;
            }
        });
        DnsServer {
            addr,
            records,
            task,
        }
    }

    fn set(&self, records: &[Ipv4Addr]) {
        *self.records.lock().unwrap() = records.to_vec();
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The response to `query`: its question echoed, then one A record per address when it asks
/// for A records (type 1), pointing back at the question's name.
fn answer(query: &[u8], records: &[Ipv4Addr]) -> Vec<u8> {
    let question_end = {
        let mut at = 12;
        while query[at] != 0 {
            at += 1 + usize::from(query[at]);
        }
        at + 5
    };
    let qtype = u16::from_be_bytes([query[question_end - 4], query[question_end - 3]]);
    let records: &[Ipv4Addr] = if qtype == 1 { records } else { &[] };
    let mut packet = query[..question_end].to_vec();
    packet[2..4].copy_from_slice(&0x8180u16.to_be_bytes());
    packet[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    for ip in records {
        packet.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        packet.extend_from_slice(&ip.octets());
    }
    packet
}

/// Simulated workers on 127.0.0.1, .2 and .3, all on one port (as pods behind one name are).
async fn workers_on_one_port() -> (u16, Vec<SimWorker>) {
    'again: for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut listeners = vec![first];
        for host in [2, 3] {
            match TcpListener::bind((Ipv4Addr::new(127, 0, 0, host), port)).await {
                Ok(l) => listeners.push(l),
                Err(_) => continue 'again,
            }
        }
        let workers = listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                let mut profile = WorkerProfile::new(format!("w{}", i + 1));
                profile.decode_step = Duration::from_millis(50);
                SimWorker::start(l, profile).unwrap()
            })
            .collect();
        return (port, workers);
    }
    panic!("no port free on 127.0.0.1, .2 and .3");
}

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// The names of the backends in force, sorted, once every one is eligible.
async fn wait_backends(proxy: &Proxy, expected: &[&str]) {
    let what = format!("backends {expected:?}, all eligible");
    proxy
        .wait_status(&what, |s| {
            let backends = s["backends"].as_array()?;
            let mut names: Vec<&str> = backends.iter().filter_map(|b| b["name"].as_str()).collect();
            names.sort();
            let eligible = backends.iter().all(|b| b["eligible"] == true);
            (names == expected && eligible).then_some(())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_records_come_and_go_as_backends() {
    let (port, _workers) = workers_on_one_port().await;
    let dns = DnsServer::start(&[ip(1), ip(2)]).await;
    let config = format!(
        "health_check: {{interval: 200ms}}\nbackends: []\npools:\n  - name: gpus\n    backends: []\n    \
         discover: {{dns: 'gpus.test:{port}', resolver: '{}', interval: 200ms, timeout: 500ms, \
         name: 'gpu-{{ip}}', backend: {{max_outstanding: 8, telemetry: [{{kind: dcgm, url: 'http://{{ip}}:{{port}}/dcgm/metrics'}}]}}}}\n",
        dns.addr
    );
    let proxy = Proxy::launch(config).await;
    wait_backends(&proxy, &["gpu-127.0.0.1", "gpu-127.0.0.2"]).await;
    let status = proxy.status().await;
    let url = status["backends"][0]["url"].as_str().unwrap();
    assert_eq!(url, format!("http://127.0.0.1:{port}"));

    // A stream in flight keeps its count across the rebuilds that follow.
    let stream = proxy.spawn(Req::completion_stream(40));
    proxy.wait_total_outstanding(1).await;
    let status = proxy.status().await;
    let holder = status["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["outstanding"] == 1)
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();

    dns.set(&[ip(1), ip(2), ip(3)]);
    wait_backends(&proxy, &["gpu-127.0.0.1", "gpu-127.0.0.2", "gpu-127.0.0.3"]).await;
    assert_eq!(proxy.outstanding(&holder).await, 1, "state kept by name");
    eventually(WAIT, "a request served by the new backend", || async {
        let answer = proxy.send(&Req::completion(1)).await;
        (answer.header("x-sim-worker") == Some("w3")).then_some(())
    })
    .await;

    // The record of the backend without the stream goes; so does the backend.
    let (gone, kept) = if holder == "gpu-127.0.0.2" {
        (1, ["gpu-127.0.0.2", "gpu-127.0.0.3"])
    } else {
        (2, [holder.as_str(), "gpu-127.0.0.3"])
    };
    let mut kept = kept.to_vec();
    kept.sort();
    let remaining: Vec<Ipv4Addr> = [1, 2, 3]
        .into_iter()
        .filter(|&i| i != gone)
        .map(ip)
        .collect();
    dns.set(&remaining);
    wait_backends(&proxy, &kept).await;
    assert_eq!(proxy.outstanding(&holder).await, 1);

    // The resolver goes away: the last good set keeps serving, and the failure is reported.
    drop(dns);
    let error = proxy
        .wait_status("the discovery failure in /status", |s| {
            s["discovery"][0]["last_error"].as_str().map(str::to_string)
        })
        .await;
    assert!(error.contains("127.0.0.1"), "{error}");
    let status = proxy.status().await;
    let group = &status["discovery"][0];
    assert_eq!(group["pool"], "gpus");
    let addresses: Vec<IpAddr> = serde_json::from_value(group["addresses"].clone()).unwrap();
    assert_eq!(addresses.len(), 2);
    wait_backends(&proxy, &kept).await;
    assert_eq!(proxy.send(&Req::completion(1)).await.status, 200);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("gpulb_discovery_up{pool=\"gpus\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("gpulb_discovery_backends{pool=\"gpus\"} 2"));
    assert!(!metrics.contains("gpulb_discovery_errors_total{pool=\"gpus\"} 0"));

    let answer = stream.await.unwrap();
    assert!(answer.body.ends_with("data: [DONE]\n\n"), "{}", answer.body);
}
