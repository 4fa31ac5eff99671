//! Unit tests of snapshot building, classification and slot acquisition.

use super::classify::{BodyView, Envelope};
use super::*;
use crate::config::Config;
use http::{HeaderMap, Method};
use std::sync::Arc;

fn envelope<'a>(method: &'a Method, path: &'a str, headers: &'a HeaderMap) -> Envelope<'a> {
    Envelope {
        method,
        path,
        headers,
    }
}

fn config(yaml: &str) -> Config {
    Config::from_yaml(yaml).unwrap()
}

const TWO_CLASSES: &str = r#"
health_check: {enabled: false}
backends:
  - {name: a, url: "http://127.0.0.1:9001", max_outstanding: 2}
  - {name: b, url: "http://127.0.0.1:9002", max_outstanding: 1}
pools:
  - {name: all, backends: [a, b]}
  - {name: only-a, backends: [a]}
classes:
  - {name: chat, pool: all, match: {path_prefix: /v1/chat/}}
  - {name: pinned, pool: only-a, match: {headers: {x-pin: "yes"}}}
  - {name: bulk, pool: all}
default_class: bulk
"#;

#[test]
fn classify_takes_first_match_then_default() {
    let snap = Snapshot::build(config(TWO_CLASSES), 1, None);
    let mut headers = HeaderMap::new();
    assert_eq!(
        snap.classify(
            &envelope(&Method::POST, "/v1/chat/completions", &headers),
            BodyView::Unread
        )
        .unwrap(),
        0
    );
    assert_eq!(
        snap.classify(
            &envelope(&Method::POST, "/v1/completions", &headers),
            BodyView::Unread
        )
        .unwrap(),
        2
    );
    headers.insert("x-pin", "yes".parse().unwrap());
    assert_eq!(
        snap.classify(
            &envelope(&Method::POST, "/v1/completions", &headers),
            BodyView::Unread
        )
        .unwrap(),
        1
    );
}

#[test]
fn acquire_fills_backends_to_their_caps_then_refuses() {
    let snap = Snapshot::build(config(TWO_CLASSES), 1, None);
    let leases: Vec<Lease> = (0..3)
        .map(|_| snap.acquire_for_class(0, &Demand::default(), &[]).unwrap())
        .collect();
    assert!(snap.acquire_for_class(0, &Demand::default(), &[]).is_none());
    assert_eq!(snap.backends[0].state.outstanding.get(), 2);
    assert_eq!(snap.backends[1].state.outstanding.get(), 1);
    drop(leases);
    assert_eq!(snap.backends[0].state.outstanding.get(), 0);
    assert_eq!(snap.backends[1].state.outstanding.get(), 0);
}

#[test]
fn acquire_skips_excluded_backends() {
    let snap = Snapshot::build(config(TWO_CLASSES), 1, None);
    for _ in 0..10 {
        let lease = snap.acquire_for_class(0, &Demand::default(), &[0]).unwrap();
        assert_eq!(lease.backend, 1);
    }
    assert!(snap
        .acquire_for_class(1, &Demand::default(), &[0])
        .is_none());
}

#[test]
fn a_refusing_backend_is_passed_over_until_its_cooldown_ends_or_it_takes_a_request() {
    let snap = Snapshot::build(config(TWO_CLASSES), 1, None);
    let refusing = &snap.backends[0].state;
    let now = crate::health::now_ms();
    refusing.note_refusal(now, std::time::Duration::from_secs(30));
    assert!(refusing.refusing(now) && !refusing.refusing(now + 30_000));
    // Backend 1 takes class 0's requests while it has room (its cap is 1), then backend 0 does.
    let first = snap.acquire_for_class(0, &Demand::default(), &[]).unwrap();
    assert_eq!(first.backend, 1);
    let second = snap.acquire_for_class(0, &Demand::default(), &[]).unwrap();
    assert_eq!(
        second.backend, 0,
        "the refusing backend was left unused with nothing else free"
    );
    drop((first, second));
    // A shorter refusal later does not cut a longer one short; an accepted request ends it.
    refusing.note_refusal(now, std::time::Duration::from_secs(1));
    assert!(refusing.refusing(now + 10_000));
    refusing.note_accepted();
    assert!(!refusing.refusing(now));
    let spread: std::collections::HashSet<usize> = (0..40)
        .map(|_| {
            snap.acquire_for_class(0, &Demand::default(), &[])
                .unwrap()
                .backend
        })
        .collect();
    assert_eq!(spread.len(), 2, "ties go both ways again: {spread:?}");
}

