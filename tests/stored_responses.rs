//! The Responses API's stored responses live in the memory of the server that made them: a
//! request naming one (`previous_response_id`, `GET /v1/responses/{id}`) goes to that backend,
//! learned from the id at the start of its answer, streamed or not.

mod common;

use common::{start_workers, Config, Proxy, Req};
use gpulb::tools::sim::Fault;
use serde_json::{json, Value};

/// A Responses API request, going on from `previous` when given.
fn respond(previous: Option<&str>, stream: bool) -> Req {
    let body = json!({"model": "sim-model", "input": "hello", "max_output_tokens": 2,
                      "stream": stream, "previous_response_id": previous});
    Req::post("/v1/responses", body.to_string())
}

/// The id a streamed answer's `response.created` event carries.
fn streamed_id(body: &str) -> String {
    let created = body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no event in {body}"));
    let event: Value = serde_json::from_str(created).unwrap();
    assert_eq!(event["type"], "response.created", "{body}");
    event["response"]["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_goes_on_at_the_backend_that_stored_its_last_response() {
    let workers = start_workers(3, |_| {}).await;
    let config = Config::fleet(&workers).set("health_check", "{interval: 100ms, fall: 1}");
    let proxy = Proxy::start(config).await;
    let first = proxy.send(&respond(None, false)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let owner = first.worker.clone();
    let mut last = first.json()["id"].as_str().unwrap().to_string();
    // Each turn goes on from the last; the other two workers would answer 404.
    for turn in 0..8 {
        let stream = turn % 2 == 1;
        let answer = proxy.send(&respond(Some(&last), stream)).await;
        assert_eq!(
            (answer.status, answer.worker.as_str()),
            (200, owner.as_str()),
            "turn {turn}: {}",
            answer.body
        );
        last = if stream {
            assert!(
                answer.body.contains("response.completed"),
                "{}",
                answer.body
            );
            streamed_id(&answer.body)
        } else {
            answer.json()["id"].as_str().unwrap().to_string()
        };
    }
    for _ in 0..4 {
        let got = proxy.send(&Req::get(format!("/v1/responses/{last}"))).await;
        assert_eq!((got.status, got.worker.as_str()), (200, owner.as_str()));
    }
    // The first answer and the eight turns' are remembered.
    assert_eq!(proxy.status().await["stored_responses"], 9);
    assert_eq!(proxy.metric("gpulb_stored_responses_tracked").await, 9.0);
    // An id no backend holds is looked for on each, and the last one's 404 reaches the client.
    let unknown = proxy.send(&respond(Some("resp_unknown"), false)).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    assert!(unknown.body.contains("resp_unknown"), "{}", unknown.body);
    // (The first answer, eight turns and four retrievals were logged before it.)
    let record = proxy.first_access_records(14).await.pop().unwrap();
    assert_eq!(record["status"], 404, "{record}");
    assert_eq!(record["attempts"], 3, "{record}");

    // The backend that stored it out (unhealthy): the request is not held for it but goes to
    // another, whose own answer says the response is not there.
    let index = workers.iter().position(|w| w.name() == owner).unwrap();
    workers[index].set_fault(Fault::ServerError);
    proxy
        .wait_status("the owner unhealthy", |s| {
            (s["backends"][index]["health"] == "unhealthy").then_some(())
        })
        .await;
    let elsewhere = proxy.send(&respond(Some(&last), false)).await;
    assert_eq!(elsewhere.status, 404, "{}", elsewhere.body);
    assert_ne!(elsewhere.worker, owner);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_a_response_wait_for_its_full_backend_and_others_do_not() {
    let workers = start_workers(2, |p| {
        p.decode_step = std::time::Duration::from_millis(20);
    })
    .await;
    let config = Config::fleet(&workers).each_backend(|b| b.max_outstanding(1));
    let proxy = Proxy::start(config).await;
    let first = proxy.send(&respond(None, false)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let owner = first.worker.clone();
    let id = first.json()["id"].as_str().unwrap().to_string();
    // Its owner busy with a long stream: a follow-up waits in gpulb's queue for it rather than
    // going to the idle backend (which would answer 404), and a plain chat goes to the idle one.
    let long = Req::post(
        "/v1/responses",
        json!({"input": "x", "max_output_tokens": 40, "previous_response_id": id}).to_string(),
    );
    let holder = proxy.spawn(long);
    proxy
        .wait_status("the owner full", |s| {
            let backends = s["backends"].as_array()?;
            let b = backends.iter().find(|b| b["name"] == owner.as_str())?;
            (b["outstanding"] == 1).then_some(())
        })
        .await;
    let follow_up = proxy.spawn(respond(Some(&id), false));
    let chat = proxy.send(&Req::completion(2)).await;
    assert_eq!(chat.status, 200);
    assert_ne!(
        chat.worker, owner,
        "a plain request waited for the busy owner"
    );
    let follow_up = follow_up.await.unwrap();
    assert_eq!(
        (follow_up.status, follow_up.worker.as_str()),
        (200, owner.as_str()),
        "{}",
        follow_up.body
    );
    assert_eq!(holder.await.unwrap().status, 200);
    proxy.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_did_not_see_a_response_finds_its_backend_and_remembers_it() {
    let workers = start_workers(4, |_| {}).await;
    let (a, b) = (
        Proxy::start(Config::fleet(&workers)).await,
        Proxy::start(Config::fleet(&workers)).await,
    );
    // Replica b never saw these: the backends that do not hold one answer 404 and the request
    // goes on to the next, until the one that does (each would otherwise miss 3 times in 4).
    let mut owner = String::new();
    let mut id = String::new();
    for turn in 0..6 {
        let first = a.send(&respond(None, false)).await;
        assert_eq!(first.status, 200, "{}", first.body);
        (owner, id) = (
            first.worker.clone(),
            first.json()["id"].as_str().unwrap().to_string(),
        );
        let found = b.send(&respond(Some(&id), false)).await;
        assert_eq!(
            (found.status, found.worker.as_str()),
            (200, owner.as_str()),
            "turn {turn}: {}",
            found.body
        );
    }
    // b now knows the last one's backend, and goes there at once.
    for n in 7..=10 {
        let again = b.send(&Req::get(format!("/v1/responses/{id}"))).await;
        assert_eq!((again.status, again.worker.as_str()), (200, owner.as_str()));
        let record = b.first_access_records(n).await.pop().unwrap();
        assert_eq!(record["attempts"], 1, "{record}");
    }
    // Not a refusal: no backend is passed over for it.
    let status = b.status().await;
    for backend in status["backends"].as_array().unwrap() {
        assert_eq!(backend["refusing"], false, "{backend}");
        assert_eq!(backend["refusals_retried_total"], 0, "{backend}");
    }
}