#[test]
fn apply_keeps_live_state_by_name() {
    let registry = Registry::new(config(TWO_CLASSES));
    let first = registry.load();
    let held = first.acquire_for_class(1, &Demand::default(), &[]).unwrap();
    let changed = TWO_CLASSES.replace("max_outstanding: 2", "max_outstanding: 5");
    assert_eq!(registry.apply(config(&changed)), 2);
    let second = registry.load();
    assert_eq!(second.backends[0].max_outstanding, 5);
    assert!(Arc::ptr_eq(
        &first.backends[0].state,
        &second.backends[0].state
    ));
    assert_eq!(second.backends[0].state.outstanding.get(), 1);
    drop(held);
    assert_eq!(second.backends[0].state.outstanding.get(), 0);
}

#[test]
fn earliest_finish_holds_for_the_fast_backend_without_spilling_and_retries_never_hold() {
    let yaml = r#"
health_check: {enabled: false}
backends:
  - {name: fast, url: "http://127.0.0.1:9001", max_outstanding: 1}
  - {name: slow, url: "http://127.0.0.1:9002", max_outstanding: 1}
  - {name: spare, url: "http://127.0.0.1:9003", max_outstanding: 1}
pools:
  - {name: main, backends: [fast, slow]}
  - {name: overflow, backends: [spare]}
classes:
  - {name: jobs, pool: main, fallback_pool: overflow, placement: earliest_finish}
"#;
    let snap = Snapshot::build(config(yaml), 1, None);
    let times = &snap.classes[0].state.service_times;
    let now = std::time::Instant::now();
    for _ in 0..3 {
        times.record("fast", std::time::Duration::from_millis(100), 1000, now);
        times.record("slow", std::time::Duration::from_millis(800), 1000, now);
    }
    let first = snap
        .grant(0, &Demand::default())
        .expect("the fast backend is free");
    assert_eq!(first.lease.backend, 0);
    // The fast one frees a slot in ~100 ms; the slow one would lose 700 ms: wait, and do not
    // spill to the fallback pool either.
    assert!(
        snap.grant(0, &Demand::default()).is_none(),
        "held for the fast backend"
    );
    assert_eq!(snap.backends[1].state.outstanding.get(), 0);
    assert_eq!(snap.backends[2].state.outstanding.get(), 0);
    // An admitted request's retry takes what is free.
    let retry = snap
        .acquire_for_class(0, &Demand::default(), &[])
        .expect("retries never hold");
    assert_eq!(retry.backend, 1);
    // With both of the main pool full, the fallback pool is used.
    assert_eq!(
        snap.grant(0, &Demand::default())
            .expect("spills when full")
            .lease
            .backend,
        2
    );
}

#[test]
fn a_reload_that_moves_a_backend_forgets_its_service_times_only() {
    let known = |snap: &Snapshot, class: &Class| -> Vec<String> {
        let now = std::time::Instant::now();
        let times = snap.service_seconds(class, now);
        times
            .into_iter()
            .map(|(name, _)| name.to_string())
            .collect()
    };
    let first = Snapshot::build(config(TWO_CLASSES), 1, None);
    let now = std::time::Instant::now();
    for class in &first.classes {
        for backend in ["a", "b"] {
            for _ in 0..3 {
                let took = std::time::Duration::from_millis(100);
                class.state.service_times.record(backend, took, 1000, now);
            }
        }
    }
    assert_eq!(known(&first, &first.classes[0]), ["a", "b"]);
    let moved = TWO_CLASSES.replace("127.0.0.1:9002", "127.0.0.1:9003");
    let second = Snapshot::build(config(&moved), 2, Some(&first));
    for class in &second.classes {
        assert_eq!(known(&second, class), ["a"], "class {}", class.name);
    }
    // A reload that moves nothing keeps what was measured.
    let third = Snapshot::build(config(&moved), 3, Some(&second));
    for class in &third.classes {
        assert_eq!(known(&third, class), ["a"], "class {}", class.name);
    }
}

#[test]
fn leases_count_their_tokens_on_the_backend_until_dropped() {
    let snap = Snapshot::build(
        config(
            "health_check: {enabled: false}\nbackends:\n  - {name: a, url: 'http://127.0.0.1:9001'}\n",
        ),
        1,
        None,
    );
    let counter = &snap.backends[0].state.outstanding_tokens;
    let demand = Demand {
        route: crate::routing::ModelRoute::Any,
        tokens: 300,
        ..Demand::default()
    };
    let mut lease = snap.grant(0, &demand).expect("a slot").lease;
    assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), 300);
    lease.set_tokens(1_000);
    let other = snap.acquire_for_class(0, &demand, &[]).unwrap();
    assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), 1_300);
    drop((lease, other));
    assert_eq!(counter.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// One backend with room for 4, a bulk class allowed half of it, and a server that reports
/// `running` requests of which this proxy had `own` in flight when it was read.
fn shared_backend(count_others: bool, running: f64, own: u32) -> Snapshot {
    shared_backend_with_share(count_others, running, own, 0.0)
}

/// [`shared_backend`], with everyone else's remembered share of the backend's load.
fn shared_backend_with_share(
    count_others: bool,
    running: f64,
    own: u32,
    others_share: f64,
) -> Snapshot {
    let yaml = format!(
        r#"
health_check: {{enabled: false}}
telemetry: {{count_others: {count_others}}}
backends:
  - {{name: a, url: "http://127.0.0.1:9001", max_outstanding: 4}}
classes:
  - {{name: chat, pool: default, match: {{path_prefix: /v1/chat/}}}}
  - {{name: bulk, pool: default, backend_share: 0.5}}
default_class: bulk
"#
    );
    let snap = Snapshot::build(config(&yaml), 1, None);
    let now = std::time::Instant::now();
    let server = crate::telemetry::ServerLoad {
        running: Some(running),
        ..Default::default()
    };
    snap.backends[0]
        .state
        .telemetry
        .store(Some(Arc::new(crate::telemetry::Telemetry {
            reading: crate::telemetry::Reading {
                gpus: vec![],
                server: Some(server),
            },
            taken_at: now,
            server_sample: Some(crate::telemetry::ServerSample {
                taken_at: now,
                own_in_flight: own,
                others_share,
            }),
        })));
    snap
}

/// How many leases class `class` gets before it is refused (at most 10).
fn leases_until_refused(snap: &Snapshot, class: usize) -> Vec<Lease> {
    (0..10)
        .map_while(|_| snap.acquire_for_class(class, &Demand::default(), &[]))
        .collect()
}

#[test]
fn other_replicas_requests_take_slots_of_the_cap_and_of_the_class_share() {
    // The server runs 3 requests, none ours: one slot of 4 is left, and bulk's half is gone.
    let snap = shared_backend(true, 3.0, 0);
    assert_eq!(
        leases_until_refused(&snap, 1).len(),
        0,
        "bulk: 3 of 4 in use"
    );
    assert_eq!(
        leases_until_refused(&snap, 0).len(),
        1,
        "chat: one slot left"
    );
    // Without count_others only this proxy's own requests count against the cap.
    let snap = shared_backend(false, 3.0, 0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 4);
}

#[test]
fn our_own_requests_in_the_servers_count_are_not_counted_twice() {
    // The server's 3 were all ours when it was read: nobody else is there.
    let snap = shared_backend(true, 3.0, 3);
    assert_eq!(leases_until_refused(&snap, 0).len(), 4);
    // Two of its three were ours: one other, so three slots for us.
    let snap = shared_backend(true, 3.0, 2);
    assert_eq!(leases_until_refused(&snap, 0).len(), 3);
}

#[test]
fn room_free_beside_other_replicas_is_filled_only_by_half_until_the_next_reading() {
    // Cap 4: the server ran 1 request of someone else's and none of ours; 3 slots were free,
    // and the other replica sees them too: this one takes 2 of them (3 - 3/2).
    let snap = shared_backend(true, 1.0, 0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 2);
    // Nobody else there, and nobody else seen before: all the room is ours.
    let snap = shared_backend(true, 0.0, 0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 4);
}

#[test]
fn room_is_split_by_the_remembered_share_of_the_others() {
    // Nobody else there at the last reading, but other replicas carried half of the backend's
    // load lately: they will fill half of the 4 free slots too, so this one takes 2.
    let snap = shared_backend_with_share(true, 0.0, 0, 0.5);
    assert_eq!(leases_until_refused(&snap, 0).len(), 2);
    // Two others sending as much as this one each (a share of 2/3): 2 of the 3 free slots
    // are theirs (rounded down), 1 is ours.
    let snap = shared_backend_with_share(true, 1.0, 0, 2.0 / 3.0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 1);
    // However large the others' share, one free slot is always this replica's to take.
    let snap = shared_backend_with_share(true, 3.0, 0, 1.0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 1);
}

/// Holds one request of `class` in its queue (its own tries find no slot) until dropped.
fn queued_request(snap: &Snapshot, class: usize) -> futures_util::future::LocalBoxFuture<'_, ()> {
    use futures_util::FutureExt;
    let c = &snap.classes[class];
    let queue = c.state.queues.get(&crate::routing::ModelRoute::Any);
    let mut waiting = async move {
        let _ = queue.admit("t", &c.policy, || None::<Grant>).await;
    }
    .boxed_local();
    assert!(tokio::task::unconstrained(waiting.as_mut())
        .now_or_never()
        .is_none());
    assert_eq!(c.state.queues.depth(), 1, "one request waits");
    waiting
}

#[tokio::test]
async fn a_class_with_requests_queued_claims_all_the_room_others_left_unless_it_keeps_a_share() {
    // Cap 4, nobody there at the last reading, but the others carried all of its load lately:
    // with nothing queued this replica leaves them 3 of the 4 free slots.
    let snap = shared_backend_with_share(true, 0.0, 0, 1.0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 1);
    // With a chat request waiting here, the room the others did not refill is all its own.
    let waiting = queued_request(&snap, 0);
    assert_eq!(leases_until_refused(&snap, 0).len(), 4);
    drop(waiting);
    // Bulk keeps half of each backend for other classes: it still leaves the others their part
    // of its room (its 2 slots: 1 for the others) with requests queued.
    let snap = shared_backend_with_share(true, 0.0, 0, 1.0);
    let waiting = queued_request(&snap, 1);
    assert_eq!(leases_until_refused(&snap, 1).len(), 1);
    drop(waiting);
}

#[test]
fn file_names_resolve_once_per_apply_and_discovered_backends_keep_their_addresses() {
    let file = |port: u16| {
        format!(
            "health_check: {{enabled: false}}\nbackends:\n  - {{name: named, url: 'http://localhost:{port}'}}\n\
             pools:\n  - name: named\n    backends: [named]\n  - name: gpus\n    backends: []\n    \
             discover: {{dns: 'gpus.test:8000', name: 'gpu-{{ip}}'}}\nclasses:\n  - {{name: a, pool: named}}\n  \
             - {{name: b, pool: gpus}}\ndefault_class: a\n"
        )
    };
    let address = |snap: &Snapshot, name: &str| {
        let b = snap.backends.iter().find(|b| b.state.name == name).unwrap();
        b.state.address.get().map(|a| a.port())
    };
    let registry = Registry::new(config(&file(9001)));
    let ip: std::net::IpAddr = "127.0.0.7".parse().unwrap();
    registry.discovered("gpus", "gpus.test:8000", Ok(vec![ip]));
    let snap = registry.load();
    assert_eq!(address(&snap, "named"), Some(9001));
    assert_eq!(address(&snap, "gpu-127.0.0.7"), Some(8000));

    // A reload resolves the file's names anew; what discovery found stays, at its address.
    registry.apply(config(&file(9002)));
    let snap = registry.load();
    assert_eq!(address(&snap, "named"), Some(9002));
    assert_eq!(address(&snap, "gpu-127.0.0.7"), Some(8000));
    assert_eq!(
        registry.file_config().backends.len(),
        1,
        "the file's own config"
    );
}

#[test]
fn a_reload_wakes_the_queues_only_when_it_may_bring_room() {
    let first = Snapshot::build(config(TWO_CLASSES), 1, None);
    let next = |yaml: &str| Snapshot::build(config(yaml), 2, Some(&first));
    let same_room = TWO_CLASSES.replace("default_class: bulk", "default_class: chat");
    assert!(
        !next(&same_room).may_add_room(&first),
        "a change that adds no room"
    );
    let higher_cap = TWO_CLASSES.replace("max_outstanding: 1}", "max_outstanding: 3}");
    assert!(
        next(&higher_cap).may_add_room(&first),
        "a backend's cap raised"
    );
    let lower_cap = TWO_CLASSES.replace("max_outstanding: 2}", "max_outstanding: 1}");
    assert!(
        !next(&lower_cap).may_add_room(&first),
        "a backend's cap lowered"
    );
    let new_backend = TWO_CLASSES.replace(
        "pools:",
        "  - {name: c, url: \"http://127.0.0.1:9003\"}\npools:",
    );
    assert!(next(&new_backend).may_add_room(&first), "a backend added");
    let wider_pool = TWO_CLASSES.replace("backends: [a]}", "backends: [a, b]}");
    assert!(
        next(&wider_pool).may_add_room(&first),
        "a pool given a member"
    );
    let capped = TWO_CLASSES.replace("pool: all}", "pool: all, max_outstanding: 1}");
    let capped = Snapshot::build(config(&capped), 2, Some(&first));
    let uncapped = Snapshot::build(config(TWO_CLASSES), 3, Some(&capped));
    assert!(uncapped.may_add_room(&capped), "a class's cap lifted");
    let moved = TWO_CLASSES.replace("{name: pinned, pool: only-a", "{name: pinned, pool: all");
    assert!(
        next(&moved).may_add_room(&first),
        "a class sent to another pool"
    );
}
